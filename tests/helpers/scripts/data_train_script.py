"""A training job on ``image_folder`` with worker processes, run as a real subprocess by
tests/test_data_crash.py (not a test module). Also holds the helpers that write small image
trees, shared by the data tests."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stoker  # noqa: E402

IMAGE_SIZE = 16
BATCH = 8


def make_image_tree(
    root: Path, classes: int = 3, per_class: int = 20, size: int = 16, seed: int = 0, fmt: str = "jpg"
) -> Path:
    """``root/class_<c>/img_<i>.<fmt>``: random RGB images, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            pixels[..., c % 3] //= 2  # some class signal for the model to learn
            Image.fromarray(pixels).save(folder / f"img_{i:03d}.{fmt}")
    return root


def make_index_tree(root: Path, classes: int = 3, per_class: int = 7, size: int = 12) -> Path:
    """Lossless PNGs of one flat colour each: example ``k`` (file order) has red = k, green = 7."""
    k = 0
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", (size + i, size), (k, 7, 0)).save(folder / f"img_{i:03d}.png")
            k += 1
    return root


class TinyConv(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x)).mean((2, 3))
        return self.fc(self.drop(h))


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    if params.get("sleep"):
        time.sleep(params["sleep"])  # slows the run so a kill lands mid-way; changes no number
    logits = model(features)
    reduction = "mean" if mode == stoker.ModeKeys.TRAIN else "none"
    return stoker.EstimatorSpec(
        loss=F.cross_entropy(logits, labels, reduction=reduction),
        eval_metrics={"accuracy": stoker.metrics.Accuracy()(logits, labels)},
    )


def make_estimator(model_dir: str | Path | None, sleep: float = 0.0, **config: object) -> stoker.Estimator:
    cfg: dict[str, object] = {
        "model_dir": model_dir,
        "progress_bar": False,
        "iterations_per_loop": 2,
        "save_checkpoints_steps": 3,
        "log_every_n_steps": 5,
    }
    cfg.update(config)
    return stoker.Estimator(
        model=lambda p: TinyConv(),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        config=stoker.RunConfig(**cfg),  # type: ignore[arg-type]
        params={"sleep": sleep},
        train_batch_size=BATCH,
    )


def input_fn(data: str | Path, num_workers: int = 2):  # noqa: ANN201
    def fn(params: dict) -> stoker.data.ImageFolderSource:
        return stoker.data.image_folder(
            data,
            batch_size=params["batch_size"],
            image_size=IMAGE_SIZE,
            num_workers=num_workers,
            num_shards=params["num_replicas"],
            shard_index=params["replica_index"],
            seed=3,
        )

    return fn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--max_steps", type=int, default=40)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    est = make_estimator(args.model_dir, sleep=args.sleep)
    est.train(input_fn(args.data, args.workers), max_steps=args.max_steps)
    print(f"done {est.global_step}", flush=True)


if __name__ == "__main__":
    main()
