"""Stopping a real training process at an exact step, with a real signal, for the stop tests.

A test names a stop as ``KIND@WHERE:STEP`` (optionally ``/RANK``), e.g. ``sigterm@train:27``: the
process of that torchrun rank (default: every one) sends ``KIND`` to itself at global step
``STEP``, ``WHERE`` it is then:

- ``train``: inside the device loop, as the training step that makes ``STEP`` returns (mid-loop);
- ``checkpoint``: inside the write of ``ckpt-STEP``'s first file.

The signal is a real one (``os.kill`` of its own pid), delivered by the kernel to whatever
handler is installed, so the run stops exactly as it would under ``kill`` from a scheduler, only
at a known place: a test can put it mid-interval and compare with an uninterrupted run bitwise.
Several stops, comma-separated, fire each once (``sigterm@train:13,sigterm@checkpoint:13``: a
second signal inside the first one's checkpoint).

The child learns its stops from the environment (:data:`ENV`, set by :func:`stop_env`); a script
arms them with :func:`install_from_env` before it trains (every script under ``scripts/`` that a
stop test runs does). What a stop does to the process is said by :func:`expected_returncode`;
:class:`Job` runs a script to a stop and to its end, :func:`ending` reads what a run left.
New places to stop (during an evaluation, an asynchronous upload) are new ``WHERE`` values of
:func:`install`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "STOKER_TEST_STOP"
KINDS = {"kill9": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}
WHERES = ("train", "checkpoint")


@dataclass(frozen=True)
class Stop:
    """Send ``kind`` to the process running global step ``step`` (``where`` it runs), on torchrun
    rank ``rank`` only if given."""

    kind: str
    step: int
    where: str = "train"
    rank: int | None = None

    def __post_init__(self) -> None:
        assert self.kind in KINDS, f"stop kind {self.kind!r}: one of {sorted(KINDS)}"
        assert self.where in WHERES, f"stop place {self.where!r}: one of {WHERES}"

    def __str__(self) -> str:
        return f"{self.kind}@{self.where}:{self.step}" + ("" if self.rank is None else f"/{self.rank}")

    @classmethod
    def parse(cls, text: str) -> Stop:
        kind, rest = text.split("@")
        where, rest = rest.split(":")
        step, _, rank = rest.partition("/")
        return cls(kind, int(step), where, int(rank) if rank else None)

    @property
    def signum(self) -> int:
        return int(KINDS[self.kind])


def expected_returncode(kind: str) -> int:
    """The exit status of a run stopped by ``kind``: killed by SIGKILL, or stoker's clean exit
    with 128 + the signal's number after its checkpoint (143 for SIGTERM, 130 for SIGINT)."""
    return -signal.SIGKILL if kind == "kill9" else 128 + KINDS[kind]


Stops = Stop | Sequence[Stop] | None


def stop_env(stops: Stops, env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``stops`` armed (``None``: without any)."""
    out = {k: v for k, v in env.items() if k != ENV}
    listed = [stops] if isinstance(stops, Stop) else list(stops or [])
    if listed:
        out[ENV] = ",".join(str(s) for s in listed)
    return out


def install_from_env() -> list[Stop]:
    """Arm the stops the environment names for this process, if any (call before training)."""
    text = os.environ.get(ENV)
    stops = [Stop.parse(t) for t in text.split(",")] if text else []
    mine = [s for s in stops if s.rank is None or int(os.environ.get("RANK", "0")) == s.rank]
    for stop in mine:
        install(stop)
    return mine


def install(stop: Stop) -> Callable[[], None]:
    """Make this process send ``stop``'s signal to itself at its step, once; returns the undo
    (a test that arms a stop in its own process calls it when done)."""
    if stop.where == "checkpoint":
        return _in_checkpoint_write(stop)
    return _in_device_loop(stop)


def _in_device_loop(stop: Stop) -> Callable[[], None]:
    from stoker.engine import loop

    run_loop = loop.DeviceLoop.run_loop
    fired = False

    def stopping_run_loop(self: loop.DeviceLoop, infeed: Any, steps: int) -> Any:
        first = self.run.global_step
        if fired or not first < stop.step <= first + steps:
            return run_loop(self, infeed, steps)
        step_fn = self.step.step_fn

        def fire_at_the_step() -> Any:
            inner = step_fn()

            def step(feed: Any) -> Any:
                nonlocal fired
                out = inner(feed)
                if not fired and self.run.global_step + 1 == stop.step:  # the step just computed
                    fired = True
                    os.kill(os.getpid(), stop.signum)
                return out

            return step

        self.step.step_fn = fire_at_the_step  # type: ignore[method-assign]
        try:
            return run_loop(self, infeed, steps)
        finally:
            del self.step.step_fn

    loop.DeviceLoop.run_loop = stopping_run_loop  # type: ignore[method-assign]

    def undo() -> None:
        loop.DeviceLoop.run_loop = run_loop  # type: ignore[method-assign]

    return undo


def _in_checkpoint_write(stop: Stop) -> Callable[[], None]:
    from stoker.storage import stores  # where write_all looks _write_one up

    write_one = stores._write_one
    fired = False
    name = f"ckpt-{stop.step}"

    def stopping_write_one(path: Any, data: bytes, retry: Any) -> str:
        nonlocal fired
        parts = str(path).split("/")  # ckpt-13, its local staging .tmp-ckpt-13-*, an object store's ckpt-13.*
        if not fired and any(p == name or p.startswith((f".tmp-{name}-", f"{name}.")) for p in parts):
            fired = True
            os.kill(os.getpid(), stop.signum)
        return write_one(path, data, retry)

    stores._write_one = stopping_write_one

    def undo() -> None:
        stores._write_one = write_one

    return undo


# ---------------------------------------------------------------------------------------------
# Running a job to a stop and to its end, and what its end is


@dataclass(frozen=True)
class Job:
    """A training job as a stop test runs it: ``argv`` with ``dir_flag DIR`` appended, in
    ``processes`` torchrun-style processes (``env``: variables added to the test environment)."""

    argv: tuple[str, ...]
    processes: int = 1
    dir_flag: str = "--model_dir"
    env: tuple[tuple[str, str], ...] = ()

    def command(self, model_dir: Path) -> list[str]:
        return [*self.argv, self.dir_flag, str(model_dir)]

    def start(self, model_dir: Path, stop: Stops = None) -> list[subprocess.Popen[str]]:
        """Start the job's processes (not waited for)."""
        from helpers.processes import launch_replicas, popen, python_env

        env = stop_env(stop, {**python_env(), **dict(self.env)})
        if self.processes == 1:
            return [popen(self.command(model_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)]
        script, *args = self.command(model_dir)[1:]
        return launch_replicas(Path(script), self.processes, *args, env=env)

    def run(self, model_dir: Path, stop: Stops = None, timeout: float = 300) -> list[tuple[int, str, str]]:
        """Run the job to its end or to ``stop``; each process's exit status, stdout and stderr."""
        procs = self.start(model_dir, stop)
        outs = []
        try:
            for p in procs:
                out, err = p.communicate(timeout=timeout)
                outs.append((p.returncode, out, err))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return outs

    def run_ok(self, model_dir: Path, timeout: float = 300) -> list[tuple[int, str, str]]:
        """Run the job to its end; assert that every process exited 0."""
        outs = self.run(model_dir, timeout=timeout)
        assert [code for code, _, _ in outs] == [0] * len(outs), "\n".join(err[-3000:] for _, _, err in outs)
        return outs

    def run_stopped(self, model_dir: Path, stop: Stop, timeout: float = 300) -> list[tuple[int, str, str]]:
        """Run the job until ``stop``; assert that every process ended as that stop ends a run
        (a replica that did not get the signal itself exits as the one that did, having agreed)."""
        outs = self.run(model_dir, stop, timeout=timeout)
        want = expected_returncode(stop.kind)
        codes = [code for code, _, _ in outs]
        if stop.kind == "kill9" and len(outs) > 1:
            assert want in codes, codes  # the others notice a lost replica and fail
        else:
            assert codes == [want] * len(outs), "\n".join(err[-3000:] for _, _, err in outs)
        return outs


@dataclass(frozen=True)
class Ending:
    """What a finished run left in its model_dir that an uninterrupted run must match bitwise."""

    latest: str
    weights: bytes  # the latest checkpoint's model.safetensors (consolidated DCP when sharded)
    best: tuple[str, float] | None  # keep_best's checkpoint and value
    best_weights: bytes | None
    evaluations: tuple[tuple[int, str, float], ...]  # (step, tag, value) of every evaluation's rows

    @property
    def evaluated_steps(self) -> list[int]:
        return sorted({step for step, _, _ in self.evaluations})


def ending(model_dir: Path) -> Ending:
    """The :class:`Ending` of the run in ``model_dir``."""
    from stoker.checkpoint import CheckpointManager
    from stoker.summary.writer import read_metrics_csv

    index = CheckpointManager(model_dir, writer=False).index()
    assert index.latest is not None, f"no checkpoint in {model_dir}"
    best = index.best
    rows = read_metrics_csv(model_dir)
    evaluations = tuple(sorted((r["step"], r["tag"], r["value"]) for r in rows if r["tag"].startswith("eval/")))
    return Ending(
        latest=index.latest,
        weights=_weights(model_dir / index.latest),
        best=None if best is None else (best.name, best.value),
        best_weights=None if best is None else _weights(model_dir / best.name),
        evaluations=evaluations,
    )


def _weights(checkpoint: Path) -> bytes:
    if (checkpoint / "model.safetensors").exists():
        return (checkpoint / "model.safetensors").read_bytes()
    import torch

    from stoker.distributed.sharded import consolidate

    tensors = sorted(consolidate(checkpoint / "dcp").items())
    return b"".join(name.encode() + bytes(t.contiguous().view(-1).view(torch.uint8).numpy()) for name, t in tensors)
