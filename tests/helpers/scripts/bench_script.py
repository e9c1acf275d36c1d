"""``python -m stoker ARGS`` with the stops armed in the environment (helpers/stops.py): the stop
tests run ``stoker bench`` through it (not a test module)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

from helpers.stops import install_from_env  # noqa: E402
from stoker.cli import main  # noqa: E402

if __name__ == "__main__":
    install_from_env()
    sys.exit(main(sys.argv[1:]))
