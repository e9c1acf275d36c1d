"""Real processes for the tests: the environment they run in, free ports, torchrun-style
replicas, and killing a training run at a checkpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from helpers.paths import ROOT


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
