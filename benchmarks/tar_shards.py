"""Tar shards (the WebDataset layout) against TFRecord shards of the same JPEGs, in one run.

Generates (once; into ``--data`` or a temporary folder) ``--examples`` ImageNet-shaped JPEGs
(500 x 375, quality 90, smooth colour fields plus noise, fixed seed; ``tfrecord_read.py``'s),
converts the same files with ``write_imagenet_tfrecords`` and ``write_image_tar_shards`` into
``--shards`` shards each, then measures in one process, interleaved over ``--rounds`` rounds
(so machine noise hits both alike):

- ``index build`` (cache deleted) and ``index load`` of all the shards, per layout (``TarShards``
  against ``RecordShards``);
- ``read``: every example's image bytes and label by global index in a shuffled order
  (``_encoded``: a ``pread`` of the member vs a ``pread`` with both CRCs and the ``Example`` parse);
- ``batches``: ``tar_shards`` vs ``imagenet_tfrecords`` with the same ``ReadOptions`` and
  ``ImageOptions`` (training, ``crop="tf_cnn"``, ``output="uint8"``, batch 32, 224 px, no
  workers): images/sec of decoded, cropped batches;
- ``resume``: a source jumped to the middle of the data (``load_state_dict``) and its first batch,
  against a batch of a running source: the jump reads nothing before the position.

``--bench`` adds ``stoker bench --model=trivial`` (the input is the work) on either folder,
interleaved, images/sec. Prints medians, the median of the per-round ratios tar/TFRecord (and
their range) and the machine load; on a shared machine compare ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np

from stoker.data import (
    ImageOptions,
    ReadOptions,
    imagenet_tfrecords,
    tar_shards,
    write_image_tar_shards,
    write_imagenet_tfrecords,
)
from stoker.data.images.tar_shards import find_tar_shards
from stoker.data.images.tfrecord import find_shards
from stoker.data.tar_io import INDEX_FOLDER, TarShards
from stoker.data.tfrecord_index import RecordShards

sys.path.insert(0, str(Path(__file__).parent))
from tfrecord_read import make_jpegs  # noqa: E402

BATCH = 32


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prepare(base: Path, examples: int, shards: int) -> tuple[Path, Path]:
    jpegs, records, tars = base / "jpeg", base / "records", base / "tars"
    if not jpegs.exists():
        make_jpegs(jpegs, examples)
    if not records.exists():
        write_imagenet_tfrecords(jpegs, records, num_shards=shards)
    if not tars.exists():
        write_image_tar_shards(jpegs, tars, samples_per_shard=-(-examples // shards))
    for name, folder in (("TFRecord", records), ("tar", tars)):
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        print(f"{name:<8} shards: {len(list(folder.glob('[!.]*')))} files, {size / 2**20:.1f} MiB")
    return records, tars


def sources(records: Path, tars: Path) -> dict[str, Callable[..., object]]:
    image = ImageOptions(image_size=224, crop="tf_cnn", output="uint8")

    def read(**kw: object) -> ReadOptions:
        return ReadOptions(batch_size=BATCH, seed=1, **kw)  # type: ignore[arg-type]

    return {
        "TFRecord": lambda **kw: imagenet_tfrecords(records, read=read(**kw), image=image, num_classes=11),
        "tar": lambda **kw: tar_shards(tars, read=read(**kw), image=image),
    }


def bench_rate(data: Path, batches: int) -> float:
    from stoker.cli import main as stoker_main

    out = io.StringIO()
    with redirect_stdout(out):
        stoker_main(
            [
                "bench",
                "--model=trivial",
                f"--data_dir={data}",
                f"--batch_size={BATCH}",
                f"--num_batches={batches}",
                "--num_warmup_batches=2",
                "--device=cpu",
            ]
        )
    line = next(x for x in out.getvalue().splitlines() if x.startswith("total images/sec:"))
    return float(line.split(":")[1])


def one_round(make: dict[str, Callable[..., object]], folders: dict[str, Path], args: argparse.Namespace) -> dict:
    indexes = {
        "TFRecord": lambda: RecordShards(find_shards(folders["TFRecord"], "train"), progress=False),
        "tar": lambda: TarShards(find_tar_shards(folders["tar"]), progress=False),
    }
    out: dict[str, float] = {}
    for name, new in make.items():
        shutil.rmtree(folders[name] / INDEX_FOLDER, ignore_errors=True)
        out[f"index build {name}"] = timed(indexes[name])
        out[f"index load {name}"] = timed(indexes[name])
        src = new()
        order = np.random.default_rng(1).permutation(src.num_examples).tolist()  # type: ignore[attr-defined]
        read_all = lambda src=src, order=order: [src._encoded(i) for i in order]  # type: ignore[attr-defined]  # noqa: E731
        out[f"read {name}"] = timed(read_all) / len(order)
        it = iter(src)  # type: ignore[call-overload]
        next(it)
        out[f"batches {name}"] = args.batches * BATCH / timed(lambda it=it: [next(it) for _ in range(args.batches)])
        batch_time = timed(lambda it=it: next(it))
        moved = new()
        moved.advance(moved.batches_per_epoch // 2)  # type: ignore[attr-defined]
        half, jumped = moved.state_dict(), new()  # type: ignore[attr-defined]
        resume = timed(lambda j=jumped, s=half: (j.load_state_dict(s), next(iter(j))))  # type: ignore[attr-defined]
        out[f"resume {name}"] = resume / batch_time
        if args.bench:
            out[f"stoker bench {name}"] = bench_rate(folders[name], args.bench)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=6, help="batches timed per round and layout")
    parser.add_argument("--bench", type=int, default=0, help="also time stoker bench over this many batches")
    parser.add_argument("--data", type=Path, default=None, help="keep the generated data here (reused)")
    args = parser.parse_args()
    base = args.data or Path(tempfile.mkdtemp(prefix="stoker-tar-bench-"))
    print(f"load average at start: {os.getloadavg()}")
    records, tars = prepare(base, args.examples, args.shards)
    make = sources(records, tars)
    folders = {"TFRecord": records, "tar": tars}
    rounds = []
    for k in range(args.rounds):
        order = dict(reversed(make.items())) if k % 2 else make  # alternate which goes first
        rounds.append(one_round(order, folders, args))
    per = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    for what, unit, scale in (
        ("index build", "ms for all shards", 1e3),
        ("index load", "ms for all shards", 1e3),
        ("read", "us/example (image bytes + label)", 1e6),
        ("batches", "images/sec (decoded 224 px tf_cnn crops, batch 32, no workers)", 1),
        ("resume", "x a running source's batch time (jump to mid-data + first batch)", 1),
        ("stoker bench", "images/sec (stoker bench --model=trivial)", 1),
    ):
        if f"{what} tar" not in per:
            continue
        tar, tfr = per[f"{what} tar"] * scale, per[f"{what} TFRecord"] * scale
        ratios = sorted(r[f"{what} tar"] / r[f"{what} TFRecord"] for r in rounds)  # per round: both met the same load
        ratio = f"{statistics.median(ratios):5.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
        print(f"{what:<13} tar {tar:9.2f}  TFRecord {tfr:9.2f}  tar/TFRecord {ratio}  {unit}")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
