"""Worker threads that build a batch one example (slot) at a time, helped by the consumer
(``worker_kind="thread"`` for image sources: :class:`_ExampleThreads`).
"""

from __future__ import annotations

import atexit
import collections
import copy
import threading
import weakref
from typing import Any, Protocol, cast

import torch

from .base import _PREFETCH_FACTOR, IndexedSource, _Workers
from .threads import one_kernel_thread


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


class _ExampleThreads(_Workers):
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

    def __init__(self) -> None:
        super().__init__()
        self.run: _SlotRun | None = None

    @property
    def loader_it(self) -> Any:
        return self.run

    def start(self, source: IndexedSource, start: int, end: int | None) -> None:
        view = cast(SlotSource, copy.copy(source))  # no reference to the source: it may be freed (see _ThreadWorkers)
        run = _SlotRun(view, start, end, ahead=_PREFETCH_FACTOR * max(1, source.num_workers))
        for i in range(source.num_workers):
            thread = threading.Thread(target=run.decode_loop, name=f"stoker-input-{i}", daemon=True)
            run.threads.append(thread)
        _RUNNING.add(run)
        for thread in run.threads:
            thread.start()
        self.run, self.next_batch = run, start
        self._stop_with_source(source, run.stop)  # _stop_all_at_exit stops and joins them at exit

    def _take(self, g: int, name: str) -> tuple[Any, list[str], str | None]:
        assert self.run is not None
        return self.run.take(g)

    def _clear(self) -> None:
        self.run = None
