"""EarlyStopping: Keras' rule, the stop at a step, its checkpointed state, kill -9 and rerun,
and the stop file a watching evaluator writes."""

from __future__ import annotations

import json
import re
import sys

import pytest
from callback_runs import kill_at_random_moments, latest_step, run_to_end

import stoker
from helpers.tiny import eval_input, make_data, make_estimator, train_input
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
    # improvements below the baseline do not reset the count
    assert [early.observe(s, {"accuracy": v}) for s, v in [(1, 0.5), (2, 0.6)]] == [False, True]
    early = EarlyStopping("accuracy", "max", patience=1, baseline=0.5)
    assert not early.observe(1, {"accuracy": 0.6})
    assert early.observe(2, {"accuracy": float("nan")})  # NaN never improves


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"monitor": "loss", "mode": "lower"}, "mode must be one of"),
        ({"monitor": "loss", "patience": 0}, "patience must be an integer >= 1"),
        ({"monitor": "loss", "min_delta": -1}, "min_delta must be a number >= 0"),
        ({"monitor": ""}, "monitor must be"),
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


def test_parse_flag():
    early = EarlyStopping.parse("accuracy:max:4:0.01")
    assert (early.watch.monitor, early.watch.mode, early.patience, early.watch.min_delta) == (
        "accuracy",
        "max",
        4,
        0.01,
    )
    with pytest.raises(ConfigError, match="PATIENCE must be an integer"):
        EarlyStopping.parse("loss:min:x")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))


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
