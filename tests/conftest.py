"""Shared tiny models and data for stoker's tests."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import stoker

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)  # steady and identical arithmetic in every test process


class TinyNet(nn.Module):
    """A small MLP with dropout (so resume must restore the RNG too)."""

    def __init__(self, width: int = 16, dropout: float = 0.2) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, width)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def classifier_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    logits = model(features)
    if labels is None:
        return stoker.EstimatorSpec(predictions={"logits": logits, "classes": logits.argmax(-1)})
    reduction = "mean" if mode == stoker.ModeKeys.TRAIN else "none"
    return stoker.EstimatorSpec(
        loss=F.cross_entropy(logits, labels, reduction=reduction),
        predictions={"logits": logits, "classes": logits.argmax(-1)},
        eval_metrics={
            "accuracy": stoker.metrics.Accuracy()(logits, labels),
            "top2": stoker.metrics.TopKAccuracy(2)(logits, labels),
        },
    )


def make_data(n: int = 200, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, y


def train_input(x: torch.Tensor, y: torch.Tensor, seed: int = 0):  # noqa: ANN201
    return lambda params: stoker.data.arrays(x, y, batch_size=params["batch_size"], seed=seed)


def eval_input(x: torch.Tensor, y: torch.Tensor | None = None):  # noqa: ANN201
    return lambda params: stoker.data.arrays(x, y, batch_size=params["batch_size"], shuffle=False, num_epochs=1)


def make_estimator(model_dir: str | os.PathLike[str] | None = None, **config: object) -> stoker.Estimator:
    params = dict(config.pop("params", {}) or {})  # type: ignore[call-overload]
    batch = int(config.pop("batch", 16))  # type: ignore[call-overload]
    opt = config.pop("opt", "adam")
    schedule = config.pop("schedule", True)
    cfg = {"model_dir": model_dir, "progress_bar": False, "iterations_per_loop": 4, "log_every_n_steps": 10**6}
    cfg.update(config)
    return stoker.Estimator(
        model=lambda p: TinyNet(),
        model_fn=classifier_fn,
        optimizer=(lambda p, ps: torch.optim.Adam(ps, lr=0.01))
        if opt == "adam"
        else (lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
        lr_schedule=(lambda p, o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)) if schedule else None,
        config=stoker.RunConfig(**cfg),  # type: ignore[arg-type]
        params=params,
        train_batch_size=batch,
    )


def state_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(autouse=True)
def _quiet_stoker() -> None:
    logging.getLogger("stoker").setLevel(logging.WARNING)


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_replicas(script: Path, nproc: int, *args: str) -> list[subprocess.Popen[str]]:
    """Start ``nproc`` processes of ``script`` the way torchrun would (RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR/PORT); with ``nproc == 1``, as a plain process without them."""
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = python_env()
        env.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        if nproc == 1:
            for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                env.pop(k)
        procs.append(
            subprocess.Popen(
                [PYTHON, str(script), *args], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    return procs


def kill_9_at_a_checkpoint_twice(command: list[str], env: dict[str, str], latest: Callable[[], str | None]) -> None:
    """Run the training ``command`` twice, each time killing it with SIGKILL 0.3 s after
    ``latest()`` (its newest checkpoint) changes: once at a random moment of training, once
    (``--slow_write 0.4``) inside a checkpoint write."""
    for slow_write in ("0", "0.4"):
        proc = subprocess.Popen(
            [*command, "--sleep", "0.02", "--slow_write", slow_write],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        before = latest()
        while latest() == before:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def stale_index_write_is_refused_and_loses_nothing(url: str) -> None:
    """On a store with conditional writes: an index write based on a version another writer
    has since replaced is refused, and a second writer's update (an evaluation) made after
    re-reading lands on top of the first's (a save), losing neither."""
    from stoker import storage
    from stoker.checkpoint import CheckpointManager

    index = storage.location(url) / "checkpoint.json"
    trainer = CheckpointManager(url, keep_checkpoint_max=0)
    trainer.save(1, {"w": torch.ones(1)}, {"global_step": 1})
    stale = CheckpointManager(url, keep_checkpoint_max=0)
    data, version = storage.read_versioned(index)
    trainer.save(2, {"w": torch.ones(1)}, {"global_step": 2})  # changes the index after `version`
    assert not storage.put_if(index, data, version)  # a stale write is refused
    stale.record_eval(1, {"loss": 0.5})  # re-read, applied on top of the trainer's update
    records = trainer.index()["checkpoints"]
    assert [r["step"] for r in records] == [1, 2] and records[0]["metrics"] == {"loss": 0.5}


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``stoker`` with ``args`` in this process: its exit code, stdout and stderr."""
    from stoker.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
