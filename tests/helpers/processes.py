"""Real processes for the tests: the environment they run in, free ports, torchrun-style
replicas, and killing a training run at a checkpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers import zygote
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


def launch_replicas(
    script: Path, nproc: int, *args: str, env: Mapping[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """Start ``nproc`` processes of ``script`` the way torchrun would (RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR/PORT); with ``nproc == 1``, as a plain process without them.
    ``env``: the environment to start from (default :func:`python_env`)."""
    port = free_port()
    procs = []
    base = python_env() if env is None else dict(env)
    for rank in range(nproc):
        child = dict(base)
        child.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
        )
        if nproc == 1:
            for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                child.pop(k)
        procs.append(popen([PYTHON, str(script), *args], env=child, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def kill_9_at_a_checkpoint_twice(command: list[str], env: dict[str, str], latest: Callable[[], str | None]) -> None:
    """Run the training ``command`` twice, each time killing it with SIGKILL 0.3 s after
    ``latest()`` (its newest checkpoint) changes: once at a random moment of training, once
    (``--slow_write 0.4``) inside a checkpoint write."""
    for slow_write in ("0", "0.4"):
        proc = popen(
            [*command, "--sleep", "0.02", "--slow_write", slow_write],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 120
        before = latest()
        while latest() == before:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def in_background(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start ``argv`` (a reference run, say) without waiting for it; :func:`finished` collects it.

    A crash test's reference run does not depend on the run it is compared with, so it trains
    while the test's other process sleeps through its slowed steps or waits to be killed: on a
    2-core machine that hides most of one process's cost. Its output goes to files, not pipes,
    so a chatty run never blocks on a full pipe while nobody reads it."""
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    proc = popen(argv, env=python_env() if env is None else env, stdout=out, stderr=err)
    proc.output_files = (out, err)  # type: ignore[attr-defined]
    return proc


def finished(proc: subprocess.Popen[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Wait for a process from :func:`in_background`, assert that it exited 0, return its output."""
    proc.wait(timeout=timeout)
    texts = []
    for f in proc.output_files:  # type: ignore[attr-defined]
        f.seek(0)
        texts.append(f.read())
        f.close()
    assert proc.returncode == 0, texts[1]
    return subprocess.CompletedProcess(proc.args, proc.returncode, texts[0], texts[1])


def popen(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdout: Any = None,
    stderr: Any = None,
    stdin: Any = None,
    text: bool = True,
) -> subprocess.Popen[Any] | zygote.ForkedProcess:
    """``subprocess.Popen(argv, ...)``; when ``argv`` runs this Python, a child forked from the
    worker's zygote (:mod:`helpers.zygote`: a real process that has not paid 2-3 s of CPU for
    importing torch). ``env`` None inherits this process's environment, as with ``Popen``."""
    env = dict(os.environ) if env is None else dict(env)
    if argv and str(argv[0]) == PYTHON:
        return zygote.start(
            list(argv[1:]),
            env=env,
            cwd=cwd,
            stdout=stdout,
            stderr=stderr,
            stdin=stdin,
            text=text,
            base_env=python_env(),
        )
    return subprocess.Popen(
        [str(a) for a in argv], env=env, cwd=cwd, stdout=stdout, stderr=stderr, stdin=stdin, text=text
    )


def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    capture_output: bool = False,
    text: bool = False,
    timeout: float | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(argv, ...)`` through :func:`popen` (its output, exit code, timeout and check)."""
    pipe = subprocess.PIPE if capture_output else None
    proc = popen(argv, env=env, cwd=cwd, stdout=pipe, stderr=pipe, text=text)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(list(argv), proc.returncode if proc.returncode is not None else -1, out, err)
    if check:
        done.check_returncode()
    return done
