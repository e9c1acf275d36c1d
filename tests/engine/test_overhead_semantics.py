"""What the loop-overhead work (issue 11) must not change: summaries a kill -9 leaves behind,
intervals that see a non-finite value, a final checkpoint on a store whose finished marker
fails, optimizers with their own ``zero_grad``."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import textwrap
import uuid

import fsspec
import pytest
import torch

from helpers.paths import TESTS
from helpers.processes import PYTHON, python_env, run_process
from helpers.tiny import classifier_fn, make_data, make_estimator, train_input
from stoker import storage
from stoker.checkpoint import CheckpointManager, load_checkpoint
from stoker.engine.loop import grad_clearer
from stoker.errors import StorageError
from stoker.hooks import LoggingHook
from stoker.hooks.base import LoopResult, RunTotals
from stoker.summary import read_metrics_csv

KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import stoker
    from stoker.hooks import Hook
    from helpers.tiny import make_data, make_estimator, train_input

    class KillAt(Hook):
        phase = "signals"  # after every built-in hook of the loop boundary
        def after_loop(self, run, result):
            if run.global_step == {kill_at}:
                os.kill(os.getpid(), signal.SIGKILL)  # no handler, no cleanup

    x, y = make_data(64)
    est = make_estimator({model_dir!r}, iterations_per_loop=1, save_checkpoints_steps=3, log_every_n_steps=2)
    est.train(train_input(x, y), max_steps={max_steps}, hooks=[KillAt()] if {kill_at} else [])
    """
)


def _run(model_dir, kill_at: int, max_steps: int) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    code = KILLED_RUN.format(tests=str(TESTS), model_dir=str(model_dir), kill_at=kill_at, max_steps=max_steps)
    return run_process([PYTHON, "-c", code], env=python_env(), capture_output=True, text=True, timeout=300)


def test_summary_rows_before_a_checkpoint_survive_kill_9(tmp_path):
    # Summaries every 2 steps, checkpoints every 3: the row of step 2 is queued when the
    # checkpoint of step 3 is written, at a boundary where the summary hook is not due. A kill
    # after that checkpoint must not lose it: the resumed run starts at step 3 and never
    # writes step 2 again.
    killed = _run(tmp_path, kill_at=4, max_steps=8)
    assert killed.returncode == -9, killed.stderr
    done = _run(tmp_path, kill_at=0, max_steps=8)
    assert done.returncode == 0, done.stderr
    loss_steps = sorted({r["step"] for r in read_metrics_csv(tmp_path) if r["tag"] == "loss"})
    assert loss_steps[:1] == [2], loss_steps
    assert {4, 6, 8} <= set(loss_steps)


def _result(first: int, losses: list[float], values: dict[str, list[float]]) -> LoopResult:
    n = len(losses)
    return LoopResult(first, n, first + n, losses, {**values, "learning_rate": [0.1] * n}, 0.01 * n, 0.0, 16 * n)


def test_a_non_finite_value_spoils_only_its_interval():
    # Before run.totals each interval summed its own values: an inf (an fp16 overflow seen in a
    # host_call value) or a NaN showed in one log line, and the next lines were finite again.
    totals = RunTotals()
    mark = totals.copy()
    totals.add(_result(0, [1.0], {"x": [float("inf")]}))
    totals.add(_result(1, [1.0], {"x": [1.0]}))
    first = totals.since(mark)
    assert first.means()["x"] == math.inf
    mark = totals.copy()
    totals.add(_result(2, [1.0, 2.0], {"x": [2.0, 4.0]}))
    assert totals.since(mark).means()["x"] == 3.0
    mark = totals.copy()
    totals.add(_result(4, [1.0], {"x": [float("-inf")]}))
    totals.add(_result(5, [1.0], {"x": [float("nan")]}))
    spoilt = totals.since(mark).means()["x"]
    assert math.isnan(spoilt)
    mark = totals.copy()
    totals.add(_result(6, [3.0], {"x": [5.0]}))
    interval = totals.since(mark)
    assert interval.means()["x"] == 5.0 and interval.loss_sum == 3.0 and interval.loss_n == 1
    # +inf and -inf in one interval: NaN, as their sum is
    mark = totals.copy()
    totals.add(_result(7, [1.0, 1.0], {"x": [float("inf"), float("-inf")]}))
    assert math.isnan(totals.since(mark).means()["x"])


def test_log_lines_recover_after_an_inf_host_call_value(tmp_path):
    def fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        spec = classifier_fn(model, features, labels, mode, params)
        step = params.setdefault("calls", [0])
        step[0] += 1
        value = torch.tensor(float("inf") if step[0] == 2 else 1.0)
        return dataclasses.replace(spec, host_call={"x": value})

    x, y = make_data(64)
    est = make_estimator(None, iterations_per_loop=1)
    est.model_fn = fn
    hook = LoggingHook(every_n_steps=2)
    lines = []
    real = hook._log

    def keep(run):  # noqa: ANN001, ANN202
        real(run)
        lines.append(hook.last_line)

    hook._log = keep
    est.train(train_input(x, y), max_steps=6, hooks=[hook])
    assert len(lines) == 3, lines
    assert "x = inf" in lines[0] and "x = 1," in lines[1] and "x = 1," in lines[2], lines


def test_a_failed_finished_marker_keeps_the_committed_checkpoint_on_a_store(monkeypatch):
    url = f"memory://bucket/{uuid.uuid4().hex[:8]}"
    manager = CheckpointManager(url)
    real = storage.write_all

    def no_marker(jobs, retry=storage.DEFAULT_RETRY):  # noqa: ANN001, ANN202
        if any(str(path).endswith("finished.json") for path, _ in jobs):
            raise StorageError("finished.json: the store refused the write")
        return real(jobs, retry)

    monkeypatch.setattr(storage, "write_all", no_marker)
    weights = {"w": torch.ones(3)}
    with pytest.raises(StorageError):
        manager.save(5, weights, {"global_step": 5}, finished=True)
    # The index was committed before the marker was tried: what it names must still be there.
    latest = manager.latest_path()
    assert latest is not None, "the commit itself must have happened"
    loaded = load_checkpoint(latest)
    assert torch.equal(loaded.model_state["w"], weights["w"])
    fs = fsspec.filesystem("memory")
    assert fs.exists(str(latest).removeprefix("memory:/"))


def test_grad_clearer_keeps_a_zero_grad_set_on_the_instance():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    calls = []

    def own_zero_grad(set_to_none: bool = True) -> None:
        calls.append(set_to_none)
        p.grad = None

    opt.zero_grad = own_zero_grad  # e.g. a wrapper library patching the instance
    p.grad = torch.ones(2)
    grad_clearer(opt)()
    assert calls == [True] and p.grad is None


def test_a_final_save_killed_mid_write_leaves_no_finished_marker_temp_file(tmp_path):
    # The final checkpoint writes finished.json's temporary file with its own files; a kill -9
    # during that write leaves it, and the next run's first save removes it with the rest.
    (tmp_path / ".finished.json.0badcafe.tmp").write_bytes(b'{"step": 5')
    (tmp_path / ".tmp-ckpt-5-0badcafe").mkdir()
    manager = CheckpointManager(tmp_path)
    manager.save(3, {"w": torch.ones(2)}, {"global_step": 3})
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")) == []
    assert not (tmp_path / "finished.json").exists()


@pytest.mark.parametrize(
    ("iterations", "resume_at", "expected"),
    [
        (3, None, [2, 4, 6, 8, 10]),  # loops of 3 end early on each multiple of 2: 2, 3, 4, 6, 8, 9, 10
        (1, None, [2, 4, 6, 8, 10]),
        (3, 5, [6, 8, 10]),  # resumed at 5: the same multiples, not counted from the resume
    ],
)
def test_logging_and_summary_intervals_when_loops_do_not_divide_them(tmp_path, iterations, resume_at, expected):
    x, y = make_data(64)
    if resume_at is not None:
        make_estimator(tmp_path, iterations_per_loop=iterations, log_every_n_steps=2).train(
            train_input(x, y), max_steps=resume_at
        )
    before = {r["step"] for r in read_metrics_csv(tmp_path) if r["tag"] == "loss"}
    hook = LoggingHook(every_n_steps=2)
    steps: list[int] = []
    real = hook._log
    hook._log = lambda run: (real(run), steps.append(run.global_step))  # type: ignore[method-assign]
    make_estimator(tmp_path, iterations_per_loop=iterations, log_every_n_steps=2).train(
        train_input(x, y), max_steps=10, hooks=[hook]
    )
    assert steps == expected
    summary_steps = sorted({r["step"] for r in read_metrics_csv(tmp_path) if r["tag"] == "loss"} - before)
    assert summary_steps == expected


@pytest.mark.parametrize("iterations", [1, 3])
def test_each_loop_reports_every_steps_loss_and_host_call_values_exactly(iterations):
    """On a CPU device the loop reads each step's loss and dict host_call values as it goes
    (cheaper than keeping tensors to the loop's end); hooks must still see every step's
    values, exactly, as floats."""
    from stoker.hooks import Hook

    computed: list[float] = []
    thirds: list[float] = []

    def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        spec = classifier_fn(model, features, labels, mode, params)
        computed.append(spec.loss.item())
        if mode == "train":
            third = spec.loss / 3  # a float32 value that is not the loss rounded another way
            thirds.append(third.item())
            spec.host_call = {"third": third, "count": torch.tensor(3)}  # an int tensor too
        return spec

    class Record(Hook):
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.steps: list[int] = []
            self.values: dict[str, list[float]] = {"third": [], "count": []}

        def after_loop(self, run, result):  # noqa: ANN001, ANN202
            self.losses += result.losses
            self.steps.append(result.steps)
            for name in self.values:
                self.values[name] += result.values[name]

    x, y = make_data(64)
    est = make_estimator(iterations_per_loop=iterations)
    est.model_fn = model_fn
    record = Record()
    est.train(train_input(x, y), max_steps=7, hooks=[record])
    assert sum(record.steps) == 7 and len(record.losses) == 7
    assert record.losses == computed  # bitwise: the float each step's loss tensor held
    assert record.values["third"] == thirds and record.values["count"] == [3.0] * 7
    assert all(type(v) is float for v in record.losses + record.values["third"] + record.values["count"])
