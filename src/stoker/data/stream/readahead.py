"""``ReadAhead``: object-store files fetched into the cache before a reader asks for them.

A source tells its :class:`~.files.FileSet` which files the coming batches need, in the order it
will read them (:meth:`~.files.FileSet.ahead`); a small pool of threads fetches those the cache
does not hold, until ``read_ahead_bytes`` are on their way, so a decoder finds its next file local
instead of waiting for a request. A fetch already under way in another thread or process is
waited for (the cache's per-file lock), never repeated. The pool is per process: a forked worker
makes its own on first use.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

log = logging.getLogger("stoker")


class Fetchable(Protocol):
    """What read-ahead needs of a set of files (a :class:`~.files.FileSet`): kept to this
    protocol so files.py may build a ReadAhead without the two modules importing each other."""

    def size(self, k: int) -> int: ...
    def cached(self, k: int) -> bool: ...
    def fetch(self, k: int) -> object: ...
    def name(self, k: int) -> str: ...


class ReadAhead:
    """Fetches files of ``files`` into the cache on ``threads`` threads, at most ``budget`` bytes at once.

    Args:
        files: the files (their cache, and which are remote).
        threads: fetches at once.
        budget: bytes of fetches under way at most; ``0`` turns read-ahead off.
    """

    def __init__(self, files: Fetchable, *, threads: int, budget: int) -> None:
        self.files = files
        self.threads = threads
        self.budget = budget
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._pending: dict[int, Future[None]] = {}
        self._lock = threading.Lock()
        #: The last error a fetch ahead met (the reader meets it again, with retries, when it reads the file).
        self.last_error: BaseException | None = None

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state.update(_pool=None, _pid=0, _pending={}, _lock=None)
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pid != os.getpid():  # a forked copy has no threads of its parent's
            # "stoker-io" threads run the store calls inline (stoker.storage.retry): no second pool.
            self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="stoker-io-readahead")
            self._pid, self._pending = os.getpid(), {}
        return self._pool

    def want(self, ks: Iterable[int]) -> None:
        """Start fetching the files ``ks`` (in this order) that the cache does not hold, while the
        bytes under way stay within the budget."""
        if self.budget <= 0:
            return
        if self._pid != os.getpid():
            self._lock = threading.Lock()  # a forked copy: a lock held by a parent's thread stays held
        with self._lock:
            pool = self._executor()
            self._pending = {k: f for k, f in self._pending.items() if not f.done()}
            under_way = sum(self.files.size(k) for k in self._pending)
            for k in ks:
                if k in self._pending or self.files.cached(k):
                    continue
                if self._pending and under_way + self.files.size(k) > self.budget:
                    break
                self._pending[k] = pool.submit(self._fetch, k)
                under_way += self.files.size(k)

    def _fetch(self, k: int) -> None:
        try:
            self.files.fetch(k)
        except Exception as e:  # noqa: BLE001 - the reader fetches it again and raises with the object's name
            self.last_error = e
            log.debug("read-ahead of %s failed: %s", self.files.name(k), e)

    def close(self) -> None:
        """Let the fetches under way finish in the background; no new ones start."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool, self._pending = None, {}


__all__ = ["ReadAhead"]
