"""Index-based input sources: the position ``(epoch, batch)`` is the whole state.

Every built-in source (as in grain) is a pure function from a position to a batch:

- epoch ``e``'s order of examples is a permutation drawn from a generator seeded by
  ``(seed, e)`` (the identity when not shuffling): the *global order*, the same for any
  number of replicas;
- global batch ``b`` (``G = batch_size x num_shards`` examples) is ``order[b*G:(b+1)*G]``, and
  replica ``r`` of ``n`` takes its rows ``r, r + n, r + 2n, ...`` (strided: replica ``r``
  reads ``order[r::n]``), so every replica gets the same number of batches per epoch when
  batches are full (replicas step in lockstep);
- batch ``b`` of epoch ``e`` is ``load_batch(order[r::n][b*B:(b+1)*B], e)``, and any randomness
  in it (augmentation) comes from :func:`example_uniforms` (or :func:`example_rng`), keyed by
  ``(seed, e, example index)``, never from a global, per-thread or per-worker RNG. The example
  index is the example's place in the whole data set, the same on every replica.

So the state saved in a checkpoint is a handful of integers (the position, plus the seed,
the data size and the sharding, checked on resume so a changed dataset is refused, not
silently misread). Resuming is a jump, not a replay: no RNG has to be fast-forwarded and no
batch re-read, whatever the augmentation, and a resumed run sees bitwise the batches an
uninterrupted one would have seen. The position is also saved as ``samples``, the examples of
the epoch's global order consumed, which every replica agrees on: a run resumed with another
number of replicas and the same global batch (:meth:`_SavedPosition.reshard_state_dict`) goes
on from there, and each example becomes the same tensor whatever the number of replicas or
workers ("elastic determinism", docs/data.md).

Workers. With ``num_workers > 0`` batches are built in worker processes (a
``torch.utils.data.DataLoader`` over "batch ``g`` counted from the start of epoch 0", so which
worker built a batch does not matter); when they start and why they are forked on Linux is in
:mod:`stoker.data._workers.processes`.

The jobs are split: :class:`_ShardOrder` is the plan (each epoch's order and this shard's part
of it), a :class:`~stoker.data._workers._Workers` runs the worker threads or processes,
:class:`_SavedPosition` is what a checkpoint holds (``state_dict``, the checks on resume,
re-sharding), and :class:`IndexedSource` is the iterator whose position is its state.
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from ..errors import CheckpointMismatchError, ConfigError, DataError
from ..resolve import auto_worker_kind
from ._workers import InSlot, _SlotRing, _Workers, build_in_slot, make_workers, read_slot
from .options import ReadOptions

log = logging.getLogger("stoker")

T = TypeVar("T")


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A torch generator whose stream depends only on ``(seed, epoch)``."""
    mixed = np.random.SeedSequence([seed % 2**63, epoch]).generate_state(2, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed % 2**63))


# splitmix64 constants (Steele, Lea and Flood, 2014): a fast, well-mixed 64-bit bijection.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def example_uniforms(
    seed: int, epoch: int, indices: torch.Tensor | np.ndarray | Sequence[int], count: int
) -> np.ndarray:
    """``count`` uniform floats in [0, 1) for each example: float64 array ``[len(indices), count]``.

    Value ``k`` of example ``i`` depends only on ``(seed, epoch, i, k)``: a counter-based
    generator (splitmix64 over the key), vectorised over the batch. So an example is augmented
    the same way whichever batch, replica or worker builds it, and a resumed run needs no RNG
    state. Draw all the numbers an example may need up front (unused ones cost nothing).
    """
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _splitmix64(_splitmix64(np.array([seed % 2**64], dtype=np.uint64)) ^ np.uint64(epoch % 2**64))
        base = _splitmix64(key ^ _splitmix64(idx))  # one stream per example
        counters = np.arange(count, dtype=np.uint64) * _GOLDEN
        bits = _splitmix64(base[:, None] + counters[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A numpy generator for one example's own random numbers: its stream depends only on
    ``(seed, epoch, index)`` (Philox, a counter-based generator, keyed through a SeedSequence).

    For a source's own augmentation (a subclass's ``load_batch``) that wants numpy's
    distributions rather than :func:`example_uniforms`' uniforms: ``rng = example_rng(self.seed,
    epoch, int(i))`` per example ``i``. Like :func:`example_uniforms`, the numbers follow the
    example, not the replica, worker or batch that builds it, so a resumed or re-sharded run
    draws them again identically. (About 20 us per call: fine per example, not per pixel.)
    """
    key = np.random.SeedSequence([seed % 2**64, epoch % 2**64, index % 2**64])
    return np.random.Generator(np.random.Philox(key))


class _ShardOrder:
    """The plan: which examples shard ``shard_index`` of ``num_shards`` reads in each epoch, in
    what order. A pure function of ``(seed, epoch)``, cached for one epoch at a time."""

    def __init__(self, num_examples: int, *, shuffle: bool, seed: int, num_shards: int, shard_index: int) -> None:
        self.num_examples = num_examples
        self.shuffle = shuffle
        self.seed = seed
        self.num_shards = num_shards
        self.shard_index = shard_index
        self._epoch: int | None = None
        self._order: torch.Tensor | None = None  # every shard's examples, in the epoch's order
        self._shard: torch.Tensor | None = None  # this shard's part of it, contiguous
        self._inverse: torch.Tensor | None = None  # example index -> position in the order

    def count_batches(self, batch_size: int, drop_remainder: bool) -> int:
        """Batches per epoch of this shard."""
        per_shard = len(range(self.shard_index, self.num_examples, self.num_shards))
        if drop_remainder:
            # Every shard gets the same number of batches (replicas step in lockstep).
            return (self.num_examples // self.num_shards) // batch_size
        return -(-per_shard // batch_size)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """All example indices (every shard) in epoch ``epoch``'s order."""
        if self._epoch != epoch or self._order is None:
            if self.shuffle:
                self._order = torch.randperm(self.num_examples, generator=epoch_generator(self.seed, epoch))
            else:
                self._order = torch.arange(self.num_examples)
            self._epoch = epoch
            self._shard = None
            self._inverse = None
        return self._order

    def shard_order(self, epoch: int) -> torch.Tensor:
        """This shard's examples in epoch ``epoch``'s order (``order[r::n]``), so a batch is one slice."""
        order = self.epoch_order(epoch)
        if self._shard is None:
            self._shard = order[self.shard_index :: self.num_shards].contiguous()  # once per epoch
        return self._shard

    def following(self, epoch: int, index: int) -> Iterator[int]:
        """The examples after ``index`` in epoch ``epoch``'s order (all shards), wrapping around."""
        order = self.epoch_order(epoch)
        if self._inverse is None:
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel())
            self._inverse = inverse
        start = int(self._inverse[index])
        n = order.numel()
        for k in range(1, n):
            yield int(order[(start + k) % n])


def _global_batch(state: dict[str, Any]) -> int:
    """The examples one step of the run that saved ``state`` read over all its replicas."""
    return int(state["batch_size"]) * int(state["num_shards"])


def _samples(state: dict[str, Any]) -> int:
    """The examples of the epoch's global order a saved position has consumed (``samples``;
    a state saved before it was recorded: its batch x the global batch)."""
    return int(state["samples"]) if "samples" in state else int(state["batch"]) * _global_batch(state)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _resharded(
    name: str, states: list[dict[str, Any]], batch_size: int, num_shards: int, shard_index: int
) -> dict[str, Any]:
    """:meth:`IndexedSource.reshard_state_dict` for a shard ``shard_index`` of ``num_shards``."""
    first = states[0]
    if "batch_size" not in first:
        raise CheckpointMismatchError(
            f"{name}: the saved input state does not record its batch size; resume with {first['num_shards']} replicas"
        )
    before = int(first["num_shards"])
    if len(states) != before:
        raise CheckpointMismatchError(
            f"{name}: the checkpoint holds the input states of {len(states)} of its {before} replicas; cannot re-shard"
        )
    old_global = _global_batch(first)
    if old_global % num_shards:
        raise CheckpointMismatchError(
            f"{name}: cannot re-shard the input from {before} to {num_shards} replicas: the global batch of "
            f"{old_global} examples does not divide among {num_shards}; resume with a number of replicas that "
            f"divides it ({_divisors(old_global)})"
        )
    if old_global != batch_size * num_shards:
        raise CheckpointMismatchError(
            f"{name}: cannot re-shard the input from {before} to {num_shards} replicas: the global batch changed "
            f"({old_global} -> {batch_size * num_shards}); keep the global batch: {old_global // num_shards} "
            "examples per replica"
        )
    if len({(int(s["epoch"]), _samples(s)) for s in states}) != 1:
        raise CheckpointMismatchError(f"{name}: the replicas' saved positions differ; cannot re-shard them")
    # The global sample count is the position every layout agrees on: with the global batch kept,
    # it is a whole number of this layout's batches.
    samples = _samples(first)
    return dict(
        first,
        num_shards=num_shards,
        shard_index=shard_index,
        batch_size=batch_size,
        batch=samples // old_global,
        samples=samples,
    )


def _checked_position(
    name: str, state: dict[str, Any], expected: dict[str, int], batches_per_epoch: int, global_batch: int
) -> tuple[int, int]:
    """The saved position ``(epoch, batch)``, once ``state`` is known to be for this source:
    ``expected`` (seed, data size, sharding, ...) match and the position fits."""
    for key, mine in expected.items():
        if key in state and state[key] != mine:
            raise CheckpointMismatchError(
                f"{name}: the saved input state has {key}={state[key]} but this source has "
                f"{key}={mine}; resume with the same data, seed, batch size and number of replicas"
            )
    epoch, batch = int(state["epoch"]), int(state["batch"])
    if epoch < 0 or not 0 <= batch <= batches_per_epoch:
        raise CheckpointMismatchError(
            f"{name}: the saved position (epoch {epoch}, batch {batch}) does not fit this source's "
            f"{batches_per_epoch} batches per epoch; resume with the same data and batch size"
        )
    if "samples" in state and int(state["samples"]) != batch * global_batch:
        raise CheckpointMismatchError(
            f"{name}: the saved position (epoch {epoch}, batch {batch}) says {state['samples']} examples of the "
            f"epoch were read, not {batch * global_batch} ({batch} global batches of {global_batch}); "
            "resume with the same batch size and number of replicas"
        )
    return epoch, batch


class _SavedPosition:
    """An :class:`IndexedSource`'s position ``(epoch, batch)``: moving it without building
    batches (:meth:`advance`), and what a checkpoint holds, the position and what it is a position
    in (seed, data size, sharding, batch size), so that a resume into other data is refused and a
    resume with another number of replicas can be re-sharded."""

    name: str
    epoch: int
    batch: int
    seed: int
    num_shards: int
    shard_index: int
    batch_size: int
    num_epochs: int | None
    batches_per_epoch: int

    if TYPE_CHECKING:

        @property
        def num_examples(self) -> int: ...

    def _position(self) -> int:
        return self.epoch * self.batches_per_epoch + self.batch

    def _end(self) -> int | None:
        return None if self.num_epochs is None else self.num_epochs * self.batches_per_epoch

    def advance(self, batches: int) -> None:
        """Move the position ``batches`` ahead without building them (as many ``next()`` calls
        would, minus the work): resuming "``n`` batches after a saved state" is a jump."""
        if batches < 0:
            raise ConfigError(f"{self.name}: cannot advance by {batches} batches")
        if batches == 0:
            return
        target = self._position() + batches
        end = self._end()
        if end is not None and target > end:
            raise ConfigError(
                f"{self.name}: cannot advance {batches} batches: the data ends {end - self._position()} batches "
                "from here"
            )
        epoch, batch = divmod(target, self.batches_per_epoch)
        if batch == 0:  # the end of an epoch reads as (epoch, batches_per_epoch), as after next()
            epoch, batch = epoch - 1, self.batches_per_epoch
        self.epoch, self.batch = epoch, batch

    def _identity(self) -> dict[str, int]:
        """Extra integers that must match on resume (besides seed, data size and sharding)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The position and what it is a position in: a few integers, JSON-serialisable."""
        state = {
            "epoch": self.epoch,
            "batch": self.batch,
            "seed": self.seed,
            "num_examples": self.num_examples,
            "num_shards": self.num_shards,
            "shard_index": self.shard_index,
            "batch_size": self.batch_size,
            # The examples of the epoch's global order consumed: the same on every replica, and
            # the position a run with another number of replicas resumes from.
            "samples": self.batch * self.batch_size * self.num_shards,
        }
        state.update(self._identity())
        return state

    def reshard_state_dict(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """This shard's state, from the states every replica of a run with another number of
        replicas saved (re-sharding on resume).

        Possible when the global batch (``batch_size x num_shards``) is unchanged: global batch
        ``b`` is ``order[b*G:(b+1)*G]`` of the epoch's global order in any layout (shards take
        strided rows of it), so the saved global sample count (``samples``, the first
        ``samples`` examples of the epoch consumed) is the same position for any number of
        replicas. A :class:`~stoker.errors.CheckpointMismatchError` says why otherwise: the
        saved global batch does not divide among ``num_shards`` replicas, or it changed.
        """
        return _resharded(self.name, states, self.batch_size, self.num_shards, self.shard_index)

    def _expected_state(self) -> dict[str, int]:
        """What a saved state must match besides its position: seed, data size, sharding, identity."""
        return {
            "seed": self.seed,
            "num_examples": self.num_examples,
            "num_shards": self.num_shards,
            "shard_index": self.shard_index,
            **self._identity(),
        }


class IndexedSource(_SavedPosition, ABC):
    """A checkpointable source that builds batch ``b`` of epoch ``e`` from example indices.

    Subclasses set up their data, then call ``super().__init__``, and implement
    :attr:`num_examples` and :meth:`load_batch`. The rest (order, sharding, epochs, workers,
    state, bad-example replacement) is here: the order and sharding are planned by a
    ``_ShardOrder``, the workers run in a ``_Workers``, the position and what a checkpoint holds are
    ``_SavedPosition``'s, and this class is the iterator whose position ``(epoch, batch)`` is
    its state.

    Args:
        read: how to read (:class:`~stoker.data.ReadOptions`: batch size, order, epochs, shard,
            workers). ``shuffle=None`` shuffles; give ``read.for_replica(params)`` in an
            ``input_fn``. ``worker_kind="auto"`` builds in threads where the source says its
            building releases the GIL (:meth:`_threads_suffice`: the libjpeg-crop decoder
            feeding a CPU step) and ``num_workers`` is at most :data:`AUTO_THREAD_WORKERS_MAX`,
            else in processes.
    """

    name = "source"
    #: Ask the Infeed to call ``next()`` on the training thread (no prefetch thread).
    prefers_inline_fetch = False

    def __init__(self, read: ReadOptions) -> None:
        name = self.name
        self.batch_size = batch_size = read.batch_size_of(name)
        self.shuffle = True if read.shuffle is None else bool(read.shuffle)
        self.seed = int(read.seed)
        self.num_epochs = read.num_epochs
        # Training repeats forever and wants full batches; a single pass (eval) keeps them all.
        self.drop_remainder = (read.num_epochs is None) if read.drop_remainder is None else bool(read.drop_remainder)
        self.num_shards = read.num_shards
        self.shard_index = read.shard_index
        self.num_workers = read.num_workers
        self.skip_bad_examples = bool(read.skip_bad_examples)
        self.start_method = read.start_method
        if self.num_examples < 1:
            raise DataError(f"{name}: the data holds no examples")
        self._plan = _ShardOrder(
            self.num_examples,
            shuffle=self.shuffle,
            seed=self.seed,
            num_shards=self.num_shards,
            shard_index=self.shard_index,
        )
        self.batches_per_epoch = self._count_batches()
        if self.batches_per_epoch < 1:
            raise ConfigError(
                f"{name}: {self.num_examples} examples over {self.num_shards} shard(s) do not fill one batch "
                f"of {batch_size} with drop_remainder=True; use a smaller batch or drop_remainder=False"
            )
        self.epoch = 0
        self.batch = 0
        #: Examples replaced because they could not be read (``skip_bad_examples=True``).
        self.bad_examples_skipped = 0
        self._bad: list[str] = []
        #: ``"thread"`` or ``"process"``: what builds the batches when ``num_workers > 0``.
        self.worker_kind = read.worker_kind
        if read.worker_kind == "auto":
            self.worker_kind = auto_worker_kind(self._threads_suffice(), self.num_workers).value
        self._workers: _Workers = make_workers(self.worker_kind, self._builds_by_slot())
        #: Set only in a worker's copy: the shared-memory slots its batches are built into.
        self._slots: _SlotRing | None = None

    # ------------------------------------------------------------------ to implement
    @property
    @abstractmethod
    def num_examples(self) -> int:
        """Examples in the whole data set (all shards)."""

    @abstractmethod
    def load_batch(self, indices: torch.Tensor, epoch: int) -> Any:
        """The batch of the examples ``indices`` (int64, in batch order) in epoch ``epoch``.

        Randomness must come from :func:`example_uniforms` or :func:`example_rng` (``self.seed``,
        ``epoch``, index), never from torch's or numpy's global RNG: those differ by worker and
        process, so a resumed, re-sharded or differently parallel run would draw other numbers.
        To read one example that may be unreadable, use :meth:`load_or_replace`.
        """

    def _threads_suffice(self) -> bool:
        """True when this source's batch building runs mostly outside the GIL, so that
        ``worker_kind="auto"`` builds in threads. Called at the end of ``__init__``'s checks."""
        return False

    def _builds_by_slot(self) -> bool:
        """Whether worker threads build this source's batches one example (slot) at a time, the
        consumer helping (``stoker.data._workers._ExampleThreads``): sources with ``fill_slot``."""
        return callable(getattr(self, "fill_slot", None))

    def _thread_copy(self) -> IndexedSource:
        """The copy of this source a worker thread builds with (see ``__getstate__``); a source
        holding open files or other per-reader state gives the copy its own."""
        return copy.copy(self)

    # ------------------------------------------------------------------ fixed-shape batches (optional)
    def batch_buffers(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        """Shapes (``batch_size`` rows first) and dtypes of the buffers a batch is built into, or
        None (the default). A source returning them also implements ``fill_batch(indices, epoch,
        buffers) -> rest`` and ``assemble(buffers, rest, *, copy) -> batch`` (as
        :class:`~stoker.data.images.EncodedImageSource`), and its workers build batches in
        shared-memory slots (:mod:`stoker.data._workers.processes`)."""
        return None

    # ------------------------------------------------------------------ the plan
    def _count_batches(self) -> int:
        return self._plan.count_batches(self.batch_size, self.drop_remainder)

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """All example indices (every shard) in epoch ``epoch``'s order."""
        return self._plan.epoch_order(epoch)

    def batch_indices(self, epoch: int, batch: int) -> torch.Tensor:
        """Example indices of this shard's batch ``batch`` of epoch ``epoch``."""
        return self._plan.shard_order(epoch)[batch * self.batch_size : (batch + 1) * self.batch_size]

    def following_examples(self, epoch: int, index: int) -> Iterator[int]:
        """The examples after ``index`` in epoch ``epoch``'s order (all shards), wrapping around."""
        return self._plan.following(epoch, index)

    def load_or_replace(self, epoch: int, index: int, load_one: Callable[[int], T]) -> T:
        """``load_one(index)``; if it raises :class:`DataError` and bad examples are skipped,
        the first following example (:meth:`following_examples`) that loads, else the error.

        Deterministic: the replacement depends only on ``(seed, epoch, index)`` and the data.
        """
        try:
            return load_one(index)
        except DataError as e:
            if not self.skip_bad_examples:
                raise
            first = e
        failed = [str(first)]
        for candidate in self.following_examples(epoch, index):
            try:
                value = load_one(candidate)
            except DataError as e:
                failed.append(str(e))
                continue
            self._bad.append("; ".join(failed))
            return value
        raise DataError(f"{self.name}: no readable example is left to replace a bad one; first error: {first}")

    def _build(self, epoch: int, batch: int) -> Any:
        return self.load_batch(self.batch_indices(epoch, batch), epoch)

    def _build_numbered(self, g: int) -> tuple[int, Any, list[str], str | None]:
        """Batch ``g`` counted from the start of epoch 0, as a worker sends it back:
        ``(g, batch, bad-example reasons, error text or None)``."""
        epoch, b = divmod(g, self.batches_per_epoch)
        try:
            if self._slots is None:
                out = self._build(epoch, b)
            else:  # built in its shared slot; only the slot number and the labels go back
                out = build_in_slot(self, self._slots, g, self.batch_indices(epoch, b), epoch)
        except DataError as e:
            # Sent back as text and raised by the training process as the same DataError, so the
            # message names the file without a worker traceback around it.
            return g, None, [], str(e)
        bad, self._bad = self._bad, []
        return g, out, bad, None

    # ------------------------------------------------------------------ iterating
    def __len__(self) -> int:
        """Batches per epoch for this shard."""
        return self.batches_per_epoch

    def __iter__(self) -> IndexedSource:
        # Start the workers now, on the thread that iterates (see stoker.data._workers).
        if self.num_workers > 0:
            end = self._end()
            if (end is None or self._position() < end) and not self._workers.ready_at(self._position()):
                self._start_workers()
        return self

    def __next__(self) -> Any:
        if self.batch >= self.batches_per_epoch:
            if self.num_epochs is not None and self.epoch + 1 >= self.num_epochs:
                self.close()
                raise StopIteration
            self.epoch += 1
            self.batch = 0
        if self.num_workers > 0:
            out, bad = self._next_from_workers()
        else:
            out = self._build(self.epoch, self.batch)
            bad, self._bad = self._bad, []
        self.batch += 1
        if bad:
            self._report_bad(bad)
        return out

    def _report_bad(self, bad: list[str]) -> None:
        for reason in bad:  # each message with the count up to it
            self.bad_examples_skipped += 1
            log.warning(
                "%s: skipped a bad example (%s) and used the next readable one of the epoch; %d skipped so far",
                self.name,
                reason,
                self.bad_examples_skipped,
            )

    # ------------------------------------------------------------------ workers
    def _start_workers(self) -> None:
        self.close()
        self._workers.start(self, self._position(), self._end())

    def _next_from_workers(self) -> tuple[Any, list[str]]:
        g = self._position()
        if not self._workers.ready_at(g):
            self._start_workers()
        out, bad, error = self._workers.next(g, self.name)
        if error is not None:
            self.close()
            raise DataError(error)
        if isinstance(out, InSlot):
            out = read_slot(self, self._workers.ring, out)
        return out, bad

    @property
    def _loader_it(self) -> Any:
        """While the workers run: the process workers' DataLoader iterator, the threads' pool; else None."""
        return self._workers.loader_it

    def close(self) -> None:
        """Stop the workers, if any (they restart at the next ``next()``)."""
        self._workers.stop()

    def __getstate__(self) -> dict[str, Any]:
        # Copies (for workers; pickled for forkserver/spawn) carry the data, not the workers.
        state = self.__dict__.copy()
        state["_workers"] = make_workers(self.worker_kind, self._builds_by_slot())
        state["_plan"] = copy.copy(self._plan)  # its own cache
        state["_bad"] = []
        return state

    # ------------------------------------------------------------------ checkpoint state (and _SavedPosition)
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Jump to a saved position; refuses a state saved for other data, seed or sharding."""
        epoch, batch = _checked_position(
            self.name, state, self._expected_state(), self.batches_per_epoch, self.batch_size * self.num_shards
        )
        self.close()
        self.epoch, self.batch = epoch, batch

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.num_examples} examples, batch_size={self.batch_size}, "
            f"shard {self.shard_index}/{self.num_shards}, epoch={self.epoch}, batch={self.batch})"
        )
