"""kill -9 an AdaNet search (a real subprocess) mid-iteration, between iterations and in the
bookkeeping before an iteration's commit; rerunning gives bitwise the same final ensemble."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, popen, python_env, run_process

SCRIPT = SCRIPTS / "adanet_script.py"
FINAL_STEP = 72  # 3 iterations of 24 steps (helpers.adanet.make_search)


def run_to_end(model_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_process(
        [PYTHON, str(SCRIPT), "--model_dir", str(model_dir), *extra],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def start(model_dir: Path, sleep: float = 0.01) -> subprocess.Popen[str]:
    return popen(
        [PYTHON, str(SCRIPT), "--model_dir", str(model_dir), "--sleep", str(sleep)],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.005)


def kill(proc: subprocess.Popen[str]) -> None:
    proc.kill()  # SIGKILL: no handler runs, no cleanup
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def outcome(model_dir: Path) -> tuple[bytes, list[str]]:
    """The final ensemble's weights and every architecture file."""
    weights = (model_dir / "final" / f"ckpt-{FINAL_STEP}" / "model.safetensors").read_bytes()
    return weights, [p.read_text() for p in sorted(model_dir.glob("architecture-*.json"))]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[str]]:
    ref = tmp_path_factory.mktemp("adanet-ref")
    done = run_to_end(ref)
    assert done.returncode == 0, done.stderr
    assert f"done {FINAL_STEP}" in done.stdout
    return outcome(ref)


def test_kill_9_mid_iteration_then_rerun_is_bitwise_equal(tmp_path, reference):
    crashed = tmp_path / "crashed"
    proc = start(crashed)
    wait_for(crashed / "architecture-0.json", proc)
    wait_for(crashed / "iteration-1" / "checkpoint.json", proc)  # iteration 1 has a checkpoint
    time.sleep(random.uniform(0.0, 0.2))
    kill(proc)
    assert not (crashed / "architecture-2.json").exists(), "the run finished before the kill; slow it down"
    done = run_to_end(crashed)
    assert done.returncode == 0, done.stderr
    assert "resumed from" in done.stderr
    assert outcome(crashed) == reference


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; kill -9 mid-iteration runs by default
def test_kill_9_between_iterations_then_rerun_is_bitwise_equal(tmp_path, reference):
    crashed = tmp_path / "crashed"
    proc = start(crashed, sleep=0.02)
    wait_for(crashed / "architecture-0.json", proc)  # iteration 0 committed, iteration 1 not yet saved
    kill(proc)
    assert not (crashed / "iteration-1" / "checkpoint.json").exists()  # iteration 1 had not saved yet
    done = run_to_end(crashed)
    assert done.returncode == 0, done.stderr
    assert outcome(crashed) == reference


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; kill -9 mid-iteration runs by default
def test_kill_9_after_saving_the_chosen_ensemble_before_the_commit(tmp_path, reference):
    crashed = tmp_path / "crashed"
    died = run_to_end(crashed, "--die_before_commit", "1")
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert (crashed / "final" / "ckpt-48").exists() and not (crashed / "architecture-1.json").exists()
    done = run_to_end(crashed)
    assert done.returncode == 0, done.stderr
    assert outcome(crashed) == reference
