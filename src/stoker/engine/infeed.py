"""The infeed: batches from an ``input_fn`` iterable, prepared ahead, on the device.

Iterating (this module) is kept apart from stepping (``loop.py``). The infeed

- normalises each item to ``(features, labels)`` (an item that is not a 2-tuple is features);
- in eval and predict, pads a short last batch to the static batch size by repeating its
  first row and returns a mask of the real rows, so the step never sees a new shape
  (TPUEstimator's padding and stopping signals);
- copies to the device: on CUDA from pinned memory, on a side stream, ``non_blocking``;
- with ``prefetch_depth > 0`` does all of that in a background thread, ``prefetch_depth``
  batches ahead, where that thread pays: always when batches are copied to a CUDA device; on
  the CPU only when fetching a batch takes long enough to be worth overlapping (see
  ``Infeed.prefetching``), since handing a batch from thread to thread costs the training
  thread more than taking an in-memory batch itself; a source with
  ``prefers_inline_fetch = True`` is always fetched in the training thread;
- measures how long the loop waited for data;
- tracks the position of the data the *loop has consumed* (not what was prefetched), for
  checkpoints: fetching inline, that is the source's own state (``state_dict`` / grain's
  ``get_state``) read when the checkpoint is taken; with the prefetch thread, which runs
  ahead, it is that state snapshotted by the thread every ``snapshot_every`` batches, plus
  the count consumed since the snapshot. A source without state is resumed by replaying the
  batches it had consumed, with a warning;
- passes over the batches a rollback took out (``NanLossHook(on_nan="rollback")``): positions
  in the *stream*, the batches the source yields counted from the start of training
  (:func:`with_rollback`); the position and those records are the state a checkpoint keeps.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data._tree import batch_rows, tree_map
from ..errors import CheckpointMismatchError, DataError, StateError, UserCodeError

log = logging.getLogger("stoker")

_END = object()

# On a CPU device the prefetch thread can only win what fetching spends outside the GIL
# (decoding, file reads, torch kernels), and every hand-over costs the training thread a lock
# round trip plus GIL contention with the producer, which needs the GIL between the ops it
# runs just when the step does. In benchmarks/overhead.py (MLP, batch 64, 2-core machine) a
# generator of in-memory tensor slices takes ~70 us per batch inline during training, and the
# thread made the run ~120 us per step slower, not faster. So a CPU infeed first fetches
# PROBE_BATCHES batches in the training thread (after one warm-up batch, which may include
# opening files or shuffling) and starts the thread only if the median fetch took at least
# THREAD_PAYS_ABOVE_S, a few times that hand-over cost (decoding a batch of images takes
# milliseconds).
PROBE_BATCHES = 16
THREAD_PAYS_ABOVE_S = 500e-6


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


@dataclass(slots=True)
class Batch:
    """One batch on the device; ``mask`` marks real rows when the batch was padded."""

    features: Any
    labels: Any
    mask: torch.Tensor | None
    rows: int


def _state_api(source: Any) -> tuple[str, str] | None:
    if callable(getattr(source, "state_dict", None)) and callable(getattr(source, "load_state_dict", None)):
        return "state_dict", "load_state_dict"
    if callable(getattr(source, "get_state", None)) and callable(getattr(source, "set_state", None)):
        return "get_state", "set_state"
    return None


class Infeed:
    """Turns an ``input_fn`` iterable into device batches and knows how far the loop got."""

    def __init__(
        self,
        source: Iterable[Any],
        *,
        device: torch.device,
        prefetch_depth: int = 2,
        snapshot_every: int = 1,
        pad_to: int | None = None,
        restore: dict[str, Any] | None = None,
        what: str = "input_fn",
    ) -> None:
        if not isinstance(source, Iterable):
            raise UserCodeError(
                f"{what} must return an iterable of (features, labels) batches; got {type(source).__name__}"
            )
        self.device = device
        self.pad_to = pad_to
        self.what = what
        self.snapshot_every = max(1, snapshot_every)
        self.wait_seconds = 0.0
        self.consumed = 0
        self._source = source
        self._api = _state_api(source)
        self._cuda = device.type == "cuda"
        self._on_cpu = device.type == "cpu"
        self._cpu_train = self._on_cpu and pad_to is None  # batches go to the step as they come
        self._stream = torch.cuda.Stream(device) if self._cuda else None
        skip = 0
        if restore is not None:
            self._restore(restore)
            skip = int(restore.get("skip", 0))  # read after _restore, which sets it when re-sharding
            advance = getattr(source, "advance", None) if skip else None
            if callable(advance):
                advance(skip)  # jump (stoker's sources): nothing is decoded to be thrown away
                skip = 0
        self._it = iter(source)
        self._skip(skip)
        #: Rollbacks so far (``with_rollback``'s records, each with the stream batches it took out).
        self.rollbacks: list[dict[str, Any]] = list(restore.get("rollbacks", [])) if restore else []
        #: The stream position of what the loop consumed: batches the source yielded, counted
        #: from the start of training (absolute where rollbacks are recorded, else relative).
        self.raw = int(restore.get("raw", restore.get("skip", 0))) if restore else 0
        self._fetched_raw = self.raw  # the producer's stream position (ahead with a prefetch thread)
        self._skips = sorted({b for r in self.rollbacks for b in r["batches"] if b >= self.raw})
        self._next_skip = self._skips[0] if self._skips else -1
        # With a prefetch thread (only then): the source's state as of the last snapshot the
        # loop consumed up to, the consumed count then, and the count the thread produced.
        self._base: Any = None
        self._base_raw = 0
        self._produced = 0
        self._queue: queue.Queue[Any] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        if getattr(source, "prefers_inline_fetch", False):
            prefetch_depth = 0  # the source says a hand-over would cost more than a fetch
        self._depth = prefetch_depth
        self._probe: list[float] | None = None  # inline fetch times while deciding (CPU only)
        self.prefetching: bool | None = False
        """Whether a prefetch thread runs: ``None`` while a CPU infeed is still measuring."""
        if prefetch_depth > 0:
            if self._cuda:
                self._start_thread()
            else:
                self._probe = []
                self.prefetching = None

    def _start_thread(self) -> None:
        # Fetched inline so far, the source's position is the consumed one: it becomes the base
        # the thread's snapshots count from.
        self._base = self._snapshot()
        self._base_raw = self._fetched_raw = self.raw
        self._produced = self.consumed
        self._queue = queue.Queue(maxsize=self._depth)
        self._thread = threading.Thread(target=self._produce, name="stoker-infeed", daemon=True)
        self._thread.start()
        self.prefetching = True

    def _measure(self, seconds: float) -> None:
        """Record one inline fetch; after the probe, start the thread if fetching is slow."""
        probe = self._probe
        assert probe is not None
        probe.append(seconds)
        if len(probe) <= PROBE_BATCHES:  # the first is a warm-up, not counted below
            return
        self._probe = None
        median = sorted(probe[1:])[PROBE_BATCHES // 2]
        if median >= THREAD_PAYS_ABOVE_S:
            log.debug(
                "%s: %.0f us per batch fetched inline; prefetching in a thread from now on", self.what, 1e6 * median
            )
            self._start_thread()
        else:
            log.debug("%s: %.0f us per batch; fetching in the training thread", self.what, 1e6 * median)
            self.prefetching = False

    # ------------------------------------------------------------------ state
    def _snapshot(self) -> Any:
        return getattr(self._source, self._api[0])() if self._api else None

    def _restore(self, state: dict[str, Any]) -> None:
        if "reshard" in state:  # saved by a run with another number of replicas
            state.update(_resharded(self._source, state["reshard"], self.what))
        if self._api is not None and state.get("source") is not None:
            getattr(self._source, self._api[1])(state["source"])
        elif self._api is None and int(state.get("skip", 0)):
            log.warning(
                "%s's iterable has no state_dict()/load_state_dict(): replaying %d batches to "
                "resume its position (give it state, or use stoker.data sources, to resume instantly)",
                self.what,
                int(state["skip"]),
            )

    def _skip(self, n: int) -> None:
        for i in range(n):
            try:
                next(self._it)
            except StopIteration:
                raise StateError(
                    f"{self.what}: the data ended after {i} of the {n} batches needed to resume its "
                    "position; resume with the same input_fn and data"
                ) from None

    def state_dict(self) -> dict[str, Any]:
        """Position of the data the loop has consumed, for a checkpoint (``skip``: stream batches
        to pass after restoring ``source``; with rollbacks, also the stream position and them)."""
        state: dict[str, Any]
        if self._api is None:
            state = {"source": None, "skip": self.raw}
        elif self._queue is None:  # fetched inline: the source stands exactly where the loop is
            state = {"source": self._snapshot(), "skip": 0}
        else:
            state = {"source": self._base, "skip": self.raw - self._base_raw}
        if self.rollbacks:
            state.update(raw=self.raw, rollbacks=[dict(r) for r in self.rollbacks])
        return state

    def _pass_skipped(self, raw: int) -> int:
        """Fetch and drop the batches a rollback took out that stand next in the stream at
        position ``raw``; return the position after them (StopIteration if the data ends)."""
        while raw == self._next_skip:
            next(self._it)
            raw += 1
            self._skips.pop(0)
            self._next_skip = self._skips[0] if self._skips else -1
        return raw

    # ------------------------------------------------------------------ producing
    def _next_item(self) -> tuple[Batch, Any, int] | object:
        """The next batch, every ``snapshot_every`` batches the source's state after it (the
        prefetch thread's way: the consumer adopts the snapshot when it takes that batch), and
        the stream position after it."""
        try:
            if self._fetched_raw == self._next_skip:
                self._fetched_raw = self._pass_skipped(self._fetched_raw)
            item = next(self._it)
        except StopIteration:
            return _END
        self._fetched_raw += 1
        self._produced += 1
        snap = self._snapshot() if self._api and self._produced % self.snapshot_every == 0 else None
        return self._prepare(item), snap, self._fetched_raw

    def _prepare(self, item: Any) -> Batch:
        if type(item) is tuple and len(item) == 2:  # (features, labels), the common case first
            features, labels = item
        elif isinstance(item, (tuple, list)) and len(item) == 2 and not hasattr(item, "_fields"):
            features, labels = item
        else:
            features, labels = item, None
        if self.pad_to is None:  # training: no padding, so the row count is not needed here
            return self._to_device(Batch(features, labels, None, -1))
        rows = batch_rows(features)
        if rows is None:
            raise DataError(f"{self.what}: features need a batch dimension to be padded")
        if rows > self.pad_to:
            raise DataError(
                f"{self.what} yielded a batch of {rows} rows, more than the per-replica batch of "
                f"{self.pad_to}; batch with params['batch_size']"
            )
        if rows < self.pad_to:
            pad = self.pad_to - rows
            grow = lambda t: torch.cat([t, t[:1].expand(pad, *t.shape[1:])]) if t.dim() > 0 else t  # noqa: E731
            features, labels = tree_map(grow, features), tree_map(grow, labels)
        mask = torch.arange(self.pad_to) < rows
        return self._to_device(Batch(features, labels, mask, rows))

    def _to_device(self, batch: Batch) -> Batch:
        device = self.device
        if not self._cuda:
            if self._on_cpu and _cpu_tensors(batch.features, batch.labels):
                return batch  # the common case on a CPU run: nothing to convert or move
            move = lambda t: t if t.device == device else t.to(device)  # noqa: E731
            return Batch(tree_map(move, batch.features), tree_map(move, batch.labels), batch.mask, batch.rows)
        # Pinned host memory lets the copy run asynchronously on a side stream, overlapping the
        # step the device is running; the consumer waits on an event, not on the host.
        with torch.cuda.stream(self._stream):
            copy = lambda t: t.pin_memory().to(device, non_blocking=True) if t.device.type == "cpu" else t.to(device)  # noqa: E731
            moved = Batch(
                tree_map(copy, batch.features),
                tree_map(copy, batch.labels),
                None if batch.mask is None else copy(batch.mask),
                batch.rows,
            )
            event = torch.cuda.Event()
            event.record(self._stream)
        return _CudaBatch(moved, event)  # type: ignore[return-value]  # typed Batch: see __next__

    def _produce(self) -> None:
        assert self._queue is not None
        while not self._stop.is_set():
            try:
                entry = self._next_item()
            except BaseException as e:  # hand any input error to the consumer, with its traceback
                entry = _Failure(e)
            while not self._stop.is_set():
                try:
                    self._queue.put(entry, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if entry is _END or isinstance(entry, _Failure):
                return

    @property
    def bad_examples_skipped(self) -> int:
        """Examples the source replaced so far in this process (``skip_bad_examples=True``); 0 for
        sources that never skip."""
        return int(getattr(self._source, "bad_examples_skipped", 0) or 0)

    # ------------------------------------------------------------------ consuming
    def __iter__(self) -> Infeed:
        return self

    def __next__(self) -> Batch:
        start = time.perf_counter()
        if self._queue is None:  # inline: the common CPU case, kept short
            try:
                if self.raw == self._next_skip:  # a batch a rollback took out (rare)
                    self.raw = self._pass_skipped(self.raw)
                item = next(self._it)
            except StopIteration:
                self.wait_seconds += time.perf_counter() - start
                raise
            self.raw += 1
            # A training batch of CPU tensors on a CPU run needs nothing done to it: skip _prepare.
            if self._cpu_train and type(item) is tuple and len(item) == 2 and _cpu_tensors(*item):
                batch = Batch(item[0], item[1], None, -1)
            else:
                batch = self._prepare(item)
            seconds = time.perf_counter() - start
            self.wait_seconds += seconds
            self.consumed += 1  # before _measure, which may start the thread from this position
            if self._probe is not None:
                self._measure(seconds)
            if self._cuda:  # prefetch_depth=0 on CUDA: the copy was still made on the side stream
                # _prepare returns a _CudaBatch on CUDA, typed Batch so that this hot path needs no isinstance
                return batch.wait()  # type: ignore[attr-defined]
            return batch
        entry = self._queue.get()
        self.wait_seconds += time.perf_counter() - start
        if entry is _END:
            raise StopIteration
        if isinstance(entry, _Failure):
            raise entry.error
        batch, snap, self.raw = entry
        self.consumed += 1
        if snap is not None:
            self._base = snap
            self._base_raw = self.raw
        if isinstance(batch, _CudaBatch):
            batch = batch.wait()
        return batch

    def close(self) -> None:
        """Stop the prefetch thread (batches it prepared are dropped; the position is kept)."""
        self._stop.set()
        if self._queue is not None:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        close = getattr(self._source, "close", None)
        if callable(close):  # e.g. stop a source's worker processes now, not at garbage collection
            close()

    def __enter__(self) -> Infeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resharded(source: Any, saved: list[dict[str, Any]], what: str) -> dict[str, Any]:
    """The input state for this replica from the states every replica of a run with another
    number of replicas saved: the source re-sharded, the count past its snapshot and the
    rollback records kept."""
    reshard = getattr(source, "reshard_state_dict", None)
    if not callable(reshard):
        raise CheckpointMismatchError(
            f"{what}: the checkpoint was written by {len(saved)} replicas and this source cannot be "
            "re-sharded to a different number (stoker.data sources can, with the same global batch); "
            f"resume with {len(saved)} replicas"
        )
    state = {"source": reshard([s["source"] for s in saved]), "skip": saved[0]["skip"]}
    state.update({key: saved[0][key] for key in ("raw", "rollbacks") if key in saved[0]})
    return state


def epochs_read(infeed: Infeed) -> float | None:
    """The epochs of its source ``infeed``'s loop has consumed (``2.41``), when the source's
    position is ``(epoch, batch)`` of ``batches_per_epoch`` batches (``stoker.data``'s); else ``None``."""
    per_epoch = getattr(infeed._source, "batches_per_epoch", None)
    if not isinstance(per_epoch, int) or per_epoch < 1:
        return None
    state = infeed.state_dict()
    position = state["source"]
    if not isinstance(position, dict) or "epoch" not in position or "batch" not in position:
        return None
    return (int(position["epoch"]) * per_epoch + int(position["batch"]) + int(state["skip"])) / per_epoch


def input_scalars(infeed: Infeed) -> dict[str, float]:
    """What ``infeed``'s source reports about the batches its loop consumed, for the summaries
    (``summary_scalars(state, ahead)``: a mixture's ``mix/<name>`` proportions); else ``{}``."""
    report = getattr(infeed._source, "summary_scalars", None)
    if not callable(report) or infeed._api is None:
        return {}
    state = infeed.state_dict()  # what the loop consumed: a snapshot and the batches after it
    return dict(report(state["source"], int(state["skip"])))


def with_rollback(
    state: dict[str, Any] | None,
    *,
    steps_after: int,
    accumulation: int,
    raw_default: int,
    record: dict[str, Any],
    since: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """A checkpoint's input ``state`` with one more rollback ``record``: from there on, the
    ``accumulation`` stream batches of the step ``steps_after`` steps after the checkpoint are
    passed over. ``since``: the rollbacks of the run so far, when it took some after that
    checkpoint was written (records only grow, so the longer list holds the other).

    Stream positions count the batches the source yields from the start of training, the ones
    passed over included, so they stay valid across further rollbacks and resumes; a state
    saved before any rollback does not record its position, which is then ``raw_default``
    (global step x ``accumulation``: every step so far consumed that many) or, for a source
    without state, its replay count.
    """
    if state is None:
        raise StateError(
            "cannot roll back: the checkpoint holds no input position for this replica (train with the same input_fn)"
        )
    first = state["reshard"][0] if "reshard" in state else state
    default = int(first["skip"]) if first.get("source") is None and "skip" in first else raw_default
    raw = int(state.get("raw", first.get("raw", default)))
    rollbacks = list(state.get("rollbacks", first.get("rollbacks", [])))
    if len(since) > len(rollbacks):
        rollbacks = [dict(r) for r in since]
    passed = {b for r in rollbacks for b in r["batches"]}
    bad: list[int] = []
    pos, consumed, start = raw, 0, steps_after * accumulation
    while len(bad) < accumulation:
        if pos not in passed:
            if consumed >= start:
                bad.append(pos)
            consumed += 1
        pos += 1
    return dict(state, raw=raw, rollbacks=[*rollbacks, dict(record, batches=bad)])


def _cpu_tensors(features: Any, labels: Any) -> bool:
    """Whether a batch is a plain CPU tensor of features and one of labels (or none): on a CPU
    run, nothing to convert or move."""
    return (
        type(features) is torch.Tensor
        and features.is_cpu
        and (labels is None or (type(labels) is torch.Tensor and labels.is_cpu))
    )


class _CudaBatch:
    """A batch whose copy is in flight on the infeed's stream."""

    __slots__ = ("batch", "event")

    def __init__(self, batch: Batch, event: Any) -> None:
        self.batch = batch
        self.event = event

    def wait(self) -> Batch:
        stream = torch.cuda.current_stream()
        stream.wait_event(self.event)

        def keep(t: torch.Tensor) -> torch.Tensor:
            # The memory was allocated on the side stream; tell the allocator the compute
            # stream uses it too, so it is not reused before the step is done with it.
            t.record_stream(stream)
            return t

        tree_map(keep, (self.batch.features, self.batch.labels, self.batch.mask))
        return self.batch
