"""A training job on ``imagenet_tfrecords`` shards, or ``tar_shards`` where the data holds
``*.tar`` files, read from a local folder or a URL (an S3 bucket on moto), run as a real
subprocess by tests/data/test_object_store_data.py and tests/data/images/test_tar_shards.py (not
a test module); the model and model_fn are in helpers/images.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker  # noqa: E402
from helpers.images import BATCH, IMAGE_SIZE, TinyConv, model_fn  # noqa: E402
from stoker.data.images.tar_shards import find_tar_shards  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data", required=True, help="a folder or URL of train-*-of-* or *.tar shards")
    p.add_argument("--cache", required=True, help="the stream cache folder")
    p.add_argument("--max_steps", type=int, default=24)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    stream = stoker.data.stream.StreamOptions(cache_dir=args.cache)

    source = stoker.data.tar_shards if find_tar_shards(args.data) else stoker.data.imagenet_tfrecords

    def input_fn(params: dict) -> stoker.data.images.EncodedImageSource:
        read = stoker.data.ReadOptions(num_workers=args.workers, seed=3, stream=stream)
        return source(
            args.data,
            num_classes=4,
            read=read.for_replica(params),
            image=stoker.data.ImageOptions(image_size=IMAGE_SIZE),
        )

    config = stoker.RunConfig(
        model_dir=args.model_dir, progress_bar=False, iterations_per_loop=2, save_checkpoints_steps=3
    )
    est = stoker.Estimator(
        model=lambda p: TinyConv(classes=4),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        config=config,
        params={"sleep": args.sleep},
        train_batch_size=BATCH,
    )
    est.train(input_fn, max_steps=args.max_steps)
    print(f"done {est.global_step}", flush=True)


if __name__ == "__main__":
    main()
