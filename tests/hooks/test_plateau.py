"""ReduceLROnPlateau: torch's rule on evaluations, the learning rate in the summaries, and the
same reductions (bitwise the same weights) after kill -9."""

from __future__ import annotations

import csv

import pytest
import torch
from callback_runs import kill_at_random_moments, run_to_end

from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.errors import ConfigError
from stoker.hooks import ReduceLROnPlateau

PLATEAU = ("--plateau", "accuracy:max:0.5:0", "--max_steps", "40")


@pytest.mark.parametrize(
    ("mode", "threshold_mode", "cooldown"), [("min", "rel", 0), ("max", "abs", 1), ("min", "abs", 2)]
)
def test_the_rule_is_torchs(mode, threshold_mode, cooldown):
    values = [1.0, 0.9, 0.95, 0.97, 0.89, 0.9, 0.91, 0.92, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    ours_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    theirs_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    ours = ReduceLROnPlateau(
        "m", mode, factor=0.5, patience=1, min_lr=0.01, threshold=0.02, threshold_mode=threshold_mode, cooldown=cooldown
    )
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(
        theirs_opt,
        mode,
        factor=0.5,
        patience=1,
        min_lr=0.01,
        threshold=0.02,
        threshold_mode=threshold_mode,
        cooldown=cooldown,
    )
    for step, v in enumerate(values, 1):
        ours.observe(step, {"m": v}, ours_opt)
        theirs.step(v)
        assert ours_opt.param_groups[0]["lr"] == theirs_opt.param_groups[0]["lr"], step
    assert ours.reductions


def test_bad_arguments():
    with pytest.raises(ConfigError, match=r"factor must be a number in \(0, 1\)"):
        ReduceLROnPlateau("loss", factor=1.5)
    with pytest.raises(ConfigError, match="threshold_mode must be one of"):
        ReduceLROnPlateau("loss", threshold_mode="x")


def test_lowers_the_rate_in_training_and_writes_it_to_the_summaries(tmp_path):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2, schedule=False, log_every_n_steps=2)
    plateau = ReduceLROnPlateau(
        "loss", factor=0.5, patience=0, threshold=10.0, threshold_mode="abs"
    )  # every evaluation after the 1st
    est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=12, eval_every_n_steps=4, hooks=[plateau])
    assert [s for s, _ in plateau.reductions] == [8, 12]
    assert est.state.optimizer.param_groups[0]["lr"] == 0.0025
    with open(tmp_path / "m" / "metrics.csv") as f:
        rates = {int(r["step"]): float(r["value"]) for r in csv.DictReader(f) if r["tag"] == "learning_rate"}
    assert rates[8] == 0.01 and rates[10] == 0.005 and rates[12] == 0.005


def test_a_monitor_the_evaluation_lacks_is_named(tmp_path):
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2)
    with pytest.raises(ConfigError, match=r"monitor='val' is not among the evaluation's metrics \['accuracy'"):
        est.train_and_evaluate(
            train_input(x, y),
            eval_input(x, y),
            max_steps=8,
            eval_every_n_steps=4,
            hooks=[ReduceLROnPlateau("val", "min")],
        )


@pytest.mark.slow
def test_kill_9_anywhere_then_rerun_gives_the_same_rates_and_weights(tmp_path):
    reference, log = run_to_end(tmp_path / "ref", *PLATEAU)
    assert "learning rate now" in log
    killed = tmp_path / "killed"
    kill_at_random_moments(killed, *PLATEAU, times=2, seed=2)
    resumed, _ = run_to_end(killed, *PLATEAU)
    assert resumed == reference
    for name in ("model.safetensors", "train_state.pt"):
        assert (killed / "ckpt-40" / name).exists()
    assert (killed / "ckpt-40" / "model.safetensors").read_bytes() == (
        tmp_path / "ref" / "ckpt-40" / "model.safetensors"
    ).read_bytes()
    ref_state = torch.load(tmp_path / "ref" / "ckpt-40" / "train_state.pt", weights_only=False)
    got_state = torch.load(killed / "ckpt-40" / "train_state.pt", weights_only=False)
    assert got_state["optimizer"]["param_groups"][0]["lr"] == ref_state["optimizer"]["param_groups"][0]["lr"] < 0.01


def plateau_run(model_dir, plateau, max_steps=60):  # noqa: ANN001, ANN201
    x, y = make_data(48)
    est = make_estimator(model_dir, iterations_per_loop=2)
    est.train(train_input(x, y), max_steps=max_steps, hooks=[plateau])
    return est


def test_watches_a_training_value_in_train(tmp_path, caplog):
    plateau = ReduceLROnPlateau("loss", factor=0.5, patience=0, source="train", every_n_steps=6)
    with caplog.at_level("INFO", logger="stoker"):
        est = plateau_run(tmp_path / "m", plateau)
    # the mean training loss per 6 steps falls to 0.870 at 30, then rises (StepLR halves the rate every 7 steps)
    assert plateau.reductions == [(36, [0.00015625]), (42, [3.90625e-05]), (48, [1.953125e-05])]
    said = "ReduceLROnPlateau: the training loss has not improved: learning rate now 0.00015625 (step 36)"
    assert said in caplog.text
    assert est.state.optimizer.param_groups[0]["lr"] == 1.953125e-05 / 4  # StepLR at 49 and 56


@pytest.mark.parametrize("first", [34, 36, 40])
def test_source_train_is_exact_across_a_resume(tmp_path, first):
    def make():  # noqa: ANN202
        return ReduceLROnPlateau("loss", factor=0.5, patience=0, source="train", every_n_steps=6)

    reference = make()
    plateau_run(tmp_path / "ref", reference)
    plateau_run(tmp_path / "resumed", make(), max_steps=first)
    resumed = make()  # a fresh Estimator and hook on the same model_dir
    est = plateau_run(tmp_path / "resumed", resumed)
    assert resumed.state_dict() == reference.state_dict()
    assert resumed.reductions == reference.reductions and est.global_step == 60
    for name in ("model.safetensors", "train_state.pt"):
        assert (tmp_path / "resumed" / "ckpt-60" / name).read_bytes() == (
            tmp_path / "ref" / "ckpt-60" / name
        ).read_bytes()
