"""``benchmarks/hf_finetune.py``: the fine-tuning example under stoker, a plain loop and HF's Trainer,
run once at a tiny size. What is checked is the table and the same loss curve for every runner
(the same initial weights, batches and optimizer: bitwise the same losses), never a speed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.paths import ROOT
from helpers.processes import PYTHON, python_env, run_process


@pytest.mark.slow  # four runners in a process importing transformers: about a minute on 2 busy cores
def test_every_runner_has_a_row_and_the_same_loss_curve(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    out = tmp_path / "figures.json"
    proc = run_process(
        [PYTHON, "benchmarks/hf_finetune.py", "--steps=6", "--rounds=2", f"--data_dir={tmp_path}", f"--out={out}"],
        cwd=ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert figures["steps"] == 6 and figures["rounds"] == 2
    assert set(figures["runners"]) == {"plain", "stoker", "stoker+ckpt", "trainer"}
    for name, row in figures["runners"].items():
        assert row["max_loss_difference"] == 0.0, name  # every step's loss, bitwise
        assert re.search(rf"^{re.escape(name)}\s+\d+\.\d\s+\d\.\d\d\d ", proc.stdout, re.M), proc.stdout
