"""A hyper-parameter search with Optuna over a digits classifier, surviving kill -9 (docs/callbacks.md).

Each trial trains a small MLP on the 8x8 digits (scikit-learn's ``load_digits``) with
``train_and_evaluate`` in its own directory ``--model_dir/trial-<N>``, reports its held-out loss
to Optuna after every evaluation (``stoker.hooks.OptunaPruning``: unpromising trials are pruned)
and returns its final held-out loss. The study is kept in ``--storage`` (an Optuna RDB URL):

    python examples/tune_digits.py --trials 6 --storage sqlite:///study.db --model_dir trials

Run the same command again and it reuses the finished trials (it runs only those missing); kill
it at any moment and the rerun resumes the interrupted trial from its newest checkpoint. It
prints every trial and the best one. Needs ``pip install 'stoker[optuna]'`` and scikit-learn.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import stoker
from stoker.tune import finished_trials, run_study

MAX_STEPS = 90
EVAL_EVERY = 30


def load_data() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Digits split 1500 / 297 by a fixed permutation, standardised with the training statistics."""
    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    train, held_out = order[:1500], order[1500:]
    mean, std = x[train].mean(0), x[train].std(0)
    std[std == 0] = 1.0
    x = (x - mean) / std
    return (torch.from_numpy(x[train]), torch.from_numpy(y[train])), (
        torch.from_numpy(x[held_out]),
        torch.from_numpy(y[held_out]),
    )


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    logits = model(features)
    reduction = "mean" if mode == stoker.ModeKeys.TRAIN else "none"
    return stoker.EstimatorSpec(
        loss=F.cross_entropy(logits, labels, reduction=reduction),
        eval_metrics={"accuracy": stoker.metrics.Accuracy()(logits, labels)},
    )


def objective(trial, model_dir: str) -> float:  # noqa: ANN001 - an optuna.Trial
    """One trial: the search space, a run in ``model_dir``, its final held-out loss."""
    params = {
        "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True),
        "hidden": trial.suggest_categorical("hidden", [8, 32, 64]),
    }
    (x, y), (ex, ey) = load_data()
    est = stoker.Estimator(
        model=lambda p: nn.Sequential(nn.Linear(64, p["hidden"]), nn.ReLU(), nn.Linear(p["hidden"], 10)),
        model_fn=model_fn,
        optimizer=lambda p, parameters: torch.optim.Adam(parameters, lr=p["learning_rate"]),
        config=stoker.RunConfig(
            model_dir=model_dir, iterations_per_loop=10, progress_bar=False, log_every_n_steps=None, seed=0
        ),
        params=params,
        train_batch_size=64,
    )
    results = est.train_and_evaluate(
        lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=0).for_replica(p)),
        lambda p: stoker.data.arrays(ex, ey, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p)),
        max_steps=MAX_STEPS,
        eval_every_n_steps=EVAL_EVERY,
        hooks=[stoker.hooks.OptunaPruning(trial, "loss")],
    )
    return results["loss"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=6, help="finished trials the study should have")
    parser.add_argument(
        "--storage", required=True, help="an Optuna RDB URL (sqlite:///study.db) or the path of a SQLite file"
    )
    parser.add_argument("--model_dir", required=True, help="each trial's checkpoints go to MODEL_DIR/trial-<N>")
    parser.add_argument("--sleep", type=float, default=0.0, help=argparse.SUPPRESS)  # tests: slows each trial
    args = parser.parse_args()
    torch.set_num_threads(1)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2)
    study = run_study(
        objective if not args.sleep else _slowed(args.sleep),
        n_trials=args.trials,
        storage=args.storage,
        model_dir=args.model_dir,
        study_name="tune_digits",
        pruner=pruner,
    )
    for t in finished_trials(study):
        print(
            json.dumps(
                {"trial": t.user_attrs["stoker_trial"], "state": t.state.name, "value": t.value, "params": t.params}
            )
        )
    best = study.best_trial
    print(f"best trial {best.user_attrs['stoker_trial']}: loss {best.value:.6f} with {best.params}")
    return 0


def _slowed(seconds: float):  # noqa: ANN202
    import time

    def slow(trial, model_dir: str) -> float:  # noqa: ANN001
        time.sleep(seconds)
        return objective(trial, model_dir)

    return slow


if __name__ == "__main__":
    raise SystemExit(main())
