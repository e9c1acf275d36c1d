"""``train_and_evaluate`` with the callbacks of docs/callbacks.md, run as a real subprocess by
the kill -9 tests in tests/hooks/, the stop tests of tests/test_stops.py and the fault matrix
(tests/test_fault_matrix.py; not a test module). A stop armed in the environment
(helpers/stops.py) is installed before training.

``--optuna STORAGE`` reports to one trial of the study "callbacks" in that storage (the trial a
stopped run left running, else a new one; one process only), ``--nan_rollback`` poisons two
batches of the training stream that ``NanLossHook(on_nan="rollback")`` rolls back, ``--pipeline
SPLIT`` trains a sequential model in two pipeline stages split before unit ``SPLIT`` (one per
process), ``--async_checkpoints`` writes checkpoints on a background thread,
``--stuck_min_seconds S`` names a stuck replica after S seconds (``RunConfig.stuck_replica``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker  # noqa: E402
from helpers.stops import install_from_env  # noqa: E402
from helpers.stores import slow_checkpoint_writes  # noqa: E402
from helpers.tiny import classifier_fn, eval_input, make_data, make_estimator, train_input  # noqa: E402


def slow_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    if mode == stoker.ModeKeys.TRAIN:
        time.sleep(params["sleep"])  # slows the run so a kill lands mid-way; changes no number
    return classifier_fn(model, features, labels, mode, params)


def hooks_from(args: argparse.Namespace) -> list[stoker.hooks.Hook]:
    hooks: list[stoker.hooks.Hook] = []
    if args.early_stopping:
        monitor, mode, patience, min_delta, *source = args.early_stopping.split(":")
        hooks.append(
            stoker.hooks.EarlyStopping(
                monitor, mode, int(patience), float(min_delta), source=source[0] if source else "eval"
            )
        )
    if args.plateau:
        monitor, mode, factor, patience = args.plateau.split(":")
        hooks.append(stoker.hooks.ReduceLROnPlateau(monitor, mode, float(factor), int(patience)))
    if args.mlflow:
        hooks.append(stoker.hooks.MLflowLogger(tracking_uri=args.mlflow, experiment="callbacks", run_name="tiny"))
    if args.wandb:
        hooks.append(stoker.hooks.WandbLogger(project="callbacks", mode="offline", dir=args.wandb))
    if args.optuna:
        hooks.append(stoker.hooks.OptunaPruning(optuna_trial(args.optuna), "accuracy"))
    if args.nan_rollback:
        hooks.append(stoker.hooks.NanLossHook(on_nan="rollback"))
    return hooks


def optuna_trial(storage: str) -> Any:
    """The trial a stopped run of this study left running (its rerun goes on with it), else a new one."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        storage=storage,
        study_name="callbacks",
        direction="maximize",
        pruner=optuna.pruners.NopPruner(),
        load_if_exists=True,
    )
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    return optuna.trial.Trial(study, running[0]._trial_id) if running else study.ask()


def training_data(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    if not args.nan_rollback:
        return make_data(100)
    # one epoch of batches covers the run: the poisoned ones (of replica 0) come once
    from helpers.rollback import poisoned_data
    from stoker.distributed import torchrun_world_size

    replicas = torchrun_world_size() // (2 if args.pipeline else 1)  # 2 stages: one process per stage
    return poisoned_data((9, 17), batch=16 // replicas, num_shards=replicas, n=16 * (args.max_steps + 8))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--slow_write", type=float, default=0.0, help="seconds each checkpoint file write sleeps first")
    p.add_argument("--early_stopping", default=None, help="MONITOR:MODE:PATIENCE:MIN_DELTA[:SOURCE]")
    p.add_argument("--plateau", default=None, help="MONITOR:MODE:FACTOR:PATIENCE")
    p.add_argument("--mlflow", default=None, help="a tracking URI")
    p.add_argument("--wandb", default=None, help="a directory for W&B's offline run files")
    p.add_argument("--iterations_per_loop", type=int, default=2)
    p.add_argument("--eval_every", type=int, default=4)
    p.add_argument("--save_every", type=int, default=5)
    p.add_argument("--log_every", type=int, default=3)
    p.add_argument("--optuna", default=None, help="an Optuna storage URL: report to a trial of its study")
    p.add_argument("--nan_rollback", action="store_true", help="poisoned batches, rolled back")
    p.add_argument("--pipeline", default=None, help="pipeline stages split before this unit")
    p.add_argument("--async_checkpoints", action="store_true")
    p.add_argument("--stuck_min_seconds", type=float, default=20.0, help="RunConfig.stuck_replica's min_seconds")
    args = p.parse_args()
    install_from_env()
    if args.slow_write:  # widens the window in which a kill lands inside a checkpoint write
        slow_checkpoint_writes(args.slow_write)
    torch.set_num_threads(1)
    x, y = training_data(args)
    ex, ey = make_data(64, seed=1)
    pipeline = {}
    if args.pipeline:
        from helpers.pipeline import make_model

        pipeline = {"model": make_model, "pipeline": stoker.PipelineConfig(split=(args.pipeline,), microbatches=4)}
    est = make_estimator(
        args.model_dir,
        iterations_per_loop=args.iterations_per_loop,
        save_checkpoints_steps=args.save_every,
        params={"sleep": args.sleep},
        log_every_n_steps=args.log_every,
        keep_best=("accuracy", "max"),
        schedule=not args.plateau,
        checkpoint_io=stoker.CheckpointIO(async_save=args.async_checkpoints),
        stuck_replica=stoker.distributed.StuckReplica(min_seconds=args.stuck_min_seconds),
        **pipeline,
    )
    est.model_fn = slow_fn
    hooks = hooks_from(args)
    results = est.train_and_evaluate(
        train_input(x, y),
        eval_input(ex, ey),
        max_steps=args.max_steps,
        eval_every_n_steps=args.eval_every,
        hooks=hooks,
    )
    for hook in hooks:  # the trial is done: the study records its value (as stoker.tune does)
        if isinstance(hook, stoker.hooks.OptunaPruning):
            hook.trial.study.tell(hook.trial, results["accuracy"])
    print(json.dumps({"global_step": est.global_step, "results": results}), flush=True)


if __name__ == "__main__":
    main()
