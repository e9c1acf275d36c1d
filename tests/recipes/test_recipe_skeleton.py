"""The recipe skeleton: a third recipe in a few lines (linear regression on generated data) gets
the command line, run_spec.json, exact resume and the rebuild from its model_dir for free."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn

import stoker
from stoker.recipes.skeleton import Recipe, RecipeConfig, option
from stoker.run_spec import EVAL_INPUT_BUILDERS, RUN_SPEC_BUILDERS, estimator_from_model_dir, eval_input_from_run_spec

# ------------------------------------------------------------------ the whole recipe
KIND = "linreg-test"
X = torch.randn(96, 3, generator=torch.Generator().manual_seed(0))
Y = X @ torch.tensor([1.5, -2.0, 0.5]) + 0.1 * torch.randn(96, generator=torch.Generator().manual_seed(1))


@dataclass(kw_only=True)
class LinRegConfig(RecipeConfig):
    features: int = option(3, "input width")

    def model_params(self) -> dict[str, Any]:
        return {"features": self.features}


def input_fns(config: LinRegConfig):  # noqa: ANN201
    def train_fn(params):  # noqa: ANN001, ANN202
        return stoker.data.arrays(X, Y, read=stoker.data.ReadOptions(seed=config.seed).for_replica(params))

    def eval_fn(params):  # noqa: ANN001, ANN202
        return stoker.data.arrays(X, Y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(params))

    return train_fn, eval_fn


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    pred = model(features).squeeze(-1)
    if mode == stoker.ModeKeys.PREDICT:
        return stoker.EstimatorSpec(predictions={"y": pred})
    err = (pred - labels) ** 2
    if mode == stoker.ModeKeys.TRAIN:
        return stoker.EstimatorSpec(loss=err.mean())
    return stoker.EstimatorSpec(loss=err, eval_metrics={"mse": stoker.metrics.Mean()(err)})


RECIPE = Recipe(
    name=KIND,
    config_class=LinRegConfig,
    help="linear regression on generated data",
    description="Fit y = x . w with one linear layer.",
    model=lambda p: nn.Linear(p["features"], 1),
    model_fn=model_fn,
    input_fns=input_fns,
    optimizer=lambda p, parameters: torch.optim.SGD(parameters, lr=p["lr"], momentum=0.5),
    train_params=("lr",),
    keep_best=("mse", "min"),
    example_features=lambda config: torch.zeros(2, config.features),
)


# ------------------------------------------------------------------ the tests
TINY = dict(
    batch_size=8,
    eval_batch_size=32,
    lr=0.1,
    eval_every_n_steps=4,
    save_checkpoints_steps=4,
    iterations_per_loop=2,
    log_every_n_steps=100,
    device="cpu",
)


@pytest.fixture
def registered():
    """The kind registered for this test only (other tests list the known kinds)."""
    yield RECIPE.register()
    RUN_SPEC_BUILDERS.pop(KIND, None)
    EVAL_INPUT_BUILDERS.pop(KIND, None)


def weights(model_dir) -> dict[str, torch.Tensor]:  # noqa: ANN001
    est, example, spec = estimator_from_model_dir(model_dir)
    est.initialize()
    assert est.global_step == 12 and spec["kind"] == KIND and example.shape == (2, 3)
    return est.model_state_dict()


def test_a_run_stopped_and_resumed_is_bitwise_the_straight_run_and_rebuilds_from_its_model_dir(tmp_path, registered):
    straight = RECIPE.train(LinRegConfig(model_dir=str(tmp_path / "straight"), max_steps=12, **TINY))
    first = RECIPE.train(LinRegConfig(model_dir=str(tmp_path / "cut"), max_steps=6, **TINY))
    resumed = RECIPE.train(model_dir=str(tmp_path / "cut"), max_steps=12, **TINY)  # a second call: resumes
    assert first["global_step"] == 6 and resumed["global_step"] == straight["global_step"] == 12
    assert resumed == straight and straight["mse"] < 0.1
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    spec = json.loads((tmp_path / "cut" / "run_spec.json").read_text())
    assert spec["kind"] == KIND and spec["params"] == {"features": 3}
    assert spec["config"] == {**vars(LinRegConfig(model_dir=str(tmp_path / "cut"), max_steps=12, **TINY))}
    eval_fn, steps = eval_input_from_run_spec(spec, tmp_path / "cut")
    est, _, _ = estimator_from_model_dir(tmp_path / "cut")
    assert steps is None and est.evaluate(eval_fn) == straight  # the same held-out data, the same weights


def test_the_command_line_is_the_config_fields(tmp_path, capsys, registered):
    parser = argparse.ArgumentParser(prog="stoker train linreg-test")
    RECIPE.add_arguments(parser)
    flags = [f"--{k}={v}" for k, v in TINY.items()]
    args = parser.parse_args(["--model_dir", str(tmp_path / "run"), "--max_steps", "4", "--features", "3", *flags])
    assert args.features == 3 and args.lr == 0.1 and args.eval_steps is None
    assert RECIPE.run(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("held-out at step 4: loss = ") and ", mse = " in out  # the default report: every metric
    assert out.rstrip().endswith(f"(model_dir {tmp_path / 'run'})")

    bad = parser.parse_args(["--model_dir", str(tmp_path / "bad"), "--batch_size", "0"])
    assert RECIPE.run(bad) == 2
    assert f"stoker train {KIND}: --batch_size must be >= 1; got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --model_dir is required
        parser.parse_args(["--max_steps", "4"])


def test_a_rerun_with_a_changed_flag_names_the_flag_and_says_what_trained(tmp_path, capsys, caplog, registered):
    caplog.set_level("INFO", logger="stoker")
    parser = argparse.ArgumentParser(prog="stoker train linreg-test")
    RECIPE.add_arguments(parser)
    flags = [f"--{k}={v}" for k, v in TINY.items() if k != "lr"]
    run = ["--model_dir", str(tmp_path / "run"), *flags]
    assert RECIPE.run(parser.parse_args([*run, "--max_steps", "4", "--lr", "0.1"])) == 0
    spec = (tmp_path / "run" / "run_spec.json").read_text()

    assert RECIPE.run(parser.parse_args([*run, "--max_steps", "8", "--lr", "0.2"])) == 1
    assert capsys.readouterr().err == (
        f"stoker train {KIND}: resuming from ckpt-4 (step 4) with changed settings: --lr 0.1 -> 0.2: restoring "
        "ckpt-4 would silently put back its optimizer lr 0.1. To go on: rerun with --lr 0.1, or set "
        "--on_changed_optimizer to 'apply' (train on with the new value from step 4) or 'keep' (with the "
        "checkpoint's)\n"
    )
    assert (tmp_path / "run" / "run_spec.json").read_text() == spec  # the refused rerun left the record alone

    assert (
        RECIPE.run(parser.parse_args([*run, "--max_steps", "8", "--lr", "0.2", "--on_changed_optimizer", "apply"])) == 0
    )
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("changed since")]
    assert said == [
        "changed since ckpt-4: --lr 0.1 -> 0.2: applied from step 4 over the checkpoint's optimizer state "
        "(on_changed_optimizer='apply'; its moments and the schedule's position go on)",
        "changed since ckpt-4: --max_steps 4 -> 8: applied (training goes on to the new value)",
    ]
    assert json.loads((tmp_path / "run" / "run_spec.json").read_text())["config"]["lr"] == 0.2


def test_a_tracker_logs_the_run_spec_of_a_fresh_run_as_params(tmp_path, registered):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    hook = stoker.hooks.MLflowLogger(tracking_uri=uri, log_checkpoints=False)
    RECIPE.train(LinRegConfig(model_dir=str(tmp_path / "run"), max_steps=4, **TINY), hooks=[hook])
    params = MlflowClient(tracking_uri=uri).get_run(hook.run_id).data.params
    # run_spec.json is written in the state phase, before the trackers' after_setup reads it
    assert (params["run_spec.kind"], params["run_spec.params.features"], params["run_spec.config.lr"]) == (
        KIND,
        "3",
        "0.1",
    )
