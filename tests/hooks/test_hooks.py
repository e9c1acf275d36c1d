"""Built-in hooks: NaN guard, step counter, logging, summaries, progress bar, profiler."""

from __future__ import annotations

import json
import math

import pytest
import torch

import stoker
from helpers.tiny import classifier_fn, make_data, make_estimator, train_input
from stoker.hooks import (
    Hook,
    HookRunner,
    LoggingHook,
    ProfilerHook,
    ProgressBarHook,
    StepCounterHook,
)
from stoker.summary import read_metrics_csv


def test_runner_calls_only_overridden_methods():
    class OnlyEnd(Hook):
        def end(self, run):  # noqa: ANN001
            pass

    runner = HookRunner([OnlyEnd(), Hook()])
    assert {e: len(fns) for e, fns in runner._by_event.items()} == {
        "begin": 0,
        "after_setup": 0,
        "before_loop": 0,
        "after_loop": 0,
        "after_evaluation": 0,
        "end": 1,
        "close": 0,
        "scheduled_after": 0,
    }
    with pytest.raises(TypeError, match="Hook instances"):
        HookRunner([object()])  # type: ignore[list-item]


def nan_at_17(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    spec = classifier_fn(model, features, labels, mode, params)
    params["calls"] = params.get("calls", 0) + 1
    if params["calls"] == 17:
        spec.loss = spec.loss * float("nan")
    return spec


# With N=1 the NaN guard is called only after a loop whose loss was not finite (run.totals wakes
# it), and loops no hook watches run as one: it must still name the step and stop before a save.
@pytest.mark.parametrize("iterations", [5, 1])
def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path, iterations):
    x, y = make_data(64)
    est = make_estimator(tmp_path, iterations_per_loop=iterations, save_checkpoints_steps=5)
    est.model_fn = nan_at_17
    with pytest.raises(
        stoker.NanLossError, match=r"loss is nan at step 17: training stopped; the last good checkpoint is .*ckpt-15"
    ) as err:
        est.train(train_input(x, y), max_steps=40)
    assert err.value.step == 17
    index = json.loads((tmp_path / "checkpoint.json").read_text())
    assert index["latest"] == "ckpt-15" and not (tmp_path / "ckpt-20").exists()
    # a new run resumes from the last good checkpoint
    again = make_estimator(tmp_path, iterations_per_loop=iterations)
    again.train(train_input(x, y), max_steps=20)
    assert again.global_step == 20 and all(torch.isfinite(p).all() for p in again.model.parameters())


class Capture(Hook):
    phase = "signals"  # after every built-in hook

    def __init__(self) -> None:
        self.logs: list[dict] = []

    def after_loop(self, run, result):  # noqa: ANN001
        self.logs.append(dict(run.logs))


def test_step_counter_reports_examples_per_second():
    x, y = make_data(64)
    cap = Capture()
    est = make_estimator(batch=16, iterations_per_loop=2)
    est.train(train_input(x, y), max_steps=8, hooks=[StepCounterHook(every_n_steps=4), cap])
    logs = [entry for entry in cap.logs if entry]
    assert logs, "the step counter reported nothing"
    last = logs[-1]
    assert last["examples_per_sec"] == pytest.approx(16 * last["steps_per_sec"])
    assert 0.0 <= last["input_wait_fraction"] <= 1.0


def lm_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    # a loss of exactly ln 2 nats per character: perplexity 2, one bit per character
    loss = model.fc1.weight.sum() * 0 + math.log(2)
    return stoker.EstimatorSpec(loss=loss, host_call={"tokens": torch.tensor(float(features.shape[0]))})


def test_logging_hook_shows_loss_ppl_bpc_and_named_values():
    x, y = make_data(64)
    est = make_estimator(iterations_per_loop=5)
    est.model_fn = lm_fn
    hook = LoggingHook(every_n_steps=10, language_model=True)
    est.train(train_input(x, y), max_steps=10, hooks=[hook])
    assert hook.last_line.startswith("step 10, loss = 0.6931, ppl = 2.000, bpc = 1.0000, tokens = 16")


def test_summaries_reach_metrics_csv_and_tensorboard(tmp_path):
    x, y = make_data(64)
    est = make_estimator(tmp_path, iterations_per_loop=5, log_every_n_steps=5)
    est.model_fn = lm_fn
    est.train(train_input(x, y), max_steps=10)
    est.evaluate(
        lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p))
    )
    rows = read_metrics_csv(tmp_path)
    losses = [(r["step"], r["value"]) for r in rows if r["tag"] == "loss"]
    assert losses == [(5, pytest.approx(math.log(2))), (10, pytest.approx(math.log(2)))]
    assert {r["tag"] for r in rows} >= {"tokens", "learning_rate", "steps_per_sec", "examples_per_sec"}
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "events").iterdir())


def test_progress_bar_follows_steps(capsys):
    x, y = make_data(64)
    bar = ProgressBarHook(force=True)
    updates = []

    class Spy(Hook):
        phase = "signals"  # after every built-in hook

        def after_loop(self, run, result):  # noqa: ANN001
            updates.append(bar._bar.n)

    make_estimator(iterations_per_loop=3).train(train_input(x, y), max_steps=7, hooks=[bar, Spy()])
    assert updates == [3, 6, 7]
    assert bar._bar is None  # closed at the end
    assert ProgressBarHook()._bar is None  # not a TTY under pytest: nothing is drawn


def test_profiler_writes_a_chrome_trace(tmp_path):
    x, y = make_data(64)
    hook = ProfilerHook(start_step=2, num_steps=2, trace_file=tmp_path / "trace.json")
    make_estimator(iterations_per_loop=2).train(train_input(x, y), max_steps=8, hooks=[hook])
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("addmm" in n or "linear" in n for n in names)


def test_stateful_hook_state_is_checkpointed(tmp_path):
    class Counter(Hook):
        def __init__(self) -> None:
            self.loops = 0

        def after_loop(self, run, result):  # noqa: ANN001
            self.loops += 1

        def state_dict(self):  # noqa: ANN201
            return {"loops": self.loops}

        def load_state_dict(self, state):  # noqa: ANN001
            self.loops = state["loops"]

    x, y = make_data(64)
    first = Counter()
    make_estimator(tmp_path, iterations_per_loop=2).train(train_input(x, y), max_steps=6, hooks=[first])
    second = Counter()
    make_estimator(tmp_path, iterations_per_loop=2).train(train_input(x, y), max_steps=10, hooks=[second])
    assert first.loops == 3 and second.loops == 5


def test_signal_handlers_are_restored_even_after_an_error(tmp_path):
    import signal

    before = signal.getsignal(signal.SIGINT)
    x, y = make_data(64)
    est = make_estimator(tmp_path, iterations_per_loop=5)
    est.model_fn = nan_at_17
    with pytest.raises(stoker.NanLossError):
        est.train(train_input(x, y), max_steps=40)
    assert signal.getsignal(signal.SIGINT) is before


def test_two_hooks_of_one_class_keep_separate_state(tmp_path):
    class Tally(Hook):
        def __init__(self, by: int) -> None:
            self.by, self.total = by, 0

        def after_loop(self, run, result):  # noqa: ANN001
            self.total += self.by

        def state_dict(self):  # noqa: ANN201
            return {"total": self.total}

        def load_state_dict(self, state):  # noqa: ANN001
            self.total = state["total"]

    x, y = make_data(64)
    make_estimator(tmp_path, iterations_per_loop=2).train(train_input(x, y), max_steps=4, hooks=[Tally(1), Tally(10)])
    a, b = Tally(1), Tally(10)
    make_estimator(tmp_path, iterations_per_loop=2).train(train_input(x, y), max_steps=6, hooks=[a, b])
    assert (a.total, b.total) == (3, 30)


def test_logging_hook_logs_the_last_partial_interval_at_the_end():
    x, y = make_data(64)
    est = make_estimator(iterations_per_loop=5)
    est.model_fn = lm_fn
    hook = LoggingHook(every_n_steps=100)
    est.train(train_input(x, y), max_steps=10, hooks=[hook])
    assert hook.last_line.startswith("step 10, loss = 0.6931")


def test_a_hook_you_pass_replaces_the_default_of_its_class():
    x, y = make_data(64)
    est = make_estimator(iterations_per_loop=5, log_every_n_steps=5)
    est.model_fn = lm_fn
    mine = LoggingHook(every_n_steps=5, language_model=True)
    seen = []

    class Spy(Hook):
        phase = "signals"  # after every built-in hook

        def after_setup(self, run):  # noqa: ANN001
            seen.extend(type(h).__name__ for h in runner_hooks)

    runner_hooks: list = []
    original = stoker.hooks.HookRunner.__init__

    def capture(self, hooks):  # noqa: ANN001, ANN202
        original(self, hooks)
        runner_hooks.extend(self.hooks)

    stoker.hooks.HookRunner.__init__ = capture
    try:
        est.train(train_input(x, y), max_steps=5, hooks=[mine, Spy()])
    finally:
        stoker.hooks.HookRunner.__init__ = original
    assert seen.count("LoggingHook") == 1 and mine in runner_hooks
    assert "bpc = 1.0000" in mine.last_line


def test_run_config_mlperf_log_writes_mllog_events(tmp_path):
    x, y = make_data(64)
    make_estimator(tmp_path, mlperf_log=True).train(train_input(x, y), max_steps=4)
    lines = (tmp_path / "mlperf.log").read_text().splitlines()
    keys = [json.loads(line.split(":::MLLOG ", 1)[1])["key"] for line in lines if ":::MLLOG" in line]
    order = [k for k in keys if k in ("run_start", "epoch_start", "epoch_stop", "run_stop")]
    assert order == ["run_start", "epoch_start", "epoch_stop", "run_stop"], keys


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_time_based_saves_alone_land_on_time_though_the_clock_is_not_read_every_step(tmp_path, monkeypatch):
    # One process, iterations_per_loop=1: the saver reads its clock only every few steps (from
    # the measured step rate); the saves must still come at the first step past each interval,
    # also when the steps suddenly get 2000x slower.
    from stoker.hooks import checkpoint_saver

    clock = FakeClock()
    monkeypatch.setattr(checkpoint_saver, "time", clock)
    reads = []
    real = FakeClock.monotonic

    def counted(self):  # noqa: ANN001, ANN202
        reads.append(self.now)
        return real(self)

    monkeypatch.setattr(FakeClock, "monotonic", counted)

    def timed_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        step = params["calls"] = params.get("calls", 0) + 1
        clock.now += 0.01 if step <= 3000 else 20.0  # 100 steps a second, then one per 20 s
        return classifier_fn(model, features, labels, mode, params)

    x, y = make_data(64)
    est = make_estimator(
        tmp_path,
        iterations_per_loop=1,
        save_checkpoints_secs=10,
        keep_checkpoint_max=0,
        log_every_n_steps=None,
        summaries=False,
    )
    est.model_fn = timed_fn
    est.train(train_input(x, y), max_steps=3006)
    steps = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("ckpt-*"))
    # every 10 s is every 1000 steps (float rounding may make it the step after); then each
    # 20 s step is past the interval, and the clock, last read at the old rate, is read again
    # within a few steps
    assert [round(s, -1) for s in steps[:3]] == [1000, 2000, 3000]
    assert steps[-1] == 3006 and all(b - a <= 3 for a, b in zip(steps[2:], steps[3:], strict=False)), steps
    fast = [t for t in reads if t <= 1030.0]  # reads in the fast part (its 3000 steps end at 1030 s)
    assert 3 < len(fast) < 100, len(fast)  # read, but not after every one of its 3000 steps


def test_loops_no_hook_watches_run_as_one_and_the_hooks_see_the_same_steps(tmp_path, monkeypatch):
    # iterations_per_loop=1 with only the built-in hooks (each waits for a due step): the loops
    # between due steps run as one; logging, summaries and step-based saves land on the same
    # steps, and the final weights equal a run where a watching hook keeps every loop a step.
    from stoker.engine.loop import DeviceLoop

    loops: list[int] = []
    real = DeviceLoop.run_loop

    def counted(self, infeed, steps):  # noqa: ANN001, ANN202
        loops.append(steps)
        return real(self, infeed, steps)

    monkeypatch.setattr(DeviceLoop, "run_loop", counted)
    x, y = make_data(64)

    def run(model_dir, hooks):  # noqa: ANN001, ANN202
        loops.clear()
        est = make_estimator(model_dir, iterations_per_loop=1, log_every_n_steps=5, save_checkpoints_steps=10)
        est.train(train_input(x, y), max_steps=20, hooks=hooks)
        rows = [(r["step"], r["tag"]) for r in read_metrics_csv(model_dir) if r["tag"] == "loss"]
        saved = sorted(p.name for p in model_dir.glob("ckpt-*"))
        return list(loops), rows, saved, [p.detach().clone() for p in est.model.parameters()]

    class EveryLoop(Hook):
        def after_loop(self, run, result):  # noqa: ANN001
            pass

    merged, rows, saved, weights = run(tmp_path / "merged", [])
    stepped, rows2, saved2, weights2 = run(tmp_path / "stepped", [EveryLoop()])
    assert stepped == [1] * 20
    assert merged == [5, 5, 5, 5]
    assert rows == rows2 == [(5, "loss"), (10, "loss"), (15, "loss"), (20, "loss")]
    assert saved == saved2 == ["ckpt-10", "ckpt-20"]
    assert all(torch.equal(a, b) for a, b in zip(weights, weights2, strict=True))


def test_hooks_read_the_run_from_a_read_only_run_info_not_the_run_config(tmp_path):
    import dataclasses

    x, y = make_data(64)
    est = make_estimator(tmp_path, seed=7, log_every_n_steps=3, precision="bf16")
    seen = []

    class Reader(Hook):
        def begin(self, run):  # noqa: ANN001
            seen.append(run.info)
            assert not hasattr(run, "config")
            with pytest.raises(dataclasses.FrozenInstanceError):
                run.info.seed = 8

    est.train(train_input(x, y), max_steps=2, hooks=[Reader()])
    assert seen == [stoker.hooks.RunInfo(model_dir=str(tmp_path), seed=7, log_every_n_steps=3, precision="bf16")]
