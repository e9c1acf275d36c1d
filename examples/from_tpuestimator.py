"""A TPUEstimator program converted to stoker (docs/migration/from-tpuestimator.md).

The TensorFlow program it replaces trained a two-layer MLP on the 8x8 digits with
``TPUEstimator``: a ``model_fn`` returning ``TPUEstimatorSpec`` (``eval_metrics=(metric_fn,
tensors)``, a ``host_call``), ``input_fn(params)`` batching with ``params["batch_size"]``,
``TPUConfig(iterations_per_loop=25)``, a checkpoint every 100 steps, and a Python loop that
alternates ``train`` and ``evaluate``. Here the same program runs on stoker:

    python examples/from_tpuestimator.py [--model_dir DIR] [--max_steps 400]

Checkpoints go to ``--model_dir`` (a new temporary directory when it is not given). Run the
same command again with the same ``--model_dir`` and it resumes from the newest checkpoint;
once ``--max_steps`` is reached a rerun only evaluates, predicts and exports. It prints the
held-out metrics of every evaluation, five predictions and the export directory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import stoker
from stoker.metrics import Accuracy, TopKAccuracy

NUM_TRAIN = 1500


def load_data() -> tuple[tuple[dict, torch.Tensor], tuple[dict, torch.Tensor]]:
    """Digits split 1500 / 297 by a fixed permutation, standardised with the training statistics.
    Features are a dict ``{"x": [N, 64]}``, as the TensorFlow program's feature columns were."""
    digits = load_digits()
    x = digits.data.astype(np.float32)  # [1797, 64], pixel values 0..16
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    train, held_out = order[:NUM_TRAIN], order[NUM_TRAIN:]
    mean, std = x[train].mean(0), x[train].std(0)
    std[std == 0] = 1.0  # a few border pixels are always 0
    x = (x - mean) / std
    return (
        ({"x": torch.from_numpy(x[train])}, torch.from_numpy(y[train])),
        ({"x": torch.from_numpy(x[held_out])}, torch.from_numpy(y[held_out])),
    )


# TensorFlow created the layers inside model_fn; stoker builds the module once, from params,
# after seeding every RNG with RunConfig.seed, and hands it to model_fn.
def build_model(params: dict) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, params["hidden"]),
        nn.ReLU(),
        nn.Linear(params["hidden"], params["hidden"]),
        nn.ReLU(),
        nn.Linear(params["hidden"], 10),
    )


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    logits = model(features["x"])
    if mode == stoker.ModeKeys.PREDICT:
        return stoker.EstimatorSpec(predictions={"class": logits.argmax(-1), "probabilities": logits.softmax(-1)})
    if mode == stoker.ModeKeys.TRAIN:
        # No train_op: stoker runs backward and the optimizer. host_call's dict form is read
        # once per device loop, like TPUEstimator's host_call, without a sync per step.
        loss = F.cross_entropy(logits, labels)
        batch_accuracy = (logits.argmax(-1) == labels).float().mean()
        return stoker.EstimatorSpec(loss=loss, host_call={"batch_accuracy": batch_accuracy.detach()})
    # EVAL: per-example losses and metric updates instead of (metric_fn, tensors), so the
    # padded rows of the last, short batch are masked out and every held-out example counts.
    return stoker.EstimatorSpec(
        loss=F.cross_entropy(logits, labels, reduction="none"),
        eval_metrics={"accuracy": Accuracy()(logits, labels), "top3_accuracy": TopKAccuracy(3)(logits, labels)},
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", help="checkpoints, events and metrics.csv (default: a new temporary directory)")
    parser.add_argument("--max_steps", type=int, default=400, help="train up to this global step; default %(default)s")
    parser.add_argument("--eval_every_n_steps", type=int, default=100, help="evaluate (and checkpoint) every N steps")
    args = parser.parse_args()
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="from_tpuestimator-")

    (x_train, y_train), (x_test, y_test) = load_data()

    # input_fn(params) as in TPUEstimator: params["batch_size"] is the per-replica batch, and
    # ReadOptions.for_replica(params) reads it with this replica's shard (params["context"]'s job).
    train_read = stoker.data.ReadOptions(seed=0)  # reshuffled every epoch, repeats forever
    eval_read = stoker.data.ReadOptions(shuffle=False, num_epochs=1)  # one pass

    def train_input_fn(params: dict) -> stoker.data.ArraySource:
        # Its position is saved in every checkpoint.
        return stoker.data.arrays(x_train, y_train, read=train_read.for_replica(params))

    def eval_input_fn(params: dict) -> stoker.data.ArraySource:
        # 4 batches of 64 and one of 41, which stoker pads to 64 and masks.
        return stoker.data.arrays(x_test, y_test, read=eval_read.for_replica(params))

    est = stoker.Estimator(
        model=build_model,
        model_fn=model_fn,
        optimizer=lambda params, parameters: torch.optim.Adam(parameters, lr=params["learning_rate"]),
        config=stoker.RunConfig(
            model_dir=model_dir,
            iterations_per_loop=25,  # TPUConfig.iterations_per_loop
            save_checkpoints_steps=100,
            keep_checkpoint_max=5,
            keep_best=("accuracy", "max"),  # also keep the best checkpoint by held-out accuracy
            log_every_n_steps=100,
            progress_bar=False,
        ),
        params={"hidden": 128, "learning_rate": 1e-3},
        train_batch_size=64,  # global, as TPUEstimator's; eval and predict default to it
    )

    latest = est.latest_checkpoint()
    print(f"model_dir: {model_dir}" + (f" (resuming from {latest.name})" if latest else " (new run)"))
    start = time.perf_counter()
    metrics = est.train_and_evaluate(
        train_input_fn, eval_input_fn, max_steps=args.max_steps, eval_every_n_steps=args.eval_every_n_steps
    )
    print(
        f"final evaluation at step {metrics['global_step']} ({len(y_test)} held-out examples, "
        f"{time.perf_counter() - start:.1f} s): accuracy {metrics['accuracy']:.4f}, "
        f"top-3 {metrics['top3_accuracy']:.4f}, loss {metrics['loss']:.4f}"
    )

    def predict_input_fn(params: dict) -> stoker.data.ArraySource:
        return stoker.data.arrays({"x": x_test["x"][:5]}, read=eval_read.for_replica(params))

    # No is_padding filter: the 5 rows are padded to the batch of 64 and the padding is removed.
    for i, row in enumerate(est.predict(predict_input_fn)):
        print(
            f"example {i}: predicted {row['class'].item()} (p={row['probabilities'].max().item():.2f}), "
            f"true {y_test[i].item()}"
        )

    # export_savedmodel -> a torch.export program of the PREDICT computation, from the best checkpoint.
    from stoker.export import export

    export_dir = export(est, Path(model_dir) / "export", example_features={"x": x_test["x"][:8]})
    print(f"exported to {export_dir}; rerun with --model_dir {model_dir} to resume")
    return 0


if __name__ == "__main__":
    sys.exit(main())
