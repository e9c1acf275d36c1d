"""TFRecord reading cost: index build, record read (both checksums) and ``tf.train.Example`` parse.

Generates (once; into ``--data`` or a temporary folder) ``--examples`` ImageNet-shaped JPEGs
(500 x 375, Pillow quality 90, smooth random colour fields plus noise, fixed seed), converts
them with ``stoker.data.write_imagenet_tfrecords`` into one shard, then measures, in one
process (so per core), interleaved over ``--rounds`` rounds:

- ``index build``: the shard's offset index from scratch (cache deleted) and ``index load``
  (read back from ``.stoker-index``);
- ``read``: every record by global index in a shuffled order (one ``pread``, both CRCs);
- ``read+parse``: the same plus ``parse_imagenet_example`` (protobuf's runtime, stoker's
  private-pool ``Example``): examples/sec;
- ``parse (tfrecord pkg)``: ``Example.FromString`` with the ``tfrecord`` package's
  ``example_pb2`` (when importable) against stoker's on the same bytes;
- ``read+parse+decode``: plus a full Pillow decode to RGB, for scale.

Prints medians and the machine load. Figures on a shared machine are noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from stoker.data import write_imagenet_tfrecords
from stoker.data.images.tfrecord import find_shards, parse_imagenet_example
from stoker.data.tfrecord_index import INDEX_FOLDER, RecordShards
from stoker.data.tfrecord_io import example_class


def make_jpegs(root: Path, n: int, classes: int = 10, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        folder = root / f"n{i % classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        small = Image.fromarray(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)).resize((500, 375), Image.BICUBIC)
        pixels = np.asarray(small, dtype=np.int16) + rng.integers(-12, 13, (375, 500, 3), dtype=np.int16)
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{i:06d}.JPEG", quality=90)


def timed(fn, *args) -> float:  # noqa: ANN001
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data", type=Path, default=None, help="keep the generated data here (reused)")
    args = parser.parse_args()
    base = args.data or Path(tempfile.mkdtemp(prefix="stoker-tfrecord-bench-"))
    jpegs, records = base / "jpeg", base / "records"
    print(f"load average at start: {os.getloadavg()}")
    if not jpegs.exists():
        start = time.perf_counter()
        make_jpegs(jpegs, args.examples)
        print(f"generated {args.examples} JPEGs in {time.perf_counter() - start:.1f} s")
    if not records.exists():
        start = time.perf_counter()
        write_imagenet_tfrecords(jpegs, records, num_shards=1)
        print(f"wrote the shard in {time.perf_counter() - start:.2f} s")
    shard = find_shards(records, "train")[0]
    print(f"shard: {shard.stat().st_size / 2**20:.1f} MiB, {args.examples} examples")

    shards = RecordShards([shard], progress=False)
    n = len(shards)
    order = np.random.default_rng(1).permutation(n).tolist()
    raw = [shards.read(i) for i in range(n)]
    ours = example_class()
    try:
        from tfrecord import example_pb2 as theirs_pb2  # the tfrecord package, only for comparison

        theirs = theirs_pb2.Example
    except ImportError:
        theirs = None

    def build() -> None:
        shutil.rmtree(records / INDEX_FOLDER, ignore_errors=True)
        RecordShards([shard], progress=False)

    def load() -> None:
        RecordShards([shard], progress=False)

    def read() -> None:
        for i in order:
            shards.read(i)

    def read_parse() -> None:
        for i in order:
            parse_imagenet_example(shards.read(i), "x")

    def parse_with(cls) -> None:  # noqa: ANN001
        for data in raw:
            cls.FromString(data).features.feature["image/encoded"].bytes_list.value[0]

    def read_parse_decode() -> None:
        for i in order[:200]:
            example = parse_imagenet_example(shards.read(i), "x")
            with Image.open(io.BytesIO(example.data)) as im:
                im.convert("RGB")

    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        variants = {
            "index build": (build, 1),
            "index load": (load, 1),
            "read": (read, n),
            "read+parse": (read_parse, n),
            "parse (stoker Example)": (lambda: parse_with(ours), n),
            "read+parse+decode": (read_parse_decode, 200),
        }
        if theirs is not None:
            variants["parse (tfrecord pkg Example)"] = (lambda: parse_with(theirs), n)
        for name, (fn, count) in variants.items():
            results.setdefault(name, []).append(timed(fn) / count)
    for name, per in results.items():
        median = statistics.median(per)
        if name.startswith("index"):
            print(f"{name:<30} {median * 1e3:8.2f} ms per shard of {n}")
        else:
            print(f"{name:<30} {median * 1e6:8.1f} us/example  {1 / median:10,.0f} examples/sec (one core)")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
