"""Asynchronous checkpoints: same bytes as synchronous ones, failures reported, kills survived."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, popen, python_env, run_process
from helpers.tiny import make_data, make_estimator, train_input
from stoker.checkpoint import CheckpointIO
from stoker.checkpoint.async_writer import AsyncCheckpointWriter, snapshot
from stoker.errors import CheckpointError
from stoker.storage import stores as storage_mod

SCRIPT = SCRIPTS / "train_script.py"


def _files(model_dir: Path, step: int) -> dict[str, bytes]:
    """A checkpoint's files, its manifest with the write's time left out."""
    d = model_dir / f"ckpt-{step}"
    files = {p.name: p.read_bytes() for p in sorted(d.iterdir())}
    manifest = json.loads(files.pop("manifest.json"))
    files["manifest.json"] = json.dumps({k: v for k, v in manifest.items() if k not in ("time", "parent")}).encode()
    return files


def _latest(model_dir: Path) -> str:
    return json.loads((model_dir / "checkpoint.json").read_text())["latest"]


def test_snapshot_shares_nothing_with_the_live_state():
    w = torch.ones(3)
    state = {"w": w, "opt": {"state": {0: {"m": torch.zeros(2)}}, "groups": [{"lr": 0.1}]}, "rng": (1, [2, 3])}
    snap = snapshot(state)
    w.add_(1)
    state["opt"]["state"][0]["m"].add_(5)
    state["opt"]["groups"][0]["lr"] = 9.0
    assert torch.equal(snap["w"], torch.ones(3)) and torch.equal(snap["opt"]["state"][0]["m"], torch.zeros(2))
    assert snap["opt"]["groups"][0]["lr"] == 0.1 and snap["rng"] == (1, [2, 3])


def test_async_run_writes_the_same_checkpoints_and_resumes_bitwise(tmp_path, monkeypatch):
    x, y = make_data(64)
    # Stopped at 8 and resumed like the asynchronous run (checkpoints record the train call's max_steps).
    for max_steps in (8, 12):
        make_estimator(tmp_path / "sync", save_checkpoints_steps=4).train(train_input(x, y), max_steps=max_steps)
    real = storage_mod._write_durably

    def slow(path, data):  # noqa: ANN001, ANN202 - the next steps run while the files are written
        time.sleep(0.05)
        return real(path, data)

    monkeypatch.setattr(storage_mod, "_write_durably", slow)
    make_estimator(tmp_path / "async", save_checkpoints_steps=4, checkpoint_io=CheckpointIO(async_save=True)).train(
        train_input(x, y), max_steps=8
    )
    # a new process-like start resumes from the asynchronously written ckpt-8
    make_estimator(tmp_path / "async", save_checkpoints_steps=4, checkpoint_io=CheckpointIO(async_save=True)).train(
        train_input(x, y), max_steps=12
    )
    for step in (4, 8, 12):
        sync, asyn = _files(tmp_path / "sync", step), _files(tmp_path / "async", step)
        assert sync == asyn, step  # every file, byte for byte
    assert _latest(tmp_path / "async") == "ckpt-12"


def test_train_and_evaluate_evaluates_the_checkpoint_still_being_written(tmp_path, monkeypatch):
    """Each evaluation during training waits for the asynchronous write of its step's checkpoint
    (the first one said "no checkpoint in model_dir"), and the run ends as with synchronous writes:
    the same evaluations, best checkpoint and files (but for the write times)."""
    from helpers.stops import ending
    from helpers.tiny import eval_input

    x, y = make_data(64)
    ex, ey = make_data(32, seed=1)

    def train_and_evaluate(model_dir: Path, io: CheckpointIO) -> None:
        est = make_estimator(model_dir, save_checkpoints_steps=3, keep_best=("accuracy", "max"), checkpoint_io=io)
        est.train_and_evaluate(train_input(x, y), eval_input(ex, ey), max_steps=16, eval_every_n_steps=4)

    train_and_evaluate(tmp_path / "sync", CheckpointIO())
    real = storage_mod._write_durably

    def slow(path, data):  # noqa: ANN001, ANN202 - the evaluation starts while the files are written
        time.sleep(0.05)
        return real(path, data)

    monkeypatch.setattr(storage_mod, "_write_durably", slow)
    train_and_evaluate(tmp_path / "async", CheckpointIO(async_save=True))
    want = ending(tmp_path / "sync")
    assert ending(tmp_path / "async") == want and want.evaluated_steps == [4, 8, 12, 16]
    got, same = _files(tmp_path / "async", 16), _files(tmp_path / "sync", 16)
    assert got.pop("evaluation.json") != b"" and same.pop("evaluation.json") != b""  # they hold write times
    assert got == same


def test_failed_async_save_stops_at_next_boundary_and_previous_stays_latest(tmp_path, monkeypatch):
    x, y = make_data(64)
    ref = tmp_path / "ref"
    make_estimator(ref, save_checkpoints_steps=4).train(train_input(x, y), max_steps=16)
    real = storage_mod._write_durably

    def fail_ckpt_8(path, data):  # noqa: ANN001, ANN202
        if ".tmp-ckpt-8-" in str(path):
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(storage_mod, "_write_durably", fail_ckpt_8)
    run = tmp_path / "run"
    est = make_estimator(
        run, save_checkpoints_steps=4, checkpoint_io=CheckpointIO(async_save=True), iterations_per_loop=2
    )
    with pytest.raises(
        CheckpointError,
        match=(
            r"asynchronous checkpoint ckpt-8 failed: checkpoint ckpt-8 was not written: cannot write "
            r".*model.safetensors: no space left on the device or quota exceeded.*ckpt-4' stays the latest "
            r"checkpoint; training stopped"
        ),
    ):
        est.train(train_input(x, y), max_steps=16)
    # reported at the first loop boundary after the write failed, at the latest by the next save
    assert 8 <= est.global_step <= 12
    assert _latest(run) == "ckpt-4" and not (run / "ckpt-8").exists() and not (run / "ckpt-12").exists()
    assert not [p for p in run.iterdir() if p.name.startswith(".tmp-")]
    monkeypatch.setattr(storage_mod, "_write_durably", real)
    make_estimator(run, save_checkpoints_steps=4, checkpoint_io=CheckpointIO(async_save=True)).train(
        train_input(x, y), max_steps=16
    )
    assert _files(run, 16)["model.safetensors"] == _files(ref, 16)["model.safetensors"]


def test_at_most_one_write_in_flight_and_failure_on_poll():
    order: list[str] = []
    gates = {"ckpt-1": threading.Event(), "ckpt-2": threading.Event()}

    def slow(name: str):  # noqa: ANN202
        def write() -> None:
            gates[name].wait(5)
            order.append(name)

        return write

    writer = AsyncCheckpointWriter(lambda: None)
    writer.submit("ckpt-1", slow("ckpt-1"))
    assert writer.in_flight
    threading.Timer(0.2, gates["ckpt-1"].set).start()
    writer.submit("ckpt-2", slow("ckpt-2"))  # waits for ckpt-1 first
    assert order == ["ckpt-1"] and writer.last_stall >= 0.15 and writer.in_flight
    gates["ckpt-2"].set()
    writer.wait()
    assert order == ["ckpt-1", "ckpt-2"]

    def boom() -> None:
        raise OSError(30, "Read-only file system")

    writer.submit("ckpt-3", boom)
    deadline = time.monotonic() + 5
    while writer.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(CheckpointError, match=r"ckpt-3 failed: OSError.*Read-only.*no earlier checkpoint"):
        writer.poll()
    writer.poll()  # reported once


def _script(model_dir: Path, *extra: str) -> list[str]:
    return [PYTHON, str(SCRIPT), "--model_dir", str(model_dir), "--max_steps", "40", "--async_checkpoints", *extra]


@pytest.mark.slow
def test_kill_9_during_async_write_then_sigterm_waits_for_the_write(tmp_path):
    ref = run_process(_script(tmp_path / "ref"), env=python_env(), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    run = tmp_path / "run"
    proc = popen(
        _script(run, "--sleep", "0.01", "--slow_write", "0.3"),
        env=python_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    # the first checkpoint committed, and the next one half-written: kill -9 now
    while not ((run / "checkpoint.json").exists() and any(p.name.startswith(".tmp-ckpt-") for p in run.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    before = _latest(run)
    # the committed one loads; then SIGTERM during a write: the process waits for it
    proc = popen(
        _script(run, "--sleep", "0.01", "--slow_write", "0.3"),
        env=python_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    while _latest(run) == before:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert f"resumed from {run / before}" in err
    stopped = _latest(run)
    assert f"SIGTERM at step {stopped.split('-')[1]}: checkpoint" in err
    assert not any(p.name.startswith(".tmp-ckpt-") for p in run.iterdir())  # nothing left half-written
    done = run_process(_script(run), env=python_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _files(run, 40)["model.safetensors"] == _files(tmp_path / "ref", 40)["model.safetensors"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_finite_weights_check_before_a_save(bad, dtype):
    from stoker.engine.saving import _all_finite

    params = [torch.ones(3, 4, dtype=dtype), torch.empty(0, dtype=dtype), torch.arange(5.0).to(dtype)]
    if bad is not None:
        params[2][3] = bad
    assert _all_finite(params) is (bad is None)
