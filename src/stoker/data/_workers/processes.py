"""Worker processes (``worker_kind="process"``): a ``torch.utils.data.DataLoader`` over the source.

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

import copy
import itertools
import logging
import sys
from typing import Any, NamedTuple, TypeVar

import torch

from .base import _PREFETCH_FACTOR, IndexedSource, _SlotRing, _Workers

log = logging.getLogger("stoker")


class InSlot(NamedTuple):
    """A worker's answer for a batch built in a shared slot: the slot, the rows filled, the rest (labels)."""

    slot: int
    rows: int
    rest: Any


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


class _BatchWorkers(_Workers):
    """Worker processes: the loader's iterator and the shared-memory slot ring while they run."""

    def __init__(self) -> None:
        super().__init__()
        self._loader_it: Any = None
        self.ring: _SlotRing | None = None

    @property
    def loader_it(self) -> Any:
        return self._loader_it

    def start(self, source: IndexedSource, start: int, end: int | None) -> None:
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
        self._loader_it = iter(loader)
        self.next_batch = start
        # Stop the workers when the source is freed. A source often dies in a reference cycle
        # (the Estimator's run state holds the Infeed that holds it); the garbage collector then
        # clears the loader's queues before the loader's own __del__ runs, and that __del__ waits
        # 5 s per worker for a goodbye that can no longer be sent. The finalizer keeps the
        # loader out of the cycle and stops it while its queues still work (at exit,
        # multiprocessing ends daemonic workers).
        self._stop_with_source(source, _stop_loader, self._loader_it)

    def _take(self, g: int, name: str) -> tuple[Any, list[str], str | None]:
        got, out, bad, error = next(self._loader_it)
        if got != g:  # the loader returns items in sampler order; this cannot happen
            raise RuntimeError(f"{name}: workers returned batch {got}, expected {g}")
        return out, bad, error

    def _clear(self) -> None:
        self._loader_it = None
        self.ring = None


__all__ = ["InSlot", "build_in_slot", "read_slot"]
