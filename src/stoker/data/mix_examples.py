"""``mix(..., per="example")``: a mixture drawn example by example, each batch a blend.

Global sample ``j`` (counted over global batches of ``G = batch_size x num_shards`` examples from
the start of training) comes from the source drawn for ``j``, a pure function of ``(seed, j)``
and the weights, as the other mixture draws batch ``g``'s source. The ``m`` samples global batch
``g`` takes from a source are the next ``m`` of that source's *global stream*: its epochs'
global orders one after another (``epoch_order(0)``, ``epoch_order(1)``, ...), each example built
by the source's own ``load_batch`` (so its augmentation is keyed by its seed, epoch and index).
Replica ``r`` of ``n`` takes the rows ``r, r + n, ...`` of every global batch, as the sources do
(``stoker.data.base``). Everything is a function of the global sample count: the state is ``g``
and how far each source's stream has been read, the same on every replica, so a resume, also on
another number of replicas with the same global batch, is exact.

Iterating (this module) is kept apart from choosing: :func:`_rows_of` plans a global batch (which
rows come from which source, at which place of its stream), :class:`ExampleMixture` builds this
replica's rows and keeps the position. Batches are built in the thread that iterates (the
infeed's prefetch thread overlaps that with the step where it pays): the sources' own workers
build whole batches of their own, which an example-wise blend does not read.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ..errors import CheckpointMismatchError, ConfigError
from ._mix_checks import STOPPING_STRATEGIES, Structure, checked_sources
from ._tree import tree_map
from .base import example_uniforms
from .text import TextSource

log = logging.getLogger("stoker")

# The per-example draws' own stream of example_uniforms, apart from the per-batch mixture's and
# from any augmentation: keyed (seed, _STREAM, global sample index).
_STREAM = 0x6D697865  # "mixe"
# Global batches planned at a time (their draws, counts and ranks), and cached.
_BLOCK = 64


def _random_access(name: str, source: Any) -> None:
    """A ConfigError unless ``source`` builds any examples of any epoch (a stoker.data index-based
    source without workers)."""
    needed = ("epoch_order", "load_batch", "num_examples", "batch_size", "num_shards", "shard_index")
    if not all(hasattr(source, a) for a in needed) or isinstance(source, TextSource):
        raise ConfigError(
            f"mix(per='example'): sources[{name!r}] must be a stoker.data source that reads any example "
            f"(arrays, image_folder, imagenet_tfrecords, cifar_binary, tar_shards); got {type(source).__name__}"
        )
    if getattr(source, "num_workers", 0):
        raise ConfigError(
            f"mix(per='example'): sources[{name!r}] has num_workers={source.num_workers}; an example-wise "
            "blend is built by the mixture: give its ReadOptions num_workers=0 (and mix num_threads=...)"
        )


def _concat(parts: list[Any]) -> Any:
    """The batches ``parts`` (one structure) joined along their first dimension."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return {k: _concat([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
        return type(first)(*(_concat([p[i] for p in parts]) for i in range(len(first))))
    if isinstance(first, (list, tuple)):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    return first


class ExampleMixture:
    """Batches whose every example is drawn from one of several sources by weight. See
    :func:`~stoker.data.mix` (``per="example"``)."""

    name = "mix"
    per = "example"

    def __init__(
        self, sources: Mapping[str, tuple[Any, float]], *, seed: int, stopping_strategy: str, num_threads: int = 0
    ) -> None:
        self.names, self.sources, self.weights = checked_sources(sources)
        if not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 0:
            raise ConfigError(f"mix: num_threads must be an integer >= 0; got {num_threads!r}")
        #: Threads building the coming global batches ahead (0: built when asked, in this thread).
        self.num_threads = num_threads
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: dict[int, Future[tuple[Any, list[Any]]]] = {}  # global batch -> its build
        self._local = threading.local()
        for name, source in self.sources.items():
            _random_access(name, source)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"mix: seed must be an integer; got {seed!r}")
        if stopping_strategy not in STOPPING_STRATEGIES:
            raise ConfigError(
                f"mix: stopping_strategy must be one of {', '.join(STOPPING_STRATEGIES)}; got {stopping_strategy!r}"
            )
        for attribute in ("batch_size", "num_shards", "shard_index"):
            values = {n: int(getattr(s, attribute)) for n, s in self.sources.items()}
            if len(set(values.values())) > 1:
                listed = ", ".join(f"{n}: {v}" for n, v in values.items())
                raise ConfigError(f"mix: the sources differ in {attribute} ({listed}); give every source the same")
        first = self.sources[self.names[0]]
        self.batch_size, self.num_shards, self.shard_index = first.batch_size, first.num_shards, first.shard_index
        self.global_batch = self.batch_size * self.num_shards
        self.seed = seed
        self.stopping_strategy = stopping_strategy
        total = math.fsum(self.weights.values())
        self._cumulative = np.cumsum([self.weights[n] / total for n in self.names])
        self._cumulative[-1] = 1.0
        # A source's stream ends after num_epochs epochs (None: never); by number, its examples
        # and the length its stream starts over at (0: never), for the vectorised plan.
        self._lengths = {n: _length(s) for n, s in self.sources.items()}
        self._sizes = np.array([int(self.sources[n].num_examples) for n in self.names], dtype=np.int64)
        self._wraps = np.array([self._lengths[n] or 0 for n in self.names], dtype=np.int64)
        # Plans of whole blocks of global batches, by the block's first batch: the current block and
        # the next (the threads building ahead reach into it).
        self._blocks: dict[int, tuple[list[list[int]], np.ndarray, np.ndarray]] = {}
        #: Global batches read so far: the index ``g`` of the next one.
        self.step = 0
        #: Samples (all replicas) read from each source's stream so far.
        self.taken = dict.fromkeys(self.names, 0)
        self.exhausted: set[str] = set()
        self.ended = False
        Structure(self.sources)

    # ------------------------------------------------------------------ the plan
    def sources_of(self, g: int) -> np.ndarray:
        """The source (its number in the mixture's order) of each of global batch ``g``'s samples."""
        return self._draws(g, g + 1)[0]

    def _draws(self, start: int, stop: int) -> np.ndarray:
        """The sources of global batches ``start .. stop - 1``'s samples: ``[stop - start, G]``."""
        g = self.global_batch
        u = example_uniforms(self.seed, _STREAM, np.arange(start * g, stop * g, dtype=np.int64), 1)
        return np.searchsorted(self._cumulative, u[:, 0], side="right").astype(np.int64).reshape(-1, g)

    def _block_of(self, g: int) -> tuple[list[list[int]], np.ndarray, np.ndarray]:
        """The cached block of plans holding global batch ``g`` (filled ``_BLOCK`` batches at a time:
        numpy's cost per call, not per sample, is what a batch of a few rows pays)."""
        start = g - g % _BLOCK
        block = self._blocks.get(start)
        if block is None:
            choice = self._draws(start, start + _BLOCK)
            onehot = choice[:, :, None] == np.arange(len(self.names))
            # each sample's rank among its source's samples in its global batch
            rank = np.take_along_axis(np.cumsum(onehot, axis=1), choice[:, :, None], axis=2)[:, :, 0] - 1
            mine = slice(self.shard_index, None, self.num_shards)  # this replica's rows
            block = self._blocks[start] = (onehot.sum(1).tolist(), choice[:, mine], rank[:, mine])
            for old in [s for s in self._blocks if s < start - _BLOCK or s > start + _BLOCK]:
                del self._blocks[old]  # keep the neighbours of the block in use
        return block

    def _plan(self, g: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Global batch ``g``'s plan (:meth:`_peek`); marks the sources it runs out of, and ends
        the mixture (StopIteration) as ``stopping_strategy`` says."""
        choice, rank, counts = self._peek(g)
        for i, name in enumerate(self.names):
            length = self._lengths[name]
            if length is None or name in self.exhausted or self.taken[name] + counts[i] <= length:
                continue  # (an exhausted source reads its stream over again: all_exhausted)
            self.exhausted.add(name)  # this batch would read past the end of its stream
            if self.stopping_strategy == "first_exhausted" or len(self.exhausted) == len(self.names):
                self.ended = True
                self.close()
                raise StopIteration
        return choice, rank, counts

    def _peek(self, g: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """Global batch ``g``'s plan: this replica's rows' sources, their ranks among their
        source's samples in the global batch, and the samples it takes of each source."""
        counts, choice, rank = self._block_of(g)
        row = g % _BLOCK
        return choice[row], rank[row], counts[row]

    # ------------------------------------------------------------------ iterating
    def __iter__(self) -> ExampleMixture:
        return self

    def __next__(self) -> Any:
        if self.ended:
            raise StopIteration
        choice, rank, counts = self._plan(self.step)
        taken = np.array([self.taken[n] for n in self.names], dtype=np.int64)
        if self.num_threads:
            built = self._ahead.pop(self.step, None)
            self._build_ahead(self.step + 1, taken + np.asarray(counts))
            batch, bad = built.result() if built is not None else _load(self._reads(choice, rank, taken), self.sources)
        else:
            batch, bad = _load(self._reads(choice, rank, taken), self.sources)
        for name, reasons in bad:
            self.sources[name]._report_bad(reasons)
        for i, name in enumerate(self.names):
            self.taken[name] += counts[i]
        self.step += 1
        return batch

    def _build_ahead(self, first: int, taken: np.ndarray) -> None:
        """Hand the threads the global batches ``first`` .. (``2 x num_threads`` ahead) not yet
        handed, each a pure function of its plan and ``taken`` there."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="stoker-mix")
        for g in range(first, self.step + 1 + 2 * self.num_threads):
            # A batch past a source's end reads its stream over again, as all_exhausted does; with
            # first_exhausted the mixture ends before it, and it is dropped unread.
            choice, rank, counts = self._peek(g)
            if g not in self._ahead:
                self._ahead[g] = self._pool.submit(self._load_in_thread, self._reads(choice, rank, taken))
            taken = taken + np.asarray(counts)

    def _load_in_thread(self, reads: list[tuple[str, int, torch.Tensor, np.ndarray]]) -> tuple[Any, list[Any]]:
        copies = getattr(self._local, "copies", None)
        if copies is None:  # each thread reads through its own copy of each source (its own files)
            copies = self._local.copies = {n: _copy_for_thread(s) for n, s in self.sources.items()}
        return _load(reads, copies)

    def advance(self, batches: int) -> None:
        """Move ``batches`` global batches ahead without building them (a resume's jump)."""
        self.close()
        for i in range(batches):
            try:
                _, _, counts = self._plan(self.step)
            except StopIteration:
                raise ConfigError(f"mix: cannot advance {batches} batches: the data ends after {i}") from None
            for k, name in enumerate(self.names):
                self.taken[name] += counts[k]
            self.step += 1

    def _reads(
        self, choice: np.ndarray, rank: np.ndarray, taken: np.ndarray
    ) -> list[tuple[str, int, torch.Tensor, np.ndarray]]:
        """What this replica's rows read, ``(source, epoch, example indices, rows)`` per source and
        epoch: row ``k`` is sample ``rank[k]`` of those the global batch takes from source
        ``choice[k]``, the next ones of its stream after ``taken``. (The epochs' orders are looked
        up here, on the thread that iterates: a source caches one epoch's order at a time.)"""
        place = taken[choice] + rank  # places in the streams
        place = np.where(self._wraps[choice] > 0, place % np.maximum(self._wraps[choice], 1), place)
        epochs, at = np.divmod(place, self._sizes[choice])
        key = choice * (int(epochs.max()) + 1) + epochs  # one read per (source, epoch)
        reads = []
        for k in np.unique(key).tolist():
            sel = np.flatnonzero(key == k)
            name, epoch = self.names[int(choice[sel[0]])], int(epochs[sel[0]])
            reads.append((name, epoch, self.sources[name].epoch_order(epoch)[torch.from_numpy(at[sel])], sel))
        return reads

    @property
    def prefers_inline_fetch(self) -> bool:
        """Whether the infeed should fetch in the training thread: with threads building ahead, or
        when every source says so."""
        return bool(self.num_threads) or all(
            bool(getattr(s, "prefers_inline_fetch", False)) for s in self.sources.values()
        )

    @property
    def bad_examples_skipped(self) -> int:
        """Unreadable examples the sources replaced so far (``skip_bad_examples=True``)."""
        return sum(int(getattr(s, "bad_examples_skipped", 0) or 0) for s in self.sources.values())

    def close(self) -> None:
        """Stop the threads building ahead, if any (they start again at the next ``next()``)."""
        for built in self._ahead.values():
            built.cancel()
        self._ahead.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # ------------------------------------------------------------------ what the summaries show
    def realised_proportions(self, state: dict[str, Any] | None = None, ahead: int = 0) -> dict[str, float]:
        """The fraction of the samples read so far (all replicas) that came from each source, as of
        ``state`` (default: now) and ``ahead`` global batches after it."""
        if state is None:
            state = self.state_dict()
        counts = np.array([int(state["taken"][n]) for n in self.names], dtype=np.int64)
        step = int(state["step"])
        for g in range(step, step + ahead):
            counts += np.bincount(self.sources_of(g), minlength=len(self.names))
        total = int(counts.sum())
        return {} if total == 0 else {n: int(c) / total for n, c in zip(self.names, counts, strict=True)}

    def summary_scalars(self, state: dict[str, Any] | None = None, ahead: int = 0) -> dict[str, float]:
        """``mix/<name>``: each source's realised proportion of the samples read."""
        return {f"mix/{n}": p for n, p in self.realised_proportions(state, ahead).items()}

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """``g``, how far each source's stream has been read, and what they are a position in."""
        return {
            "per": self.per,
            "step": self.step,
            "seed": self.seed,
            "weights": dict(self.weights),
            "stopping_strategy": self.stopping_strategy,
            "global_batch": self.global_batch,
            "num_examples": {n: int(self.sources[n].num_examples) for n in self.names},
            "taken": dict(self.taken),
            "exhausted": sorted(self.exhausted),
            "ended": self.ended,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Jump to a saved position; refuses another seed, other sources or another global batch."""
        self._check_saved(state)
        self.close()
        self.step = int(state["step"])
        self.taken = {n: int(state["taken"][n]) for n in self.names}
        self.exhausted = set(state["exhausted"])
        self.ended = bool(state["ended"])

    def reshard_state_dict(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """The state is the same on every replica (all of it counts global samples): any one of
        them, once the global batch is known to be unchanged."""
        if len({int(s["step"]) for s in states}) != 1:
            raise CheckpointMismatchError("mix: the replicas' saved positions differ; cannot re-shard them")
        self._check_saved(states[0])
        return dict(states[0])

    def _check_saved(self, state: dict[str, Any]) -> None:
        if state.get("per") != self.per:
            raise CheckpointMismatchError(
                f"mix: the saved input was mixed per {state.get('per', 'batch')}, this one per {self.per}; "
                "resume with the same per="
            )
        mine = {n: int(self.sources[n].num_examples) for n in self.names}
        checks = (("sources", sorted(state["taken"]), sorted(self.names)), ("seed", state["seed"], self.seed))
        checks += (("global batch", state["global_batch"], self.global_batch), ("data", state["num_examples"], mine))
        for what, saved, now in checks:
            if saved != now:
                raise CheckpointMismatchError(
                    f"mix: the saved input has {what} {saved} but this one {now}; resume with the same {what}"
                )
        if dict(state["weights"]) != self.weights:  # allowed (a schedule of weights), but said
            log.warning(
                "mix: the weights changed since the checkpoint (%s -> %s); samples from global batch %d on are "
                "drawn with the new ones",
                state["weights"],
                self.weights,
                int(state["step"]),
            )

    def __repr__(self) -> str:
        weights = ", ".join(f"{n}={self.weights[n]:g}" for n in self.names)
        return f"ExampleMixture({weights}, seed={self.seed}, step={self.step})"


def _length(source: Any) -> int | None:
    """The samples of a source's stream: ``num_epochs`` epochs (None: it never ends)."""
    return None if source.num_epochs is None else int(source.num_epochs) * int(source.num_examples)


def _load(
    reads: list[tuple[str, int, torch.Tensor, np.ndarray]], sources: Mapping[str, Any]
) -> tuple[Any, list[tuple[str, list[str]]]]:
    """The batch ``reads`` (:meth:`ExampleMixture._reads`) make, from ``sources``, and the examples
    each source replaced on the way (``skip_bad_examples``), for the iterating thread to report."""
    parts, rows, bad = [], [], []
    for name, epoch, indices, sel in reads:
        source = sources[name]
        parts.append(source.load_batch(indices, epoch))
        rows.append(sel)
        if getattr(source, "_bad", None):
            bad.append((name, source._bad))
            source._bad = []
    if len(parts) == 1:
        return parts[0], bad
    order = torch.from_numpy(np.argsort(np.concatenate(rows), kind="stable"))
    return tree_map(lambda t: t.index_select(0, order), _concat(parts)), bad


def _copy_for_thread(source: Any) -> Any:
    """The copy of ``source`` a building thread reads through (its own open files)."""
    make = getattr(source, "_thread_copy", None)
    return make() if callable(make) else source


__all__ = ["ExampleMixture"]
