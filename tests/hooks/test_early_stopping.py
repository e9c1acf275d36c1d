"""EarlyStopping: Keras' rule, the stop at a step, its checkpointed state, kill -9 and rerun,
and the stop file a watching evaluator writes."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from callback_runs import kill_at_random_moments, latest_step, run_to_end

import stoker
from helpers.tiny import classifier_fn, eval_input, make_data, make_estimator, train_input
from stoker.errors import ConfigError
from stoker.hooks.early_stopping import STOP_FILE, EarlyStopping, read_stop, write_stop

STOPS = ("--early_stopping", "loss:min:2:0.02")  # stops the tiny run at step 24 of 60


def test_the_rule_is_keras():
    early = EarlyStopping("loss", "min", patience=2, min_delta=0.1)
    assert [early.observe(s, {"loss": v}) for s, v in [(1, 1.0), (2, 0.95), (3, 0.8), (4, 0.79), (5, 0.75)]] == [
        False,
        False,
        False,
        False,
        True,
    ]
    assert (early.best, early.best_step, early.stopped_step) == (0.8, 3, 5)
    assert early.observe(6, {"loss": 0.0})  # stopped stays stopped


def test_baseline_and_max_mode():
    early = EarlyStopping("accuracy", "max", patience=2, baseline=0.9)
    # improvements below the baseline do not reset the count, but never stop (Keras 3)
    assert [early.observe(s, {"accuracy": v}) for s, v in [(1, 0.5), (2, 0.6), (3, 0.7), (4, 0.65)]] == [
        False,
        False,
        False,
        True,
    ]
    assert (early.wait, early.best, early.stopped_by) == (4, 0.7, "patience")
    early = EarlyStopping("accuracy", "max", patience=1, baseline=0.5, check_finite=False)
    assert not early.observe(1, {"accuracy": 0.6})
    assert early.observe(2, {"accuracy": float("nan")})  # NaN never improves
    assert early.stopped_by == "patience"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"monitor": "loss", "mode": "lower"}, r"mode must be one of \('auto', 'min', 'max'\); got 'lower'"),
        ({"monitor": "loss", "patience": -1}, "patience must be an integer >= 0; got -1"),
        ({"monitor": "loss", "min_delta": -1}, "min_delta must be a number >= 0"),
        ({"monitor": ""}, "monitor must be the name of an evaluation metric or a training value; got ''"),
        ({"monitor": "loss", "source": "training"}, r"source must be one of \('eval', 'train'\); got 'training'"),
        ({"monitor": "loss", "every_n_steps": 5}, "every_n_steps applies to source='train'"),
        ({"monitor": "loss", "source": "train", "every_n_steps": 0}, "every_n_steps must be an integer >= 1; got 0"),
        ({"monitor": "loss", "check_finite": 1}, "check_finite must be True or False; got 1"),
        ({"monitor": "loss", "stopping_threshold": "0.1"}, "stopping_threshold must be a finite number or None"),
        ({"monitor": "loss", "divergence_threshold": float("inf")}, "divergence_threshold must be a finite number"),
        (
            {"monitor": "loss", "stopping_threshold": 2.0, "divergence_threshold": 1.0},
            "stopping_threshold must be better than divergence_threshold \\(mode='min'\\); got 2 and 1",
        ),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        EarlyStopping(**kwargs)


def test_a_monitor_the_evaluation_lacks_names_those_it_has(tmp_path):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2)
    with pytest.raises(
        ConfigError, match=r"monitor='acc' is not among the evaluation's metrics \['accuracy', 'loss', 'top2'\]"
    ):
        est.train_and_evaluate(
            train_input(x, y),
            eval_input(x, y),
            max_steps=8,
            eval_every_n_steps=4,
            hooks=[stoker.hooks.EarlyStopping("acc")],
        )


def test_stops_in_process_and_a_rerun_does_nothing(tmp_path, caplog):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2, keep_best=("loss", "min"))
    early = EarlyStopping("loss", "min", patience=1, min_delta=10.0)  # the 2nd evaluation stops it
    results = est.train_and_evaluate(
        train_input(x, y), eval_input(x, y), max_steps=40, eval_every_n_steps=4, hooks=[early]
    )
    assert est.global_step == 8 and results["global_step"] == 8 and early.stopped_step == 8
    assert read_stop(tmp_path / "m")["step"] == 8
    index = json.loads((tmp_path / "m" / "checkpoint.json").read_text())
    assert index["latest"] == "ckpt-8" and index["best"]["name"] in ("ckpt-4", "ckpt-8")
    weights = (tmp_path / "m" / "ckpt-8" / "model.safetensors").read_bytes()

    again = make_estimator(tmp_path / "m", iterations_per_loop=2, keep_best=("loss", "min"))
    with caplog.at_level("INFO", logger="stoker"):
        rerun = again.train_and_evaluate(
            train_input(x, y),
            eval_input(x, y),
            max_steps=40,
            eval_every_n_steps=4,
            hooks=[EarlyStopping("loss", "min", patience=1, min_delta=10.0)],
        )
    assert again.global_step == 8 and rerun == {**results, "global_step": 8}
    assert "this run stopped early at step 8" in caplog.text and "eval at step" not in caplog.text
    assert (tmp_path / "m" / "ckpt-8" / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in (tmp_path / "m").glob("ckpt-*")) == ["ckpt-4", "ckpt-8"]


def test_the_stop_file_stops_a_plain_training_run_at_its_next_checkpoint(tmp_path):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2, save_checkpoints_steps=6)
    est.train(train_input(x, y), max_steps=4)
    write_stop(tmp_path / "m", 4, "the evaluator said so")
    assert not list(tmp_path.glob("m/.*tmp"))
    est.train(train_input(x, y), max_steps=40)
    assert est.global_step == 4  # read when training starts
    (tmp_path / "m" / STOP_FILE).unlink()

    class WriteAt(stoker.hooks.Hook):  # the evaluator's write, as it would land mid-run
        def after_loop(self, run, result):
            if run.global_step == 8:
                write_stop(tmp_path / "m", 6, "loss did not improve")

    est.train(train_input(x, y), max_steps=40, hooks=[WriteAt()])
    assert est.global_step == 12 and latest_step(tmp_path / "m") == 12  # stopped at the next checkpoint


@pytest.mark.slow
def test_kill_9_anywhere_then_rerun_stops_at_the_same_step_with_the_same_weights(tmp_path):
    reference, _ = run_to_end(tmp_path / "ref", *STOPS)
    assert reference["global_step"] == 24
    killed = tmp_path / "killed"
    steps = kill_at_random_moments(killed, *STOPS, times=3, seed=1)
    assert min(steps) < 24, steps  # at least one kill landed before the stop
    resumed, _ = run_to_end(killed, *STOPS)
    assert resumed == reference
    assert latest_step(killed) == 24
    ref_w = (tmp_path / "ref" / "ckpt-24" / "model.safetensors").read_bytes()
    assert (killed / "ckpt-24" / "model.safetensors").read_bytes() == ref_w
    assert read_stop(killed) == read_stop(tmp_path / "ref")
    again, log = run_to_end(killed, *STOPS)
    assert again == reference and "this run stopped early at step 24" in log and "eval at step" not in log


@pytest.mark.slow
def test_kill_9_anywhere_with_a_training_value_then_rerun_stops_at_the_same_step(tmp_path):
    watch = ("--early_stopping", "loss:min:2:0:train")  # the mean training loss every 3 steps: stops at 27
    reference, _ = run_to_end(tmp_path / "ref", *watch)
    assert reference["global_step"] == 27
    killed = tmp_path / "killed"
    steps = kill_at_random_moments(killed, *watch, times=3, seed=3)
    assert min(steps) < 27, steps
    resumed, _ = run_to_end(killed, *watch)
    assert resumed == reference and read_stop(killed) == read_stop(tmp_path / "ref")
    assert weights(killed, 27) == weights(tmp_path / "ref", 27)


def test_parse_flag():
    early = EarlyStopping.parse("accuracy:max:4:0.01")
    assert (early.watch.name, early.watch.mode, early.patience, early.min_delta) == ("accuracy", "max", 4, 0.01)
    assert EarlyStopping.parse("top2").watch.mode == "max"  # MODE defaults to auto
    with pytest.raises(ConfigError, match="PATIENCE must be an integer"):
        EarlyStopping.parse("loss:min:x")


def test_a_watching_evaluator_decides_and_writes_the_stop_file(tmp_path):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2, save_checkpoints_steps=4)
    est.train(train_input(x, y), steps=12)  # ckpt-4, 8, 12; no finished.json (no max_steps)
    watcher = make_estimator(tmp_path / "m", iterations_per_loop=2)
    early = EarlyStopping("loss", patience=1, min_delta=10.0)
    result = watcher.evaluate_continuously(
        eval_input(x, y),
        timeout_secs=30,
        poll_secs=0.05,
        order="oldest",
        on_result=early.evaluator_callback(tmp_path / "m"),
    )
    assert result.evaluated == [4, 8, 12] and early.stopped_step == 8
    assert read_stop(tmp_path / "m")["step"] == 8 and "stopped early at step 8" in result.stop_reason
    est.train(train_input(x, y), steps=12)
    assert est.global_step == 12  # the trainer honours it when it starts


def test_stoker_evaluate_early_stopping_picks_up_the_recorded_evaluations(tmp_path):
    from stoker.engine.cli import _early_stopping

    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2, save_checkpoints_steps=4)
    est.train(train_input(x, y), steps=12)
    for step in (4, 8, 12):  # as an evaluator killed after these would have left the index
        assert est.state.checkpoints is not None
        est.state.checkpoints.record_eval(step, {"loss": 1.0})
    on_result = _early_stopping("loss:min:3:10", est)  # 4, 8, 12 replayed: two without improvement
    assert read_stop(tmp_path / "m") is None
    on_result(16, {"loss": 0.5, "global_step": 16})  # the third: stop
    assert read_stop(tmp_path / "m")["step"] == 16


@pytest.mark.slow
def test_stoker_evaluate_watch_early_stopping_stops_stoker_train(tmp_path):
    import subprocess

    from helpers.processes import PYTHON, popen, python_env

    model_dir = tmp_path / "run"
    common = dict(env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watcher = popen(
        [
            PYTHON,
            "-m",
            "stoker",
            "evaluate",
            "--watch",
            str(model_dir),
            "--device",
            "cpu",
            "--timeout_secs",
            "120",
            "--poll_secs",
            "0.05",
            "--order",
            "oldest",
            "--early_stopping",
            "loss:min:1:100",
        ],
        **common,
    )
    trainer = popen(
        [
            PYTHON,
            "-m",
            "stoker",
            "train",
            "charlm",
            "--model_dir",
            str(model_dir),
            "--eval_every_n_steps",
            "0",
            "--corpus_bytes",
            "60000",
            "--max_steps",
            "100000",
            "--save_checkpoints_steps",
            "20",
            "--keep_checkpoint_max",
            "3",
            "--eval_steps",
            "2",
            "--seq_len",
            "8",
            "--mem_len",
            "8",
            "--iterations_per_loop",
            "2",
            "--log_every_n_steps",
            "1000",
        ],
        **common,
    )
    t_out, t_err = trainer.communicate(timeout=600)
    w_out, w_err = watcher.communicate(timeout=600)
    assert trainer.returncode == 0 and watcher.returncode == 0, t_err[-3000:] + w_err[-3000:]
    evaluated = [int(s) for s in re.search(r"evaluated steps \[([\d, ]+)\]", w_out).group(1).split(", ")]
    stop = read_stop(model_dir)
    assert stop is not None and stop["step"] == evaluated[1]  # the 2nd evaluation did not improve by 100
    assert f"{STOP_FILE} says early stopping: loss did not improve" in t_err
    assert f"training stopped early at step {evaluated[1]}" in w_out
    final = json.loads((model_dir / "checkpoint.json").read_text())["latest"]
    assert evaluated[1] <= int(final.split("-")[1]) < 100000  # the trainer stopped at its next checkpoint


# ==================================================================== as Keras and Lightning users expect
def host_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    """The tiny classifier reporting its weights' squared norm each step (``host_call``); from
    7.2 on, as infinity."""
    spec = classifier_fn(model, features, labels, mode, params)
    if mode == stoker.ModeKeys.TRAIN:
        norm = sum((p.detach() ** 2).sum() for p in model.parameters())
        spec.host_call = {"weight_norm": norm, "blown": torch.where(norm < 7.2, norm, torch.inf)}
    return spec


def train_and_evaluate(model_dir, hook, max_steps=60, **config):  # noqa: ANN001, ANN201
    x, y = make_data(48)
    est = make_estimator(model_dir, iterations_per_loop=2, **config)
    est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=max_steps, eval_every_n_steps=4, hooks=[hook])
    return est


def train(model_dir, hook, max_steps=60, **config):  # noqa: ANN001, ANN201
    x, y = make_data(48)
    est = make_estimator(model_dir, iterations_per_loop=2, **config)
    est.model_fn = host_fn
    est.train(train_input(x, y), max_steps=max_steps, hooks=[hook])
    return est


def weights(model_dir, step):  # noqa: ANN001, ANN201
    return (model_dir / f"ckpt-{step}" / "model.safetensors").read_bytes()


def test_train_refuses_hooks_that_act_on_evaluations(tmp_path):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2)
    with pytest.raises(ConfigError) as e:
        est.train(train_input(x, y), max_steps=8, hooks=[EarlyStopping("accuracy")])
    assert str(e.value) == (
        "train: EarlyStopping acts on evaluations, which train() does not make: give it to "
        "train_and_evaluate(train_input_fn, eval_input_fn, max_steps, eval_every_n_steps=N) "
        "(or watch a training value: source='train')"
    )
    with pytest.raises(ConfigError) as e:
        est.train(train_input(x, y), max_steps=8, hooks=[EarlyStopping("loss"), stoker.hooks.ReduceLROnPlateau("loss")])
    assert str(e.value).startswith(
        "train: EarlyStopping and ReduceLROnPlateau act on evaluations, which train() does not make: give them to "
    )

    class Reads(stoker.hooks.Hook):  # a user's hook says so the same way
        needs_evaluations = True

    with pytest.raises(ConfigError) as e:
        est.train(train_input(x, y), max_steps=8, hooks=[Reads()])
    assert str(e.value) == (
        "train: Reads acts on evaluations, which train() does not make: give it to "
        "train_and_evaluate(train_input_fn, eval_input_fn, max_steps, eval_every_n_steps=N)"
    )
    assert not list((tmp_path / "m").glob("ckpt-*"))  # refused before training
    est.train(train_input(x, y), max_steps=4, hooks=[EarlyStopping("loss", source="train", every_n_steps=2)])
    assert est.global_step == 4


def test_train_refuses_optuna_pruning_too(tmp_path):
    optuna = pytest.importorskip("optuna")
    x, y = make_data(48)
    trial = optuna.create_study().ask()
    with pytest.raises(ConfigError, match=r"^train: OptunaPruning acts on evaluations, .*eval_every_n_steps=N\)$"):
        make_estimator(tmp_path / "m").train(
            train_input(x, y), max_steps=8, hooks=[stoker.hooks.OptunaPruning(trial, "loss")]
        )


def test_mode_auto_maximises_accuracy(tmp_path):
    # accuracy 0.5, 0.521 (8), 0.521, 0.5 (16): "min" (the old default) stopped at 12 while it rose
    early = EarlyStopping("accuracy", patience=2)
    est = train_and_evaluate(tmp_path / "m", early)
    assert (est.global_step, early.stopped_step, early.best_step, early.stopped_by) == (16, 16, 8, "patience")
    assert early.reason == (
        "early stopping: accuracy did not improve (max, min_delta 0) in 2 evaluation(s); best 0.520833 at step 8"
    )


def test_patience_0_stops_at_the_first_evaluation_that_does_not_improve(tmp_path):
    early = EarlyStopping("loss", patience=0, min_delta=0.02)  # improves by 0.093, 0.043, 0.029, then 0.018
    est = train_and_evaluate(tmp_path / "m", early)
    assert (est.global_step, early.stopped_step, early.wait) == (20, 20, 1)


def test_stopping_threshold_stops_once_the_metric_is_that_good(tmp_path, caplog):
    early = EarlyStopping("loss", stopping_threshold=0.9)  # eval loss 0.911 at 16, 0.892 at 20
    with caplog.at_level("INFO", logger="stoker"):
        est = train_and_evaluate(tmp_path / "m", early)
    assert (est.global_step, early.stopped_step, early.stopped_by) == (20, 20, "stopping_threshold")
    assert early.reason == "early stopping: loss = 0.892388 reached stopping_threshold 0.9"
    assert f"training stopped at step 20: {early.reason}" in caplog.text
    assert read_stop(tmp_path / "m") == {"step": 20, "reason": early.reason, "by": "EarlyStopping"}
    state = early.state_dict()
    assert (state["stopped_step"], state["stopped_by"], state["reason"]) == (20, "stopping_threshold", early.reason)
    assert state["stopped_value"] == early.best  # reaching it was also the best so far
    # equal is reached: the threshold is "at least this good"
    assert EarlyStopping("loss", stopping_threshold=0.5).decide(1, 0.5)
    assert not EarlyStopping("accuracy", stopping_threshold=0.5).decide(1, 0.4999)


def test_divergence_threshold_stops_once_the_metric_is_worse(tmp_path):
    # the weights' norm per 4 steps: 7.01, 6.80, 6.81, 6.92, 7.01, 7.10, 7.16 (28): above 7.1 at 28
    early = EarlyStopping("weight_norm", "min", patience=100, divergence_threshold=7.1, source="train", every_n_steps=4)
    est = train(tmp_path / "m", early)
    assert (est.global_step, early.stopped_step, early.stopped_by) == (28, 28, "divergence_threshold")
    assert re.fullmatch(
        r"early stopping: training weight_norm = 7\.15\d+ is above divergence_threshold 7\.1", early.reason
    ), early.reason
    assert not EarlyStopping("loss", divergence_threshold=1.0).decide(1, 1.0)  # only worse than it stops


def test_check_finite_stops_at_a_nan_or_infinite_value(tmp_path):
    early = EarlyStopping("blown", "min", patience=100, source="train", every_n_steps=4)
    est = train(tmp_path / "m", early)
    assert (est.global_step, early.stopped_step, early.stopped_by) == (32, 32, "check_finite")
    assert early.reason == "early stopping: training blown = inf is not finite (check_finite)"
    lenient = EarlyStopping("blown", "min", patience=100, check_finite=False, source="train", every_n_steps=4)
    assert train(tmp_path / "n", lenient).global_step == 60  # infinity only never improves
    assert (lenient.stopped_step, lenient.best_step, lenient.wait) == (None, 8, 13)
    nan = EarlyStopping("loss")
    assert not nan.decide(4, 1.0) and nan.decide(8, math.nan) and nan.stopped_by == "check_finite"


def test_source_train_watches_the_mean_training_loss_every_n_steps(tmp_path):
    # the mean training loss over each 6 steps: 1.152, 0.976, 0.930, 0.892, 0.870 (30), 0.870, 0.890 (42)
    early = EarlyStopping("loss", patience=2, source="train", every_n_steps=6)
    est = train(tmp_path / "m", early)
    assert (est.global_step, early.stopped_step, early.best_step) == (42, 42, 30)
    assert early.reason == (
        "early stopping: training loss did not improve (min, min_delta 0) in 2 check(s) of its mean over 6 steps; "
        "best 0.869885 at step 30"
    )
    assert latest_step(tmp_path / "m") == 42 and read_stop(tmp_path / "m")["step"] == 42


class Recorded(EarlyStopping):
    """EarlyStopping that lists every check it takes in."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.checks: list[tuple[int, float]] = []

    def decide(self, step: int, value: float) -> bool:
        self.checks.append((step, value))
        return super().decide(step, value)


@pytest.mark.parametrize(
    ("kwargs", "first"),
    [
        ({"monitor": "loss", "patience": 2}, 28),  # inside the interval of the best check (30)
        ({"monitor": "loss", "patience": 2}, 36),  # at a check
        ({"monitor": "blown", "mode": "min", "patience": 100}, 28),  # inside the interval of the first infinity
    ],
)
def test_source_train_is_exact_across_a_resume(tmp_path, kwargs, first):
    def make():  # noqa: ANN202
        return Recorded(**kwargs, source="train", every_n_steps=6)

    reference = make()
    train(tmp_path / "ref", reference)
    first_part = make()
    train(tmp_path / "resumed", first_part, max_steps=first)
    assert first_part.stopped_step is None
    resumed = make()  # a fresh Estimator and hook on the same model_dir
    est = train(tmp_path / "resumed", resumed)
    assert first_part.checks + resumed.checks == reference.checks  # bitwise the same values at the same steps
    assert est.global_step == reference.stopped_step and resumed.state_dict() == reference.state_dict()
    step = reference.stopped_step
    assert weights(tmp_path / "resumed", step) == weights(tmp_path / "ref", step)


def test_source_train_checks_at_each_multiple_whatever_the_loops(tmp_path):
    reference = Recorded("loss", patience=2, source="train", every_n_steps=6)
    train(tmp_path / "ref", reference)  # loops of 2 steps
    x, y = make_data(48)
    checks = []
    for max_steps in (21, 60):  # loops of 4, a stop between loop boundaries and a resume there
        landed = Recorded("loss", patience=2, source="train", every_n_steps=6)
        est = make_estimator(tmp_path / "m", iterations_per_loop=4)
        est.model_fn = host_fn
        est.train(train_input(x, y), max_steps=max_steps, hooks=[landed])
        checks += landed.checks
    assert [step for step, _ in checks] == [6, 12, 18, 24, 30, 36, 42]  # loops end at each multiple
    assert checks == reference.checks and landed.state_dict() == reference.state_dict()
    assert weights(tmp_path / "m", 42) == weights(tmp_path / "ref", 42)


def test_evaluations_are_exact_across_a_resume(tmp_path):
    def make():  # noqa: ANN202 - eval loss improves by more than 0.01 until 32, not at 36 and 40
        return EarlyStopping("loss", patience=2, min_delta=0.01)

    reference = make()
    train_and_evaluate(tmp_path / "ref", reference)
    assert reference.stopped_step == 40
    train_and_evaluate(tmp_path / "resumed", make(), max_steps=34)
    resumed = make()
    est = train_and_evaluate(tmp_path / "resumed", resumed)
    assert est.global_step == 40 and resumed.state_dict() == reference.state_dict()
    assert weights(tmp_path / "resumed", 40) == weights(tmp_path / "ref", 40)


def test_a_rerun_says_how_to_go_on_and_a_larger_patience_does(tmp_path, caplog):
    def make(patience):  # noqa: ANN001, ANN202 - patience 1 stops at 20, patience 3 at 36
        return EarlyStopping("loss", patience=patience, min_delta=0.02)

    reference = make(3)
    train_and_evaluate(tmp_path / "ref", reference)
    assert reference.stopped_step == 36
    stopped = make(1)
    train_and_evaluate(tmp_path / "m", stopped)
    assert stopped.stopped_step == 20 and read_stop(tmp_path / "m")["step"] == 20
    with caplog.at_level("INFO", logger="stoker"):
        est = train_and_evaluate(tmp_path / "m", make(1))
    assert est.global_step == 20
    assert (
        f"EarlyStopping: this run stopped early at step 20 ({stopped.reason}); nothing more to do: to train on "
        "from here, rerun with patience > 1 (the checks in a row without improvement); or remove EarlyStopping "
        "from hooks= and early_stop.json from the model_dir" in caplog.text
    )
    caplog.clear()
    with caplog.at_level("INFO", logger="stoker"):
        raised = make(3)
        est = train_and_evaluate(tmp_path / "m", raised)
    assert f"the stop at step 20 ({stopped.reason}) does not hold with the settings given now" in caplog.text
    # it goes on from step 20 as the run with patience 3 from the start did
    assert est.global_step == 36 and raised.state_dict() == reference.state_dict()
    assert weights(tmp_path / "m", 36) == weights(tmp_path / "ref", 36)
    assert read_stop(tmp_path / "m") == read_stop(tmp_path / "ref")


def test_a_recorded_stop_is_judged_by_the_settings_given_now(tmp_path, caplog):
    early = EarlyStopping("loss", patience=100, source="train", every_n_steps=6, stopping_threshold=0.9)
    train(tmp_path / "m", early)  # train loss means 0.930 at 18, 0.892 at 24
    assert (early.stopped_step, early.stopped_by) == (24, "stopping_threshold")
    with caplog.at_level("INFO", logger="stoker"):
        train(
            tmp_path / "m", EarlyStopping("loss", patience=100, source="train", every_n_steps=6, stopping_threshold=0.9)
        )
    assert "rerun with a stopping_threshold it has not reached, or none" in caplog.text
    assert read_stop(tmp_path / "m")["step"] == 24
    goes_on = EarlyStopping("loss", patience=2, source="train", every_n_steps=6)  # no threshold: patience stops at 42
    est = train(tmp_path / "m", goes_on)
    assert (est.global_step, goes_on.stopped_step, goes_on.stopped_by) == (42, 42, "patience")
    assert read_stop(tmp_path / "m")["step"] == 42


def test_a_stop_the_evaluator_wrote_is_not_withdrawn_and_says_how_to_go_on(tmp_path, caplog):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2)
    est.train(train_input(x, y), max_steps=8)
    write_stop(tmp_path / "m", 8, "early stopping: loss did not improve", by="evaluator")
    again = make_estimator(tmp_path / "m", iterations_per_loop=2)
    with caplog.at_level("INFO", logger="stoker"):
        again.train(train_input(x, y), max_steps=40, hooks=[EarlyStopping("loss", source="train", every_n_steps=4)])
    assert again.global_step == 8 and read_stop(tmp_path / "m")["by"] == "evaluator"
    assert (
        "training stopped at step 8: this run was stopped early: early_stop.json says early stopping: loss did not "
        "improve (at step 8); to train on, remove early_stop.json from the model_dir" in caplog.text
    )
