"""Asynchronous checkpoints: the loop hands a snapshot to a background writer and goes on.

The snapshot is taken on the loop thread, at the loop boundary: every tensor of the state is
copied off the live parameters and optimizer buffers (to the CPU), every container rebuilt.
That copy is the only part of a save the loop waits for; serialising, hashing, writing,
syncing and committing the index happen on one background thread. Because the snapshot
is a copy, the next steps can change the live tensors freely, and what is written is exactly
what a synchronous save at that step would have written: exact resume does not change.

At most one save is in flight: a save that comes while the previous one is still being
written waits for it first. A failed write is reported at the next loop boundary (or at the
next save, or at the end of training), as a ``CheckpointError`` that names the checkpoint, the
cause and the checkpoint that stays the latest; since the index is the commit point, a failed
write never touches the previous checkpoint. The end of training (also after SIGTERM) waits
for the write in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ..errors import CheckpointError
from ..storage import Location

log = logging.getLogger("stoker")


def snapshot(state: Any) -> Any:
    """A copy of ``state`` that shares no tensor and no container with it (tensors to the CPU)."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        copied = {k: snapshot(v) for k, v in state.items()}
        return copied if type(state) is dict else type(state)(copied)
    if isinstance(state, list):
        return [snapshot(v) for v in state]
    if isinstance(state, tuple):
        items = [snapshot(v) for v in state]
        return type(state)(*items) if hasattr(state, "_fields") else tuple(items)
    return state  # numbers, strings, None: immutable


class AsyncCheckpointWriter:
    """Runs one checkpoint write at a time on a background thread and keeps its outcome.

    ``latest`` is asked, when a write failed, for the checkpoint that stays the latest, to say
    so in the error.
    """

    def __init__(self, latest: Callable[[], Location | None]) -> None:
        self._latest = latest
        self._thread: threading.Thread | None = None
        self._name = ""
        self._error: BaseException | None = None
        self.last_stall = 0.0  # seconds the previous submit waited for an earlier write

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, name: str, write: Callable[[], Any]) -> None:
        """Start ``write()`` (which writes checkpoint ``name``) once the previous write is done."""
        start = time.perf_counter()
        self.wait()  # at most one in flight; raises the previous write's failure
        self.last_stall = time.perf_counter() - start
        self._name, self._error = name, None

        def run() -> None:
            try:
                write()
            except BaseException as e:  # noqa: BLE001 - kept and re-raised on the loop thread
                self._error = e

        # Not a daemon: an interpreter that exits (e.g. sys.exit after SIGTERM) joins it first.
        self._thread = threading.Thread(target=run, name=f"stoker-ckpt-{name}", daemon=False)
        self._thread.start()

    def poll(self) -> None:
        """Raise the failure of a write that has finished, if it failed; never blocks."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
            self._raise()

    def wait(self) -> None:
        """Wait for the write in flight; raise its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._raise()

    def drain(self) -> None:
        """Wait for the write in flight and log (not raise) its failure: for error paths."""
        try:
            self.wait()
        except CheckpointError as e:
            log.error("%s", e)

    def _raise(self) -> None:
        error, self._error = self._error, None
        if error is None:
            return
        if "stays the latest" in str(error):  # a StorageError already says what is kept
            what = str(error)
        else:
            latest = self._latest()
            kept = f"{str(latest)!r} stays the latest checkpoint" if latest else "no earlier checkpoint exists"
            what = f"{type(error).__name__}: {error}; {kept}"
        raise CheckpointError(
            f"asynchronous checkpoint {self._name} failed: {what}; training stopped: rerun the same command to resume"
        ) from error


__all__ = ["AsyncCheckpointWriter", "snapshot"]
