"""Scalar summaries of a run: TensorBoard events and a ``metrics.csv`` beside them.

``metrics.csv`` has one row per value (``step,wall_time,tag,value``), so new tags (eval
metrics, host_call values) never change its columns, and it reads with any CSV tool.

The events file is written in the calling thread, with TensorBoard's own protos and record
framing, as ``torch.utils.tensorboard.SummaryWriter.add_scalar`` writes it (one ``Event`` per
scalar with a ``simple_value``), but without its writer thread: creating and closing that
writer took ~2 ms and every flush waited for the thread, so a ``train()`` of a few hundred
steps spent ~7 ms on summaries. Checksums come from ``google-crc32c`` (C) where it is
installed (a dependency; TensorBoard's pure-Python table is the fallback, ~4 us per record).
Files are flushed to the OS at most every ``flush_secs`` (TensorBoard's own writer waits 120 s)
and at ``close``, since with summaries every 100 steps of a fast model a flush per write was a
measurable part of the loop (benchmarks/overhead.py).

Only TensorBoard's protos are imported when a run opens its writer: its record framing module
(``tensorboard.compat.tensorflow_stub``, where the pure-Python checksum table and TensorBoard's
file counter live) imports boto3 and fsspec for its ``gfile``, which took 0.24 s CPU of every
run's start (benchmarks/startup.py); it is imported only where ``google-crc32c``'s C code is
missing.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import socket
import struct
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import storage

CSV_NAME = "metrics.csv"
EVENTS_DIR = "events"


_uids = itertools.count()


class EventFileWriter:
    """A TensorBoard events file (``events.out.tfevents.*``) of scalars, written synchronously."""

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._crc = _c_crc32c()
        self._table: Any = None
        if self._crc is None:  # the fallback: TensorBoard's table (its module imports boto3, fsspec)
            from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import CRC_TABLE

            self._table = CRC_TABLE
        self._headers: dict[int, bytes] = {}  # record length -> length + its crc (lengths repeat)
        os.makedirs(logdir, exist_ok=True)
        self.path, self._file = _create(Path(logdir))
        self._record(
            self._event(
                wall_time=time.time(),
                file_version="brain.Event:2",
                source_metadata=event_pb2.SourceMetadata(writer="tensorboard.summary.writer.event_file_writer"),
            )
        )
        self.flush()

    def _masked_crc32c(self, data: bytes) -> bytes:
        """TensorFlow's masked CRC-32C of ``data``."""
        if self._crc is not None:
            crc = self._crc(data)
        else:  # TensorBoard's pure-Python computation
            table, crc = self._table, 0xFFFFFFFF
            for b in data:
                crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
            crc ^= 0xFFFFFFFF
        return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)

    def _record(self, event: Any) -> None:
        # TFRecord framing: length, masked crc32c of the length, data, masked crc32c of the data
        data = event.SerializeToString()
        header = self._headers.get(len(data))
        if header is None:
            length = struct.pack("<Q", len(data))
            header = self._headers[len(data)] = length + self._masked_crc32c(length)
        self._file.write(header + data + self._masked_crc32c(data))

    def add_scalar(self, tag: str, value: float, step: int, walltime: float) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)])
        self._record(self._event(summary=summary, wall_time=walltime, step=int(step)))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _next_uid() -> int:
    """The counter of TensorBoard's own writers when this process has loaded them (so names
    never collide with theirs), else stoker's own: importing theirs costs a run's start 0.3 s."""
    theirs = sys.modules.get("tensorboard.summary.writer.event_file_writer")
    counter = getattr(theirs, "_global_uid", None)
    try:
        return int(counter.get()) if counter is not None else next(_uids)
    except (AttributeError, TypeError, ValueError):
        return next(_uids)


def _create(logdir: Path) -> tuple[Path, io.BufferedWriter]:
    """A new events file in ``logdir``, named as TensorBoard names its own; created exclusively,
    the next number taken when a writer of this process and second already has the name."""
    while True:
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{_next_uid()}"
        try:
            return logdir / name, open(logdir / name, "xb")  # noqa: SIM115 - closed in close()
        except FileExistsError:
            continue


def _c_crc32c() -> Any:
    """``google_crc32c.value`` if the C implementation is installed, else ``None``."""
    try:
        import google_crc32c
    except ImportError:
        return None
    return google_crc32c.value if getattr(google_crc32c, "implementation", "") == "c" else None


class ScalarWriter:
    """Appends scalars to ``model_dir/events`` (TensorBoard) and ``model_dir/metrics.csv``.

    ``write`` queues; ``flush()`` writes the queue and hands the files to the OS (on an object
    store: uploads them); ``flush(force=False)`` does so only every ``flush_secs`` seconds.
    ``close()`` flushes.
    """

    def __init__(self, model_dir: str | os.PathLike[str], tensorboard: bool = True, flush_secs: float = 10.0) -> None:
        self.flush_secs = flush_secs
        self._flushed_at = time.monotonic()
        self._pending: list[tuple[int, float, list[tuple[str, float]]]] = []
        where = storage.location(model_dir)
        # On an object store the files are written to a local mirror and copied up at every
        # flush (appending to an object is not possible); a resumed run continues the CSV.
        self.remote = where if isinstance(where, storage.UrlPath) else None
        self.model_dir = storage.local_cache(where) if isinstance(where, storage.UrlPath) else where
        self.model_dir.mkdir(parents=True, exist_ok=True)
        if self.remote is not None and not (self.model_dir / CSV_NAME).exists():
            storage.download(self.remote / CSV_NAME, self.model_dir / CSV_NAME)
        self._tb: Any = None
        if tensorboard:
            try:
                self._tb = EventFileWriter(self.model_dir / EVENTS_DIR)
            except ImportError:  # tensorboard is a dependency, but keep training if it is broken
                self._tb = None
        path = self.model_dir / CSV_NAME
        new = not path.exists() or path.stat().st_size == 0
        self._csv_file = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
        self._csv = csv.writer(self._csv_file)
        if new:  # written through at once: another writer of this file must see it is not new
            self._csv.writerow(["step", "wall_time", "tag", "value"])
            self._csv_file.flush()

    def write(self, step: int, scalars: Mapping[str, float], prefix: str = "") -> None:
        """Queue ``scalars`` of ``step``; they reach the files at the next due ``flush``."""
        self._pending.append((step, time.time(), [(f"{prefix}{tag}", float(value)) for tag, value in scalars.items()]))

    def flush(self, force: bool = True) -> None:
        """Write what was queued and hand the files to the OS (and upload them to an object
        store); without ``force`` only if ``flush_secs`` have passed since the last flush.

        Queued rows are encoded together here rather than one ``write`` at a time: between the
        training loops that call ``write`` the encoding code runs from cold caches, and costs
        several times more per row (~100 us for five scalars on a 2-core machine).
        """
        if not force and time.monotonic() - self._flushed_at < self.flush_secs:
            return
        self._flushed_at = time.monotonic()
        pending, self._pending = self._pending, []
        for step, now, rows in pending:
            stamp = f"{now:.3f}"
            self._csv.writerows([step, stamp, tag, repr(value)] for tag, value in rows)
            if self._tb is not None:
                for tag, value in rows:
                    self._tb.add_scalar(tag, value, step, now)
        self._csv_file.flush()
        if self._tb is not None:
            self._tb.flush()
        if self.remote is not None:
            storage.upload(self.model_dir / CSV_NAME, self.remote / CSV_NAME)
            if self._tb is not None:
                storage.upload(self._tb.path, self.remote / EVENTS_DIR / self._tb.path.name)

    def close(self) -> None:
        self.flush()
        self._csv_file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics_csv(model_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Rows of ``metrics.csv`` as dicts with ``step`` (int), ``tag`` and ``value`` (float)."""
    path = storage.location(model_dir) / CSV_NAME
    if not storage.exists(path):
        return []
    rows = csv.DictReader(io.StringIO(storage.read_bytes(path).decode(), newline=""))
    return [
        {"step": int(r["step"]), "wall_time": float(r["wall_time"]), "tag": r["tag"], "value": float(r["value"])}
        for r in rows
    ]
