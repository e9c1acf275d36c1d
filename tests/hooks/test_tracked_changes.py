"""Trackers record a rerun's changed settings (stoker.config.changes) beside the params the run
started with: ``changed.<step>.<name>`` params, read back through MLflow's client and from W&B's
offline files."""

from __future__ import annotations

import time

import pytest
import torch

import stoker
from helpers.tiny import TinyNet, classifier_fn, make_data, train_input
from stoker.hooks.wandb_logger import offline_files, offline_records

X, Y = make_data(48)


def estimator(model_dir, lr: float, **config):  # noqa: ANN001, ANN003, ANN201
    cfg = dict(model_dir=model_dir, progress_bar=False, iterations_per_loop=2, log_every_n_steps=4, summaries=False)
    return stoker.Estimator(
        model=lambda p: TinyNet(),
        model_fn=classifier_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=p["lr"], momentum=0.9),
        config=stoker.RunConfig(**{**cfg, **config}),
        params={"lr": lr},
        train_batch_size=16,
    )


def test_mlflow_keeps_the_first_params_and_records_each_change_with_its_step(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = stoker.hooks.MLflowLogger(tracking_uri=uri, experiment="tiny", log_checkpoints=False)
    estimator(tmp_path / "m", 0.05).train(train_input(X, Y), max_steps=8, hooks=[first])
    second = stoker.hooks.MLflowLogger(tracking_uri=uri, experiment="tiny", log_checkpoints=False)
    rerun = estimator(tmp_path / "m", 0.2, on_changed_optimizer="apply", log_every_n_steps=2)
    rerun.train(train_input(X, Y), max_steps=12, hooks=[second])
    assert second.run_id == first.run_id
    params = mlflow.tracking.MlflowClient(tracking_uri=uri).get_run(first.run_id).data.params
    assert params["lr"] == "0.05"  # what the run started with
    assert {k: v for k, v in params.items() if k.startswith("changed.")} == {
        "changed.8.lr": "0.2 (was 0.05; applied)",
        "changed.8.RunConfig.log_every_n_steps": "2 (was 4; applied)",
        "changed.8.max_steps": "12 (was 8; applied)",
    }


def test_mlflow_a_rerun_that_fails_before_its_first_checkpoint_logs_the_same_changes_again(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    hook = stoker.hooks.MLflowLogger(tracking_uri=uri, experiment="tiny", log_checkpoints=False)
    estimator(tmp_path / "m", 0.05).train(train_input(X, Y), max_steps=4, hooks=[hook])

    class Dies(stoker.hooks.Hook):
        def after_setup(self, run: stoker.hooks.RunContext) -> None:
            raise RuntimeError("killed before a checkpoint")

    with pytest.raises(RuntimeError):
        rerun = estimator(tmp_path / "m", 0.2, on_changed_optimizer="apply")
        rerun.train(
            train_input(X, Y),
            max_steps=8,
            hooks=[stoker.hooks.MLflowLogger(tracking_uri=uri, log_checkpoints=False), Dies()],
        )
    rerun = estimator(tmp_path / "m", 0.2, on_changed_optimizer="apply")
    rerun.train(
        train_input(X, Y), max_steps=8, hooks=[stoker.hooks.MLflowLogger(tracking_uri=uri, log_checkpoints=False)]
    )
    params = mlflow.tracking.MlflowClient(tracking_uri=uri).get_run(hook.run_id).data.params
    assert params["changed.4.lr"] == "0.2 (was 0.05; applied)" and params["lr"] == "0.05"


def test_wandb_records_each_change_in_the_runs_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    hooks = []
    for lr, max_steps in ((0.05, 4), (0.2, 8)):
        hook = stoker.hooks.WandbLogger(project="tiny", dir=str(tmp_path), log_checkpoints=False)
        estimator(tmp_path / "m", lr, on_changed_optimizer="keep").train(
            train_input(X, Y), max_steps=max_steps, hooks=[hook]
        )
        hooks.append(hook)
    assert hooks[0].run_id == hooks[1].run_id
    config: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while "changed.4.lr" not in config and time.monotonic() < deadline:
        time.sleep(0.2)  # W&B's service process may still be writing the file
        for path in offline_files(tmp_path / "wandb", hooks[0].run_id):
            for record in offline_records(path):
                kind = record.WhichOneof("record_type")
                if kind in ("run", "config"):  # the config wandb.init got, then its updates
                    items = record.run.config.update if kind == "run" else record.config.update
                    config.update({i.key: i.value_json for i in items})
    assert config["changed.4.lr"] == '"0.2 (was 0.05; kept)"'
    assert config["changed.4.max_steps"] == '"8 (was 4; applied)"'
    assert config["lr"] == '"0.05"'  # the run's params, logged as text, as it started
