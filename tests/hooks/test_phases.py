"""Hooks run by named phases (stoker.hooks.base.PHASES): the full order of the default hooks and
of every hook stoker ships, the tie rule within a phase, and an unknown phase refused."""

from __future__ import annotations

import optuna
import pytest

import stoker
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.adanet.iteration import DivergedCandidateHook
from stoker.bench.outputs import BenchSummaries
from stoker.bench.train import ChangedSettings, EvaluationLines, StepTimer, WarmUpEnd
from stoker.errors import ConfigError
from stoker.hooks import (
    EarlyStopping,
    Hook,
    MLflowLogger,
    OptunaPruning,
    ProfilerHook,
    ProgressBarHook,
    ReduceLROnPlateau,
    WandbLogger,
)
from stoker.hooks.base import PHASES, sorted_hooks
from stoker.recipes.skeleton import _RunSpecWriter
from stoker.recipes.throughput import Throughput


class Mine(Hook):
    """A hook of the user's, in the default phase (reporting)."""


class MineBeforeSaving(Hook):
    phase = "recording"


def name(hook: Hook) -> str:
    source = getattr(hook, "source", None)
    return f"{type(hook).__name__}({source})" if isinstance(source, str) else type(hook).__name__


def runner_order(monkeypatch, tmp_path, given: list[Hook]) -> list[str]:
    """The hooks of a train_and_evaluate call given ``given``, in the order the runner calls them."""
    monkeypatch.setattr(ProgressBarHook, "would_show", staticmethod(lambda: True))
    seen: list[str] = []
    original = stoker.hooks.HookRunner.__init__

    class Seen(Exception):
        pass

    def capture(self, hooks):  # noqa: ANN001, ANN202
        original(self, hooks)
        seen.extend(name(h) for h in self.hooks)
        raise Seen

    monkeypatch.setattr(stoker.hooks.HookRunner, "__init__", capture)
    x, y = make_data(64)
    est = make_estimator(tmp_path, mlperf_log=True, progress_bar=True, log_every_n_steps=2)
    with pytest.raises(Seen):
        est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=4, eval_every_n_steps=2, hooks=given)
    return seen


def every_shipped_hook(tmp_path) -> list[Hook]:
    trial = optuna.create_study().ask()
    quiet = lambda line: None  # noqa: E731
    return [
        Mine(),
        EarlyStopping("loss", source="train", every_n_steps=2),
        ReduceLROnPlateau("loss", source="train", every_n_steps=2),
        EarlyStopping("loss"),
        ReduceLROnPlateau("loss"),
        OptunaPruning(trial, "loss"),
        MineBeforeSaving(),
        MLflowLogger(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"),
        WandbLogger(mode="disabled"),
        ProfilerHook(start_step=10**6),
        DivergedCandidateHook(),
        _RunSpecWriter("kind", None),  # type: ignore[arg-type]
        StepTimer(batch_size=8, display_every=1, with_accuracy=False, log=quiet),
        WarmUpEnd(2, lambda: None),
        EvaluationLines(examples=8, stop_at=None, log=quiet),
        BenchSummaries(tmp_path / "bench", verbosity=1, every_n_steps=100, loss_tag="loss"),
        ChangedSettings({}, quiet),
        Throughput(),
    ]


def test_the_full_order_of_the_default_hooks_and_every_shipped_hook(monkeypatch, tmp_path):
    order = runner_order(monkeypatch, tmp_path, every_shipped_hook(tmp_path))
    assert order == [
        # timing: the loop's own time first
        "StepTimer",
        "WarmUpEnd",
        "Throughput",
        # state: the stop step, the NaN guard before anything saves, diverged candidates cleaned
        "StopAtStepHook",
        "NanLossHook",
        "DivergedCandidateHook",
        "_RunSpecWriter",  # run_spec.json, which the trackers log as params in their after_setup
        # measurement: rates into run.logs for the trackers and the log line
        "StepCounterHook",
        # recording: what the checkpoint of the boundary holds
        "EarlyStopping(train)",
        "ReduceLROnPlateau(train)",
        "MLflowLogger",
        "WandbLogger",
        "MineBeforeSaving",
        # saving
        "CheckpointSaverHook",
        # evaluation, on the checkpoint just written
        "EvaluationHook",
        # decisions on that evaluation (MLPerf's run_stop after the final evaluation)
        "MLPerfLogHook",
        "EarlyStopping(eval)",
        "ReduceLROnPlateau(eval)",
        "OptunaPruning",
        "EvaluationLines",
        # reporting, then the user's hooks of the default phase
        "LoggingHook",
        "SummaryHook",
        "BenchSummaries",
        "ChangedSettings",
        "Mine",
        # display
        "ProgressBarHook",
        "ProfilerHook",
        # signals: stops from outside the run, after EarlyStopping withdrew a stop that no longer holds
        "StopFileHook",
        "PreemptionHook",
    ]


def test_the_default_hooks_alone(monkeypatch, tmp_path):
    assert runner_order(monkeypatch, tmp_path, []) == [
        "StopAtStepHook",
        "NanLossHook",
        "StepCounterHook",
        "CheckpointSaverHook",
        "EvaluationHook",
        "MLPerfLogHook",
        "LoggingHook",
        "SummaryHook",
        "ProgressBarHook",
        "StopFileHook",
        "PreemptionHook",
    ]


def test_within_a_phase_stokers_hooks_come_first_then_the_others_each_in_the_order_given():
    class A(Hook):
        phase = "state"

    class B(Hook):
        phase = "state"

    a, b = A(), B()
    stop, nan = stoker.hooks.StopAtStepHook(last_step=3), stoker.hooks.NanLossHook()
    logging_hook = stoker.hooks.LoggingHook()
    assert sorted_hooks([logging_hook, b, nan, a, stop]) == [nan, stop, b, a, logging_hook]
    assert sorted_hooks([a, stop, b, nan]) == [stop, nan, a, b]


def test_every_shipped_hook_names_a_phase_and_none_a_priority(tmp_path):
    hooks = every_shipped_hook(tmp_path) + [
        stoker.hooks.NanLossHook(),
        stoker.hooks.StopAtStepHook(last_step=1),
        stoker.hooks.StepCounterHook(),
        stoker.hooks.LoggingHook(),
        stoker.hooks.SummaryHook(),
        stoker.hooks.ProgressBarHook(),
        stoker.hooks.CheckpointSaverHook(save_steps=1),
        stoker.hooks.PreemptionHook(),
        stoker.hooks.MLPerfLogHook(),
    ]
    for h in hooks:
        assert h.phase in PHASES and not hasattr(h, "priority"), type(h).__name__


def test_an_unknown_phase_is_a_config_error():
    class Late(Hook):
        phase = "last"  # type: ignore[assignment]

    with pytest.raises(ConfigError) as e:
        sorted_hooks([Late()])
    assert str(e.value) == (
        "hooks: Late.phase must be one of timing, state, measurement, recording, saving, evaluation, decisions, "
        "reporting, display, signals; got 'last'"
    )
