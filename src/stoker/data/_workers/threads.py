"""Worker threads that build whole batches (``worker_kind="thread"`` for sources that build by
batch), and what every decoding thread sets up first: one kernel thread of its own.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import ctypes
import functools
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

from .base import _PREFETCH_FACTOR, IndexedSource, _Workers


@functools.cache
def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (libgomp, libiomp5 or libomp, found among this process's
    mapped files so that no second copy is loaded), or None (no OpenMP, or not Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "omp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith(("libgomp", "libiomp5", "libomp")) and ".so" in name:
            try:
                return ctypes.CDLL(path)
            except OSError:
                return None
    return None


def one_kernel_thread() -> bool:
    """Make torch's CPU kernels called from *this* thread run on this thread alone (the resize in
    a decoding thread): OpenMP's thread count is a per-thread setting, set here to 1 after
    torch's own per-thread initialisation (which would otherwise set it back), while
    ``torch.set_num_threads`` would also change the training thread's. True when it took."""
    torch.get_num_threads()  # torch's lazy per-thread init first
    runtime = _openmp_runtime()
    if runtime is None:
        return torch.get_num_threads() == 1
    runtime.omp_set_num_threads(1)
    return torch.get_num_threads() == 1


def _build_with(local: threading.local, view: IndexedSource, g: int) -> tuple[int, Any, list[str], str | None]:
    """Thread side: batch ``g`` built by this thread's own copy of ``view`` (its own bad-example
    list, order cache and open files), made on the thread's first batch."""
    source = getattr(local, "source", None)
    if source is None:
        # A decoding thread whose resize used the training's OpenMP thread count would start a
        # team of its own per image, all spinning on the cores the decoders and the step share.
        one_kernel_thread()
        source = local.source = view._thread_copy()
    return source._build_numbered(g)


def _stop_pool(pool: concurrent.futures.ThreadPoolExecutor) -> None:
    pool.shutdown(wait=False, cancel_futures=True)


class _ThreadWorkers(_Workers):
    """Batches built by ``num_workers`` threads of this process, ``2 x num_workers`` ahead, in order.

    For sources whose batch building spends its time outside the GIL (a JPEG decoder called
    through ctypes or a C extension that releases it): no process to fork, no shared-memory slot
    and no copy out of one, and the batch tensors are handed over as they are. Batch ``g`` is
    ``_build_numbered(g)`` as in a worker process, so the batches and the resume are the same.
    Each thread builds with its own copy of the source (``_thread_copy``), as a worker process
    has its own: the bad-example list, the order cache and open file descriptors are per copy.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.pending: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
        self._submit: Callable[[], None] | None = None

    @property
    def loader_it(self) -> Any:
        return self.pool

    def start(self, source: IndexedSource, start: int, end: int | None) -> None:
        # The threads see a copy, not ``source``: a queued batch then keeps no reference to the
        # source, which can be freed (and its finalizer stop the threads) while batches are queued.
        view = copy.copy(source)
        local = threading.local()
        pool = concurrent.futures.ThreadPoolExecutor(source.num_workers, thread_name_prefix="stoker-input")
        numbers = itertools.count(start) if end is None else iter(range(start, end))
        pending = self.pending

        def submit() -> None:
            g = next(numbers, None)
            if g is not None:
                pending.append(pool.submit(_build_with, local, view, g))

        self.pool, self._submit, self.next_batch = pool, submit, start
        for _ in range(_PREFETCH_FACTOR * source.num_workers):
            submit()
        self._stop_with_source(source, _stop_pool, pool)  # the pool's threads end with the interpreter

    def _take(self, g: int, name: str) -> tuple[Any, list[str], str | None]:
        assert self._submit is not None
        future = self.pending.popleft()
        self._submit()  # keep the threads as far ahead as before
        got, out, bad, error = future.result()
        if got != g:  # batches are queued in order; this cannot happen
            raise RuntimeError(f"{name}: input threads returned batch {got}, expected {g}")
        return out, bad, error

    def _clear(self) -> None:
        self.pool, self._submit = None, None
        self.pending.clear()


__all__ = ["one_kernel_thread"]
