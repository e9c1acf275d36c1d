"""Every program the docs show runs as printed.

The README's example and the AdaNet guide's search are taken from their pages (the first
```python block after a marker) and run in a fresh folder; the tutorial's program is
``examples/quickstart.py``, which the page shows in full (``test_docs.py`` checks the copy) and
this file runs. The TPUEstimator guide's program is run by ``test_examples.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.processes import PYTHON, python_env, run_process


def program_after(page: str, marker: str) -> str:
    """The first fenced ```python block after ``marker`` in ``page``."""
    text = (ROOT / page).read_text()
    start = text.index(marker)
    match = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL).search(text, start)
    assert match is not None, f"no ```python block after {marker!r} in {page}"
    return match[1]


def run_program(code: str, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = folder / "program.py"
    script.write_text(code)
    done = run_process(
        [PYTHON, str(script), *args], cwd=folder, env=python_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_readme_example_trains_evaluates_predicts_exports_and_resumes(tmp_path):
    code = program_after("README.md", "## Example")
    first = run_program(code, tmp_path)
    assert "'global_step': 300" in first.stdout, first.stdout
    assert (tmp_path / "exported" / "example" / "model.pt2").exists()
    again = run_program(code, tmp_path)  # the rerun finds step 300 and trains nothing
    assert "'global_step': 300" in again.stdout
    assert json.loads((tmp_path / "runs" / "example" / "checkpoint.json").read_text())["latest"] == "ckpt-300"


@pytest.mark.slow  # ~19 s here
def test_the_adanet_guide_search_runs_three_iterations_and_exports(tmp_path):
    pytest.importorskip("sklearn")
    start = time.perf_counter()
    done = run_program(program_after("docs/adanet.md", "In code:"), tmp_path)
    assert "'global_step':" in done.stdout, done.stdout
    assert (tmp_path / "exported" / "adanet" / "architecture.json").exists()
    assert (tmp_path / "runs" / "adanet" / "iteration-2").is_dir()
    print(f"the AdaNet guide's program: {time.perf_counter() - start:.1f} s")


@pytest.mark.slow  # ~65 s here: the program ends with benchmarks/overhead.py, twice
def test_the_tutorial_program_trains_and_resumes(tmp_path):
    pytest.importorskip("sklearn")
    model_dir = tmp_path / "quickstart"
    args = (str(ROOT / "examples" / "quickstart.py"), "--model_dir", str(model_dir), "--max_steps", "200")
    first = run_process([PYTHON, *args], env=python_env(), capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "held-out accuracy at step 200:" in first.stdout
    assert "held-out example 4: predicted" in first.stdout
    again = run_process([PYTHON, *args], env=python_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already holds ckpt-200: resuming from it" in again.stdout
