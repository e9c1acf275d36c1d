"""The migration guide's program runs as printed, and rerunning it resumes instead of starting over."""

from __future__ import annotations

import re
import subprocess
import sys

import safetensors.torch
import torch

from helpers.paths import ROOT
from helpers.processes import popen, python_env


def start(*args: str) -> subprocess.Popen[str]:
    return popen(
        [sys.executable, str(ROOT / "examples" / "from_tpuestimator.py"), *args],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return out


def run(*args: str) -> str:
    return finish(start(*args))


def test_from_tpuestimator_trains_exports_and_resumes_bitwise(tmp_path):
    split, whole = tmp_path / "split", tmp_path / "whole"
    # the uninterrupted run shares nothing with the split one: it runs beside it, on the other core
    reference = start("--model_dir", str(whole), "--max_steps", "60", "--eval_every_n_steps", "30")
    first = run("--model_dir", str(split), "--max_steps", "30", "--eval_every_n_steps", "30")
    assert "(new run)" in first and "final evaluation at step 30" in first
    assert (split / "export" / "model.pt2").is_file()
    second = run("--model_dir", str(split), "--max_steps", "60", "--eval_every_n_steps", "30")
    assert "(resuming from ckpt-30)" in second and "final evaluation at step 60" in second
    finish(reference)
    a = safetensors.torch.load_file(split / "ckpt-60" / "model.safetensors")
    b = safetensors.torch.load_file(whole / "ckpt-60" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    accuracy = float(re.search(r"accuracy (\d\.\d+)", second).group(1))
    assert accuracy > 0.5  # digits after 60 steps of Adam; chance is 0.1


def test_tune_digits_runs_a_study_and_reuses_its_finished_trials(tmp_path):
    example = str(ROOT / "examples" / "tune_digits.py")
    args = ["--trials", "2", "--storage", f"sqlite:///{tmp_path / 'study.db'}", "--model_dir", str(tmp_path / "trials")]
    first = finish(
        popen(
            [sys.executable, example, *args],
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    assert re.search(r"^best trial \d: loss \d\.\d+ with \{'learning_rate'", first, re.M)
    assert sorted(p.name for p in (tmp_path / "trials").iterdir()) == ["trial-0", "trial-1"]
    proc = popen(
        [sys.executable, example, *args], env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert out == first and "tune: trial" not in err  # nothing trained again
