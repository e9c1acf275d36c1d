"""Workers that build an :class:`~stoker.data.IndexedSource`'s batches: threads or processes.

With ``worker_kind="thread"`` batches are built by threads of the training process, for
sources whose batch building runs outside the GIL: image sources one example at a time, the
thread that asks for a batch decoding its remaining examples instead of waiting
(:class:`_ExampleThreads`), other sources a whole batch per thread (:class:`_ThreadWorkers`).
With ``worker_kind="process"`` they are built in worker processes (:class:`_BatchWorkers`).

Every kind is a :class:`~stoker.data._workers.base._Workers` (start at a batch number, the next
batch, stop), so the source that owns them never asks which kind it has. One module per kind:

- :mod:`.base`: the ``_Workers`` base and what the workers read of a source;
- :mod:`.processes`: worker processes, their start method and the shared-memory batch slots;
- :mod:`.threads`: threads that build whole batches, and one kernel thread per decoding thread;
- :mod:`.example_threads`: threads that build a batch one example at a time, the consumer helping.
"""

from __future__ import annotations

from .base import _Workers
from .example_threads import _ExampleThreads, _SlotRun
from .processes import InSlot, _BatchWorkers, _SlotRing, build_in_slot, read_slot
from .threads import _ThreadWorkers, one_kernel_thread


def make_workers(kind: str, by_example: bool = False) -> _Workers:
    """A stopped set of workers: ``"thread"`` or ``"process"``; ``by_example``: threads that build
    a batch one example at a time, helped by the consumer (:class:`_ExampleThreads`)."""
    if kind == "thread":
        return _ExampleThreads() if by_example else _ThreadWorkers()
    return _BatchWorkers()


__all__ = [
    "InSlot",
    "_BatchWorkers",
    "_ExampleThreads",
    "_SlotRing",
    "_SlotRun",
    "_ThreadWorkers",
    "_Workers",
    "build_in_slot",
    "make_workers",
    "one_kernel_thread",
    "read_slot",
]
