"""The fault matrix (issue 47 item 8): a run stopped in every way, at every kind of place, in every
kind of job, then rerun with the same command, ends bitwise as the run that was never stopped.

- kinds: kill -9, SIGTERM, SIGINT: real signals, sent by the process to itself at a known place
  (helpers/stops.py), delivered by the kernel to whatever handler is installed; with replicas,
  kill -9 of one replica (a dead replica: the other names it and exits 1) and a stuck replica
  (one hangs inside a step, alive: the other names it, every process exits 1);
- places: inside a device loop (a step between two evaluations), during an evaluation (after its
  first batch), during a checkpoint write (its first file), during an upload (the first file of a
  checkpoint written to an object store, S3 through moto; on the background writer's thread
  where the job writes asynchronously);
- jobs: ``train``; ``train_and_evaluate`` with every shipped hook at once (EarlyStopping,
  ReduceLROnPlateau, MLflowLogger, ``keep_best``, OptunaPruning, NaN rollback over two poisoned
  batches); ``stoker bench --train_dir``; an AdaNet search choosing by evaluation; the hooks' job
  in 2 replicas (gloo) and in 2 pipeline stages.

A cell runs the job to its stop (the kind's exit status: killed, or 143 / 130 after a checkpoint
of the step it stopped at), reruns the same command to its end and compares with the job's
uninterrupted run: the final weights, the best checkpoint and its weights, the steps evaluated
and their results, MLflow's history (each step once, read back through MLflow's client), the
Optuna trial's reported values, AdaNet's architectures. A cell that cannot apply (``train`` has
no evaluation) is not run; docs/results/faults.md lists every cell with its outcome and time.

The whole matrix is slow (``-m slow``); a few representative cells run by default.
``STOKER_FAULT_MATRIX_LOG=FILE`` appends one JSON line per cell (its id and seconds), from which
the results page's times are taken.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON
from helpers.stops import Job, Stop, ending, expected_returncode, mlflow_history
from stoker import storage

KINDS = ("kill9", "sigterm", "sigint", "stuck")
WHERES = ("train", "eval", "checkpoint", "upload")


# ------------------------------------------------------------------ what a run ends with
def adanet_outcome(model_dir: str) -> tuple[Any, ...]:
    """The final ensemble's checkpoint (weights, ...) and every iteration's architecture and selection."""
    root = storage.location(model_dir)
    files = [f"architecture-{t}.json" for t in range(3)] + [f"iteration-{t}/selection.json" for t in range(3)]
    return (ending(root / "final"), *(storage.read_bytes(root / name) for name in files))


def optuna_values(storage_url: str) -> list[tuple[str, dict[int, float], float | None]]:
    """Every trial of the study "callbacks": its state, reported values and value."""
    import optuna

    study = optuna.load_study(study_name="callbacks", storage=storage_url)
    return [(t.state.name, t.intermediate_values, t.value) for t in study.get_trials(deepcopy=False)]


@dataclass(frozen=True)
class Row:
    """One kind of job: its script and flags, where each place's stop falls (global step and the
    torchrun rank that sends it, ``None``: every one) and what its ending is."""

    script: str
    args: tuple[str, ...]
    stops: Mapping[str, tuple[int, int | None]]
    processes: int = 1
    dir_flag: str = "--model_dir"
    trackers: bool = False  # MLflowLogger (and OptunaPruning in one process)
    async_flag: str | None = "--async_checkpoints"  # how the job writes asynchronously, if it can
    outcome: Callable[[str], Any] = ending
    env: tuple[tuple[str, str], ...] = field(default=(("MLFLOW_ALLOW_FILE_STORE", "true"),))

    def job(self, base: Path, upload: bool) -> Job:
        """The job, its trackers' stores under ``base``; with ``upload``, writing asynchronously."""
        argv = [PYTHON, str(SCRIPTS / self.script), *self.args]
        if self.trackers:
            argv += ["--mlflow", (base / "mlruns").as_uri()]
            if self.processes == 1:
                argv += ["--optuna", f"sqlite:///{base / 'study.db'}"]
        if upload and self.async_flag:
            argv.append(self.async_flag)
        return Job(tuple(argv), processes=self.processes, dir_flag=self.dir_flag, env=self.env)

    def ending(self, model_dir: str, base: Path) -> dict[str, Any]:
        """Everything the job's run left that an uninterrupted run must match."""
        out: dict[str, Any] = {"checkpoints": self.outcome(model_dir)}
        if self.trackers:
            out["mlflow"] = mlflow_history((base / "mlruns").as_uri())
            if self.processes == 1:
                out["optuna"] = optuna_values(f"sqlite:///{base / 'study.db'}")
        return out


STUCK_AFTER = ("--stuck_min_seconds", "3")  # RunConfig.stuck_replica: a stuck replica named after 3 s
HOOKS = (
    *("--max_steps", "40", "--iterations_per_loop", "4", "--eval_every", "5", "--save_every", "6"),
    *("--log_every", "3", "--early_stopping", "accuracy:max:4:0", "--plateau", "accuracy:max:0.5:1"),
    "--nan_rollback",
)
ROWS = {
    "train": Row(
        "train_script.py", ("--max_steps", "24"), {"train": (13, None), "checkpoint": (15, None), "upload": (15, None)}
    ),
    "hooks": Row(
        "callbacks_script.py",
        HOOKS,
        {"train": (13, None), "eval": (20, None), "checkpoint": (18, None), "upload": (18, None)},
        trackers=True,
    ),
    "bench": Row(
        "bench_script.py",
        (
            *("bench", "--model=trivial", "--data_name=cifar10", "--batch_size=8", "--peak_tflops=1", "--device=cpu"),
            *("--num_batches=40", "--num_warmup_batches=5", "--iterations_per_loop=4", "--display_every=100"),
            *("--eval_during_training_every_n_steps=10", "--num_eval_batches=2", "--save_model_steps=6"),
        ),
        {"train": (23, None), "eval": (28, None), "checkpoint": (30, None), "upload": (30, None)},
        dir_flag="--train_dir",
        async_flag=None,  # stoker bench writes its checkpoints synchronously
    ),
    "adanet": Row(
        "adanet_script.py",
        ("--evaluator",),
        {"train": (30, None), "eval": (48, None), "checkpoint": (40, None), "upload": (40, None)},
        outcome=adanet_outcome,
    ),
    "replicas": Row(
        "callbacks_script.py",
        (*HOOKS, *STUCK_AFTER),
        {"train": (13, 1), "eval": (20, None), "checkpoint": (18, None), "upload": (18, None)},
        processes=2,
        trackers=True,
    ),
    "pipeline": Row(
        "callbacks_script.py",
        (*HOOKS, *STUCK_AFTER, "--pipeline", "2"),
        {"train": (13, 1), "eval": (20, None), "checkpoint": (18, None), "upload": (18, None)},
        processes=2,
        trackers=True,
        async_flag=None,  # sharded (dcp/) checkpoints are written synchronously
    ),
}

#: Cells whose signal lands where no handler of stoker's is installed, so it takes its default
#: action (SIGTERM ends the process, SIGINT raises KeyboardInterrupt: exit status 1), as kill -9
#: would: AdaNet evaluates its candidates to choose one after the iteration's training has
#: ended. The rerun redoes the choice and is bitwise all the same (docs/results/faults.md).
NOT_GRACEFUL = {("adanet", "eval", "sigterm"): -signal.SIGTERM, ("adanet", "eval", "sigint"): 1}

#: The cells the default run keeps (fast); the rest are slow.
DEFAULT = {("train", "checkpoint", "sigint")}  # an evaluation with every hook: test_stops.py by default


def cells() -> list[Any]:
    out = []
    for row, spec in ROWS.items():
        for where in WHERES:
            for kind in KINDS:
                stuck_applies = where == "train" and spec.processes > 1  # one replica of several hangs
                if where in spec.stops and (kind != "stuck" or stuck_applies):
                    marks = () if (row, where, kind) in DEFAULT else (pytest.mark.slow,)
                    out.append(pytest.param(row, where, kind, marks=marks, id=f"{row}-{where}-{kind}"))
    return out


@pytest.fixture(autouse=True)
def _mlflow_file_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads its file store only when told


# ------------------------------------------------------------------ uninterrupted runs, once per row
_REFERENCES: dict[str, dict[str, Any]] = {}


def reference(row: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The ending of ``row``'s uninterrupted run (local, synchronous writes), run once per worker."""
    if row not in _REFERENCES:
        base = tmp_path_factory.mktemp(f"ref-{row}")
        spec = ROWS[row]
        spec.job(base, upload=False).run_ok(base / "run")
        _REFERENCES[row] = spec.ending(str(base / "run"), base)
    return _REFERENCES[row]


def _log(cell: str, seconds: float) -> None:
    path = os.environ.get("STOKER_FAULT_MATRIX_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"cell": cell, "seconds": round(seconds, 1)}) + "\n")


# ------------------------------------------------------------------ the cells
@pytest.mark.parametrize(("row", "where", "kind"), cells())
def test_a_stopped_job_rerun_ends_as_the_uninterrupted_run(tmp_path, tmp_path_factory, request, row, where, kind):
    spec = ROWS[row]
    want = reference(row, tmp_path_factory)
    started = time.monotonic()
    upload = where == "upload"
    model_dir = f"s3://bucket/{uuid.uuid4().hex[:12]}" if upload else str(tmp_path / "run")
    if upload:
        request.getfixturevalue("s3_env")  # sets the environment the processes reach the server with
    job = spec.job(tmp_path, upload)
    step, rank = spec.stops[where]
    stop = Stop(kind, step, where, rank)
    cell = (row, where, kind)
    run = job.run if cell in NOT_GRACEFUL else job.run_stopped
    outs = run(model_dir, stop, timeout=120 if kind == "stuck" else 300)  # a stuck job ends in seconds
    if cell in NOT_GRACEFUL:
        ((code, _, err),) = outs
        assert code == NOT_GRACEFUL[cell], err[-3000:]
        assert kind == "sigterm" or err.rstrip().endswith("KeyboardInterrupt"), err[-3000:]
    if upload:  # the chief writes: in the background where the job writes asynchronously
        how = "an asynchronous" if spec.async_flag else "a synchronous"
        assert f"{stop} fires in {how} checkpoint write" in outs[0][2], outs[0][2][-3000:]
    if rank is not None and kind in ("kill9", "stuck"):  # a dead or stuck replica: the other names it
        ((code, _, err), (lost_code, _, lost_err)) = outs
        assert code == 1, err[-3000:]
        if kind == "kill9":
            assert lost_code == -signal.SIGKILL and "stopped responding" in err, err[-3000:]
        else:
            assert f"last seen at step {step}, in the input and model_fn" in err, err[-3000:]
            assert lost_code == 1 and "another replica named a stuck one (stuck replica: " in lost_err, lost_err[-3000:]
    elif kind not in ("kill9", "stuck") and cell not in NOT_GRACEFUL:
        name = signal.Signals(stop.signum).name
        for _, out, err in outs:
            assert re.search(rf"{name} at step \d+: checkpoint", out + err), (out + err)[-3000:]
            assert "Traceback" not in err, err[-3000:]
            if where != "upload" and rank is None and spec.processes == 1:  # the step it stopped at
                assert f"{name} at step {step}: checkpoint" in out + err, (out + err)[-3000:]
    job.run_ok(model_dir)
    got = spec.ending(model_dir, tmp_path)
    assert got.keys() == want.keys()
    assert got["checkpoints"] == want["checkpoints"]
    if "mlflow" in want:
        assert got["mlflow"].keys() == want["mlflow"].keys()
        for key in ("loss", "learning_rate", "eval/loss", "eval/accuracy"):
            assert got["mlflow"][key] == want["mlflow"][key], key  # each step once, the same values
        for key in want["mlflow"]:  # rates are timings, the rest exact: each at the same steps, once
            assert [s for s, _ in got["mlflow"][key]] == [s for s, _ in want["mlflow"][key]], key
    if "optuna" in want:
        assert got["optuna"] == want["optuna"]  # one trial, the same values reported, complete
    _log(f"{row}-{where}-{kind}", time.monotonic() - started)


def test_the_matrix_covers_every_job_and_place():
    assert set(ROWS) == {"train", "hooks", "bench", "adanet", "replicas", "pipeline"}
    assert all(set(spec.stops) == set(WHERES) for row, spec in ROWS.items() if row != "train")
    assert set(ROWS["train"].stops) == set(WHERES) - {"eval"}  # train evaluates nothing
    assert expected_returncode("sigterm") == 143 and expected_returncode("sigint") == 130
    assert expected_returncode("stuck") == 1
    stuck = [c.id for c in cells() if c.values[2] == "stuck"]
    assert stuck == ["replicas-train-stuck", "pipeline-train-stuck"]


# ------------------------------------------------------------------ a disk that fills, a read-only model_dir
# Real file systems, real errors: the train row's job in a tmpfs of its own (a private mount
# namespace, root only), filled or remounted read-only just before ckpt-15's first file is written
# (helpers/stops.py, install_fault_from_env). The same faults simulated in one process, and a
# read-only model_dir refused at the start, are tests/storage/test_storage_faults.py,
# tests/checkpoint/test_async_checkpoint.py and tests/storage/test_check_dir.py.
_NAMESPACE = """
set -u
mount -t tmpfs -o size=4m tmpfs "$MNT" || exit 99
run() {{ env STOKER_TEST_FAULT="$1" {command} > "$OUT/$2.out" 2> "$OUT/$2.err"; echo $? > "$OUT/$2.rc"; }}
run "{fault}" stopped
cp -a "$MNT/run" "$OUT/stopped"
{between}
run "" rerun
cp -a "$MNT/run" "$OUT/run"
"""


LEFTOVERS = (".tmp-", ".trash-", ".checkpoint.json.")  # a save's staging files


def _read(out: Path, name: str) -> tuple[int, str]:
    return int((out / f"{name}.rc").read_text()), (out / f"{name}.err").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "extra"),
    [("full", ()), ("full", ("--async_checkpoints",)), ("readonly", ())],
    ids=["full", "full-async", "readonly"],
)
def test_a_disk_that_fills_or_turns_read_only_during_a_checkpoint_write(tmp_path, tmp_path_factory, fault, extra):
    """The write fails with the file system's ENOSPC or EROFS: training stops with one error naming
    the checkpoint, the cause and ckpt-12, which stays the latest (nothing half-written is left
    where there is room to clean up). A rerun on the read-only file system is refused in one line
    before anything is written; with space freed or the file system writable again, the same
    command ends bitwise as the uninterrupted run."""
    import shlex
    import shutil
    import subprocess

    from helpers.processes import python_env

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a tmpfs of its own needs root and unshare")
    want = reference("train", tmp_path_factory)
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    command = shlex.join(
        [PYTHON, str(SCRIPTS / "train_script.py"), "--model_dir", f"{mnt}/run", "--max_steps", "24", *extra]
    )
    if fault == "full":
        armed, between = f"full:15:{mnt}/filler", f'rm "{mnt}/filler"'
    else:  # a rerun while read-only, then writable again
        armed, between = (
            f"readonly:15:{mnt}",
            'run "" refused; cp -a "$MNT/run" "$OUT/refused"; umount "$MNT"',
        )
    script = _NAMESPACE.format(command=command, fault=armed, between=between)
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        env={**python_env(), "MNT": str(mnt), "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    code, err = _read(out, "stopped")
    cause = (
        "no space left on the device or quota exceeded"
        if fault == "full"
        else "the location is read-only or not writable"
    )
    assert code == 1 and cause in err and "ckpt-12' stays the latest" in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    if extra:
        assert last.startswith("stoker.errors.CheckpointError: asynchronous checkpoint ckpt-15 failed: "), last
    else:
        assert last.startswith("stoker.errors.StorageError: checkpoint ckpt-15 was not written: "), last
    assert json.loads((out / "stopped" / "checkpoint.json").read_text())["latest"] == "ckpt-12"
    left = [p.name for p in (out / "stopped").iterdir() if p.name.startswith(LEFTOVERS)]
    if fault == "full":
        assert not left  # the failed write's staging folder removed
    else:  # a read-only file system keeps it; the rerun's first save removes it
        assert any(name.startswith(".tmp-ckpt-15-") for name in left), left
        code, err = _read(out, "refused")
        assert code == 1 and err.strip().splitlines()[-1] == (
            f"stoker.errors.ConfigError: model_dir '{mnt}/run' is on a read-only file system; give a writable directory"
        ), err[-3000:]
        assert _tree(out / "refused") == _tree(out / "stopped")  # nothing written, nothing removed
    code, err = _read(out, "rerun")
    assert code == 0, err[-3000:]
    assert ending(out / "run") == want["checkpoints"]
    assert not [p.name for p in (out / "run").iterdir() if p.name.startswith(LEFTOVERS)]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
