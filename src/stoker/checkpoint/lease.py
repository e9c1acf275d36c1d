"""Evaluation leases: a watching evaluator's claim that retention must not delete a checkpoint yet.

While an evaluator reads and evaluates ``ckpt-<step>``, it holds a **lease** on it: an object
beside the index, ``checkpoint.lease.<owner>.json``, holding ``{"owner", "pid", "host",
"pidns", "time", "stale_after", "name", "dir", "step"}`` (the fields of the index lock object,
``stoker.storage.lock``, plus the checkpoint and the holder's own stated limit).

* **Written atomically**: locally a temporary file, fsynced and renamed; on S3 and GCS one put
  (atomic); on a store without conditional writes under the index lock object, so a reader
  holding that lock never sees half a lease.
* **Honoured by retention** (``stoker.checkpoint.retention``): a checkpoint retention would drop
  stays in the index while a live lease names it; the next retention pass after the lease ends
  deletes it. Leases are only listed when retention has something to drop, so a save that
  drops nothing costs nothing more.
* **Taken race-free**: the evaluator writes the lease, then updates the index (which must still
  name the checkpoint). Retention lists leases after it has read the index and writes the
  index conditionally (or under the index lock), so either it sees the lease, or its write lands
  before the evaluator's update and the evaluator learns the checkpoint is gone before reading it.
* **Renewed** every ``stale_after / 5`` seconds while the evaluation runs (a thread), so an
  evaluation may take longer than ``stale_after``.
* **Broken**, with a warning naming the holder, by any retention pass (or a starting evaluator)
  that finds it not renewed for ``stale_after`` seconds (by the holder's clock) or held by a
  process of this host and PID namespace that has exited (a ``kill -9``). A dead evaluator never
  pins disk for longer than ``stale_after``, and on its own host not at all.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from .. import storage
from ..errors import ConfigError, StorageError
from ..storage import lock as store_lock
from ..storage.stores import DEFAULT_RETRY, Location, RetryPolicy, UrlPath
from .index import INDEX_NAME, CheckpointRecord

log = logging.getLogger("stoker")

LEASE_PREFIX = "checkpoint.lease."
LEASE_SUFFIX = ".json"
LEASE_STALE_AFTER = 300.0  # seconds without renewal before a lease is broken; renewed every fifth of it


@dataclass(frozen=True)
class Lease:
    """One lease object's content."""

    owner: str
    pid: int
    host: str
    pidns: str
    time: float
    stale_after: float
    name: str
    dir: str
    step: int

    def encode(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @property
    def holder(self) -> store_lock.LockOwner:
        return store_lock.LockOwner(owner=self.owner, pid=self.pid, host=self.host, pidns=self.pidns, time=self.time)

    def broken_because(self, now: float | None = None) -> str | None:
        """Why this lease no longer holds (its holder exited, or it was not renewed in time), or None."""
        now = time.time() if now is None else now
        if self.holder.gone():
            return "its holder has exited"
        if now - self.time > self.stale_after:
            return f"not renewed for {now - self.time:.0f} s, over its limit of {self.stale_after:g} s"
        return None

    def describe(self) -> str:
        return f"the lease on {self.name} held by pid {self.pid} on {self.host}"


def lease_name(owner: str) -> str:
    return f"{LEASE_PREFIX}{owner}{LEASE_SUFFIX}"


def is_lease_name(name: str) -> bool:
    return name.startswith(LEASE_PREFIX) and name.endswith(LEASE_SUFFIX)


def parse(data: bytes) -> Lease | None:
    try:
        f = json.loads(data)
        return Lease(
            owner=str(f["owner"]),
            pid=int(f["pid"]),
            host=str(f["host"]),
            pidns=str(f.get("pidns", "")),
            time=float(f["time"]),
            stale_after=float(f["stale_after"]),
            name=str(f["name"]),
            dir=str(f["dir"]),
            step=int(f["step"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def read_leases(model_dir: Location, retry: RetryPolicy = DEFAULT_RETRY) -> dict[str, tuple[bytes, Lease | None]]:
    """Every lease object of ``model_dir``: ``{file name: (content, parsed or None)}``."""
    out: dict[str, tuple[bytes, Lease | None]] = {}
    for name in storage.listdir(model_dir):
        if not is_lease_name(name):
            continue
        try:
            data = storage.read_bytes(model_dir / name, retry)
        except (OSError, StorageError):
            continue  # released between the listing and the read
        out[name] = (bytes(data), parse(data))
    return out


def remove_if_unchanged(path: Location, expected: bytes, retry: RetryPolicy = DEFAULT_RETRY) -> None:
    """Remove the lease ``path`` if it still holds ``expected`` (its holder may have renewed it since)."""
    try:
        current = storage.read_bytes(path, retry)
    except (OSError, StorageError):  # gone already
        return
    if bytes(current) == expected:
        _delete(path)


def _delete(path: Location) -> None:
    if isinstance(path, Path):
        path.unlink(missing_ok=True)
    else:
        storage.remove_tree(path)  # one object


def live_leases(model_dir: Location, retry: RetryPolicy = DEFAULT_RETRY, *, who: str = "retention") -> list[Lease]:
    """The leases that hold; those that no longer do are broken (removed) with a warning."""
    live: list[Lease] = []
    now = time.time()
    for name, (data, lease) in read_leases(model_dir, retry).items():
        if lease is None:
            log.warning("%s: ignoring the unreadable lease object %s", who, model_dir / name)
            continue
        why = lease.broken_because(now)
        if why is None:
            live.append(lease)
            continue
        log.warning("%s: breaking %s (%s)", who, lease.describe(), why)
        remove_if_unchanged(model_dir / name, data, retry)
    return live


def _write(path: Location, data: bytes, retry: RetryPolicy) -> None:
    if isinstance(path, Path):  # temp + fsync + rename: a reader sees the old lease or the new one
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        storage.write_all([(tmp, data)], retry)
        os.replace(tmp, path)
        return
    if storage.supports_conditional_writes(path):  # one put: atomic on S3 and GCS
        storage.write_all([(path, data)], retry)
        return
    # A store without conditional writes may show a half-written object: write it under the
    # index lock object, which retention holds while it reads the leases.
    with store_lock.index_lock(path.parent / INDEX_NAME, retry):
        storage.write_all([(path, data)], retry)


class LeaseHolder:
    """One evaluator's lease object: taken on a checkpoint, renewed by a thread, released.

    ``stale_after``: the limit written into the lease (retention breaks it after this long
    without renewal); it is renewed every ``stale_after / 5`` seconds while held.
    """

    def __init__(
        self, model_dir: Location, stale_after: float = LEASE_STALE_AFTER, retry: RetryPolicy = DEFAULT_RETRY
    ) -> None:
        if not stale_after > 0:
            raise ConfigError(f"a lease's stale_after must be > 0; got {stale_after!r}")
        self.model_dir = model_dir
        self.stale_after = float(stale_after)
        self.retry = retry
        owner = uuid.uuid4().hex
        self.path = model_dir / lease_name(owner)
        self._base = Lease(
            owner=owner,
            pid=os.getpid(),
            host=store_lock._HOST,
            pidns=store_lock._pid_namespace(),
            time=0.0,
            stale_after=self.stale_after,
            name="",
            dir="",
            step=-1,
        )
        self.current: Lease | None = None
        self._lock = threading.Lock()  # a renewal never writes after a release
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, record: CheckpointRecord) -> None:
        """Write the lease on ``record``'s checkpoint and start renewing it."""
        self.release()
        with self._lock:
            self.current = replace(
                self._base, time=time.time(), name=record.name, dir=record.directory, step=record.step
            )
            _write(self.path, self.current.encode(), self.retry)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, args=(self._stop,), name="stoker-lease", daemon=True)
        self._thread.start()

    def _renew(self, stop: threading.Event) -> None:
        while not stop.wait(self.stale_after / 5):
            with self._lock:
                if stop.is_set() or self.current is None:
                    return
                self.current = replace(self.current, time=time.time())
                try:
                    _write(self.path, self.current.encode(), self.retry)
                except Exception as e:  # noqa: BLE001 - the next renewal tries again
                    log.warning("could not renew %s (%s)", self.current.describe(), e)

    def release(self) -> None:
        """Stop renewing and remove the lease object (retention may then delete the checkpoint)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self.current is None:
                return
            self.current = None
            if isinstance(self.path, UrlPath) and not storage.supports_conditional_writes(self.path):
                with store_lock.index_lock(self.path.parent / INDEX_NAME, self.retry):
                    _delete(self.path)
            else:
                _delete(self.path)


__all__ = [
    "LEASE_PREFIX",
    "LEASE_STALE_AFTER",
    "Lease",
    "LeaseHolder",
    "is_lease_name",
    "lease_name",
    "live_leases",
    "parse",
    "read_leases",
]
