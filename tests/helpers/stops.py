"""Stopping a real training process at an exact step, with a real signal, for the stop tests.

A test names a stop as ``KIND@WHERE:STEP`` (optionally ``/RANK``), e.g. ``sigterm@train:27``: the
process of that torchrun rank (default: every one) sends ``KIND`` to itself at global step
``STEP``, ``WHERE`` it is then:

- ``train``: inside the device loop, as the training step that makes ``STEP`` returns (mid-loop);
- ``eval``: inside the evaluation of the weights of step ``STEP``, as its first batch returns
  (any evaluation: ``train_and_evaluate``'s, ``stoker bench``'s, an AdaNet ``Evaluator``'s);
- ``checkpoint``: inside the write of ``ckpt-STEP``'s first file;
- ``upload``: inside the write of ``ckpt-STEP``'s first file to an object store (a local write
  does not fire it, so a job that is not writing to a store is never stopped by mistake); on the
  background writer's thread when the job writes asynchronously.

The signal is a real one (``os.kill`` of its own pid), delivered by the kernel to whatever
handler is installed, so the run stops exactly as it would under ``kill`` from a scheduler, only
at a known place: a test can put it mid-interval and compare with an uninterrupted run bitwise.
``stuck@train:STEP`` is not a signal: the process hangs there (inside the input and model_fn of
step ``STEP``, its heartbeat thread still beating) for :data:`STUCK_SECONDS`, a replica alive
but stuck, which the others name (``RunConfig.stuck_replica``) and every process exits 1.
Several stops, comma-separated, fire each once (``sigterm@train:13,sigterm@checkpoint:13``: a
second signal inside the first one's checkpoint).

The child learns its stops from the environment (:data:`ENV`, set by :func:`stop_env`); a script
arms them with :func:`install_from_env` before it trains (every script under ``scripts/`` that a
stop test runs does). What a stop does to the process is said by :func:`expected_returncode`;
:class:`Job` runs a script to a stop and to its end, :func:`ending` reads what a run left.
New places to stop are new ``WHERE`` values of :func:`install`. tests/test_fault_matrix.py runs
every kind at every place in every kind of job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "STOKER_TEST_STOP"
KINDS = {"kill9": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}
STUCK = "stuck"  # not a signal: the process hangs in its step (a stuck replica)
STUCK_SECONDS = 600.0
WHERES = ("train", "eval", "checkpoint", "upload")


@dataclass(frozen=True)
class Stop:
    """Send ``kind`` to the process running global step ``step`` (``where`` it runs), on torchrun
    rank ``rank`` only if given."""

    kind: str
    step: int
    where: str = "train"
    rank: int | None = None

    def __post_init__(self) -> None:
        assert self.kind in KINDS or self.kind == STUCK, f"stop kind {self.kind!r}: one of {sorted(KINDS)} or stuck"
        assert self.where in WHERES, f"stop place {self.where!r}: one of {WHERES}"
        assert self.kind != STUCK or self.where == "train", "a stuck stop hangs inside a training step"

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
    """The exit status of a run stopped by ``kind``: killed by SIGKILL, stoker's clean exit with
    128 + the signal's number after its checkpoint (143 for SIGTERM, 130 for SIGINT), or 1 for
    every process of a job whose stuck replica was named (docs/distributed.md)."""
    if kind == STUCK:
        return 1
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
    """Arm the stops the environment names for this process, if any (call before training), and
    the storage fault (:func:`install_fault_from_env`)."""
    install_fault_from_env()
    text = os.environ.get(ENV)
    stops = [Stop.parse(t) for t in text.split(",")] if text else []
    mine = [s for s in stops if s.rank is None or int(os.environ.get("RANK", "0")) == s.rank]
    for stop in mine:
        install(stop)
    return mine


def install(stop: Stop) -> Callable[[], None]:
    """Make this process send ``stop``'s signal to itself at its step, once; returns the undo
    (a test that arms a stop in its own process calls it when done)."""
    if stop.where == "eval":
        return _in_evaluation(stop)
    if stop.where in ("checkpoint", "upload"):
        return _in_checkpoint_write(stop, remote_only=stop.where == "upload")
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
                if stop.kind == STUCK and not fired and self.run.global_step + 1 == stop.step:
                    fired = True  # in the input and model_fn of the step: the others wait in its all-reduce
                    time.sleep(STUCK_SECONDS)
                out = inner(feed)
                if stop.kind != STUCK and not fired and self.run.global_step + 1 == stop.step:  # the step just computed
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


def _in_evaluation(stop: Stop) -> Callable[[], None]:
    from stoker.engine import evaluation

    compute = evaluation.EvaluationRun.compute
    fired = False

    def stopping_compute(self: evaluation.EvaluationRun, *args: Any, **kwargs: Any) -> Any:
        model_fn = self.model_fn

        def fire_after_the_first_batch(model: Any, features: Any, labels: Any, mode: Any, params: Any) -> Any:
            nonlocal fired
            out = model_fn(model, features, labels, mode, params)
            if not fired and self.state.global_step == stop.step:  # the weights evaluated are of that step
                fired = True
                os.kill(os.getpid(), stop.signum)
            return out

        self.model_fn = fire_after_the_first_batch
        try:
            return compute(self, *args, **kwargs)
        finally:
            self.model_fn = model_fn

    evaluation.EvaluationRun.compute = stopping_compute  # type: ignore[method-assign]

    def undo() -> None:
        evaluation.EvaluationRun.compute = compute  # type: ignore[method-assign]

    return undo


def _in_checkpoint_write(stop: Stop, remote_only: bool) -> Callable[[], None]:
    def fire() -> None:  # says (on stderr) whether the write is a background one, the loop going on
        background = any(t.name.startswith("stoker-ckpt-") for t in threading.enumerate())
        kind = "an asynchronous" if background else "a synchronous"
        print(f"{stop} fires in {kind} checkpoint write", file=sys.stderr, flush=True)
        os.kill(os.getpid(), stop.signum)

    return _at_checkpoint_write(stop.step, fire, remote_only)


def _at_checkpoint_write(step: int, act: Callable[[], None], remote_only: bool = False) -> Callable[[], None]:
    """Call ``act()`` once, just before the first file of ``ckpt-<step>`` is written."""
    from stoker.storage import stores  # where write_all looks _write_one up

    write_one = stores._write_one
    fired = False
    name = f"ckpt-{step}"

    def acting_write_one(path: Any, data: bytes, retry: Any) -> str:
        nonlocal fired
        parts = str(path).split("/")  # ckpt-13, its local staging .tmp-ckpt-13-*, an object store's ckpt-13.*
        if remote_only and not isinstance(path, stores.UrlPath):
            return write_one(path, data, retry)
        if not fired and any(p == name or p.startswith((f".tmp-{name}-", f"{name}.")) for p in parts):
            fired = True
            act()
        return write_one(path, data, retry)

    stores._write_one = acting_write_one

    def undo() -> None:
        stores._write_one = write_one

    return undo


# ---------------------------------------------------------------------------------------------
# Storage faults at a checkpoint write: a disk that fills, a file system turned read-only

FAULT_ENV = "STOKER_TEST_FAULT"


def install_fault_from_env() -> None:
    """Arm the storage fault the environment names (:data:`FAULT_ENV`), if any: ``full:STEP:FILE``
    fills the file system of ``FILE`` (writing ``FILE`` until it is full) just before the first
    file of ``ckpt-STEP`` is written; ``readonly:STEP:MOUNT`` makes ``MOUNT`` read-only there
    (root in a private mount namespace, as tests/test_fault_matrix.py runs it). The write then
    fails with the file system's own ENOSPC or EROFS."""
    text = os.environ.get(FAULT_ENV)
    if not text:
        return
    what, step, target = text.split(":", 2)
    if what == "full":
        _at_checkpoint_write(int(step), lambda: _fill(Path(target)))
    elif what == "readonly":
        _at_checkpoint_write(int(step), lambda: _remount_read_only(target))
    else:
        raise AssertionError(f"{FAULT_ENV}={text!r}: full:STEP:FILE or readonly:STEP:MOUNT")


def _fill(path: Path) -> None:
    """Write ``path`` until its file system has no byte left (smaller and smaller writes)."""
    import errno

    with open(path, "ab", buffering=0) as f:
        chunk = 1 << 20
        while chunk:
            try:
                f.write(b"\0" * chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk //= 2


def _remount_read_only(mount: str) -> None:
    """Put a read-only view of ``mount`` over it (remounting the file system itself read-only is
    refused while this process holds files open for writing; paths opened from now on resolve
    to the view and fail with EROFS). ``umount MOUNT`` makes it writable again."""
    subprocess.run(["mount", "--bind", mount, mount], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", mount], check=True)


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

    def command(self, model_dir: str | os.PathLike[str]) -> list[str]:
        return [*self.argv, self.dir_flag, str(model_dir)]

    def start(self, model_dir: str | os.PathLike[str], stop: Stops = None) -> list[subprocess.Popen[str]]:
        """Start the job's processes (not waited for)."""
        from helpers.processes import launch_replicas, popen, python_env

        env = stop_env(stop, {**python_env(), **dict(self.env)})
        if self.processes == 1:
            return [popen(self.command(model_dir), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)]
        script, *args = self.command(model_dir)[1:]
        return launch_replicas(Path(script), self.processes, *args, env=env)

    def run(
        self, model_dir: str | os.PathLike[str], stop: Stops = None, timeout: float = 300
    ) -> list[tuple[int, str, str]]:
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

    def run_ok(self, model_dir: str | os.PathLike[str], timeout: float = 300) -> list[tuple[int, str, str]]:
        """Run the job to its end; assert that every process exited 0."""
        outs = self.run(model_dir, timeout=timeout)
        assert [code for code, _, _ in outs] == [0] * len(outs), "\n".join(err[-3000:] for _, _, err in outs)
        return outs

    def run_stopped(
        self, model_dir: str | os.PathLike[str], stop: Stop, timeout: float = 300
    ) -> list[tuple[int, str, str]]:
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
    recorded: tuple[tuple[int, tuple[tuple[str, float], ...]], ...]  # the index's evaluations (step, results)

    @property
    def evaluated_steps(self) -> list[int]:
        return sorted({step for step, _, _ in self.evaluations})


def ending(model_dir: str | os.PathLike[str]) -> Ending:
    """The :class:`Ending` of the run in ``model_dir`` (a folder, or an object store's URL)."""
    from stoker import storage
    from stoker.checkpoint import CheckpointManager
    from stoker.summary.writer import read_metrics_csv

    index = CheckpointManager(model_dir, writer=False).index()
    assert index.latest is not None, f"no checkpoint in {model_dir}"
    root = storage.location(model_dir)
    latest, best = index.record(index.latest), index.best
    assert latest is not None
    best_record = None if best is None else index.record(best.name)
    rows = read_metrics_csv(model_dir)
    evaluations = tuple(sorted((r["step"], r["tag"], r["value"]) for r in rows if r["tag"].startswith("eval/")))
    return Ending(
        latest=index.latest,
        weights=_weights(root / latest.directory),
        best=None if best is None else (best.name, best.value),
        best_weights=None if best_record is None else _weights(root / best_record.directory),
        evaluations=evaluations,
        recorded=tuple((r.step, tuple(sorted(r.metrics.items()))) for r in index.checkpoints if r.evaluated),
    )


def mlflow_history(uri: str, experiment: str = "callbacks") -> dict[str, list[tuple[int, float]]]:
    """Every metric of the one run in ``uri``'s ``experiment``, read back through MLflow's client:
    sorted (step, value); asserts the run finished."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.status == "FINISHED"
    keys = sorted(run.data.metrics)
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)) for key in keys}


def _weights(checkpoint: Any) -> bytes:
    from stoker import storage

    if storage.exists(checkpoint / "model.safetensors"):
        return storage.read_bytes(checkpoint / "model.safetensors")
    import torch

    from stoker.distributed.sharded import consolidate

    tensors = sorted(consolidate(checkpoint / "dcp").items())
    return b"".join(name.encode() + bytes(t.contiguous().view(-1).view(torch.uint8).numpy()) for name, t in tensors)
