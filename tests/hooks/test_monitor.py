"""What EarlyStopping and ReduceLROnPlateau watch: mode="auto" read from the name, and a
training value's mean every N steps summed the same way in a resumed run."""

from __future__ import annotations

import math

import pytest

import stoker
from helpers.tiny import make_data, make_estimator, train_input
from stoker.config import RunInfo
from stoker.errors import ConfigError
from stoker.hooks.base import LoopResult
from stoker.hooks.monitor import Monitor, resolve_mode

REFUSED = (
    "EarlyStopping: mode='auto' cannot tell whether 'learning_rate' should go down or up (names with loss, error, "
    "mse, mae, rmse, nll, perplexity, ppl or bpc are minimised, names with accuracy, acc, auc, precision, recall, "
    "f1 or top-k (top5, top_5_accuracy) maximised); give mode='min' or mode='max'"
)


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("loss", "min"),
        ("val_loss", "min"),
        ("eval/loss", "min"),
        ("mlm_loss", "min"),
        ("logloss", "min"),
        ("error", "min"),
        ("top1_error", "min"),  # an error of a top-k: lower is better
        ("mse", "min"),
        ("val_mae", "min"),
        ("rmse", "min"),
        ("ppl", "min"),
        ("bpc", "min"),
        ("accuracy", "max"),
        ("eval_accuracy", "max"),
        ("val_acc", "max"),
        ("top_5_accuracy", "max"),
        ("top2", "max"),
        ("top_k", "max"),
        ("auc", "max"),
        ("roc_auc", "max"),
        ("precision", "max"),
        ("Recall", "max"),
        ("f1", "max"),
        ("macro_f1_score", "max"),
    ],
)
def test_auto_reads_the_direction_from_the_name(name, mode):
    assert resolve_mode("EarlyStopping", name, "auto") == mode
    assert resolve_mode("EarlyStopping", name, "max" if mode == "min" else "min") != mode  # given: kept


@pytest.mark.parametrize("name", ["learning_rate", "grad_norm", "accumulated", "stoplossy", "topic"])
def test_auto_refuses_a_name_it_cannot_read_and_states_the_rule(name):
    with pytest.raises(ConfigError) as e:
        resolve_mode("EarlyStopping", name, "auto")
    assert str(e.value) == REFUSED.replace("'learning_rate'", repr(name))


def test_the_hooks_default_to_auto():
    assert stoker.hooks.EarlyStopping("accuracy").watch.mode == "max"
    assert stoker.hooks.EarlyStopping("loss").watch.mode == "min"
    plateau = stoker.hooks.ReduceLROnPlateau("top2")
    assert (plateau.mode, plateau.best) == ("max", -math.inf)
    with pytest.raises(ConfigError, match="ReduceLROnPlateau: mode='auto' cannot tell whether 'lr'"):
        stoker.hooks.ReduceLROnPlateau("lr")


def loop(first: int, losses: list[float], **values: list[float]) -> LoopResult:
    return LoopResult(first, len(losses), first + len(losses), losses, values, 0.0, 0.0, 0)


class Run:
    """The part of a RunContext a Monitor reads."""

    def __init__(self, step: int, log_every_n_steps: int | None = 100) -> None:
        self.global_step = step
        self.info = RunInfo(log_every_n_steps=log_every_n_steps)
        self.last_evaluation = None


def test_a_training_value_is_the_mean_since_the_last_check_at_each_multiple():
    watch = Monitor("EarlyStopping", "loss", source="train", every_n_steps=4)
    run = Run(0)
    assert watch.start(run) is None
    seen = []
    for first, losses in [(0, [1.0, 2.0, 3.0]), (3, [4.0, 5.0, 6.0]), (6, [7.0, 8.0])]:
        run.global_step = first + len(losses)
        seen.append(watch.take(run, loop(first, losses)))
    # the first loop boundary at or past 4 and 8: what ran since the last check
    assert seen == [None, (6, 3.5), (8, 7.5)]


def test_its_partial_sum_is_in_the_state_so_a_resume_checks_the_same_values():
    values = [0.1 * i + 1 / (i + 3) for i in range(12)]
    whole = Monitor("EarlyStopping", "score", "max", source="train", every_n_steps=6)
    run = Run(0)
    whole.start(run)
    checks = []
    for first in range(0, 12, 2):
        run.global_step = first + 2
        checks.append(whole.take(run, loop(first, [0.0, 0.0], score=values[first : first + 2])))

    first_half = Monitor("EarlyStopping", "score", "max", source="train", every_n_steps=6)
    run = Run(0)
    first_half.start(run)
    resumed_checks = []
    for first in (0, 2):
        run.global_step = first + 2
        resumed_checks.append(first_half.take(run, loop(first, [0.0, 0.0], score=values[first : first + 2])))
    state = first_half.state_dict()
    assert state["interval"] == [0, values[0] + values[1] + values[2] + values[3], 4]
    resumed = Monitor("EarlyStopping", "score", "max", source="train", every_n_steps=6)
    assert resumed.load_state_dict(state)
    run = Run(4)
    assert resumed.start(run) is None
    for first in range(4, 12, 2):
        run.global_step = first + 2
        resumed_checks.append(resumed.take(run, loop(first, [0.0, 0.0], score=values[first : first + 2])))
    assert resumed_checks == checks and [c[0] for c in checks if c] == [6, 12]


def test_a_training_value_the_run_lacks_is_named_with_those_it_has(tmp_path):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2)
    hook = stoker.hooks.EarlyStopping("train_accuracy", source="train", every_n_steps=4)
    with pytest.raises(ConfigError) as e:
        est.train(train_input(x, y), max_steps=8, hooks=[hook])
    assert str(e.value) == (
        "EarlyStopping: monitor='train_accuracy' (source='train') is not among the training values "
        "['learning_rate', 'loss'] (the loss and the model_fn's host_call values)"
    )


def test_source_train_needs_an_interval(tmp_path):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2, log_every_n_steps=None)
    with pytest.raises(ConfigError) as e:
        est.train(train_input(x, y), max_steps=8, hooks=[stoker.hooks.EarlyStopping("loss", source="train")])
    assert str(e.value) == (
        "EarlyStopping: source='train' checks every every_n_steps steps (default RunConfig.log_every_n_steps, "
        "None here); give every_n_steps"
    )


def test_a_state_of_another_monitor_is_not_taken(caplog):
    state = stoker.hooks.EarlyStopping("loss", patience=1).state_dict()
    state["wait"], state["best"] = 1, 0.5
    early = stoker.hooks.EarlyStopping("accuracy", patience=1)
    with caplog.at_level("INFO", logger="stoker"):
        early.load_state_dict(state)
    assert (early.wait, early.best) == (0, None)
    assert (
        "EarlyStopping: the checkpoint's state watched 'loss' (source='eval', mode='min'), this run watches "
        "'accuracy' (source='eval', mode='max'): it starts afresh" in caplog.text
    )
