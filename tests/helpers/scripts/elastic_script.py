"""A job run by tests/distributed/test_elastic_resume.py as real processes, one per replica (not a
test module): it trains on an id tree (helpers/images.make_id_tree: an example's label is its
index) with random crops, flips and colour distortions, and records what every step trains on,
one JSON line per step and replica: the step, the example ids and their augmented pixels."""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker  # noqa: E402
from helpers.images import TinyConv, model_fn  # noqa: E402
from stoker.hooks import Hook  # noqa: E402

CLASSES = 20  # make_id_tree's examples: one class each
IMAGE_SIZE = 12


class Recorder(Hook):
    """Knows the step a loop trains (one step per loop) and appends what it trains on to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step = 0

    def before_loop(self, run, steps):  # noqa: ANN001
        self.step = run.global_step + 1

    def record(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        pixels = [base64.b64encode(row.contiguous().numpy().tobytes()).decode() for row in features]
        line = json.dumps({"step": self.step, "ids": labels.tolist(), "pixels": pixels})
        with self.path.open("a") as f:  # written before the step ends: a step a kill cuts short is trained again
            f.write(line + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--records", required=True, help="file prefix: <records>-r<rank>.jsonl")
    p.add_argument("--max_steps", type=int, default=14)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--mix", choices=["batch", "example"], help="train on stoker.data.mix(per=...) of two readings")
    args = p.parse_args()
    torch.set_num_threads(1)
    rank = stoker.distributed.torchrun_rank() or 0
    recorder = Recorder(Path(f"{args.records}-r{rank}.jsonl"))

    def recording_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        if mode == stoker.ModeKeys.TRAIN:
            recorder.record(features, labels)
            if args.sleep:
                time.sleep(args.sleep)  # slows the run so a kill lands mid-way; changes no number
        return model_fn(model, features, labels, mode, params)

    est = stoker.Estimator(
        model=lambda params: TinyConv(classes=CLASSES),
        model_fn=recording_fn,
        optimizer=lambda params, parameters: torch.optim.SGD(parameters, lr=0.1, momentum=0.9),
        config=stoker.RunConfig(
            model_dir=args.model_dir,
            iterations_per_loop=1,
            save_checkpoints_steps=2,
            progress_bar=False,
            log_every_n_steps=10**6,
            distributed_timeout=60,
        ),
        train_batch_size=8,  # the global batch, whatever the number of replicas
    )

    def folder(params, seed):  # noqa: ANN001, ANN202
        return stoker.data.image_folder(
            args.data,
            read=stoker.data.ReadOptions(seed=seed, num_workers=args.workers).for_replica(params),
            image=stoker.data.ImageOptions(image_size=IMAGE_SIZE, distortions=True, decoder="pillow"),
        )

    def train_input(params):  # noqa: ANN001, ANN202
        if args.mix:  # two readings of the tree (their own orders and augmentation), mixed 0.6 / 0.4
            return stoker.data.mix({"a": (folder(params, 5), 0.6), "b": (folder(params, 6), 0.4)}, seed=3, per=args.mix)
        return folder(params, 5)

    est.train(train_input, max_steps=args.max_steps, hooks=[recorder])
    est.strategy.teardown()


if __name__ == "__main__":
    main()
