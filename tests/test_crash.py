"""Crash safety with real processes: kill -9 at a random moment, SIGTERM preemption."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, finished, in_background, popen, python_env, run_process

SCRIPT = SCRIPTS / "train_script.py"
MAX_STEPS = 60


def run_to_end(model_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_process(
        [PYTHON, str(SCRIPT), "--model_dir", str(model_dir), "--max_steps", str(MAX_STEPS), *extra],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def start_to_end(model_dir: Path, *extra: str) -> subprocess.Popen[str]:
    """The uninterrupted reference run, in the background (collected with ``finished``)."""
    return in_background([PYTHON, str(SCRIPT), "--model_dir", str(model_dir), "--max_steps", str(MAX_STEPS), *extra])


def start(model_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return popen(
        [PYTHON, str(SCRIPT), "--model_dir", str(model_dir), "--max_steps", str(MAX_STEPS), "--sleep", "0.02", *extra],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_checkpoint(model_dir: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (model_dir / "checkpoint.json").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)


def latest_step(model_dir: Path) -> int:
    index = json.loads((model_dir / "checkpoint.json").read_text())
    return next(r["step"] for r in index["checkpoints"] if r["name"] == index["latest"])


def final_weights(model_dir: Path) -> bytes:
    return (model_dir / f"ckpt-{MAX_STEPS}" / "model.safetensors").read_bytes()


@pytest.mark.parametrize(
    "precision", ["fp32", pytest.param("bf16-sr", marks=pytest.mark.slow), pytest.param("fp16", marks=pytest.mark.slow)]
)
def test_kill_9_at_a_random_moment_then_rerun_is_bitwise_equal(tmp_path, precision):
    ref = start_to_end(tmp_path / "ref", "--precision", precision)
    rng = random.Random()
    crashed = tmp_path / "crashed"
    delays = []
    for _ in range(2):  # kill it twice, at random moments after a checkpoint exists
        proc = start(crashed, "--precision", precision)
        wait_for_checkpoint(crashed, proc)
        delays.append(rng.uniform(0.0, 0.6))
        time.sleep(delays[-1])
        proc.kill()  # SIGKILL: no handler runs, no cleanup
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
    killed_at = latest_step(crashed)
    assert killed_at < MAX_STEPS, "the run finished before the kill; slow it down"
    done = run_to_end(crashed, "--precision", precision)
    assert done.returncode == 0, done.stderr
    assert f"resumed from {crashed}" in done.stderr
    finished(ref)
    assert final_weights(crashed) == final_weights(tmp_path / "ref"), f"kill delays {delays}, resumed at {killed_at}"


def test_sigterm_finishes_the_step_checkpoints_and_exits_cleanly(tmp_path):
    ref = start_to_end(tmp_path / "ref")
    proc = start(tmp_path / "run")
    wait_for_checkpoint(tmp_path / "run", proc)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    step = latest_step(tmp_path / "run")
    assert f"SIGTERM at step {step}: checkpoint" in err
    assert step < MAX_STEPS
    done = run_to_end(tmp_path / "run")
    assert done.returncode == 0, done.stderr
    finished(ref)
    assert final_weights(tmp_path / "run") == final_weights(tmp_path / "ref")
