"""The index lock on an fsspec store: conditional writes where the store has them, else a lock file.

Two processes write a model_dir's index (the trainer saving, a watching evaluator recording
results). On S3 and GCS every index write is conditional on the version read
(:func:`stoker.storage.put_if`), so no lock is needed between processes. Any other fsspec store
gets a **lock object** beside the index, ``checkpoint.json.lock``:

* it is created exclusively (``open(..., "xb")``: ``O_EXCL`` on a local disk, ``If-None-Match``
  on S3, a check under the GIL in ``memory://``), holds ``{"owner", "pid", "host", "pidns",
  "time"}``, and is read back to confirm the owner (this narrows the race on a store whose
  ``"xb"`` is a check-then-write);
* its holder deletes it when the update is written;
* a waiting writer breaks a lock older than ``stale_after`` seconds (by the holder's clock),
  or at once when the holder ran on this host, in this PID namespace, and has exited (a
  ``kill -9`` during an index update), with a warning naming the holder.

A process-wide :func:`stoker.storage.url_lock` is held around all of this, for the threads of
one process. The guarantees and limits are in docs/checkpoints.md.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from ..errors import StorageError
from . import stores as storage
from .stores import DEFAULT_RETRY, RetryPolicy, UrlPath

log = logging.getLogger("stoker")

LOCK_SUFFIX = ".lock"
STALE_AFTER = 120.0  # seconds; an index update holds the lock for well under one
_warned_not_exclusive: set[str] = set()


@dataclass(frozen=True)
class LockOwner:
    """Who holds a lock object: what it contains."""

    owner: str
    pid: int
    host: str
    pidns: str
    time: float

    def encode(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    def gone(self) -> bool:
        """Whether the holder ran in this host's PID namespace and has exited (never true elsewhere)."""
        if self.host != _HOST or not self.pidns or self.pidns != _pid_namespace():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:  # it exists, under another user
            return False
        return False


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:  # not Linux: no liveness check across processes, only the timeout
        return ""


_HOST = socket.gethostname()


def _parse(data: bytes) -> LockOwner | None:
    try:
        fields = json.loads(data)
        return LockOwner(
            owner=str(fields["owner"]),
            pid=int(fields["pid"]),
            host=str(fields["host"]),
            pidns=str(fields.get("pidns", "")),
            time=float(fields["time"]),
        )
    except (ValueError, KeyError, TypeError):
        return None  # empty (created, not yet written) or not ours


def _create_exclusive(fs: Any, key: str, data: bytes) -> bool:
    """Create ``key`` holding ``data`` only if it does not exist; False if it does."""
    try:
        with fs.open(key, "xb") as f:
            f.write(data)
        return True
    except FileExistsError:
        return False
    except (NotImplementedError, ValueError) as e:  # this store cannot open "xb"
        name = type(fs).__name__
        if name not in _warned_not_exclusive:
            _warned_not_exclusive.add(name)
            log.warning(
                "%s cannot create a file exclusively (%s): the index lock %s is a check-then-write, "
                "so two index writers in different processes may still collide",
                name,
                e,
                key,
            )
    fs.invalidate_cache(key)
    if fs.exists(key):
        return False
    fs.pipe_file(key, data)
    return True


def _read(fs: Any, key: str) -> bytes | None:
    try:
        fs.invalidate_cache(key)
        return bytes(fs.cat_file(key))
    except FileNotFoundError:
        return None


def _remove(fs: Any, key: str, expected: bytes) -> None:
    """Remove the lock ``key`` if it still holds ``expected``.

    Read just before: two waiters breaking the same stale lock must not remove the new lock
    that the faster of them has taken since (a window this narrows; without conditional
    deletes nothing closes it).
    """
    if _read(fs, key) != expected:
        return
    try:
        fs.rm_file(key)
    except FileNotFoundError:
        pass
    finally:
        fs.invalidate_cache(key)


@contextmanager
def lock_file(path: UrlPath, *, stale_after: float = STALE_AFTER, retry: RetryPolicy = DEFAULT_RETRY) -> Iterator[None]:
    """Hold the lock object ``path`` (created exclusively, removed on exit) while the block runs.

    Waits while another live holder has it; breaks it, with a warning, once it is older than
    ``stale_after`` seconds or its holder on this host has exited. Raises ``StorageError`` if
    it cannot be taken within ``2 * stale_after`` seconds.
    """
    fs, key = storage.filesystem(path), storage._key(path)
    me = LockOwner(owner=uuid.uuid4().hex, pid=os.getpid(), host=_HOST, pidns=_pid_namespace(), time=time.time())
    deadline = time.monotonic() + 2 * stale_after
    pause, unreadable_since = 0.01, None
    while True:
        me = replace(me, time=time.time())
        # The read back decides, not the create's result: a create retried after a lost
        # response finds its own lock, and a store whose "xb" is not exclusive lets the last
        # of two creators win.
        retry.call("create", path, _create_exclusive, fs, key, me.encode())
        data = retry.call("read", path, _read, fs, key)
        holder = None if data is None else _parse(data)
        if holder is not None and holder.owner == me.owner:
            break
        if data is None:
            stale = False  # released between the create and the read: try again
        elif holder is None:  # being written by its creator, or garbage: give it stale_after
            unreadable_since = unreadable_since or time.monotonic()
            stale = time.monotonic() - unreadable_since > stale_after
        else:
            unreadable_since = None
            stale = time.time() - holder.time > stale_after or holder.gone()
        if stale:
            who = (
                "unreadable"
                if holder is None
                else f"pid {holder.pid} on {holder.host}, taken {time.time() - holder.time:.0f} s ago"
            )
            log.warning("breaking the stale index lock %s (%s)", path, who)
            retry.call("remove", path, _remove, fs, key, data)
            continue
        if time.monotonic() > deadline:
            who = "an unreadable lock" if holder is None else f"pid {holder.pid} on {holder.host}"
            raise StorageError(f"cannot take the index lock {path}: held by {who} for more than {2 * stale_after:g} s")
        if data is not None:
            time.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, 0.5)
    try:
        yield
    finally:
        data = retry.call("read", path, _read, fs, key)
        current = None if data is None else _parse(data)
        if current is not None and current.owner == me.owner:
            retry.call("remove", path, _remove, fs, key, data)
        else:
            log.warning("the index lock %s was broken while this process (pid %d) held it", path, me.pid)


@contextmanager
def index_lock(index: UrlPath, retry: RetryPolicy = DEFAULT_RETRY) -> Iterator[None]:
    """Hold what guards a read-modify-write of ``index`` on a store.

    Always the process-wide :func:`stoker.storage.url_lock`; on a store without conditional
    writes also the lock object ``<index>.lock`` (:func:`lock_file`).
    """
    with storage.url_lock(index.parent):
        if storage.supports_conditional_writes(index):
            yield
        else:
            with lock_file(index.with_name(index.name + LOCK_SUFFIX), retry=retry):
                yield


__all__ = ["LOCK_SUFFIX", "STALE_AFTER", "LockOwner", "index_lock", "lock_file"]
