"""Training data on object storage against local disk: ``stoker bench`` on the same TFRecord shards.

Generates (once; into ``--data`` or a temporary folder) ``--examples`` ImageNet-shaped JPEGs
(~320 x 240, smooth content plus noise, fixed seed) written as ``--shards`` TFRecord shards in
tf_cnn's layout, starts moto's S3 server (a real S3-protocol server) in a child process on the
loopback address, uploads the shards to ``s3://bench/tfr``, then, interleaved round by round so
that machine noise hits every variant alike, runs ``stoker bench --model=trivial`` (the input is
the work: decoding, cropping, batching) on

- ``local``: the shards on local disk (their offset indexes already cached beside them);
- ``s3 cold``: ``--data_dir=s3://bench/tfr``, the machine's stream cache emptied first: listing,
  fetching every shard and indexing it happen inside the command;
- ``s3+30ms cold``: the same through a wrapping filesystem (``lat://``, :class:`LatencyS3`) that
  makes every S3 request wait 30 ms first, to stand for a real object store's latency;
- ``s3+30ms warm``: that command with the shards and their indexes already in the cache (a
  restart, or the second replica of a machine): nothing is fetched or indexed again;
- ``s3+30ms streamed``: the indexes in the cache but not the shards' bytes (evicted): every shard
  is fetched during the run, by the read-ahead and on demand, inside the warm-up and timed batches.

Each row: the bench's figure (images/sec over the timed batches, after ``--warmup`` batches), the
wall seconds of the whole command (start-up, listing, fetching, indexing included) and both as
ratios to ``local``; target: the latency row at **>= 0.9x** the local rate.

Two more rows time the cache filling: shards per second fetched from ``lat://`` into an empty
cache on 1 and on 8 threads, against the shards per second training consumes at the local rate.

``--streaming`` adds rows for the source alone, read in order (``shuffle=False``) over shards
whose indexes are cached but whose bytes are not (evicted): ``--stream_batches`` batches of
``imagenet_tfrecords(...)`` (224 px crops, no workers), images/sec, locally and from ``lat://`` with the read-ahead
on (the default) and off (``read_ahead_bytes=0``: each shard fetched when the first read needs it).

``--new_machine`` measures instead what a new machine (an empty stream cache) fetches before its
first step: the source built (``decoder="auto"``, whose probe reads 16 examples) and its first
batch read, the read-ahead off so that only what the batch itself needs counts, on shards
uploaded to a fresh prefix: first with no indexes beside them on the store (every new machine
before indexes were kept there; this machine writes them), then, on another empty cache, with
them there. Each row counts the GET requests and the bytes they returned (whole shards, index
objects, ranged reads), from s3fs's one request funnel, for a shuffled training read and for an
in-order one.

The machine load (``os.getloadavg()``) is printed at the start: on a shared machine the
absolute figures are noise, the ratios of one interleaved run less so.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

BUCKET = "bench"
LATENCY_S = 0.030


def make_shards(folder: Path, examples: int, shards: int) -> Path:
    """``folder/records``: ``examples`` JPEGs in 10 classes as ``shards`` TFRecord shards (made once)."""
    from stoker.data import write_imagenet_tfrecords

    records = folder / "records"
    if records.exists():
        return records
    rng = np.random.default_rng(0)
    tree = folder / "jpeg"
    for i in range(examples):
        small = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        pixels = np.asarray(Image.fromarray(small).resize((320, 240), Image.Resampling.BICUBIC), dtype=np.int16)
        pixels = np.clip(pixels + rng.integers(-12, 13, pixels.shape), 0, 255).astype(np.uint8)
        out = tree / f"class_{i % 10}"
        out.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        (out / f"img_{i:05d}.jpg").write_bytes(buf.getvalue())
    write_imagenet_tfrecords(tree, records, num_shards=shards)
    shutil.rmtree(tree)
    return records


def start_moto() -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """moto's S3 server in a child process on a free loopback port; the environment that reaches it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1)  # noqa: S310 - loopback
            break
        except OSError:
            time.sleep(0.1)
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": url,
    }
    return server, env


def register_latency(latency: float) -> None:
    """``lat://`` URLs: S3 through s3fs, every request (``_call_s3``: the one funnel of s3fs's
    requests, listing, metadata and reads alike) held ``latency`` seconds first."""
    import fsspec
    import s3fs

    class LatencyS3(s3fs.S3FileSystem):  # type: ignore[misc]
        protocol = ("lat",)

        async def _call_s3(self, method: Any, *args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(latency)
            return await super()._call_s3(method, *args, **kwargs)

    fsspec.register_implementation("lat", LatencyS3, clobber=True)


def upload(records: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("s3")
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    for shard in sorted(records.glob("train-*")):
        fs.put_file(str(shard), f"{BUCKET}/tfr/{shard.name}")


def bench_row(data_dir: str, args: argparse.Namespace) -> dict[str, float]:
    """One ``stoker bench --model=trivial --data_dir=...`` in this process: images/sec and wall seconds."""
    from stoker.bench import BenchConfig, run_benchmark

    cfg = BenchConfig(
        model="trivial",
        data_dir=data_dir,
        batch_size=args.batch_size,
        num_batches=args.batches,
        num_warmup_batches=args.warmup,
        device="cpu",
        display_every=10_000,
    )
    start = time.perf_counter()
    result = run_benchmark(cfg, log=lambda line: None)
    return {"rate": float(result["images_per_sec"]), "wall": time.perf_counter() - start}


def stream_row(data_dir: str, args: argparse.Namespace, read_ahead: bool) -> float:
    """Images/sec of one in-order epoch of the source over shards whose bytes are not cached."""
    from stoker.data import ImageOptions, ReadOptions, imagenet_tfrecords
    from stoker.data.stream import READ_AHEAD_BYTES, StreamOptions

    stream = StreamOptions(read_ahead_bytes=READ_AHEAD_BYTES if read_ahead else 0)
    read = ReadOptions(batch_size=args.batch_size, shuffle=False, num_epochs=1, stream=stream)
    source = imagenet_tfrecords(data_dir, read=read, image=ImageOptions(image_size=224, output="uint8"))
    if source.records.remote:  # indexed (and cached) now; drop the bytes, keep the indexes
        shutil.rmtree(source.records.files.cache.files_dir)
        source.records.files.cache.files_dir.mkdir()
    start = time.perf_counter()
    n = sum(len(labels) for _, labels in itertools.islice(source, args.stream_batches))
    return n / (time.perf_counter() - start)


def fetch_row(url: str, threads: int) -> float:
    """Shards per second fetched into an empty cache on ``threads`` threads (what the read-ahead
    can supply; the decoders need ``rate / examples per shard``)."""
    from concurrent.futures import ThreadPoolExecutor

    from stoker.data.images.tfrecord import shard_files
    from stoker.data.stream import FileSet

    shutil.rmtree(data_cache(), ignore_errors=True)
    files = FileSet(shard_files(url, "train"))
    start = time.perf_counter()
    with ThreadPoolExecutor(threads, thread_name_prefix="stoker-io-bench") as pool:
        list(pool.map(files.fetch, range(len(files))))
    return len(files) / (time.perf_counter() - start)


class Requests:
    """The S3 GETs of this process (s3fs's ``_call_s3``, counted while installed): whole objects,
    ranged reads and index objects, and the bytes each kind returned."""

    def __init__(self) -> None:
        import s3fs

        self.counts: dict[str, int] = {}
        real = s3fs.S3FileSystem._call_s3
        requests = self

        async def counted(fs: Any, method: str, *args: Any, **kwargs: Any) -> Any:
            response = await real(fs, method, *args, **kwargs)
            if method == "get_object":
                kind = (
                    "index"
                    if "/.stoker-index/" in kwargs.get("Key", "")
                    else "ranged"
                    if "Range" in kwargs
                    else "whole"
                )
                requests.add(kind, int(response.get("ContentLength") or 0))
            return response

        s3fs.S3FileSystem._call_s3 = counted

    def add(self, kind: str, size: int) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.counts[f"{kind} bytes"] = self.counts.get(f"{kind} bytes", 0) + size

    def take(self) -> dict[str, int]:
        out, self.counts = self.counts, {}
        return out


def new_machine_row(
    url: str, cache: Path, shuffle: bool, args: argparse.Namespace, requests: Requests
) -> dict[str, Any]:
    """What a machine with the empty stream cache ``cache`` fetches to build the source and read its first batch."""
    from stoker.data import ImageOptions, ReadOptions, imagenet_tfrecords
    from stoker.data.stream import StreamOptions

    shutil.rmtree(cache, ignore_errors=True)
    stream = StreamOptions(cache_dir=cache, read_ahead_bytes=0)
    read = ReadOptions(batch_size=args.batch_size, shuffle=shuffle, seed=1, stream=stream)
    requests.take()
    start = time.perf_counter()
    source = imagenet_tfrecords(url, read=read, image=ImageOptions(image_size=224, output="uint8"))
    built = {**requests.take(), "seconds": time.perf_counter() - start}
    next(iter(source))
    batch = {**requests.take(), "seconds": time.perf_counter() - start - built["seconds"]}
    return {"built": built, "first batch": batch, "shards fetched": source.records.files.cache.fetched}


def new_machine_report(args: argparse.Namespace, records: Path) -> None:
    """Before / after: a new machine with no indexes on the store, then one with them there."""
    import fsspec

    fs = fsspec.filesystem("s3")
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    for shard in sorted(records.glob("train-*")):
        fs.put_file(str(shard), f"{BUCKET}/fresh/{shard.name}")
    total = sum(f.stat().st_size for f in records.glob("train-*"))
    requests = Requests()
    url, base = f"s3://{BUCKET}/fresh", Path(tempfile.mkdtemp(prefix="stoker-new-machine-"))
    rows = {
        "no indexes on the store (before), shuffled": new_machine_row(url, base / "a", True, args, requests),
        "indexes on the store (after), shuffled": new_machine_row(url, base / "b", True, args, requests),
        "indexes on the store (after), in order": new_machine_row(url, base / "c", False, args, requests),
    }
    shutil.rmtree(base, ignore_errors=True)
    print(
        f"\na new machine (empty stream cache), {args.shards} shards, {total / 2**20:.1f} MiB, batch {args.batch_size}:"
    )
    head = ("whole shards", "MiB", "index objects", "MiB", "ranged reads", "MiB", "s")
    print(f"{'':<58}" + "".join(f"{h:>14}" for h in head))
    for name, row in rows.items():
        for phase in ("built", "first batch"):
            r = row[phase]
            cells = [
                f"{r.get(kind, 0):>14}{r.get(kind + ' bytes', 0) / 2**20:>14.2f}"
                for kind in ("whole", "index", "ranged")
            ]
            print(f"{name + ': ' + phase:<58}{''.join(cells)}{r['seconds']:>14.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


def data_cache() -> Path:
    from stoker._cache import cache_dir

    return cache_dir() / "data"


def interleaved(rows: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[Any]]:
    """Each row once per round, the order rotated by one each round (no row always follows another)."""
    out: dict[str, list[Any]] = {name: [] for name in rows}
    names = list(rows)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fn = rows[name]
            out[name].append(fn())
            print(f"  round {r + 1} {name}: {out[name][-1]}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=None, help="keep the generated shards here (reused)")
    p.add_argument("--examples", type=int, default=2048)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--batches", type=int, default=40, help="timed batches per bench run")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streaming", action="store_true", help="also the in-order streaming rows of the source alone")
    p.add_argument("--stream_batches", type=int, default=24, help="batches read per streaming row")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("--new_machine", action="store_true", help="only what a new machine fetches before step 1")
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} CPUs")
    base = args.data or Path(tempfile.mkdtemp(prefix="stoker-objstore-bench-"))
    records = make_shards(base, args.examples, args.shards)
    size = sum(f.stat().st_size for f in records.glob("train-*"))
    print(f"{args.shards} shards, {args.examples} examples, {size / 2**20:.1f} MiB; batch {args.batch_size}")
    server, env = start_moto()
    os.environ.update(env)
    os.environ.setdefault("STOKER_CACHE_DIR", str(base / "stoker-cache"))
    try:
        if args.new_machine:
            new_machine_report(args, records)
            return
        upload(records)
        register_latency(LATENCY_S)
        bench_row(str(records), args)  # indexes the local shards once, measures the kernels once

        def cold(url: str) -> Callable[[], dict[str, float]]:
            def run() -> dict[str, float]:
                shutil.rmtree(data_cache(), ignore_errors=True)
                return bench_row(url, args)

            return run

        def warm(url: str) -> Callable[[], dict[str, float]]:
            def run() -> dict[str, float]:
                from stoker.data.images.tfrecord import shard_files
                from stoker.data.tfrecord_index import RecordShards

                RecordShards(shard_files(url, "train"), progress=False)  # fetched and indexed, not timed
                return bench_row(url, args)

            return run

        def streamed(url: str) -> Callable[[], dict[str, float]]:
            def run() -> dict[str, float]:
                from stoker.data.images.tfrecord import shard_files
                from stoker.data.tfrecord_index import RecordShards

                records = RecordShards(shard_files(url, "train"), progress=False)  # indexed, not timed
                shutil.rmtree(records.files.cache.files_dir)  # the bytes go, the indexes stay
                return bench_row(url, args)

            return run

        rows: dict[str, Callable[[], Any]] = {
            "local": lambda: bench_row(str(records), args),
            "s3 cold": cold(f"s3://{BUCKET}/tfr"),
            "s3+30ms cold": cold(f"lat://{BUCKET}/tfr"),
            "s3+30ms warm": warm(f"lat://{BUCKET}/tfr"),
            "s3+30ms streamed": streamed(f"lat://{BUCKET}/tfr"),
        }
        rows["fetch s3+30ms 1 thread"] = lambda: fetch_row(f"lat://{BUCKET}/tfr", 1)
        rows["fetch s3+30ms 8 threads"] = lambda: fetch_row(f"lat://{BUCKET}/tfr", 8)
        if args.streaming:
            rows["stream local"] = lambda: stream_row(str(records), args, read_ahead=True)
            rows["stream s3+30ms read-ahead"] = lambda: stream_row(f"lat://{BUCKET}/tfr", args, read_ahead=True)
            rows["stream s3+30ms no read-ahead"] = lambda: stream_row(f"lat://{BUCKET}/tfr", args, read_ahead=False)
        results = interleaved(rows, args.rounds)
    finally:
        server.terminate()
        server.wait()
    report(results, args)


def report(results: dict[str, list[Any]], args: argparse.Namespace) -> None:
    print(
        f"\nstoker bench --model=trivial, {args.batches} timed batches of {args.batch_size}, median of {args.rounds}:"
    )
    local = statistics.median(r["rate"] for r in results["local"])
    local_wall = statistics.median(r["wall"] for r in results["local"])
    figures: dict[str, Any] = {}
    print(f"{'':<18}{'images/sec':>12}{'x local':>9}{'wall s':>9}{'x local':>9}")
    for name in ("local", "s3 cold", "s3+30ms cold", "s3+30ms warm", "s3+30ms streamed"):
        rate = statistics.median(r["rate"] for r in results[name])
        wall = statistics.median(r["wall"] for r in results[name])
        figures[name] = {
            "images_per_sec": rate,
            "wall_s": wall,
            "rate_ratio": rate / local,
            "wall_ratio": wall / local_wall,
        }
        print(f"{name:<18}{rate:>12.1f}{rate / local:>8.2f}x{wall:>9.2f}{wall / local_wall:>8.2f}x")
    ratio = figures["s3+30ms cold"]["rate_ratio"]
    print(f"target: s3+30ms at >= 0.9x the local rate: {ratio:.2f}x ({'met' if ratio >= 0.9 else 'NOT met'})")
    per_shard = args.examples / args.shards
    print(f"\nshards fetched into an empty cache from s3+30ms, shards/sec (training needs {local / per_shard:.2f}):")
    for name in ("fetch s3+30ms 1 thread", "fetch s3+30ms 8 threads"):
        rate = statistics.median(results[name])
        figures[name] = {"shards_per_sec": rate, "headroom": rate * per_shard / local}
        print(f"{name:<32}{rate:>10.2f}  ({rate * per_shard / local:.0f}x what the local rate consumes)")
    stream_rows = [name for name in results if name.startswith("stream")]
    if stream_rows:
        print(f"\nthe source alone, {args.stream_batches} batches in order over shards not in the cache, images/sec:")
        base = statistics.median(results["stream local"])
        for name in stream_rows:
            rate = statistics.median(results[name])
            figures[name] = {"images_per_sec": rate, "rate_ratio": rate / base}
            print(f"{name:<32}{rate:>10.1f}{rate / base:>8.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
