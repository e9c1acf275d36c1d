"""Input pipeline throughput and checkpoint cost: ``stoker.data.image_folder`` against a plain DataLoader.

Generates (once; into ``--data`` or a temporary folder) a tree of ~2,000 random 64 x 64 JPEGs
in 10 classes (fixed seed), then, interleaved round by round so that machine noise hits
every variant alike, measures batches/sec of

- ``stoker W=n``: ``image_folder(train=True, image_size=56, batch_size=64, num_workers=n)``
  iterated directly (each worker builds whole batches; index-based augmentation);
- ``plain W=n``: ``torch.utils.data.DataLoader(batch_size=64, shuffle=True, num_workers=n)``
  over a map-style Dataset doing the same Pillow decode and the same augmentation (random
  resized crop + flip, with Python's ``random``) per sample, then ``to_tensor`` + normalise
  per sample and the default collate, as a torchvision pipeline does;

for ``n`` in 0 and 2. Each measurement is ``--batches`` batches after the first one (start-up
is reported on its own). Prints the median of each, the ratio stoker/plain (target >= 1.0x),
and the cost of checkpointing the input position: ``state_dict()`` + ``json.dumps`` per call
(median over 1000, target < 1 ms) and its size (target < 4 KiB). ``--startup`` also times the
worker start methods (iter() to the first batch) for fork, forkserver and spawn.
The machine load (``os.getloadavg()``) is printed at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from stoker.data import image_folder
from stoker.data.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    augment_image,
    decode_rgb,
    scan_image_folder,
)

BATCH = 64
IMAGE_SIZE = 56


def make_tree(root: Path, classes: int = 10, per_class: int = 200, size: int = 64, seed: int = 0) -> Path:
    """Random JPEGs, written once (a marker file says the tree is complete)."""
    from PIL import Image

    marker = root / f".complete-{classes}x{per_class}x{size}-{seed}"
    if marker.exists():
        return root
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class_{c:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            # smooth random content (upsampled noise) compresses like a photo, not like static
            small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
            Image.fromarray(small).resize((size, size), Image.Resampling.BICUBIC).save(
                folder / f"{i:04d}.jpg", quality=90
            )
    marker.touch()
    return root


class PlainDataset(torch.utils.data.Dataset):
    """The per-sample baseline: decode, augment, to tensor, normalise, one example at a time."""

    def __init__(self, root: Path) -> None:
        _, self.paths, self.labels = scan_image_folder(root, (".jpg",))
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        u = [random.random() for _ in range(23)]
        arr = augment_image(decode_rgb(self.paths[i]), IMAGE_SIZE, u)
        x = torch.from_numpy(np.array(arr)).permute(2, 0, 1).float().div_(255)
        return x.sub_(self.mean).div_(self.std), int(self.labels[i])


def rate(make: Callable[[], Iterable[object]], batches: int) -> tuple[float, float]:
    """(batches/sec after the first batch, seconds to the first batch)."""
    start = time.perf_counter()
    source = make()
    it = iter(source)
    next(it)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - start
    close = getattr(source, "close", None)
    if close is not None:
        close()
    del it
    return batches / elapsed, first


def stoker_variant(root: Path, workers: int, start_method: str | None = None) -> Callable[[], Iterable[object]]:
    return lambda: image_folder(
        root, batch_size=BATCH, image_size=IMAGE_SIZE, num_workers=workers, start_method=start_method
    )


def plain_variant(root: Path, workers: int) -> Callable[[], Iterable[object]]:
    dataset = PlainDataset(root)
    return lambda: torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=workers
    )


def checkpoint_cost(root: Path) -> tuple[float, int]:
    source = image_folder(root, batch_size=BATCH, image_size=IMAGE_SIZE)
    next(source)
    times = []
    for _ in range(1000):
        start = time.perf_counter()
        text = json.dumps(source.state_dict())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6, len(text.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="folder for the generated JPEG tree (default: a temporary one)")
    parser.add_argument("--batches", type=int, default=30, help="batches timed per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads in the main process")
    parser.add_argument("--startup", action="store_true", help="also time the worker start methods")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    torch.set_num_threads(args.threads)
    tmp = None
    if args.data:
        root = Path(args.data)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="stoker-jpegs-")
        root = Path(tmp.name)
    start = time.perf_counter()
    make_tree(root)
    print(f"data: {root} (2000 JPEGs, 10 classes, 64x64; ready in {time.perf_counter() - start:.1f}s)")

    variants: dict[str, Callable[[], Iterable[object]]] = {}
    for w in args.workers:
        variants[f"stoker W={w}"] = stoker_variant(root, w)
        variants[f"plain W={w}"] = plain_variant(root, w)
    for make in variants.values():  # warm-up: page cache, first-call costs
        rate(make, 2)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    firsts: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, make in variants.items():
            r, f = rate(make, args.batches)
            rates[name].append(r)
            firsts[name].append(f)

    results: dict[str, object] = {"loadavg_start": os.getloadavg()}
    print(
        f"\nimage_folder train, {IMAGE_SIZE}px crops of 64px JPEGs, batch {BATCH}, {args.batches} batches x "
        f"{args.rounds} rounds, torch {torch.__version__}"
    )
    print(f"{'variant':<13}{'batches/s':>11}{'images/s':>10}{'first batch':>13}{'stoker/plain':>14}")
    for w in args.workers:
        s, p = statistics.median(rates[f"stoker W={w}"]), statistics.median(rates[f"plain W={w}"])
        for name, med in ((f"stoker W={w}", s), (f"plain W={w}", p)):
            first = statistics.median(firsts[name])
            ratio = f"{s / p:>13.2f}x" if name.startswith("stoker") else ""
            print(f"{name:<13}{med:>11.1f}{med * BATCH:>10.0f}{first:>12.2f}s{ratio}")
            results[name] = {"batches_per_sec": med, "all": rates[name], "first_batch_s": first}
        results[f"ratio W={w}"] = s / p

    micros, size = checkpoint_cost(root)
    print(
        f"\ninput state checkpoint: state_dict() + json.dumps = {micros:.1f} us per call (median of 1000), {size} bytes"
    )
    results["checkpoint_us"], results["checkpoint_bytes"] = micros, size

    if args.startup:
        print("\nworker start method, 2 workers: seconds from iter() to the first batch (median of 3)")
        for method in ("fork", "spawn", "forkserver"):
            try:
                # 3 more batches before closing, so that every worker has started
                times = [rate(stoker_variant(root, 2, method), 3)[1] for _ in range(3)]
            except RuntimeError as e:  # e.g. a worker that aborted while being stopped
                print(f"  {method:<11} failed: {e}")
                continue
            print(f"  {method:<11}{statistics.median(times):>7.2f}s   {' '.join(f'{t:.2f}' for t in times)}")
            results[f"startup_{method}"] = times
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
