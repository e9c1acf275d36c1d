"""Changed settings on rerun (stoker.config.changes): real reruns into one model_dir with other
values; the exact line each change gets, the refusals, and which value trained, bitwise against
a run with the intended value."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import stoker
from helpers.tiny import TinyNet, classifier_fn, eval_input, make_data, state_equal, train_input
from stoker.checkpoint import load_checkpoint
from stoker.config.changes import RULES, Policy, compare, params_settings
from stoker.engine import model_state
from stoker.errors import CheckpointError, ConfigError
from stoker.hooks import Hook, LoopResult, RunContext

X, Y = make_data()


def estimator(model_dir, *, lr=0.05, batch=16, eval_batch=None, schedule=None, width=16, params=None, **config):  # noqa: ANN001, ANN003, ANN201
    """A tiny classifier; SGD with momentum at ``params["lr"]`` (so the optimizer state holds the rate)."""
    cfg = dict(model_dir=model_dir, progress_bar=False, iterations_per_loop=4, log_every_n_steps=None, summaries=False)
    cfg.update(config)
    return stoker.Estimator(
        model=lambda p: TinyNet(width=width, dropout=p.get("dropout", 0.2)),
        model_fn=classifier_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=p["lr"], momentum=0.9),
        lr_schedule=schedule,
        config=stoker.RunConfig(**cfg),
        params={"lr": lr, **(params or {})},
        train_batch_size=batch,
        eval_batch_size=eval_batch,
    )


def train(est: stoker.Estimator, max_steps: int) -> stoker.Estimator:
    return est.train(train_input(X, Y), max_steps=max_steps)


class StopAt(Hook):
    """Stops training at a step, as a kill would, without changing the command's max_steps."""

    def __init__(self, step: int) -> None:
        self.due_step = step

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        run.request_stop("stopped for the test")


@pytest.fixture
def lines(caplog):  # noqa: ANN001, ANN201
    """The stoker log lines about changed settings, as ``(level, message)``."""
    caplog.set_level(logging.INFO, logger="stoker")

    def changed() -> list[tuple[str, str]]:
        return [(r.levelname, r.getMessage()) for r in caplog.records if r.getMessage().startswith("changed since")]

    return changed


def test_every_run_config_field_has_a_rule():
    fields = {f"RunConfig.{f.name}" for f in dataclasses.fields(stoker.RunConfig)}
    assert fields <= RULES.keys(), sorted(fields - RULES.keys())
    assert {k for k in RULES if not k.startswith("RunConfig.")} == {
        "params",
        "optimizer",
        "optimizer.type",
        "lr_schedule",
        "lr_schedule.lr",
        "train_batch_size",
        "eval_batch_size",
        "max_steps",
        "eval_every_n_steps",
        "eval_steps",
    }


def test_the_same_command_says_nothing_and_resumes_bitwise(tmp_path, lines):
    ref = train(estimator(tmp_path / "ref"), 40)
    estimator(tmp_path / "run").train(train_input(X, Y), max_steps=40, hooks=[StopAt(20)])
    assert estimator(tmp_path / "run").latest_checkpoint().name == "ckpt-20"
    again = train(estimator(tmp_path / "run"), 40)
    assert state_equal(ref.model, again.model)
    assert lines() == []


def test_a_changed_lr_is_refused_by_default_and_nothing_trains(tmp_path):
    first = train(estimator(tmp_path), 20)
    rerun = estimator(tmp_path, lr=0.2)
    with pytest.raises(ConfigError) as error:
        train(rerun, 40)
    assert str(error.value) == (
        'resuming from ckpt-20 (step 20) with changed settings: params["lr"] 0.05 -> 0.2: restoring ckpt-20 '
        'would silently put back its optimizer lr 0.05. To go on: rerun with params["lr"] 0.05, or set '
        "RunConfig.on_changed_optimizer to 'apply' (train on with the new value from step 20) or 'keep' (with "
        "the checkpoint's)"
    )
    assert rerun.latest_checkpoint().name == "ckpt-20" and rerun.global_step == 0
    assert state_equal(first.model, estimator(tmp_path).initialize().model)


def test_keep_trains_on_with_the_checkpoints_lr_bitwise_and_says_so(tmp_path, lines):
    ref = train(estimator(tmp_path / "ref"), 40)
    train(estimator(tmp_path / "run"), 20)
    kept = train(estimator(tmp_path / "run", lr=0.2, on_changed_optimizer="keep"), 40)
    assert lines() == [
        (
            "WARNING",
            'changed since ckpt-20: params["lr"] 0.05 -> 0.2: the checkpoint\'s 0.05 trains on (its optimizer '
            "state is restored; on_changed_optimizer='keep')",
        ),
        ("INFO", "changed since ckpt-20: max_steps 20 -> 40: applied (training goes on to the new value)"),
    ]
    assert kept.state.optimizer.param_groups[0]["lr"] == 0.05
    assert state_equal(ref.model, kept.model)
    # The checkpoints go on recording what trained: the same rerun is refused again, not silently kept.
    with pytest.raises(ConfigError, match=r'params\["lr"\] 0.05 -> 0.2'):
        train(estimator(tmp_path / "run", lr=0.2), 60)


def test_apply_trains_on_with_the_new_lr_bitwise_as_a_run_that_changed_it_at_that_step(tmp_path, lines):
    # The intended run: 20 steps at 0.05, then the rate set to 0.2 in the same process.
    ref = train(estimator(tmp_path / "ref"), 20)
    ref.state.optimizer.param_groups[0]["lr"] = 0.2
    train(ref, 40)
    train(estimator(tmp_path / "run"), 20)
    applied = train(estimator(tmp_path / "run", lr=0.2, on_changed_optimizer="apply"), 40)
    assert lines()[0] == (
        "INFO",
        'changed since ckpt-20: params["lr"] 0.05 -> 0.2: applied from step 20 over the checkpoint\'s optimizer '
        "state (on_changed_optimizer='apply'; its moments and the schedule's position go on)",
    )
    assert state_equal(ref.model, applied.model)
    assert not state_equal(train(estimator(tmp_path / "plain"), 40).model, applied.model)
    # Later checkpoints record 0.2: the same command again is a plain resume.
    again = train(estimator(tmp_path / "run", lr=0.2), 44)
    assert again.state.optimizer.param_groups[0]["lr"] == 0.2


def test_safe_settings_apply_with_one_line_each_and_resume_stays_bitwise(tmp_path, lines):
    ref = train(estimator(tmp_path / "ref"), 40)
    train(estimator(tmp_path / "run"), 20)
    changed = estimator(
        tmp_path / "run", iterations_per_loop=5, keep_checkpoint_max=2, save_checkpoints_steps=10, eval_batch=32
    )
    train(changed, 40)
    assert lines() == [
        ("INFO", "changed since ckpt-20: RunConfig.iterations_per_loop 4 -> 5: applied (loops group the same steps)"),
        (
            "INFO",
            "changed since ckpt-20: RunConfig.save_checkpoints_steps None -> 10: applied (checkpoints follow the "
            "new cadence)",
        ),
        (
            "INFO",
            "changed since ckpt-20: RunConfig.save_checkpoints_secs 600.0 -> None: applied (checkpoints follow the "
            "new cadence)",
        ),
        (
            "INFO",
            "changed since ckpt-20: RunConfig.keep_checkpoint_max 5 -> 2: applied (the next checkpoint keeps the "
            "new number)",
        ),
        ("INFO", "changed since ckpt-20: eval_batch_size 16 -> 32: applied (evaluation is exact at any batch size)"),
        ("INFO", "changed since ckpt-20: max_steps 20 -> 40: applied (training goes on to the new value)"),
    ]
    assert state_equal(ref.model, changed.model)
    assert sorted(p.name for p in (tmp_path / "run").glob("ckpt-*")) == ["ckpt-30", "ckpt-40"]


def test_train_and_evaluate_records_its_evaluation_settings_for_its_own_training_only(tmp_path, lines):
    est = estimator(tmp_path)
    est.train_and_evaluate(train_input(X, Y), eval_input(X[:32], Y[:32]), max_steps=8, eval_every_n_steps=4)
    assert load_checkpoint(tmp_path / "ckpt-8").train_state["settings"]["eval_every_n_steps"] == 4
    train(est, 12)  # a plain train after it records no evaluation settings
    assert "eval_every_n_steps" not in load_checkpoint(tmp_path / "ckpt-12").train_state["settings"]
    rerun = estimator(tmp_path / "run")
    rerun.train_and_evaluate(train_input(X, Y), eval_input(X[:32], Y[:32]), max_steps=8, eval_every_n_steps=4)
    estimator(tmp_path / "run").train_and_evaluate(
        train_input(X, Y), eval_input(X[:32], Y[:32]), max_steps=12, eval_every_n_steps=6, eval_steps=1
    )
    assert lines() == [
        ("INFO", "changed since ckpt-8: max_steps 8 -> 12: applied (training goes on to the new value)"),
        (
            "INFO",
            "changed since ckpt-8: eval_every_n_steps 4 -> 6: applied (evaluations follow the new cadence from the "
            "resumed step)",
        ),
    ]


def test_seed_batch_size_and_accumulation_are_refused_naming_each(tmp_path):
    train(estimator(tmp_path), 20)
    with pytest.raises(ConfigError) as error:
        train(estimator(tmp_path, seed=1, batch=32, gradient_accumulation_steps=2), 40)
    assert str(error.value) == (
        "resuming from ckpt-20 (step 20) with changed settings: RunConfig.seed 0 -> 1: the checkpoint's weights "
        "and random streams come from its seed; RunConfig.gradient_accumulation_steps 1 -> 2: the checkpoint's "
        "input position counts micro-batches of its size; train_batch_size 16 -> 32: the checkpoint's input "
        "position counts batches of its size. To go on: rerun with RunConfig.seed 0, "
        "RunConfig.gradient_accumulation_steps 1, train_batch_size 16, or start a new model_dir from these "
        "weights (warm_start_from)"
    )


def test_a_changed_param_is_given_and_a_model_that_no_longer_fits_names_it(tmp_path, lines):
    train(estimator(tmp_path, params={"dropout": 0.2}), 20)
    rerun = train(estimator(tmp_path, params={"dropout": 0.5}), 24)
    assert lines()[0] == (
        "INFO",
        'changed since ckpt-20: params["dropout"] 0.2 -> 0.5: handed to model, model_fn, input_fn, optimizer and '
        "lr_schedule as given",
    )
    assert rerun.model.drop.p == 0.5
    with pytest.raises(CheckpointError) as error:
        train(estimator(tmp_path, params={"dropout": 0.5, "width": 32}, width=32), 28)
    assert str(error.value).endswith('. Changed since it was written: params["width"] (not given) -> 32')


def test_a_schedule_setting_in_its_state_is_refused_kept_or_applied(tmp_path, lines):
    def step_lr(size):  # noqa: ANN001, ANN202
        return lambda p, o: torch.optim.lr_scheduler.StepLR(o, step_size=size, gamma=0.5)

    ref = train(estimator(tmp_path / "ref", schedule=step_lr(7)), 40)
    train(estimator(tmp_path / "run", schedule=step_lr(7)), 20)
    with pytest.raises(ConfigError, match="lr_schedule.step_size 7 -> 3: restoring ckpt-20 would silently put back"):
        train(estimator(tmp_path / "run", schedule=step_lr(3)), 40)
    kept = train(estimator(tmp_path / "run", schedule=step_lr(3), on_changed_optimizer="keep"), 40)
    assert kept.state.schedule.step_size == 7 and state_equal(ref.model, kept.model)
    applied = train(estimator(tmp_path / "run", schedule=step_lr(3), on_changed_optimizer="apply"), 44)
    assert applied.state.schedule.step_size == 3
    assert lines()[-1][1].startswith("changed since ckpt-40: lr_schedule.step_size 7 -> 3: applied from step 40")


def test_a_lambda_schedule_is_code_the_resumed_step_takes_its_rate_from_this_runs_function(tmp_path, lines):
    def factor(length: int):  # noqa: ANN202
        return lambda step: min(1.0, (step + 1) / length)

    def warmup(length):  # noqa: ANN001, ANN202
        return lambda p, o: torch.optim.lr_scheduler.LambdaLR(o, factor(length))

    ref = train(estimator(tmp_path / "ref", schedule=warmup(30)), 40)
    train(estimator(tmp_path / "same", schedule=warmup(30)), 20)
    same = train(estimator(tmp_path / "same", schedule=warmup(30)), 40)
    assert state_equal(ref.model, same.model) and lines() == [
        ("INFO", "changed since ckpt-20: max_steps 20 -> 40: applied (training goes on to the new value)")
    ]
    train(estimator(tmp_path / "run", schedule=warmup(30)), 20)
    rerun = estimator(tmp_path / "run", schedule=warmup(60)).initialize()
    assert rerun.state.optimizer.param_groups[0]["lr"] == 0.05 * factor(60)(20)  # the new function at step 20
    assert lines()[-1] == (
        "INFO",
        f"changed since ckpt-20: the lr_schedule's rate {0.05 * factor(30)(20)} -> {0.05 * factor(60)(20)}: "
        "applied (the rate the lr_schedule function gives at the resumed step; it runs as given)",
    )
    # lr applied under a schedule moves its base: the resumed step runs at the new base's rate
    applied = estimator(tmp_path / "run", lr=0.2, schedule=warmup(30), on_changed_optimizer="apply").initialize()
    assert applied.state.schedule.base_lrs == [0.2]
    assert applied.state.optimizer.param_groups[0]["lr"] == 0.2 * factor(30)(20)


def test_a_static_loss_scale_is_used_as_given(tmp_path, lines):
    fp16 = dict(precision="fp16", device="cpu", loss_scale=128.0)
    train(estimator(tmp_path, **fp16), 8)
    rerun = estimator(tmp_path, **{**fp16, "loss_scale": 64.0}).initialize()
    assert rerun.state.precision.scaler.scale == 64.0
    assert lines()[0][1].startswith("changed since ckpt-8: RunConfig.loss_scale {'dynamic': False, 'init': 128.0")


def test_a_checkpoint_without_settings_resumes_without_a_comparison(tmp_path, lines, monkeypatch):
    written = model_state._train_state
    monkeypatch.setattr(model_state, "_train_state", lambda *a: {**written(*a), "settings": None})
    train(estimator(tmp_path), 20)
    monkeypatch.undo()
    train(estimator(tmp_path, lr=0.2), 24)  # as before settings were recorded: the checkpoint's lr, unsaid
    assert lines() == []


def test_compare_merges_a_param_with_the_optimizer_setting_it_set():
    recorded = {**params_settings({"lr": 0.05, "wd": 0.1}), "optimizer.lr": 0.05, "optimizer.group1.lr": 0.05}
    current = {**params_settings({"lr": 0.2, "wd": 0.1}), "optimizer.lr": 0.2, "optimizer.group1.lr": 0.2}
    [change] = compare(recorded, current, on_changed_optimizer="apply")
    assert (change.key, tuple(c.key for c in change.also), change.rule.policy, change.outcome) == (
        "params.lr",
        ("optimizer.lr", "optimizer.group1.lr"),
        Policy.OPTIMIZER,
        "applied",
    )
    assert change.name({"params.lr": "--lr"}) == "--lr" and change.tracker_name == "lr"


def test_a_long_param_is_recorded_by_its_digest_and_a_function_not_at_all():
    recorded = params_settings({"vocab": list(range(300)), "name": "x", "fn": print, "nested": {"a": 1}})
    assert recorded == {
        "params.vocab": "<300 items, sha256 3b5f74133aec836d>",
        "params.name": "x",
        "params.nested.a": 1,
    }
    [change] = compare(
        recorded,
        params_settings({"vocab": list(range(301)), "name": "x", "nested": {"a": 1}}),
        on_changed_optimizer="refuse",
    )
    assert (change.key, change.outcome) == ("params.vocab", "given")


def test_a_rate_the_optimizer_holds_as_a_float32_tensor_is_still_the_params():
    f32 = float(torch.tensor(0.01)), float(torch.tensor(0.02))
    recorded = {**params_settings({"lr": 0.01}), "optimizer.lr": f32[0]}
    [change] = compare(recorded, {**params_settings({"lr": 0.02}), "optimizer.lr": f32[1]}, on_changed_optimizer="keep")
    assert (change.key, change.old, change.new, change.outcome) == ("params.lr", 0.01, 0.02, "kept")
    assert [(c.key, c.old) for c in change.restored] == [("optimizer.lr", f32[0])]
