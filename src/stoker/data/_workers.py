"""Workers that build an :class:`~stoker.data.IndexedSource`'s batches: threads or processes.

With ``worker_kind="thread"`` batches are built by threads of the training process, for
sources whose batch building runs outside the GIL: image sources one example at a time, the
thread that asks for a batch decoding its remaining examples instead of waiting
(:class:`_ExampleThreads`), other sources a whole batch per thread (:class:`_ThreadWorkers`).
The rest of this docstring is about the worker processes (``worker_kind="process"``).

With ``num_workers > 0`` batches are built in worker processes by a
``torch.utils.data.DataLoader(batch_size=None)`` over :class:`_BatchPlan`, a map-style
dataset whose item ``g`` is "batch number ``g`` counted from the start of epoch 0". Its
sampler counts up from the current position (through epoch boundaries: one plan spans all
epochs, so no worker is ever restarted at an epoch boundary), each worker builds whole
batches (one inter-process transfer per batch, none per example), and the loader returns
them in order. Because item ``g`` depends only on ``g``, which worker built it and how far
the workers had prefetched do not matter: resume with workers is exact by construction.

The workers start when the source is iterated (``iter()``) or, after a ``load_state_dict``
or ``advance`` that moved the position, at the next ``next()``. stoker's Infeed calls
``load_state_dict`` and then ``iter()`` on the training thread *before* it starts its
prefetch thread, so the workers are forked from the training thread, not from the
prefetch thread while the training thread is inside a step.

Start method. On Linux the workers are forked (elsewhere the platform default is used;
``start_method`` overrides). Measured on the 2-core development machine for a 2-worker
``image_folder`` (seconds from ``iter()`` to the first batch, median of 3;
``benchmarks/input_pipeline.py --startup``): fork 0.11 s, forkserver 3.0 s, spawn 3.2 s
(every spawned worker imports torch again). ``forkserver`` and ``spawn`` also re-import
``__main__`` in the workers (a training script without an ``if __name__ == "__main__":``
guard would start training again in them), pickle the dataset (an ImageNet file list is
~100 MB) into every worker, and a ``spawn`` worker stopped in the middle of a batch can
abort in its interpreter's shutdown ("terminate called without an active exception"). Fork is safe here because
(a) it happens on the thread that iterates the source, before the Infeed's prefetch thread
exists, and one plan spans all epochs, so no fork happens later from the prefetch thread;
(b) a worker runs only this package's batch code, Pillow and numpy, with torch set to one
intra-op thread by the DataLoader, so it never uses a lock or OpenMP pool inherited from
another thread of the parent; (c) nothing in a worker touches CUDA (sources that put data
on the GPU, such as :func:`~stoker.data.synthetic_images`, never use workers). It is also
what ``torch.utils.data.DataLoader`` does by default on Linux.

Shared-memory batch slots. A source whose batches are fixed-shape buffers (``batch_buffers()``
not None: the uint8 image batches of :class:`~stoker.data.images.EncodedImageSource`) gets a
:class:`_SlotRing` allocated in shared memory *before* the workers start (inherited through
``fork``; with ``spawn`` its file descriptors are sent once, with the worker's copy of the
source). A worker builds batch ``g`` directly into slot ``g % slots`` and sends back only the
slot number and the small rest (labels): no per-batch tensor is pickled, no file descriptor
passed per tensor. The ring holds ``prefetch_factor x num_workers + 2`` slots: the loader never
has more than ``prefetch_factor x num_workers`` batches requested ahead of the one the
training process is reading, and it requests batch ``g + slots`` only after batch ``g`` was
returned to the caller, who copied it out of its slot (``assemble(..., copy=True)``: the one
copy, or the normalisation when the source yields float32) before asking for the next.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import copy
import ctypes
import functools
import itertools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar, cast

import torch

log = logging.getLogger("stoker")


class IndexedSource(Protocol):
    """What the workers read of a ``stoker.data.base.IndexedSource`` (a protocol, so this module
    does not import the one that imports it)."""

    num_workers: int
    start_method: str | None
    seed: int
    _slots: _SlotRing | None

    def _build_numbered(self, g: int) -> tuple[int, Any, list[str], str | None]: ...

    def batch_buffers(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None: ...

    def _thread_copy(self) -> IndexedSource: ...


_PREFETCH_FACTOR = 2


class InSlot(NamedTuple):
    """A worker's answer for a batch built in a shared slot: the slot, the rows filled, the rest (labels)."""

    slot: int
    rows: int
    rest: Any


class _SlotRing:
    """``count`` shared-memory copies of a source's batch buffers; batch ``g`` uses slot ``g % count``."""

    def __init__(self, layout: dict[str, tuple[tuple[int, ...], torch.dtype]], count: int) -> None:
        self.count = count
        self.buffers = {
            name: torch.empty((count, *shape), dtype=dtype).share_memory_() for name, (shape, dtype) in layout.items()
        }

    def slot_of(self, g: int) -> int:
        return g % self.count

    def views(self, slot: int, rows: int) -> dict[str, torch.Tensor]:
        """The first ``rows`` rows of slot ``slot`` of every buffer."""
        return {name: buf[slot, :rows] for name, buf in self.buffers.items()}


T = TypeVar("T")


def _start_method(requested: str | None) -> str | None:
    if requested is not None:
        return requested
    return "fork" if sys.platform.startswith("linux") else None  # see the module docstring


def _as_is(item: T) -> T:
    return item


def _stop_loader(loader_iter: Any) -> None:
    shutdown = getattr(loader_iter, "_shutdown_workers", None)  # the DataLoader iterator's own clean stop
    if shutdown is None:
        return
    try:
        shutdown()
    except RuntimeError as e:
        # A worker that dies while being stopped loses only batches nobody wants. (A spawned
        # worker stopped mid-batch can abort in interpreter shutdown while torch's queue thread
        # is still sending a tensor: "terminate called without an active exception".)
        log.debug("input workers stopped with an error, ignored: %s", e)


def build_in_slot(source: Any, ring: _SlotRing, g: int, indices: torch.Tensor, epoch: int) -> InSlot:
    """Worker side: batch ``g`` (the examples ``indices`` of ``epoch``) built by
    ``source.fill_batch`` into its slot; what goes back to the training process."""
    slot = ring.slot_of(g)
    return InSlot(slot, len(indices), source.fill_batch(indices, epoch, ring.views(slot, len(indices))))


def read_slot(source: Any, ring: _SlotRing | None, answer: InSlot) -> Any:
    """Training-process side: the batch out of its slot (``source.assemble`` copies it out, so
    the workers may reuse the slot once the next batch is asked for)."""
    if ring is None:  # the workers fill slots only when the ring exists
        raise RuntimeError("input workers answered with a shared-memory slot, but no slots are allocated")
    return source.assemble(ring.views(answer.slot, answer.rows), answer.rest, copy=True)


class _BatchPlan(torch.utils.data.Dataset):
    """Map-style view for workers: item ``g`` is batch ``g`` counted from the start of epoch 0."""

    def __init__(self, source: IndexedSource) -> None:
        self.source = source

    def __getitem__(self, g: int) -> tuple[int, Any, list[str], str | None]:
        return self.source._build_numbered(g)


class _BatchWorkers:
    """One source's running workers: the loader's iterator and the batch number it gives next.

    Not running until :meth:`start`; :meth:`stop` ends the processes. A copy of the source
    (for the workers) gets a fresh, stopped ``_BatchWorkers``.
    """

    def __init__(self) -> None:
        self.loader_it: Any = None
        self.next_batch = -1
        self.ring: _SlotRing | None = None
        self._finalizer: weakref.finalize | None = None

    def ready_at(self, g: int) -> bool:
        """Running and about to give batch ``g``."""
        return self.loader_it is not None and self.next_batch == g

    def start(self, source: IndexedSource, start: int, end: int | None) -> None:
        """Start ``source.num_workers`` workers building batches ``start``, ``start + 1``, ... (to ``end``)."""
        sampler = itertools.count(start) if end is None else range(start, end)
        worker_view = copy.copy(source)  # a copy without the loader: no reference cycle
        layout = source.batch_buffers()
        self.ring = None if layout is None else _SlotRing(layout, _PREFETCH_FACTOR * source.num_workers + 2)
        worker_view._slots = self.ring
        loader = torch.utils.data.DataLoader(
            _BatchPlan(worker_view),
            batch_size=None,
            sampler=sampler,
            num_workers=source.num_workers,
            collate_fn=_as_is,
            multiprocessing_context=_start_method(source.start_method),
            # The loader draws its workers' base seed from this generator, not from torch's
            # global RNG, which belongs to the training step (dropout) and must not move.
            generator=torch.Generator().manual_seed(source.seed % 2**63),
            prefetch_factor=_PREFETCH_FACTOR,  # the slot ring's size depends on it
        )
        self.loader_it = iter(loader)
        self.next_batch = start
        # Stop the workers when the source is freed. A source often dies in a reference cycle
        # (the Estimator's run state holds the Infeed that holds it); the garbage collector then
        # clears the loader's queues before the loader's own __del__ runs, and that __del__ waits
        # 5 s per worker for a goodbye that can no longer be sent. The finalizer keeps the
        # loader out of the cycle and stops it while its queues still work.
        self._finalizer = weakref.finalize(source, _stop_loader, self.loader_it)
        self._finalizer.atexit = False  # at exit, multiprocessing ends daemonic workers

    def next(self, g: int, name: str) -> tuple[Any, list[str], str | None]:
        """Batch ``g`` from the workers: (batch, bad-example reasons, error text or None)."""
        got, out, bad, error = next(self.loader_it)
        if got != g:  # the loader returns items in sampler order; this cannot happen
            raise RuntimeError(f"{name}: workers returned batch {got}, expected {g}")
        self.next_batch = g + 1
        return out, bad, error

    def stop(self) -> None:
        finalizer, self._finalizer = self._finalizer, None
        self.loader_it = None
        self.next_batch = -1
        self.ring = None
        if finalizer is not None:
            finalizer()  # runs _stop_loader once


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


class _ThreadWorkers:
    """Batches built by ``num_workers`` threads of this process, ``2 x num_workers`` ahead, in order.

    For sources whose batch building spends its time outside the GIL (a JPEG decoder called
    through ctypes or a C extension that releases it): no process to fork, no shared-memory slot
    and no copy out of one, and the batch tensors are handed over as they are. Batch ``g`` is
    ``_build_numbered(g)`` as in a worker process, so the batches and the resume are the same.
    Each thread builds with its own copy of the source (``_thread_copy``), as a worker process
    has its own: the bad-example list, the order cache and open file descriptors are per copy.
    """

    ring: _SlotRing | None = None  # batches come back as tensors, never in slots

    def __init__(self) -> None:
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.pending: collections.deque[concurrent.futures.Future[Any]] = collections.deque()
        self.next_batch = -1
        self._submit: Callable[[], None] | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def loader_it(self) -> Any:
        return self.pool

    def ready_at(self, g: int) -> bool:
        """Running and about to give batch ``g``."""
        return self.pool is not None and self.next_batch == g

    def start(self, source: IndexedSource, start: int, end: int | None) -> None:
        """Start ``source.num_workers`` threads building batches ``start``, ``start + 1``, ... (to ``end``)."""
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
        self._finalizer = weakref.finalize(source, _stop_pool, pool)
        self._finalizer.atexit = False  # the pool's threads end with the interpreter

    def next(self, g: int, name: str) -> tuple[Any, list[str], str | None]:
        """Batch ``g`` from the threads: (batch, bad-example reasons, error text or None)."""
        assert self._submit is not None
        future = self.pending.popleft()
        self._submit()  # keep the threads as far ahead as before
        got, out, bad, error = future.result()
        if got != g:  # batches are queued in order; this cannot happen
            raise RuntimeError(f"{name}: input threads returned batch {got}, expected {g}")
        self.next_batch = g + 1
        return out, bad, error

    def stop(self) -> None:
        finalizer, self._finalizer = self._finalizer, None
        self.pool, self._submit, self.next_batch = None, None, -1
        self.pending.clear()
        if finalizer is not None:
            finalizer()  # runs _stop_pool once


class SlotSource(Protocol):
    """What :class:`_ExampleThreads` needs of a source that builds a batch one example (slot) at a
    time (:class:`~stoker.data.images.EncodedImageSource`)."""

    batches_per_epoch: int
    _bad: list[str]

    def batch_indices(self, epoch: int, batch: int) -> torch.Tensor: ...

    def slot_plan(self, indices: torch.Tensor, epoch: int) -> tuple[Any, Any, dict[str, torch.Tensor]]: ...

    def fill_slot(
        self, epoch: int, idx: Any, draws: Any, j: int, buffers: dict[str, torch.Tensor]
    ) -> tuple[int, int, str | None]: ...

    def finish_slots(self, epoch: int, buffers: dict[str, torch.Tensor], used: list[int], labels: list[int]) -> Any: ...

    def _thread_copy(self) -> Any: ...


class _SlotBatch:
    """A batch while its examples are being decoded: the plan, the next slot to hand out, the results."""

    def __init__(self, epoch: int, plan: tuple[Any, Any, dict[str, torch.Tensor]]) -> None:
        self.epoch = epoch
        self.idx, self.draws, self.buffers = plan
        self.rows = len(self.idx)
        self.next_slot = 0
        self.done = 0
        self.used = [0] * self.rows
        self.labels = [0] * self.rows
        self.bad: list[list[str]] = [[] for _ in range(self.rows)]
        self.errors: dict[int, str] = {}
        self.ready = threading.Event()


class _SlotRun:
    """The state of running :class:`_ExampleThreads`: the batches being built and the threads."""

    def __init__(self, view: SlotSource, start: int, end: int | None, ahead: int) -> None:
        self.view = view
        self.local = threading.local()
        self.cond = threading.Condition()
        self.pending: collections.OrderedDict[int, _SlotBatch] = collections.OrderedDict()
        self.planned = start  # the next batch number to plan
        self.taken = start  # the next batch number the consumer takes
        self.end = end
        self.ahead = ahead
        self.stopped = False
        self.failure: BaseException | None = None
        self.threads: list[threading.Thread] = []

    # -------------------------------------------------------------- under self.cond
    def _plan(self) -> _SlotBatch:
        g = self.planned
        epoch, b = divmod(g, self.view.batches_per_epoch)
        batch = _SlotBatch(epoch, self.view.slot_plan(self.view.batch_indices(epoch, b), epoch))
        self.pending[g] = batch
        self.planned = g + 1
        return batch

    def _next_task(self) -> tuple[_SlotBatch, int] | None:
        """The first slot not handed out, oldest batch first; a new batch planned while the
        decoding is less than ``ahead`` batches ahead of the consumer."""
        for batch in self.pending.values():
            if batch.next_slot < batch.rows:
                batch.next_slot += 1
                return batch, batch.next_slot - 1
        if self.planned < self.taken + self.ahead and (self.end is None or self.planned < self.end):
            batch = self._plan()
            batch.next_slot = 1
            return batch, 0
        return None

    # -------------------------------------------------------------- any thread
    def run_slot(self, batch: _SlotBatch, j: int) -> None:
        """Decode slot ``j`` of ``batch`` with this thread's own copy of the source."""
        source = getattr(self.local, "source", None)
        if source is None:
            source = self.local.source = self.view._thread_copy()
        try:
            used, label, error = source.fill_slot(batch.epoch, batch.idx, batch.draws, j, batch.buffers)
        except BaseException as e:  # a bug, not bad data (fill_slot returns that as text): the consumer raises it
            with self.cond:
                if self.failure is None:  # the slot will never be done: every later take() must raise, not wait
                    self.failure = (
                        e
                        if isinstance(e, Exception)
                        else RuntimeError(f"input threads: decoding stopped by {type(e).__name__}; close the source")
                    )
                batch.ready.set()
            raise
        bad, source._bad = source._bad, []
        with self.cond:
            batch.used[j], batch.labels[j], batch.bad[j] = used, label, bad
            if error is not None:
                batch.errors[j] = error
            batch.done += 1
            if batch.done == batch.rows:
                batch.ready.set()

    def decode_loop(self) -> None:
        """A decoding thread: slots in order until stopped."""
        one_kernel_thread()  # see _build_with
        while True:
            with self.cond:
                task = None if self.stopped else self._next_task()
                while task is None and not self.stopped:
                    self.cond.wait()
                    task = None if self.stopped else self._next_task()
                if task is None:
                    return
            try:
                self.run_slot(*task)
            except BaseException:  # recorded for the consumer by run_slot
                return

    def take(self, g: int) -> tuple[Any, list[str], str | None]:
        """Batch ``g`` for the consumer, who decodes its remaining slots itself instead of waiting."""
        while True:
            task = None
            with self.cond:
                if self.failure is not None:
                    raise self.failure
                batch = self.pending.get(g)
                if batch is None:
                    if g != self.planned:  # batches are taken in order; this cannot happen
                        raise RuntimeError(f"input threads: batch {g} asked for, {self.planned} is next to plan")
                    batch = self._plan()
                    self.cond.notify_all()
                if batch.done == batch.rows:
                    del self.pending[g]
                    self.taken = g + 1
                    self.cond.notify_all()  # room for one more batch ahead
                elif batch.next_slot < batch.rows:
                    batch.next_slot += 1
                    task = (batch, batch.next_slot - 1)
            if task is not None:
                self.run_slot(*task)
            elif batch.done < batch.rows:
                batch.ready.wait()
            else:
                break
        if batch.errors:  # the first bad slot's, as a batch built in order would raise
            return None, [], batch.errors[min(batch.errors)]
        out = self.view.finish_slots(batch.epoch, batch.buffers, batch.used, batch.labels)
        return out, [reason for reasons in batch.bad for reason in reasons], None

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


_RUNNING: weakref.WeakSet[_SlotRun] = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    """Stop the decoding threads before the interpreter finalises (a daemon thread still inside a
    torch kernel then aborts the process); each finishes the image it is on."""
    runs = list(_RUNNING)
    for run in runs:
        run.stop()
    for run in runs:
        for thread in run.threads:
            thread.join(timeout=5)


atexit.register(_stop_all_at_exit)


class _ExampleThreads:
    """Batches built one example at a time by ``num_workers`` threads of this process, and by the
    thread that asks for a batch: while its batch is not complete it decodes the batch's remaining
    examples itself instead of waiting.

    For sources that build in slots (:class:`SlotSource`) with a decoder that releases the GIL. On
    a CPU step this keeps one busy thread per core: ``cores - 1`` decoding threads plus the
    training thread, which decodes only when its next batch is not ready. With a thread per core
    beside the training thread, three runnable threads on two cores, the OS parks a thread that
    holds the GIL and the others wait for it (trivial on real JPEGs, 2 cores: 1.75 cores busy
    against 1.93; docs/data.md, "Workers"). Slot ``j`` of batch ``g`` depends only on ``(g, j)``, a
    bad example is replaced within its slot, and the batch's bad-example reasons are reported in
    slot order: which thread decoded what does not change a batch, so resume stays exact. The
    decoding runs up to ``2 x num_workers`` batches ahead (at least 2).
    """

    ring: _SlotRing | None = None  # batches come back as tensors, never in slots

    def __init__(self) -> None:
        self.run: _SlotRun | None = None
        self.next_batch = -1
        self._finalizer: weakref.finalize | None = None

    @property
    def loader_it(self) -> Any:
        return self.run

    def ready_at(self, g: int) -> bool:
        """Running and about to give batch ``g``."""
        return self.run is not None and self.next_batch == g

    def start(self, source: IndexedSource, start: int, end: int | None) -> None:
        """Start ``source.num_workers`` threads decoding batches ``start``, ``start + 1``, ... (to ``end``)."""
        view = cast(SlotSource, copy.copy(source))  # no reference to the source: it may be freed (see _ThreadWorkers)
        run = _SlotRun(view, start, end, ahead=_PREFETCH_FACTOR * max(1, source.num_workers))
        for i in range(source.num_workers):
            thread = threading.Thread(target=run.decode_loop, name=f"stoker-input-{i}", daemon=True)
            run.threads.append(thread)
        _RUNNING.add(run)
        for thread in run.threads:
            thread.start()
        self.run, self.next_batch = run, start
        self._finalizer = weakref.finalize(source, run.stop)
        self._finalizer.atexit = False  # _stop_all_at_exit stops and joins them

    def next(self, g: int, name: str) -> tuple[Any, list[str], str | None]:
        """Batch ``g``: (batch, bad-example reasons, error text or None)."""
        assert self.run is not None
        out = self.run.take(g)
        self.next_batch = g + 1
        return out

    def stop(self) -> None:
        finalizer, self._finalizer = self._finalizer, None
        self.run, self.next_batch = None, -1
        if finalizer is not None:
            finalizer()  # runs run.stop once


def make_workers(kind: str, by_example: bool = False) -> _BatchWorkers | _ThreadWorkers | _ExampleThreads:
    """A stopped set of workers: ``"thread"`` or ``"process"``; ``by_example``: threads that build
    a batch one example at a time, helped by the consumer (:class:`_ExampleThreads`)."""
    if kind == "thread":
        return _ExampleThreads() if by_example else _ThreadWorkers()
    return _BatchWorkers()
