"""Write the names of the flags ``benchmark_cnn.py`` defines, one per line, sorted, with their kind.

    python tests/bench/data/extract_seed_flags.py /work/shared/seeds/004_346fb5d9aed239ec.txt \
        > tests/bench/data/tf_cnn_benchmarks_flags.txt

Only the names and kinds are kept (``flags.DEFINE_<kind>('<name>', ...``), not the seed's text.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def main(path: str) -> None:
    text = Path(path).read_text()
    found = re.findall(r"flags\.DEFINE_([a-z]+)\(\s*'([a-z0-9_]+)'", text)
    print(
        f"# {len(found)} flags of tf_cnn_benchmarks' benchmark_cnn.py: kind name"
        " (tests/bench/data/extract_seed_flags.py)"
    )
    for kind, name in sorted(found, key=lambda kn: kn[1]):
        print(f"{kind} {name}")


if __name__ == "__main__":
    main(sys.argv[1])
