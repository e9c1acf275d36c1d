"""The watching evaluator keeps up: newest-first when behind, and a lease so retention never
deletes the checkpoint it evaluates (stoker.checkpoint.lease, ContinuousEvaluation).

In one process: retention keeps a leased checkpoint and deletes it after release; leases of
exited holders, and leases not renewed within their limit, are broken with a warning; a renewed
lease outlives its limit; newest-first records the older pending checkpoints as superseded,
durably (a second evaluator neither evaluates nor reports them); ``stoker inspect`` says it.

Real processes (tests/helpers/scripts/continuous_eval_script.py): a trainer with keep-3 retention and an
evaluator made slow on purpose, killed with SIGKILL while it holds a lease and started again,
on a local model_dir, on ``s3://`` (moto) and on a store with a lock object (``shared://``):
no evaluation computed and thrown away, the final checkpoint evaluated, every checkpoint
evaluated, superseded or removed before reading (exactly one of them), nothing repeated.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers import shared_store
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, popen, python_env
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker import storage
from stoker.checkpoint import CheckpointManager, Coverage
from stoker.checkpoint import lease as lease_mod
from stoker.checkpoint.lease import LeaseHolder, read_leases
from stoker.cli import main
from stoker.engine import ContinuousEvalConfig, ContinuousEvalResult, ContinuousEvaluation
from stoker.storage import location
from stoker.storage import lock as store_lock
from stoker.summary.inspect import format_inspection, inspect_run

SCRIPT = SCRIPTS / "continuous_eval_script.py"


def _save(m: CheckpointManager, step: int) -> None:
    m.save(step, {"w": torch.full((1,), float(step))}, {"global_step": step})


def _names(m: CheckpointManager) -> list[str]:
    return [r.name for r in m.records()]


def _plant(model_dir: Path, name: str = "ckpt-1", **fields: object) -> Path:
    """A lease object as another evaluator would have left it."""
    lease = {
        "owner": "someone-else",
        "pid": 1,
        "host": "another-host",
        "pidns": "",
        "time": time.time(),
        "stale_after": 300.0,
        "name": name,
        "dir": name,
        "step": int(name.split("-")[1]),
        **fields,
    }
    path = model_dir / lease_mod.lease_name(str(lease["owner"]))
    path.write_text(json.dumps(lease))
    return path


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ============================================================== the lease, in one process
def test_retention_keeps_a_leased_checkpoint_and_deletes_it_after_release(tmp_path):
    m = CheckpointManager(tmp_path, keep_checkpoint_max=2)
    _save(m, 1)
    holder = LeaseHolder(tmp_path, stale_after=60)
    holder.take(m.records()[0])
    lease_file = tmp_path / lease_mod.lease_name(holder.current.owner)
    held = json.loads(lease_file.read_text())
    assert {k: held[k] for k in ("pid", "name", "dir", "step", "stale_after")} == {
        "pid": os.getpid(),
        "name": "ckpt-1",
        "dir": "ckpt-1",
        "step": 1,
        "stale_after": 60.0,
    }
    assert set(held) == {"owner", "pid", "host", "pidns", "time", "stale_after", "name", "dir", "step"}
    for step in (2, 3, 4):
        _save(m, step)
    assert _names(m) == ["ckpt-1", "ckpt-3", "ckpt-4"]  # ckpt-2 went; the leased ckpt-1 stays
    assert (tmp_path / "ckpt-1").is_dir() and not (tmp_path / "ckpt-2").exists()
    holder.release()
    assert not lease_file.exists()
    assert _names(m) == ["ckpt-1", "ckpt-3", "ckpt-4"]  # released: deleted at the next retention pass
    m.apply_retention()
    assert _names(m) == ["ckpt-3", "ckpt-4"] and not (tmp_path / "ckpt-1").exists()


def test_a_save_that_drops_nothing_does_not_read_the_leases(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, keep_checkpoint_max=3)
    calls = []
    real = lease_mod.read_leases
    monkeypatch.setattr(lease_mod, "read_leases", lambda *a, **k: calls.append(1) or real(*a, **k))
    for step in (1, 2, 3):
        _save(m, step)
    assert calls == []
    _save(m, 4)
    assert calls == [1]


def test_a_lease_of_an_exited_holder_on_this_host_is_broken_at_once(tmp_path, caplog):
    m = CheckpointManager(tmp_path, keep_checkpoint_max=1)
    _save(m, 1)
    pid = _exited_pid()
    planted = _plant(tmp_path, pid=pid, host=store_lock._HOST, pidns=store_lock._pid_namespace())
    with caplog.at_level("WARNING", logger="stoker"):
        _save(m, 2)
    assert _names(m) == ["ckpt-2"] and not (tmp_path / "ckpt-1").exists() and not planted.exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"retention: breaking the lease on ckpt-1 held by pid {pid} on {store_lock._HOST} (its holder has exited)"
    ]


def test_a_lease_not_renewed_within_its_limit_is_broken_and_a_fresh_one_holds(tmp_path, caplog):
    m = CheckpointManager(tmp_path, keep_checkpoint_max=1)
    _save(m, 1)
    fresh = _plant(tmp_path)  # another host, live by its clock: honoured
    _save(m, 2)
    assert _names(m) == ["ckpt-1", "ckpt-2"] and fresh.exists()
    fresh.unlink()
    stale = _plant(tmp_path, time=time.time() - 20, stale_after=5)
    with caplog.at_level("WARNING", logger="stoker"):
        _save(m, 3)
    assert _names(m) == ["ckpt-3"] and not stale.exists()
    (message,) = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(
        r"retention: breaking the lease on ckpt-1 held by pid 1 on another-host "
        r"\(not renewed for 2\d s, over its limit of 5 s\)",
        message,
    ), message
    unreadable = tmp_path / lease_mod.lease_name("garbage")
    unreadable.write_text("{")
    _save(m, 4)  # an unreadable lease holds nothing (and is left for its writer)
    assert _names(m) == ["ckpt-4"] and unreadable.exists()


def test_a_renewed_lease_outlives_its_limit(tmp_path):
    m = CheckpointManager(tmp_path, keep_checkpoint_max=1)
    _save(m, 1)
    holder = LeaseHolder(tmp_path, stale_after=0.5)  # renewed every 0.1 s
    holder.take(m.records()[0])
    first = holder.current.time
    time.sleep(1.2)
    _save(m, 2)
    assert _names(m) == ["ckpt-1", "ckpt-2"]
    assert holder.current.time > first + 0.8
    holder.release()
    _save(m, 3)
    assert _names(m) == ["ckpt-3"]
    assert read_leases(tmp_path) == {}


# ============================================================== newest-first, in one process
def test_newest_first_supersedes_the_backlog_durably_and_inspect_says_so(tmp_path):
    x, y = make_data(100)
    ex, ey = make_data(64, seed=1)
    make_estimator(
        tmp_path, iterations_per_loop=2, save_checkpoints_steps=2, keep_checkpoint_max=0, keep_best=("accuracy", "max")
    ).train(train_input(x, y), max_steps=6)
    evaluator = make_estimator(tmp_path, keep_checkpoint_max=0, keep_best=("accuracy", "max"))
    seen: list[int] = []
    result = evaluator.evaluate_continuously(
        eval_input(ex, ey), timeout_secs=30, poll_secs=0.01, on_result=lambda s, r: seen.append(s)
    )
    assert result.evaluated == seen == [6] and result.superseded == [2, 4]
    assert result.skipped == result.discarded == []
    assert result.coverage == Coverage(evaluated=(6,), superseded=(2, 4))
    assert result.coverage_line() == "1 evaluated, 2 superseded, 0 removed before reading, 0 discarded"
    index = json.loads((tmp_path / "checkpoint.json").read_text())
    assert [(r["step"], bool(r["metrics"]), r.get("superseded", False)) for r in index["checkpoints"]] == [
        (2, False, True),
        (4, False, True),
        (6, True, False),
    ]
    assert index["best"]["name"] == "ckpt-6"
    assert read_leases(tmp_path) == {}  # released
    # scalars only for the evaluated checkpoint
    with open(tmp_path / "eval" / "metrics.csv", newline="") as f:
        assert {int(r["step"]) for r in csv.DictReader(f)} == {6}
    # a second evaluator neither evaluates nor reports a superseded checkpoint
    again = make_estimator(tmp_path, keep_checkpoint_max=0, keep_best=("accuracy", "max"))
    result = again.evaluate_continuously(eval_input(ex, ey), timeout_secs=30, poll_secs=0.01)
    assert result.evaluated == result.superseded == []
    assert result.coverage is not None and result.coverage.superseded == (2, 4)
    # ... nor does order="oldest": superseded is final
    result = again.evaluate_continuously(eval_input(ex, ey), timeout_secs=30, poll_secs=0.01, order="oldest")
    assert result.evaluated == []
    info = inspect_run(tmp_path)
    assert info["coverage"] == {"evaluated": [6], "superseded": [2, 4], "removed": [], "discarded": []}
    assert [c["superseded"] for c in info["checkpoints"]] == [True, True, False]
    page = format_inspection(info)
    assert "watching evaluator: 1 evaluated, 2 superseded, 0 removed before reading, 0 discarded" in page
    assert re.search(r"ckpt-2 .* superseded$", page, re.M)


def test_a_checkpoint_removed_before_the_lease_is_taken_is_never_read(tmp_path, caplog):
    x, y = make_data(100)
    make_estimator(tmp_path, iterations_per_loop=2, save_checkpoints_steps=2, keep_checkpoint_max=0).train(
        train_input(x, y), max_steps=4
    )
    est = make_estimator(tmp_path, keep_checkpoint_max=0)
    watcher = ContinuousEvaluation(est.evaluation, est.state.checkpoints, ContinuousEvalConfig())
    stale = next(r for r in est.state.checkpoints.records() if r.step == 2)
    est.state.checkpoints.update_index(lambda index: (index.without("ckpt-2"), None))
    computed = []
    real = est.evaluation.compute
    est.evaluation.compute = lambda *a, **k: computed.append(1) or real(*a, **k)  # type: ignore[method-assign]
    res = ContinuousEvalResult()
    with caplog.at_level("INFO", logger="stoker"):
        assert watcher.evaluate_one(eval_input(*make_data(16, seed=1)), stale, res) is None
    assert computed == [] and res.skipped == [2] and res.discarded == []
    assert read_leases(tmp_path) == {}
    assert "evaluator: ckpt-2 was removed by retention before it was evaluated; skipped" in caplog.messages


def test_order_and_lease_arguments_are_checked(tmp_path, capsys):
    with pytest.raises(ValueError, match="order must be 'newest' or 'oldest'"):
        ContinuousEvalConfig(order="random")
    with pytest.raises(ValueError, match="lease_secs must be > 0 or None"):
        ContinuousEvalConfig(lease_secs=0)
    assert main(["evaluate", str(tmp_path), "--order", "oldest"]) == 2
    assert "--order applies only with --watch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["evaluate", str(tmp_path), "--watch", "--order", "random"])
    assert "invalid choice" in capsys.readouterr().err


# ============================================================== real processes: the scenario
class Store:
    """How the processes' model_dir is read from the test: local, s3:// or shared://."""

    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.url, self.env = url, env
        self.root = location(url)

    def index(self) -> dict:
        """The index as the JSON object on the store."""
        return CheckpointManager(self.url, writer=False).index().to_json()

    def has_index(self) -> bool:
        return storage.exists(self.root / "checkpoint.json")

    def leases(self) -> dict:
        return {name: lease for name, (_, lease) in read_leases(self.root).items()}

    def checkpoint_dirs(self) -> set[str]:
        return {n for n in storage.listdir(self.root) if n.startswith("ckpt-")}

    def eval_rows(self) -> list[tuple[int, str]]:
        data = storage.read_bytes(self.root / "eval" / "metrics.csv").decode()
        return [(int(r["step"]), r["tag"]) for r in csv.DictReader(io.StringIO(data, newline=""))]


def _start(store: Store, role: str, *extra: str) -> subprocess.Popen[str]:
    return popen(
        [PYTHON, str(SCRIPT), "--role", role, "--model_dir", store.url, *extra],
        env={**python_env(), **store.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"process did not finish: {out}\n{err}") from None
    assert proc.returncode == 0, f"{out}\n{err}"
    return out, err


def _evaluations(log: Path) -> list[tuple[int, int]]:
    if not log.exists():
        return []
    return [(int(pid), int(step)) for pid, step, _ in (line.split() for line in log.read_text().splitlines() if line)]


def scenario(store: Store, tmp_path: Path, *, max_steps: int, save_steps: int, keep: int = 3) -> dict:
    """Trainer and a slow evaluator (about 1 s per evaluation); the evaluator is killed with
    SIGKILL in the middle of an evaluation (holding a lease) and started again."""
    log = tmp_path / "evaluated.txt"
    common = ("--save_steps", str(save_steps), "--keep", str(keep), "--timeout_secs", "120")
    evaluator_args = ("--evaluated_log", str(log), "--eval_sleep", "0.25", "--order", "newest", *common)
    go = tmp_path / "go"
    first = _start(store, "evaluate", *evaluator_args)
    trainer = _start(store, "train", "--max_steps", str(max_steps), "--sleep", "0.05", "--wait_for", str(go), *common)
    # both import at once; training starts once the evaluator watches (so it counts every checkpoint)
    assert first.stdout is not None and first.stdout.readline().strip() == "watching", first.communicate()
    go.touch()
    deadline = time.monotonic() + 180
    while True:  # kill it mid-evaluation: it holds a lease taken 0.1 s ago or more (an evaluation takes ~1 s)
        assert first.poll() is None and trainer.poll() is None, (first.communicate(), trainer.communicate())
        assert time.monotonic() < deadline, "the evaluator never held a lease long enough"
        held = [x for x in store.leases().values() if x is not None and x.pid == first.pid]
        if _evaluations(log) and held and 0.1 < time.time() - held[0].time < 0.5:
            break
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_lease = next(x for x in store.leases().values() if x is not None and x.pid == first.pid)
    recorded_before = {r["step"] for r in store.index()["checkpoints"] if r["metrics"]}
    assert killed_lease.step not in recorded_before
    second = _start(store, "evaluate", *evaluator_args)
    _, trainer_err = _finish(trainer)
    out, second_err = _finish(second)
    index = store.index()
    cov = index["coverage"]
    saved = set(range(save_steps, max_steps + 1, save_steps))
    evaluated, superseded, removed = set(cov["evaluated"]), set(cov["superseded"]), set(cov["removed"])
    evals = _evaluations(log)
    # nothing computed and thrown away; nothing evaluated twice; the restarted evaluator repeats nothing
    assert cov["discarded"] == []
    assert all(n == 1 for n in Counter(step for _, step in evals).values()), evals
    assert {step for _, step in evals} == evaluated
    assert not {step for pid, step in evals if pid == second.pid} & recorded_before
    # the final checkpoint is always evaluated; every checkpoint is in exactly one of the three
    assert max_steps in evaluated and next(r for r in index["checkpoints"] if r["step"] == max_steps)["metrics"]
    assert not (evaluated & superseded or evaluated & removed or superseded & removed), cov
    assert evaluated | superseded | removed == saved, (sorted(saved - (evaluated | superseded | removed)), cov)
    # the dead evaluator's lease was broken (by the trainer's retention or the restarted evaluator)
    broken = f"breaking the lease on {killed_lease.name} held by pid {first.pid} on "
    assert broken in trainer_err + second_err, (trainer_err[-2000:], second_err[-2000:])
    assert store.leases() == {}
    # retention went on: the newest `keep`, the best and the latest, nothing else, nothing orphaned
    retained = {r["name"] for r in index["checkpoints"]}
    newest = {r["name"] for r in index["checkpoints"][-keep:]}
    assert retained <= newest | {index["best"]["name"], index["latest"]}, retained
    assert store.checkpoint_dirs() == {r.get("dir", r["name"]) for r in index["checkpoints"]}
    # keep_best: the best of the evaluations, on an evaluated checkpoint
    best = max(r["metrics"]["accuracy"] for r in index["checkpoints"] if r["metrics"])
    assert index["best"]["step"] in evaluated and index["best"]["value"] >= best
    # scalars only for evaluated checkpoints, once each
    rows = store.eval_rows()
    assert Counter(rows).most_common(1)[0][1] == 1
    assert {s for s, t in rows if t == "eval/accuracy"} == evaluated
    assert re.search(r"totals \d+ evaluated, \d+ superseded, \d+ removed before reading, 0 discarded", out), out
    return cov


def test_slow_evaluator_beside_training_killed_holding_a_lease_wastes_nothing(tmp_path):
    cov = scenario(Store(str(tmp_path / "run"), {}), tmp_path, max_steps=40, save_steps=2)
    assert len(cov["superseded"]) >= 1  # it really fell behind


@pytest.mark.slow  # ~90 s on 2 busy cores: three processes each importing torch, and moto
def test_the_same_on_s3(s3_env, tmp_path):  # noqa: F811
    scenario(Store(f"s3://bucket/{uuid.uuid4().hex[:8]}", s3_env), tmp_path, max_steps=30, save_steps=3)


@pytest.mark.slow  # ~55 s on 2 busy cores
def test_the_same_on_a_store_with_a_lock_object(tmp_path, monkeypatch):
    env = {shared_store.ROOT_ENV: str(tmp_path / "store")}
    monkeypatch.setenv(shared_store.ROOT_ENV, env[shared_store.ROOT_ENV])
    shared_store.register()
    scenario(Store(f"shared://bucket/{uuid.uuid4().hex[:8]}", env), tmp_path, max_steps=30, save_steps=3)
