"""Input pipeline throughput and checkpoint cost: ``stoker.data.image_folder`` against a plain DataLoader.

Generates (once; into ``--data`` or a temporary folder) a tree of ~2,000 random 64 x 64 JPEGs
in 10 classes (fixed seed), then, interleaved round by round so that machine noise hits
every variant alike, measures batches/sec of

- ``stoker W=n``: ``image_folder`` (training, ``image_size=56``, ``batch_size=64``, ``num_workers=n``)
  iterated directly (decoding threads fill a batch one example at a time and the caller helps,
  worker processes build whole batches; index-based augmentation);
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

``--real`` adds the real-image rows (issue 25): ImageNet-shaped JPEGs (~500x375, quality 90,
smooth content plus mild noise; generated once into ``--real_data``, default
``~/.cache/stoker-bench/imagenet-like-<n>``), batch 32, 224px training crops, side by side in
one run (interleaved rounds):

- ``stoker real W=n``: ``image_folder`` with ``output="uint8"``, ``crop="tf_cnn"``, ``num_workers=n`` (window
  decode, uint8 resize; ``n`` threads with libjpeg-crop, else processes with shared-memory slots:
  ``worker_kind="auto"``), the batch normalised in the main process by
  ``ImagePreprocessor`` (what ``stoker bench`` does in the step on a CPU);
- ``plain real W=n``: what a PyTorch user writes: a ``DataLoader(num_workers=n)`` over a
  Dataset doing Pillow open, random-resized crop + resize (``Image.resize(box=...)``), flip,
  uint8 tensor, default collate, then the uint8 batch normalised in the main process;

with images/sec and the ratio stoker/plain (target >= 2x). ``--decoders`` prints the per-core
table: images/sec on one core of each decoder's full decode and of the training transform
(header, tf_cnn crop box, DCT-scaled decode, resize, flip) per decoder, the Pillow reference
transform, and the training transform on 2 threads against 2 processes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from stoker.data import ImageOptions, ReadOptions, example_uniforms, image_folder
from stoker.data.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TRAIN_DRAWS,
    ImagePreprocessor,
    center_crop_box,
    flip_of,
    random_resized_crop_box,
    sample_distorted_box,
    scan_image_folder,
)
from stoker.data.images.crops import INCEPTION_FLIP_INDEX
from stoker.data.images.decoders import available_decoders, decode_crop_resize, get_decoder

REAL_BATCH = 32
REAL_SIZE = 224

BATCH = 64
IMAGE_SIZE = 56


def decode_rgb(path: str) -> Image.Image:
    """The file decoded to RGB by Pillow, as a plain PyTorch pipeline decodes it."""
    with Image.open(path) as im:
        im.load()
        return im if im.mode == "RGB" else im.convert("RGB")


def augment_image(im: Image.Image, image_size: int, u: np.ndarray | None) -> np.ndarray:
    """The Pillow reference transform: ``image_size`` square uint8 HWC, torchvision's random-resized
    crop and flip from the example's uniforms ``u`` (the evaluation centre crop when ``None``),
    bilinear: what the image sources compute, done the slow, obvious way."""
    width, height = im.size
    if u is None:
        box: tuple[float, float, float, float] = center_crop_box(
            width, height, image_size, int(round(image_size / 0.875))
        )
    else:
        left, top, w, h = random_resized_crop_box(width, height, u)
        box = (left, top, left + w, top + h)
    arr = np.asarray(im.resize((image_size, image_size), Image.Resampling.BILINEAR, box=box))
    if u is not None and u[INCEPTION_FLIP_INDEX] < 0.5:
        arr = arr[:, ::-1]
    return arr


def make_tree(root: Path, classes: int = 10, per_class: int = 200, size: int = 64, seed: int = 0) -> Path:
    """Random JPEGs, written once (a marker file says the tree is complete)."""
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


def make_imagenet_like(root: Path, count: int = 1280, classes: int = 10, seed: int = 0) -> Path:
    """``count`` ImageNet-shaped JPEGs (500x375, quality 90: smooth content plus mild noise, which
    compresses like a photo), written once (a marker file says the tree is complete)."""
    marker = root / f".complete-{count}x{classes}-{seed}"
    if marker.exists():
        return root
    rng = np.random.default_rng(seed)
    for k in range(count):
        folder = root / f"class_{k % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        small = rng.integers(0, 256, (375 // 6, 500 // 6, 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(small).resize((500, 375), Image.Resampling.BICUBIC), dtype=np.int16)
        noisy = np.clip(smooth + rng.integers(-12, 12, smooth.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(folder / f"{k:05d}.jpg", quality=90)
    marker.touch()
    return root


class PlainRealDataset(torch.utils.data.Dataset):
    """The PyTorch user's version: Pillow decode, random-resized crop + resize, flip, uint8 tensor."""

    def __init__(self, root: Path, size: int = REAL_SIZE) -> None:
        _, self.paths, self.labels = scan_image_folder(root, (".jpg",))
        self.size = size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        with Image.open(self.paths[i]) as im:
            im = im.convert("RGB")
            left, top, w, h = random_resized_crop_box(*im.size, [random.random() for _ in range(22)])
            im = im.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
            if random.random() < 0.5:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(im).copy()), int(self.labels[i])


class Normalised:
    """Iterates ``make()``'s uint8 batches and normalises each in this process, as the step would."""

    def __init__(self, source: Iterable[object]) -> None:
        self.source = source
        self.pre = ImagePreprocessor()

    def __iter__(self):  # noqa: ANN204
        while True:  # epochs back to back (stoker's training source never ends; the DataLoader's does)
            for images, labels in self.source:  # type: ignore[misc]
                yield self.pre(images), labels

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()


def stoker_real(root: Path, workers: int) -> Callable[[], Iterable[object]]:
    return lambda: Normalised(
        image_folder(
            root,
            read=ReadOptions(batch_size=REAL_BATCH, num_workers=workers),
            image=ImageOptions(image_size=REAL_SIZE, output="uint8", crop="tf_cnn"),
        )
    )


def plain_real(root: Path, workers: int) -> Callable[[], Iterable[object]]:
    dataset = PlainRealDataset(root)
    return lambda: Normalised(
        torch.utils.data.DataLoader(
            dataset,
            batch_size=REAL_BATCH,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            persistent_workers=workers > 0,  # the baseline's best setting: no worker restart per epoch
        )
    )


def _train_transform(decoder_name: str, data: list[bytes]) -> Callable[[int], object]:
    decoder = get_decoder(decoder_name)
    draws = example_uniforms(0, 0, np.arange(len(data)), TRAIN_DRAWS)

    def one(k: int) -> object:
        u = draws[k % len(data)]
        b = data[k % len(data)]
        w, h = decoder.size(b)
        return decode_crop_resize(b, sample_distorted_box(w, h, u), REAL_SIZE, "bilinear", flip_of(u), decoder=decoder)

    return one


_TABLE_DATA: list[bytes] = []  # the encoded images, inherited by forked pool processes (not pickled per task)


def _chunk(args: tuple[str, range]) -> int:
    torch.set_num_threads(1)
    one = _train_transform(args[0], _TABLE_DATA)
    for k in args[1]:
        one(k)
    return len(args[1])


def decoder_table(root: Path, count: int = 256, rounds: int = 3) -> dict[str, float]:
    """Images/sec on one core (best of ``rounds``) per decoder and transform, and 2 threads vs 2 processes."""
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    _, paths, _ = scan_image_folder(root, (".jpg",))
    data = [Path(p).read_bytes() for p in paths[:count]]
    _TABLE_DATA[:] = data
    rows: dict[str, Callable[[int], object]] = {}
    for name in available_decoders():
        decoder = get_decoder(name)
        rows[f"{name}: full decode"] = lambda k, d=decoder: d.decode(data[k % len(data)])
        rows[f"{name}: train transform"] = _train_transform(name, data)
    pil_u = example_uniforms(0, 0, np.arange(len(data)), 23)
    rows["pillow reference (augment_image)"] = lambda k: augment_image(
        decode_rgb(paths[k % len(data)]), REAL_SIZE, pil_u[k % len(data)]
    )
    best: dict[str, float] = {name: 0.0 for name in rows}
    for _ in range(rounds):  # interleaved: noise hits every row alike
        for name, fn in rows.items():
            start = time.perf_counter()
            for k in range(len(data)):
                fn(k)
            best[name] = max(best[name], len(data) / (time.perf_counter() - start))
    chunks = [range(i, min(i + 32, len(data))) for i in range(0, len(data), 32)]
    for name in available_decoders():
        for kind, pool in (("2 threads", ThreadPoolExecutor), ("2 processes", ProcessPoolExecutor)):
            ctx = {"mp_context": multiprocessing.get_context("fork")} if pool is ProcessPoolExecutor else {}
            with pool(2, **ctx) as ex:  # type: ignore[operator]
                list(ex.map(_chunk, [(name, range(2))] * 2))  # start the workers
                rate_ = 0.0
                for _ in range(rounds):
                    start = time.perf_counter()
                    done = sum(ex.map(_chunk, [(name, c) for c in chunks]))
                    rate_ = max(rate_, done / (time.perf_counter() - start))
            best[f"{name}: train transform, {kind}"] = rate_
    return best


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
        root,
        read=ReadOptions(batch_size=BATCH, num_workers=workers, start_method=start_method),
        image=ImageOptions(image_size=IMAGE_SIZE),
    )


def plain_variant(root: Path, workers: int) -> Callable[[], Iterable[object]]:
    dataset = PlainDataset(root)
    return lambda: torch.utils.data.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, drop_last=True, num_workers=workers
    )


def checkpoint_cost(root: Path) -> tuple[float, int]:
    source = image_folder(root, read=ReadOptions(batch_size=BATCH), image=ImageOptions(image_size=IMAGE_SIZE))
    next(source)
    times = []
    for _ in range(1000):
        start = time.perf_counter()
        text = json.dumps(source.state_dict())
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6, len(text.encode())


def real_rows(args: argparse.Namespace, root: Path) -> dict[str, object]:
    """The real-image rows: stoker vs the plain DataLoader, interleaved, with the ratio."""
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; usable cores {len(os.sched_getaffinity(0))}")
    variants: dict[str, Callable[[], Iterable[object]]] = {}
    for w in args.workers:
        variants[f"stoker real W={w}"] = stoker_real(root, w)
        variants[f"plain real W={w}"] = plain_real(root, w)
    for make in variants.values():
        rate(make, 1)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, make in variants.items():
            rates[name].append(rate(make, args.real_batches)[0] * REAL_BATCH)
    print(
        f"\nreal images: {REAL_SIZE}px training crops of 500x375 JPEGs, batch {REAL_BATCH}, "
        f"{args.real_batches} batches x {args.rounds} rounds, decoder {get_decoder().name}"
    )
    print(f"{'variant':<18}{'images/s':>10}{'stoker/plain':>14}")
    out: dict[str, object] = {}
    for w in args.workers:
        s, p = statistics.median(rates[f"stoker real W={w}"]), statistics.median(rates[f"plain real W={w}"])
        print(f"{f'stoker real W={w}':<18}{s:>10.0f}{s / p:>13.2f}x")
        print(f"{f'plain real W={w}':<18}{p:>10.0f}")
        out[f"stoker real W={w}"], out[f"plain real W={w}"], out[f"real ratio W={w}"] = s, p, s / p
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return out


def print_decoders(root: Path) -> dict[str, float]:
    table = decoder_table(root)
    print(f"\nper-core decode table (images/sec, one process, 1 torch thread; {REAL_SIZE}px training crops):")
    for name, value in table.items():
        print(f"  {name:<44}{value:>8.0f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="folder for the generated JPEG tree (default: a temporary one)")
    parser.add_argument("--batches", type=int, default=30, help="batches timed per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads in the main process")
    parser.add_argument("--startup", action="store_true", help="also time the worker start methods")
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--real", action="store_true", help="also the real-image rows (ImageNet-shaped JPEGs)")
    parser.add_argument("--real_only", action="store_true", help="only the real-image rows (and --decoders)")
    parser.add_argument("--real_data", help="folder of the generated ImageNet-shaped JPEGs (cached)")
    parser.add_argument("--real_count", type=int, default=1280, help="ImageNet-shaped JPEGs to generate")
    parser.add_argument("--real_batches", type=int, default=20, help="batches of 32 timed per real measurement")
    parser.add_argument("--decoders", action="store_true", help="the per-core decoder table")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.real or args.real_only or args.decoders:
        real_root = Path(args.real_data or Path.home() / ".cache" / "stoker-bench" / f"imagenet-like-{args.real_count}")
        start = time.perf_counter()
        make_imagenet_like(real_root, args.real_count)
        print(
            f"real data: {real_root} ({args.real_count} JPEGs 500x375 q90; ready in {time.perf_counter() - start:.1f}s)"
        )
    if args.real_only:
        real_rows(args, real_root)
        if args.decoders:
            print_decoders(real_root)
        return
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
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

    if args.real:
        results.update(real_rows(args, real_root))
    if args.decoders:
        results["decoders"] = print_decoders(real_root)

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
