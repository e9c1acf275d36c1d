"""The local cache of object-store files: bounded, shared by the processes of one machine, kept
across runs.

A file is fetched whole (one request, streamed to disk) under a hidden temporary name and renamed
into place, so a reader never sees a partial copy, whoever fetched it. Its name in the cache is
a hash of its URL, size and version (:class:`~.listing.DataFile`) plus its own name, so a replaced
object is fetched again and a restart finds what the last run fetched.

Several processes (the replicas and worker processes of one machine) share a cache folder:

- a file is fetched once: the fetcher holds ``<name>.lock`` (a POSIX record lock, which a forked
  worker does not inherit, beside a lock of this process for its threads); the others wait for it
  and then find the file;
- the cache stays under its limit: after a fetch, the process that finds the total over the limit
  deletes the least recently read files (each read touches its file's access time) down to 90% of
  it, under ``.evict.lock``. A reader that holds a file open keeps reading it after it is deleted
  (POSIX), and one that opens it afterwards fetches it again, so eviction never breaks a read;
- leftovers of a killed fetch (``.<name>.tmp-*`` older than an hour) are deleted by the next eviction.

Faults: every fetch goes through a :class:`~stoker.storage.RetryPolicy` (transient errors retried
with backoff, a short copy counts as one); a permanent one raises
:class:`~stoker.errors.StorageError` naming the object.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ...storage import UrlPath, filesystem, location
from .listing import DataFile
from .options import StreamOptions

log = logging.getLogger("stoker")

_STALE_TMP_SECONDS = 3600.0
_EVICT_TO = 0.9  # of the limit: some room, so that not every fetch evicts

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _forget_thread_locks() -> None:
    global _thread_locks, _thread_locks_guard
    # A forked worker has none of its parent's threads: a lock one of them held would never be released.
    _thread_locks, _thread_locks_guard = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_thread_locks)


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold ``path`` as a lock among the threads of this process and among processes (``lockf``);
    yields False when ``wait`` is False and another holds it."""
    with _thread_locks_guard:
        inner = _thread_locks.setdefault(str(path), threading.Lock())
    if not inner.acquire(blocking=wait):
        yield False
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the record lock
    finally:
        inner.release()


def cache_name(file: DataFile) -> str:
    """The name of ``file``'s copy in the cache: a hash of its URL, size and version, then its own name."""
    digest = hashlib.sha256(f"{file.url}\0{file.size}\0{file.version}".encode()).hexdigest()[:32]
    return f"{digest}-{''.join(c if c.isalnum() or c in '-_.' else '_' for c in file.name)[-80:]}"


class ShardCache:
    """Object-store files copied to a local folder, at most ``limit`` bytes of them.

    Args:
        options: where the cache is, its limit and the retry policy (:class:`~.options.StreamOptions`).
    """

    def __init__(self, options: StreamOptions) -> None:
        self.root = options.cache_path
        self.files_dir = self.root / "files"
        self.retry = options.retry
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.limit = options.cache_limit if options.cache_limit is not None else self._default_limit()
        self._held: int | None = None  # bytes the folder holds, as last counted plus what this process added
        self.fetched = 0  #: files this process fetched (the rest were found in the cache)
        self.fetched_bytes = 0

    def _default_limit(self) -> int:
        return shutil.disk_usage(self.files_dir).free // 2 + self.held_bytes()

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_held"] = None  # another process counts again
        return state

    # ------------------------------------------------------------------ reading
    def path_of(self, file: DataFile) -> Path:
        """Where ``file`` is (or would be) cached."""
        return self.files_dir / cache_name(file)

    def get(self, file: DataFile) -> Path:
        """The local copy of ``file``, fetched now if the cache does not hold it; a read touches it."""
        path = self.path_of(file)
        try:
            os.utime(path)  # the least recently read go first
            return path
        except FileNotFoundError:
            return self.fetch(file)

    def holds(self, file: DataFile) -> bool:
        """Whether the cache holds ``file`` now (without touching it)."""
        return self.path_of(file).exists()

    def fetch(self, file: DataFile) -> Path:
        """Copy ``file`` into the cache unless another thread or process just did; its local path."""
        path = self.path_of(file)
        with _locked(path.with_name(f".{path.name}.lock")):
            if path.exists():
                return path
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
            try:
                self.retry.call("read", file.url, _download, file, tmp)
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        self.fetched += 1
        self.fetched_bytes += file.size
        if self._held is not None:
            self._held += file.size
        if self._held is None or self._held > self.limit:
            self.evict()
        return path

    # ------------------------------------------------------------------ the limit
    def held_bytes(self) -> int:
        """Bytes of the cached files (counted now)."""
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list[tuple[int, int, Path]]:
        """``(last read ns, size, path)`` of every cached file; stale temporary files deleted."""
        out = []
        now = time.time()
        for entry in os.scandir(self.files_dir):
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue  # deleted meanwhile
            if entry.name.startswith("."):
                if ".tmp-" in entry.name and now - st.st_mtime > _STALE_TMP_SECONDS:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)  # a fetch that was killed
                continue
            out.append((st.st_atime_ns, st.st_size, Path(entry.path)))
        return out

    def evict(self) -> None:
        """Delete the least recently read files until the cache holds at most 90% of its limit
        (skipped while another process evicts)."""
        with _locked(self.root / ".evict.lock", wait=False) as mine:
            if not mine:
                return
            entries = sorted(self._entries())
            held = sum(size for _, size, _ in entries)
            if held > self.limit:
                target = int(self.limit * _EVICT_TO)
                for _, size, path in entries:
                    if held <= target:
                        break
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        held -= size
                    with contextlib.suppress(FileNotFoundError):
                        path.with_name(f".{path.name}.lock").unlink()
            self._held = held


def _download(file: DataFile, tmp: Path) -> None:
    """Stream ``file`` to ``tmp`` (one request); a short copy is a transient fault (retried)."""
    url = location(file.url)
    assert isinstance(url, UrlPath)
    fs = filesystem(url, who="data")
    fs.get_file(str(fs._strip_protocol(str(url))), str(tmp))
    got = tmp.stat().st_size
    if got != file.size:
        raise ConnectionError(
            f"got {got} of its {file.size} bytes (the object changed since it was listed, or the transfer broke)"
        )


__all__ = ["ShardCache", "cache_name"]
