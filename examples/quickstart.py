"""Quickstart: train, evaluate and predict with stoker, then measure its overhead.

Part 1 trains a small MLP on scikit-learn's bundled digits (8x8 images of the digits 0-9,
1797 examples): 1500 for training, the other 297 held out. It evaluates every 200 steps
(each evaluation is recorded on the checkpoint of that step, and the best one by accuracy is
kept), prints the final held-out accuracy and predicts five held-out digits.

Part 2 runs ``benchmarks/overhead.py --steps 200 --rounds 1 --processes 1``: stoker's training loop against
a hand-written PyTorch loop on a host-bound MLP.

    python examples/quickstart.py [--model_dir runs/quickstart] [--max_steps 600]

Checkpoints go to ``--model_dir``. Rerunning with the same directory resumes from the newest
checkpoint; once ``--max_steps`` is reached a rerun only evaluates and predicts. Give a larger
``--max_steps`` to continue training, or delete the directory to start over.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import stoker
from stoker.metrics import Accuracy, TopKAccuracy

ROOT = Path(__file__).resolve().parents[1]
NUM_TRAIN = 1500


def load_data() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Digits split 1500 / 297 by a fixed permutation, standardised with the training statistics."""
    digits = load_digits()
    x = digits.data.astype(np.float32)  # [1797, 64], pixel values 0..16
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    train, held_out = order[:NUM_TRAIN], order[NUM_TRAIN:]
    mean, std = x[train].mean(0), x[train].std(0)
    std[std == 0] = 1.0  # a few border pixels are always 0
    x = (x - mean) / std
    return (
        (torch.from_numpy(x[train]), torch.from_numpy(y[train])),
        (torch.from_numpy(x[held_out]), torch.from_numpy(y[held_out])),
    )


def build_model(params: dict) -> nn.Module:
    """An MLP built from params: called once by the Estimator, after seeding."""
    layers: list[nn.Module] = []
    width = 64
    for _ in range(params["num_layers"]):
        layers += [nn.Linear(width, params["hidden"]), nn.ReLU(), nn.Dropout(params["dropout"])]
        width = params["hidden"]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    logits = model(features)
    predictions = {"class": logits.argmax(-1), "probabilities": logits.softmax(-1)}
    if mode == stoker.ModeKeys.PREDICT:
        return stoker.EstimatorSpec(predictions=predictions)
    if mode == stoker.ModeKeys.TRAIN:
        return stoker.EstimatorSpec(loss=F.cross_entropy(logits, labels), predictions=predictions)
    # EVAL: per-example losses, so the padded rows of the last, short batch are masked out exactly.
    return stoker.EstimatorSpec(
        loss=F.cross_entropy(logits, labels, reduction="none"),
        predictions=predictions,
        eval_metrics={
            "accuracy": Accuracy()(logits, labels),
            "top3_accuracy": TopKAccuracy(3)(logits, labels),
        },
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", default="runs/quickstart", help="checkpoints, events and metrics.csv")
    parser.add_argument("--max_steps", type=int, default=600, help="train up to this global step")
    args = parser.parse_args()

    (x_train, y_train), (x_test, y_test) = load_data()

    # How to read; for_replica(params) adds what stoker sets: params["batch_size"] (the global
    # batch divided among replicas) and this replica's shard of the data.
    eval_read = stoker.data.ReadOptions(shuffle=False, num_epochs=1)

    def train_input_fn(params: dict) -> stoker.data.ArraySource:
        # Shuffled anew each epoch, repeats forever, checkpointable.
        read = stoker.data.ReadOptions(seed=params["data_seed"])
        return stoker.data.arrays(x_train, y_train, read=read.for_replica(params))

    def eval_input_fn(params: dict) -> stoker.data.ArraySource:
        # One pass: 4 batches of 64 and one of 41, which stoker pads and masks.
        return stoker.data.arrays(x_test, y_test, read=eval_read.for_replica(params))

    est = stoker.Estimator(
        model=build_model,
        model_fn=model_fn,
        optimizer=lambda params, parameters: torch.optim.Adam(parameters, lr=params["learning_rate"]),
        config=stoker.RunConfig(
            model_dir=args.model_dir,
            iterations_per_loop=25,
            save_checkpoints_steps=100,
            keep_best=("accuracy", "max"),
            log_every_n_steps=100,
        ),
        params={"hidden": 128, "num_layers": 2, "dropout": 0.1, "learning_rate": 1e-3, "data_seed": 0},
        train_batch_size=64,
    )

    latest = est.latest_checkpoint()
    if latest is not None:
        print(f"{args.model_dir} already holds {latest.name}: resuming from it")
    start = time.perf_counter()
    results = est.train_and_evaluate(train_input_fn, eval_input_fn, max_steps=args.max_steps, eval_every_n_steps=200)
    seconds = time.perf_counter() - start
    print(
        f"held-out accuracy at step {results['global_step']}: {results['accuracy']:.4f} "
        f"(top-3 {results['top3_accuracy']:.4f}, loss {results['loss']:.4f}, {len(y_test)} examples, {seconds:.1f} s)"
    )

    def predict_input_fn(params: dict) -> stoker.data.ArraySource:
        return stoker.data.arrays(x_test[:5], read=eval_read.for_replica(params))

    for i, row in enumerate(est.predict(predict_input_fn)):
        confidence = row["probabilities"][row["class"]].item()
        print(f"held-out example {i}: predicted {row['class'].item()} (p={confidence:.2f}), true {y_test[i].item()}")
    print(
        f"checkpoints are in {args.model_dir}; rerun the same command to resume (it only evaluates once max_steps "
        "is reached)"
    )

    print(
        "\nstoker's overhead against a hand-written loop (benchmarks/overhead.py --steps 200 --rounds 1 "
        "--processes 1):",
        flush=True,
    )
    bench = [
        sys.executable,
        str(ROOT / "benchmarks" / "overhead.py"),
        "--steps",
        "200",
        "--rounds",
        "1",
        "--processes",
        "1",
    ]
    return subprocess.run(bench, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
