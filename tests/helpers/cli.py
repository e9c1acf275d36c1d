"""The ``stoker`` command line run in the test's own process."""

from __future__ import annotations

import pytest


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``stoker`` with ``args`` in this process: its exit code, stdout and stderr."""
    from stoker.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
