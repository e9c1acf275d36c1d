"""Every "auto" decision about the machine, each made once, with the reason for it.

A choice that depends on the machine (how many threads, what decodes the input and in what
kind of worker, ...) is a pure function here from explicit facts (core counts, what the
decoder can do, where the step runs) to a :class:`Choice`: the value and a short reason a run
header can print. Nothing here measures or reads the machine: callers gather the facts
(``stoker.kernels.machine``, ``stoker.data.jpeg``) and pass them in, so each rule can be
tested on made-up facts.

This module is a leaf (it imports no other part of stoker), so every layer may ask it: the
data sources resolve ``worker_kind="auto"`` with it, and ``stoker bench`` builds its plan from
the same rules. The thresholds are measured values; where they were measured is in the docs
page each constant cites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Choice(Generic[T]):
    """One resolved "auto": the ``value`` chosen and the ``reason`` (a short clause, no full stop)."""

    value: T
    reason: str


#: ``worker_kind="auto"`` takes threads for at most this many workers: a decoding thread still
#: holds the GIL for ~0.15 ms an image, so beyond a few threads the GIL bounds the rate.
#: Measured: docs/data.md#workers.
AUTO_THREAD_WORKERS_MAX = 4


def image_threads_suffice(*, releases_gil: bool, decode_on_device: bool, pin_memory: bool) -> Choice[bool]:
    """Whether decoding threads build an image source's batches well enough: the CPU decoder
    releases the GIL for a whole decode (``releases_gil``: libjpeg-crop) and the batches feed a
    CPU step (not ``pin_memory`` for a CUDA infeed, not decoded on the device). On a CUDA host
    processes measured faster at every worker count tried (docs/data.md#workers)."""
    if decode_on_device:
        return Choice(False, "the GPU decodes")
    if pin_memory:
        return Choice(False, "the batches feed a CUDA step (processes measured faster there)")
    if not releases_gil:
        return Choice(False, "the decoder holds the GIL")
    return Choice(True, "the decoder releases the GIL for a whole decode")


def auto_worker_kind(threads_suffice: bool, num_workers: int) -> Choice[str]:
    """What ``worker_kind="auto"`` gives: ``"thread"`` when building a batch releases the GIL
    (``threads_suffice``) and there are at most :data:`AUTO_THREAD_WORKERS_MAX` workers, else
    ``"process"``."""
    if not threads_suffice:
        return Choice("process", "building a batch holds the GIL")
    if num_workers > AUTO_THREAD_WORKERS_MAX:
        return Choice("process", f"more than {AUTO_THREAD_WORKERS_MAX} workers would be bound by the GIL")
    return Choice("thread", "the decoder releases the GIL")


__all__ = ["AUTO_THREAD_WORKERS_MAX", "Choice", "auto_worker_kind", "image_threads_suffice"]
