"""What every kind of input worker is: the :class:`Workers` base and what it reads of a source.

A set of workers builds an :class:`~stoker.data.IndexedSource`'s batches ahead of the consumer,
in order, batch ``g`` counted from the start of epoch 0: :meth:`Workers.start` at a batch
number, :meth:`Workers.next` for each batch in turn, :meth:`Workers.stop` to end them. Each kind
(:mod:`.processes`, :mod:`.threads`, :mod:`.example_threads`) says how it runs them.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

import torch

#: Batches each worker is asked for ahead of the consumer.
_PREFETCH_FACTOR = 2


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


class IndexedSource(Protocol):
    """What the workers read of a ``stoker.data.base.IndexedSource`` (a protocol, so this package
    does not import the module that imports it)."""

    num_workers: int
    start_method: str | None
    seed: int
    _slots: _SlotRing | None

    def _build_numbered(self, g: int) -> tuple[int, Any, list[str], str | None]: ...

    def batch_buffers(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None: ...

    def _thread_copy(self) -> IndexedSource: ...


class _Workers(ABC):
    """One source's workers, stopped until :meth:`start`: the batch number they give next and
    the finalizer that stops them when the source is freed.

    A copy of the source (for the workers) gets a fresh, stopped set of the same kind.
    """

    #: The shared-memory slots batches come back in (process workers only); else None.
    ring: _SlotRing | None = None

    def __init__(self) -> None:
        self.next_batch = -1
        self._finalizer: weakref.finalize | None = None

    @property
    @abstractmethod
    def loader_it(self) -> Any:
        """What runs while the workers run (the loader's iterator, the pool, the run); else None."""

    def ready_at(self, g: int) -> bool:
        """Running and about to give batch ``g``."""
        return self.loader_it is not None and self.next_batch == g

    @abstractmethod
    def start(self, source: IndexedSource, start: int, end: int | None) -> None:
        """Start ``source.num_workers`` workers building batches ``start``, ``start + 1``, ... (to ``end``)."""

    @abstractmethod
    def _take(self, g: int, name: str) -> tuple[Any, list[str], str | None]:
        """Batch ``g`` from the running workers."""

    @abstractmethod
    def _clear(self) -> None:
        """Forget the running workers (the finalizer then stops them)."""

    def next(self, g: int, name: str) -> tuple[Any, list[str], str | None]:
        """Batch ``g``: (batch, bad-example reasons, error text or None)."""
        out = self._take(g, name)
        self.next_batch = g + 1
        return out

    def stop(self) -> None:
        """End the workers (they start again at the next :meth:`start`)."""
        finalizer, self._finalizer = self._finalizer, None
        self._clear()
        self.next_batch = -1
        if finalizer is not None:
            finalizer()  # runs the stop function once

    def _stop_with_source(self, source: IndexedSource, stop: Callable[..., None], *args: Any) -> None:
        """Call ``stop(*args)`` when ``source`` is freed (or at :meth:`stop`), never at exit."""
        self._finalizer = weakref.finalize(source, stop, *args)
        self._finalizer.atexit = False
