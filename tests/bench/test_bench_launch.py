"""``stoker bench --num_gpus=N``: N local replicas through torch's elastic launcher, the same
run as ``torchrun --nproc_per_node=N``; a killed replica ends the run with ReplicaLostError."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.paths import ROOT
from helpers.processes import PYTHON, free_port, popen, python_env, run_process
from stoker.bench.launch import lost_replica_message
from stoker.cli import main

TINY = [
    "bench",
    "--model=trivial",
    "--data_name=cifar10",
    "--batch_size=4",
    "--peak_tflops=1",
    "--device=cpu",
    "--num_warmup_batches=1",
    "--display_every=1",
    "--optimizer=momentum",
    "--init_learning_rate=0.05",
]


def _run(cmd: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return run_process(cmd, capture_output=True, text=True, cwd=ROOT, env=python_env(), timeout=timeout)


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; the killed-replica test launches two processes
def test_num_gpus_2_is_torchrun_nproc_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ours, theirs = tmp_path / "ours.json", tmp_path / "torchrun.json"
    flags = [*TINY, "--num_batches=4"]
    a = _run(
        [PYTHON, "-m", "stoker", *flags, "--num_gpus=2", f"--results_file={ours}", f"--train_dir={tmp_path / 'run'}"]
    )
    assert a.returncode == 0, a.stderr[-3000:]
    b = _run(
        [
            PYTHON,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "stoker",
            *flags,
            f"--results_file={theirs}",
        ]
    )
    assert b.returncode == 0, b.stderr[-3000:]
    r1, r2 = json.loads(ours.read_text()), json.loads(theirs.read_text())
    assert r1["batch_size"] == r2["batch_size"] == 8 and r1["num_devices"] == 2  # global = 4 x 2
    assert len(r1["losses"]) == 4
    np.testing.assert_allclose(r1["losses"], r2["losses"], rtol=1e-5)
    assert a.stdout.count("total images/sec") == 1  # rank 0 prints, once
    assert "Devices:     ['cpu:0', 'cpu:1']" in a.stdout.splitlines()
    # --eval afterwards, in one process, finds the replicas' checkpoint.
    assert (
        main(
            [
                "bench",
                "--model=trivial",
                "--data_name=cifar10",
                "--batch_size=4",
                "--device=cpu",
                "--eval",
                "--num_batches=2",
                f"--train_dir={tmp_path / 'run'}",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"Successfully loaded model from {tmp_path / 'run' / 'ckpt-5'}." in out and "Accuracy @ 1 = " in out


def test_killed_replica_ends_the_run_with_replica_lost_error(tmp_path: Path) -> None:
    proc = popen(
        [PYTHON, "-m", "stoker", *TINY, "--num_batches=100000", "--num_gpus=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=python_env(),
    )
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < 2 or not _stepping(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            workers = _children(proc.pid)
            time.sleep(0.2)
        os.kill(workers[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert "stoker bench: error: replica 1 stopped responding (killed by SIGKILL)" in err, err[-3000:]
    assert "Rerun the same command to resume from the last complete checkpoint" in err


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _stepping(pid: int) -> bool:
    # Both workers are past start-up once each has used a second of CPU time.
    ticks = os.sysconf("SC_CLK_TCK")
    kids = _children(pid)
    return len(kids) == 2 and all(
        int(Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[11]) > ticks for k in kids
    )


@pytest.mark.parametrize(("world", "num_gpus", "ok"), [("2", "3", False), ("2", "2", True), ("2", "1", True)])
def test_num_gpus_under_torchrun_must_equal_world_size(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], world: str, num_gpus: str, ok: bool
) -> None:
    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("RANK", "0")
    # --forward_only stops a valid combination right after the check (multi-process is training only).
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--forward_only", f"--num_gpus={num_gpus}"])
    err = capsys.readouterr().err
    assert e.value.code == 2
    if ok:
        assert "but WORLD_SIZE" not in err and "only training" in err
    else:
        assert "--num_gpus=3 but WORLD_SIZE=2" in err and "must equal WORLD_SIZE (2) or be 1" in err


def test_num_gpus_is_for_training_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--num_gpus=2", "--forward_only"])
    assert e.value.code == 2 and "--num_gpus=2: only training runs on several processes" in capsys.readouterr().err


def test_num_gpus_zero_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--num_gpus=0"])
    assert e.value.code == 2 and "--num_gpus must be an integer >= 1; got 0" in capsys.readouterr().err


def test_lost_replica_message_prefers_the_killed_replica() -> None:
    class Failure:
        def __init__(self, exitcode: int, timestamp: int) -> None:
            self.exitcode, self.timestamp = exitcode, timestamp

        def signal_name(self) -> str:
            return signal.Signals(-self.exitcode).name if self.exitcode < 0 else "<N/A>"

    class Failed(Exception):
        failures = {0: Failure(1, 5), 1: Failure(-9, 7)}  # the survivor exited 1 first

    msg = str(lost_replica_message(Failed()))
    assert msg.startswith("replica 1 stopped responding (killed by SIGKILL)")


def test_ddp_gets_the_repacking_bucket_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # One-rank gloo group in this process: enough for DDP to be built with the bucket size.
    import torch

    from stoker.distributed import Replicated

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    strategy = Replicated("cpu", timeout=30)
    try:
        strategy.bucket_cap_mb = 0.5
        ddp = strategy.wrap_model(torch.nn.Linear(4, 4))
        assert ddp.bucket_bytes_cap == int(0.5 * 2**20)
        strategy.bucket_cap_mb = None
        assert strategy.wrap_model(torch.nn.Linear(4, 4)).bucket_bytes_cap == 25 * 2**20  # DDP's default
    finally:
        strategy.teardown()
