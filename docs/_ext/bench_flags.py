"""Regenerate docs/bench-reference.md's flag lists from the flags' declarations (``stoker.bench.flags``).

    .venv/bin/python docs/_ext/bench_flags.py     # from the repository root; rewrites docs/bench-reference.md

The lists sit between the markers below; ``tests/bench/test_bench_flags.py`` fails when the
page and the declarations differ, so run this after adding or changing a flag.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "bench-reference.md"
BEGIN = "<!-- flags:begin (python docs/_ext/bench_flags.py) -->\n"
END = "<!-- flags:end -->"


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    from stoker.bench.config import BenchConfig
    from stoker.bench.flags import all_flags, markdown_tables

    page = PAGE.read_text()
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(head + BEGIN + "\n" + markdown_tables(all_flags(BenchConfig)) + "\n" + END + tail)


if __name__ == "__main__":
    main()
