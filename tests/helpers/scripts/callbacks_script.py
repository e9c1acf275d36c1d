"""``train_and_evaluate`` with the callbacks of docs/callbacks.md, run as a real subprocess by
the kill -9 tests in tests/hooks/ and the stop tests of tests/test_stops.py (not a test module).
A stop armed in the environment (helpers/stops.py) is installed before training."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

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
    return hooks


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
    args = p.parse_args()
    install_from_env()
    if args.slow_write:  # widens the window in which a kill lands inside a checkpoint write
        slow_checkpoint_writes(args.slow_write)
    torch.set_num_threads(1)
    x, y = make_data(100)
    ex, ey = make_data(64, seed=1)
    est = make_estimator(
        args.model_dir,
        iterations_per_loop=args.iterations_per_loop,
        save_checkpoints_steps=args.save_every,
        params={"sleep": args.sleep},
        log_every_n_steps=args.log_every,
        keep_best=("accuracy", "max"),
        schedule=not args.plateau,
    )
    est.model_fn = slow_fn
    results = est.train_and_evaluate(
        train_input(x, y),
        eval_input(ex, ey),
        max_steps=args.max_steps,
        eval_every_n_steps=args.eval_every,
        hooks=hooks_from(args),
    )
    print(json.dumps({"global_step": est.global_step, "results": results}), flush=True)


if __name__ == "__main__":
    main()
