"""The migration guides' programs run as printed, and rerunning them resumes instead of starting over."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

from helpers.paths import ROOT
from helpers.processes import popen, python_env


def start(*args: str, program: str = "from_tpuestimator.py") -> subprocess.Popen[str]:
    return popen(
        [sys.executable, str(ROOT / "examples" / program), *args],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return out


def run(*args: str, program: str = "from_tpuestimator.py") -> str:
    return finish(start(*args, program=program))


def same_weights(a_dir: Path, b_dir: Path, checkpoint: str) -> bool:
    a = safetensors.torch.load_file(a_dir / checkpoint / "model.safetensors")
    b = safetensors.torch.load_file(b_dir / checkpoint / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; the Lightning example's resume runs by default
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


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; tests/test_tune.py covers the study
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


def test_from_lightning_runs_and_resumes_an_epoch_bitwise(tmp_path):
    split, whole = tmp_path / "split", tmp_path / "whole"
    reference = start("--model_dir", str(whole), "--max_epochs", "2", program="from_lightning.py")
    first = run("--model_dir", str(split), "--max_epochs", "1", program="from_lightning.py")
    assert "(new run)" in first and "final evaluation at step 23 (epoch 1)" in first
    second = run("--model_dir", str(split), "--max_epochs", "2", program="from_lightning.py")
    assert "(resuming from ckpt-23)" in second and "final evaluation at step 46 (epoch 2)" in second
    assert re.search(r"best checkpoint: ckpt-(23|46) \(accuracy 0\.\d+\)", second)
    assert re.search(r"predicted \[\d, \d, \d, \d, \d\], true \[0, 4, 4, 8, 4\]", second)
    finish(reference)
    assert same_weights(split, whole, "ckpt-46")


@pytest.mark.slow
def test_from_lightning_stops_early_at_the_same_step_after_a_resume(tmp_path):
    # The page's run: EarlyStopping(val_loss, min_delta=0.005, patience=2) stops it in epoch 11.
    split, whole = tmp_path / "split", tmp_path / "whole"
    reference = start("--model_dir", str(whole), program="from_lightning.py")
    run("--model_dir", str(split), "--max_epochs", "6", program="from_lightning.py")
    resumed = run("--model_dir", str(split), program="from_lightning.py")
    assert "(resuming from ckpt-138)" in resumed and "stopped early at step 253" in resumed
    assert "stopped early at step 253" in finish(reference)
    assert same_weights(split, whole, "ckpt-253")
    again = run("--model_dir", str(split), program="from_lightning.py")  # stopped: nothing more to do
    assert "(resuming from ckpt-253)" in again and "final evaluation at step 253" in again


@pytest.mark.slow  # default run under 5 minutes on 2 cores; the fast tests of this area cover the same code
def test_finetune_hf_resumes_bitwise_and_writes_a_folder_transformers_loads(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("datasets")
    split, whole = tmp_path / "split", tmp_path / "whole"
    reference = start("--model_dir", str(whole), "--steps", "60", program="finetune_hf.py")
    first = run("--model_dir", str(split), "--steps", "30", program="finetune_hf.py")
    assert "new run" in first and re.search(r"^step 30: held-out accuracy", first, re.M)
    second = run("--model_dir", str(split), "--steps", "60", program="finetune_hf.py")
    assert "resuming from ckpt-30" in second
    finish(reference)
    assert same_weights(split, whole, "ckpt-60")
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(split / "hf")
    ckpt = safetensors.torch.load_file(split / "ckpt-60" / "model.safetensors")
    assert all(torch.equal(v, ckpt[k]) for k, v in model.state_dict().items())  # DIR/hf holds step 60's weights
    accuracy = float(re.search(r"^step 60: held-out accuracy (\d\.\d+)", second, re.M).group(1))
    assert accuracy > 0.8  # about a third of the sentences are about a return value
