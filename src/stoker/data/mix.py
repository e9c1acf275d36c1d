"""``mix``: weighted mixtures of sources, one source per batch, drawn from the seed.

``stoker.data.mix({"web": (web, 0.7), "books": (books, 0.3)}, seed=1)`` is an iterator of
batches: batch ``g`` (counted from the start of training, on every replica) is the next batch
of the source drawn for ``g``, a pure function of ``(seed, g)`` and the weights (a categorical
draw from a counter-based generator, :func:`~stoker.data.example_uniforms`). So

- every replica draws the same source at every step: replicas step in lockstep on batches of
  the same shapes, and each source is sharded as it always is (built with
  ``ReadOptions(...).for_replica(params)``, its own seed, workers and augmentation);
- which source batch ``g`` comes from depends neither on workers nor on the number of replicas
  (with the same global batch), so a re-sharded resume draws the same sources;
- the state is ``g``, each source's own ``state_dict`` (nested under its name) and the counts
  drawn so far: a resumed run sees bitwise the batches of an uninterrupted one.

Iterating (this module) is kept apart from choosing: :class:`_Draws` is the plan (which source
batch ``g`` comes from), :class:`Mixture` the iterator whose position is its state.

A finite source (``num_epochs`` set) can run out. ``stopping_strategy`` says what then, with
the names and meaning of Hugging Face's ``interleave_datasets``: ``"first_exhausted"`` (the
default) ends the mixture at the first batch drawn from a source that has none left;
``"all_exhausted"`` starts such a source over (from where it stood when mixed) until every
source has run out at least once, then ends. Sources that repeat forever (``num_epochs=None``,
the training default) never run out: both read the same.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CheckpointMismatchError, ConfigError, DataError
from ._mix_checks import STOPPING_STRATEGIES, Structure, agreed, checked_sources
from .base import example_uniforms

if TYPE_CHECKING:
    from .mix_examples import ExampleMixture

log = logging.getLogger("stoker")

# The draws' own stream of example_uniforms: keyed (seed, _STREAM, g), apart from any source's
# augmentation, which is keyed (seed, epoch, example index) with small epochs.
_STREAM = 0x6D6978  # "mix"
# Draws are made this many batches at a time (vectorised), and cached.
_BLOCK = 4096


class _Draws:
    """The plan: the source batch ``g`` comes from, for every ``g``; a pure function of the seed
    and the weights, computed ``_BLOCK`` batches at a time."""

    def __init__(self, seed: int, weights: list[float]) -> None:
        self.seed = seed
        total = math.fsum(weights)
        self.cumulative = np.cumsum([w / total for w in weights])
        self.cumulative[-1] = 1.0  # so that every uniform in [0, 1) falls in a source
        self.start = self.stop = 0  # the cached block: batches start .. stop - 1
        self.block: list[int] = []

    def between(self, start: int, stop: int) -> np.ndarray:
        """The sources (their numbers, in the mixture's order) of batches ``start .. stop - 1``."""
        if stop <= start:
            return np.empty(0, dtype=np.int64)
        u = example_uniforms(self.seed, _STREAM, np.arange(start, stop, dtype=np.int64), 1)[:, 0]
        return np.searchsorted(self.cumulative, u, side="right").astype(np.int64)

    def source_of(self, g: int) -> int:
        """The source of batch ``g`` (from a cached block)."""
        if not self.start <= g < self.stop:
            self.start = g - g % _BLOCK
            self.stop = self.start + _BLOCK
            self.block = self.between(self.start, self.stop).tolist()  # Python ints: indexed per batch
        return self.block[g - self.start]


class Mixture:
    """Batches from several sources, each batch from one drawn by its weight. See :func:`mix`."""

    name = "mix"

    def __init__(self, sources: Mapping[str, tuple[Any, float]], *, seed: int, stopping_strategy: str) -> None:
        self.names, self.sources, self.weights = checked_sources(sources)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"mix: seed must be an integer; got {seed!r}")
        if stopping_strategy not in STOPPING_STRATEGIES:
            raise ConfigError(
                f"mix: stopping_strategy must be one of {', '.join(STOPPING_STRATEGIES)}; got {stopping_strategy!r}"
            )
        self.seed = seed
        self.stopping_strategy = stopping_strategy
        self.batch_size: int | None = agreed(self.sources, "batch_size", "the same batch size")
        self.num_shards: int | None = agreed(self.sources, "num_shards", "the same replica's shard")
        self.shard_index: int | None = agreed(self.sources, "shard_index", "the same replica's shard")
        self._draws = _Draws(seed, [self.weights[n] for n in self.names])
        #: Batches drawn so far (all sources): the index ``g`` of the next one.
        self.step = 0
        #: Batches drawn from each source so far.
        self.drawn = dict.fromkeys(self.names, 0)
        self.exhausted: set[str] = set()
        self.ended = False
        # Where "all_exhausted" starts a source over: where it stood when mixed.
        self._initial = {n: self.sources[n].state_dict() for n in self.names}
        self._structure = Structure(self.sources)

    # ------------------------------------------------------------------ iterating
    def __iter__(self) -> Mixture:
        for source in self.sources.values():
            if callable(getattr(source, "__iter__", None)):
                iter(source)  # a stoker.data source starts its workers now, on the thread that iterates
        return self

    def __next__(self) -> Any:
        # Kept short: it runs once per batch, and an in-memory source's batch takes microseconds.
        if self.ended:
            raise StopIteration
        name = self.names[self._draws.source_of(self.step)]
        try:
            batch = next(self.sources[name])
        except StopIteration:
            batch = self._after_the_end_of(name)
        if name not in self._structure.checked:
            self._structure.check(name, batch)
        self.step += 1
        self.drawn[name] += 1
        return batch

    def _after_the_end_of(self, name: str) -> Any:
        """Source ``name`` has no batch left: start it over and take its first batch, or end the
        mixture (StopIteration), as ``stopping_strategy`` says."""
        source = self.sources[name]
        self.exhausted.add(name)
        if self.stopping_strategy == "first_exhausted" or len(self.exhausted) == len(self.names):
            self.ended = True
            self.close()
            raise StopIteration
        source.load_state_dict(self._initial[name])
        try:
            return next(source)
        except StopIteration:
            raise DataError(f"mix: source {name!r} yields no batch, even started over") from None

    def advance(self, batches: int) -> None:
        """Move ``batches`` ahead as as many ``next()`` calls would (a resume's jump past the batches
        a prefetch thread's snapshot lags behind): each source that repeats forever and can jump
        (``stoker.data``'s) jumps by the batches drawn from it, building none; otherwise they are read."""
        counts = np.bincount(self._draws.between(self.step, self.step + batches), minlength=len(self.names))
        drawn = [(self.sources[n], int(c)) for n, c in zip(self.names, counts, strict=True) if c]
        if all(callable(getattr(s, "advance", None)) and getattr(s, "num_epochs", 0) is None for s, _ in drawn):
            for source, count in drawn:
                source.advance(count)
            for name, count in zip(self.names, counts.tolist(), strict=True):
                self.drawn[name] += count
            self.step += batches
            return
        for i in range(batches):  # a source may run out on the way: read them, as next() does
            try:
                next(self)
            except StopIteration:
                raise ConfigError(f"mix: cannot advance {batches} batches: the data ends after {i}") from None

    def source_of(self, g: int) -> str:
        """The name of the source batch ``g`` is drawn from (a pure function of the seed and weights)."""
        return self.names[self._draws.source_of(g)]

    @property
    def prefers_inline_fetch(self) -> bool:
        """Whether the infeed should fetch in the training thread: when every source says so."""
        return all(bool(getattr(s, "prefers_inline_fetch", False)) for s in self.sources.values())

    @property
    def bad_examples_skipped(self) -> int:
        """Unreadable examples the sources replaced so far (``skip_bad_examples=True``)."""
        return sum(int(getattr(s, "bad_examples_skipped", 0) or 0) for s in self.sources.values())

    def close(self) -> None:
        """Stop the sources' workers, if any (they restart at the next ``next()``)."""
        for source in self.sources.values():
            close = getattr(source, "close", None)
            if callable(close):
                close()

    # ------------------------------------------------------------------ what the summaries show
    def realised_proportions(self, state: dict[str, Any] | None = None, ahead: int = 0) -> dict[str, float]:
        """The fraction of the batches drawn so far that came from each source: as of ``state``
        (this mixture's ``state_dict``; default: now) and ``ahead`` batches after it (the infeed's
        loop stands there when a prefetch thread snapshotted the state earlier). Empty before
        the first batch."""
        if state is None:
            state = self.state_dict()
        counts = np.array([int(state["drawn"][n]) for n in self.names], dtype=np.int64)
        step = int(state["step"])
        if ahead > 0:
            counts += np.bincount(self._draws.between(step, step + ahead), minlength=len(self.names))
        total = int(counts.sum())
        return {} if total == 0 else {n: int(c) / total for n, c in zip(self.names, counts, strict=True)}

    def summary_scalars(self, state: dict[str, Any] | None = None, ahead: int = 0) -> dict[str, float]:
        """What the training summaries report of this input: ``mix/<name>``, each source's realised
        proportion (:meth:`realised_proportions`)."""
        return {f"mix/{n}": p for n, p in self.realised_proportions(state, ahead).items()}

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """The position ``step``, each source's own state under its name, and the counts drawn."""
        return {
            "per": "batch",
            "step": self.step,
            "seed": self.seed,
            "weights": dict(self.weights),
            "stopping_strategy": self.stopping_strategy,
            "drawn": dict(self.drawn),
            "exhausted": sorted(self.exhausted),
            "ended": self.ended,
            "sources": {n: self.sources[n].state_dict() for n in self.names},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Jump to a saved position: every source to its own; refuses another seed or other sources."""
        self._check_saved(state)
        self.close()
        for n in self.names:
            self.sources[n].load_state_dict(state["sources"][n])
        self.step = int(state["step"])
        self.drawn = {n: int(state["drawn"][n]) for n in self.names}
        self.exhausted = set(state["exhausted"])
        self.ended = bool(state["ended"])

    def reshard_state_dict(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """This replica's state from the states every replica of a run with another number of
        replicas saved: each source re-sharded by its own ``reshard_state_dict`` (the draws
        depend on the batch count only, the same on every replica)."""
        first = states[0]
        if len({int(s["step"]) for s in states}) != 1:
            raise CheckpointMismatchError("mix: the replicas' saved positions differ; cannot re-shard them")
        self._check_saved(first)
        resharded = {}
        for n in self.names:
            reshard = getattr(self.sources[n], "reshard_state_dict", None)
            if not callable(reshard):
                raise CheckpointMismatchError(
                    f"mix: source {n!r} cannot be re-sharded to another number of replicas; "
                    f"resume with {len(states)} replicas"
                )
            resharded[n] = reshard([s["sources"][n] for s in states])
        return dict(first, sources=resharded)

    def _check_saved(self, state: dict[str, Any]) -> None:
        if state.get("per", "batch") != "batch":
            raise CheckpointMismatchError(
                f"mix: the saved input was mixed per {state['per']}, this one per batch; resume with the same per="
            )
        saved = list(state.get("sources", {}))
        if sorted(saved) != sorted(self.names):
            raise CheckpointMismatchError(
                f"mix: the saved input mixes {', '.join(saved)} but this one mixes {', '.join(self.names)}; "
                "resume with the same sources"
            )
        if int(state["seed"]) != self.seed:
            raise CheckpointMismatchError(
                f"mix: the saved input has seed={state['seed']} but this one seed={self.seed}; "
                "resume with the same seed"
            )
        if dict(state["weights"]) != self.weights:  # allowed (a schedule of weights), but said
            log.warning(
                "mix: the weights changed since the checkpoint (%s -> %s); batches from %d on are drawn with the new "
                "ones",
                state["weights"],
                self.weights,
                int(state["step"]),
            )

    def __repr__(self) -> str:
        weights = ", ".join(f"{n}={self.weights[n]:g}" for n in self.names)
        return f"Mixture({weights}, seed={self.seed}, step={self.step})"


def mix(
    sources: Mapping[str, tuple[Any, float]],
    *,
    seed: int = 0,
    stopping_strategy: str = "first_exhausted",
    per: str = "batch",
    num_threads: int = 0,
) -> Mixture | ExampleMixture:
    """Mix several sources by weight: each batch (or each example) comes from one source, drawn
    from the seed.

    Args:
        sources: ``{name: (source, weight)}``; each source a ``stoker.data`` source (or any
            iterator with ``state_dict`` / ``load_state_dict``) built for this replica
            (``read=ReadOptions(...).for_replica(params)``), all with the same batch size and
            batches of the same structure; weights positive (normalised to proportions).
        seed: seeds the draws (which source each batch comes from); the sources keep their own
            seeds for their order and augmentation.
        stopping_strategy: when a finite source runs out, ``"first_exhausted"`` ends the mixture,
            ``"all_exhausted"`` starts that source over until every source has run out once.
        per: ``"batch"`` (a :class:`Mixture`): each batch from one source, read by the source
            itself (its workers included); ``"example"`` (an
            :class:`~stoker.data.mix_examples.ExampleMixture`): each example of a global batch
            drawn on its own, so every batch is a blend, built from the sources' examples in the
            thread that iterates (index-based sources that read any example, without workers).
        num_threads: with ``per="example"``, threads that build the coming batches ahead (each
            reading through its own copy of each source; 0: built when asked). A ``per="batch"``
            mixture's sources build ahead in their own workers.

    The source of batch ``g`` (of global sample ``j``) is a pure function of ``(seed, g)`` (of
    ``(seed, j)``) and the weights, the same on every replica and with any number of workers or
    replicas; the state (``state_dict``) holds ``g`` and every source's position, so a resume is
    exact. The training summaries report each source's realised proportion as ``mix/<name>``.
    """
    if per == "batch":
        if num_threads:
            raise ConfigError(
                f"mix: num_threads={num_threads} builds per='example' blends; a per='batch' mixture's "
                "sources build ahead in their own workers (ReadOptions(num_workers=...))"
            )
        return Mixture(sources, seed=seed, stopping_strategy=stopping_strategy)
    if per == "example":
        from .mix_examples import ExampleMixture  # it builds on this module's checks

        return ExampleMixture(sources, seed=seed, stopping_strategy=stopping_strategy, num_threads=num_threads)
    raise ConfigError(f"mix: per must be one of batch, example; got {per!r}")


__all__ = ["STOPPING_STRATEGIES", "Mixture", "mix"]
