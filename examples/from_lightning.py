"""A PyTorch Lightning program converted to stoker (docs/migration/from-lightning.md).

The Lightning program it replaces trained a two-layer MLP on the 8x8 digits: a
``LightningModule`` (``training_step`` logging a batch accuracy, ``validation_step`` logging
``val_loss`` and ``val_acc``, ``configure_optimizers`` returning Adam and a per-epoch
``StepLR``), a ``Trainer(max_epochs=20, logger=CSVLogger(...))`` with the callbacks
``ModelCheckpoint(monitor="val_acc", mode="max")`` and ``EarlyStopping(monitor="val_loss",
min_delta=0.005, patience=2)``, and ``fit(..., ckpt_path="last")``. Here the same program
runs on stoker:

    python examples/from_lightning.py [--model_dir DIR] [--max_epochs 20]

Checkpoints go to ``--model_dir`` (a new temporary directory when it is not given). Run the
same command again with the same ``--model_dir`` and it resumes where it stopped (killed
anywhere, it resumes bitwise); a run that stopped early says so and does nothing more. It
prints each run's final evaluation, why it stopped, the best checkpoint and five predictions.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn

import stoker
from stoker.hooks import EarlyStopping
from stoker.metrics import Accuracy

NUM_TRAIN = 1500
BATCH_SIZE = 64
STEPS_PER_EPOCH = NUM_TRAIN // BATCH_SIZE  # 23: training batches are full (the last partial one is dropped)


def load_data() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Digits split 1500 / 297 by a fixed permutation, standardised with the training statistics
    (what the Lightning program's DataModule did in ``setup``)."""
    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    train, held_out = order[:NUM_TRAIN], order[NUM_TRAIN:]
    mean, std = x[train].mean(0), x[train].std(0)
    std[std == 0] = 1.0
    x = (x - mean) / std
    return (
        (torch.from_numpy(x[train]), torch.from_numpy(y[train])),
        (torch.from_numpy(x[held_out]), torch.from_numpy(y[held_out])),
    )


# LightningModule.__init__ built the layers; stoker builds the module once, from params, after
# seeding every RNG with RunConfig.seed (Trainer(deterministic=True) + seed_everything).
def build_model(params: dict) -> nn.Module:
    hidden = params["hidden"]
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


# training_step, validation_step and predict_step in one function, told apart by mode.
def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    logits = model(features)
    if mode == stoker.ModeKeys.PREDICT:
        return stoker.EstimatorSpec(predictions={"class": logits.argmax(-1)})
    if mode == stoker.ModeKeys.TRAIN:
        # return loss -> EstimatorSpec(loss=...): stoker runs backward and the optimizer.
        # self.log("train_acc", ...) -> host_call, read once per device loop (no sync per step).
        loss = F.cross_entropy(logits, labels)
        return stoker.EstimatorSpec(loss=loss, host_call={"train_acc": (logits.argmax(-1) == labels).float().mean()})
    # self.log("val_loss") / self.log("val_acc") -> a per-example loss (averaged over every
    # held-out example, the padded rows of the last batch masked out) and a metric.
    return stoker.EstimatorSpec(
        loss=F.cross_entropy(logits, labels, reduction="none"),
        eval_metrics={"accuracy": Accuracy()(logits, labels)},
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", help="checkpoints, events and metrics.csv (default: a new temporary directory)")
    parser.add_argument("--max_epochs", type=int, default=20, help="Trainer(max_epochs=...); default %(default)s")
    args = parser.parse_args()
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="from_lightning-")
    (x_train, y_train), (x_test, y_test) = load_data()

    # The DataLoaders -> input_fn(params): ReadOptions says how to read (DataLoader(shuffle=...)),
    # for_replica(params) adds the per-replica batch and this replica's shard (the DistributedSampler),
    # and the source's position (epoch, batch) is saved in every checkpoint: a resume is mid-epoch exact.
    train_read = stoker.data.ReadOptions(seed=0)
    eval_read = stoker.data.ReadOptions(shuffle=False, num_epochs=1)

    def train_input_fn(params: dict) -> stoker.data.ArraySource:
        return stoker.data.arrays(x_train, y_train, read=train_read.for_replica(params))

    def eval_input_fn(params: dict) -> stoker.data.ArraySource:
        return stoker.data.arrays(x_test, y_test, read=eval_read.for_replica(params))

    est = stoker.Estimator(
        model=build_model,
        model_fn=model_fn,
        # configure_optimizers -> optimizer= and lr_schedule=; stoker steps a schedule every
        # optimizer step, so Lightning's per-epoch StepLR(step_size=10) counts 10 epochs of steps.
        optimizer=lambda params, parameters: torch.optim.Adam(parameters, lr=params["learning_rate"]),
        lr_schedule=lambda params, opt: torch.optim.lr_scheduler.StepLR(opt, step_size=10 * STEPS_PER_EPOCH, gamma=0.5),
        config=stoker.RunConfig(
            model_dir=model_dir,  # Trainer(default_root_dir=...); resuming is automatic (ckpt_path="last")
            iterations_per_loop=STEPS_PER_EPOCH,
            keep_checkpoint_max=3,
            keep_best=("accuracy", "max"),  # ModelCheckpoint(monitor="val_acc", mode="max")
            log_every_n_steps=STEPS_PER_EPOCH,  # metrics.csv and TensorBoard events: CSVLogger, TensorBoardLogger
            progress_bar=False,
        ),
        params={"hidden": 128, "learning_rate": 1e-3},  # the hparams: handed to build_model, model_fn, optimizer
        train_batch_size=BATCH_SIZE,
    )

    latest = est.latest_checkpoint()
    print(f"model_dir: {model_dir}" + (f" (resuming from {latest.name})" if latest else " (new run)"))
    stopping = EarlyStopping("loss", mode="min", min_delta=0.005, patience=2)  # EarlyStopping(monitor="val_loss", ...)
    # Trainer.fit(max_epochs, check_val_every_n_epoch=1): an evaluation (and a checkpoint) at the
    # step that ends every epoch of the train input (its length: 23 steps).
    metrics = est.train_and_evaluate(
        train_input_fn, eval_input_fn, max_epochs=args.max_epochs, eval_every_n_epochs=1, hooks=[stopping]
    )
    step = metrics["global_step"]
    print(
        f"final evaluation at step {step} (epoch {step // STEPS_PER_EPOCH}): accuracy {metrics['accuracy']:.4f}, "
        f"loss {metrics['loss']:.4f}"
    )
    if stopping.stopped_step is not None:
        print(f"stopped early at step {stopping.stopped_step}: {stopping.reason}")
    best = json.loads((Path(model_dir) / "checkpoint.json").read_text())["best"]
    print(f"best checkpoint: {best['name']} (accuracy {best['value']:.4f})")  # ModelCheckpoint.best_model_path

    def predict_input_fn(params: dict) -> stoker.data.ArraySource:
        return stoker.data.arrays(x_test[:5], read=eval_read.for_replica(params))

    # trainer.predict(model, dataloader) -> est.predict: one dict per example, padding removed.
    predicted = [row["class"].item() for row in est.predict(predict_input_fn)]
    print(f"predicted {predicted}, true {y_test[:5].tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
