"""What tf_cnn_benchmarks-style preprocessing costs: ``stoker.data.preprocessing`` on the CPU.

Per batch (``--batch`` x ``--size`` x ``--size`` uint8 images, a smooth colour field with
noise), interleaved round by round so machine noise hits every variant alike, the median
milliseconds of

- ``normalize_images``: the old loader-side cast + normalise (reference);
- ``ImagePreprocessor``: the cast + normalise of ``--nodistortions`` (channels_last output);
- ``ImagePreprocessor distortions``: plus tf_cnn's colour distortions (``--distortions``);

and the per-example host work of a training batch: ``example_uniforms(..., TRAIN_DRAWS)``,
``sample_distorted_box`` for a 500x375 image and ``color_params``.

``run()`` returns a dict; ``main()`` prints it, with the machine load and thread count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from stoker.data.base import example_uniforms
from stoker.data.images import normalize_images
from stoker.data.preprocessing import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TRAIN_DRAWS,
    ImagePreprocessor,
    color_params,
    sample_distorted_box,
)


def _images(batch: int, size: int) -> torch.Tensor:
    rng = np.random.default_rng(0)
    yy, xx = np.meshgrid(np.linspace(0, 1, size), np.linspace(0, 1, size), indexing="ij")
    base = np.stack([xx, yy, 1 - xx * yy], -1) * 255
    return torch.from_numpy(
        np.stack([(base + rng.normal(0, 20, base.shape)).clip(0, 255) for _ in range(batch)]).astype(np.uint8)
    )


def _ms(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def run(*, batch: int = 64, size: int = 224, rounds: int = 7, threads: int = 1) -> dict[str, float]:
    """Median milliseconds per batch of each variant (see the module docstring)."""
    torch.set_num_threads(threads)
    images = _images(batch, size)
    u = example_uniforms(0, 0, np.arange(batch), TRAIN_DRAWS)
    color = torch.from_numpy(color_params(u))
    plain, distorted = ImagePreprocessor(), ImagePreprocessor(distortions=True)
    variants: dict[str, Callable[[], object]] = {
        "normalize_images ms/batch": lambda: normalize_images(images, IMAGENET_MEAN, IMAGENET_STD),
        "ImagePreprocessor ms/batch": lambda: plain(images),
        "ImagePreprocessor distortions ms/batch": lambda: distorted(images, color),
        "example_uniforms(TRAIN_DRAWS) ms/batch": lambda: example_uniforms(0, 1, np.arange(batch), TRAIN_DRAWS),
        "sample_distorted_box ms/batch": lambda: [sample_distorted_box(500, 375, r) for r in u],
        "color_params ms/batch": lambda: color_params(u),
    }
    for fn in variants.values():  # warm-up: allocator, first-call costs
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, fn in variants.items():
            times[k].append(_ms(fn))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"load {os.getloadavg()}, torch threads {args.threads}, batch {args.batch}x{args.size}x{args.size}")
    result = run(batch=args.batch, size=args.size, rounds=args.rounds, threads=args.threads)
    for k, v in result.items():
        print(f"{k:42s} {v:9.2f}")
    base = result["ImagePreprocessor ms/batch"]
    print(f"distortions / no distortions: {result['ImagePreprocessor distortions ms/batch'] / base:.1f}x")


if __name__ == "__main__":
    main()
