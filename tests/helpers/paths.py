"""Where things are: the repository root, the tests folder and the process scripts."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SCRIPTS = TESTS / "helpers" / "scripts"
