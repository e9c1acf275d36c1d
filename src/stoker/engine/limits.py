"""How much of each input a quick run reads, and an input's epoch in steps.

``RunConfig``'s quick-run settings are Lightning's flags with Lightning's meaning
(``BatchLimits``, the input's slice); :func:`limited` applies them to what ``input_fn``
returned, before the infeed:

- evaluation and prediction read the first ``N`` batches (``limit_eval_batches``,
  ``fast_dev_run``; with ``overfit_batches``, as many of the eval input's): :class:`FirstBatches`;
- training reads the first ``N`` batches of every epoch, then jumps to the next epoch
  (``limit_train_batches``): :class:`EpochWindow`, for a source whose position is
  ``(epoch, batch)`` (``stoker.data``'s), so the jump reads nothing and the position stays the
  whole state: a resumed run reads what an uninterrupted one would;
- or the same first ``N`` batches over and over (``overfit_batches``): :class:`OverfitBatches`,
  any input; those batches are read once and kept, and its state is how many it has yielded.

A count may be a fraction of the input's length (a float in (0, 1], Lightning's ``0.1``),
for an input that knows it (``len()``). The training input's epoch is then what the run counts
as one: :func:`epoch_batches` gives it for ``max_epochs`` and ``eval_every_n_epochs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ..config.slices import BatchLimits
from ..data._tree import tree_map
from ..errors import ConfigError
from ..spec import ModeKeys


def limited(source: Any, mode: ModeKeys, limits: BatchLimits) -> Iterable[Any]:
    """``source`` read as ``limits`` say for ``mode`` (itself when they say nothing)."""
    if mode is ModeKeys.TRAIN:
        if limits.overfit is not None:
            return OverfitBatches(source, count(source, limits.overfit, "overfit_batches"))
        if limits.train is not None:
            return EpochWindow(source, count(source, limits.train, "limit_train_batches"))
        return source
    limit = limits.eval if mode is ModeKeys.EVAL else limits.predict
    name = "limit_eval_batches" if mode is ModeKeys.EVAL else "fast_dev_run"
    return source if limit is None else FirstBatches(source, count(source, limit, name))


def count(source: Any, limit: int | float, name: str) -> int:
    """``limit`` in batches: itself, or that fraction of ``len(source)`` (at least one batch)."""
    if isinstance(limit, int):
        return limit
    length = length_of(source, f"RunConfig.{name}={limit} (a fraction)")
    batches = int(length * limit)
    if batches < 1:
        raise ConfigError(f"RunConfig.{name}={limit} of an input of {length} batches is no batch; give more")
    return batches


def length_of(source: Any, what: str) -> int:
    """``len(source)``: the batches of one epoch; a ``ConfigError`` naming ``what`` needs it."""
    try:
        return len(source)
    except TypeError:
        raise ConfigError(
            f"{what} needs an input_fn whose iterable knows its length (len(): the batches of an epoch, as "
            f"stoker.data's sources do); got a {type(source).__name__}"
        ) from None


def epoch_batches(source: Any, accumulation: int, what: str) -> int:
    """The optimizer steps of one epoch of the train input ``source`` (as :func:`limited` reads it)."""
    batches = length_of(source, what)
    if batches < accumulation or batches % accumulation:
        raise ConfigError(
            f"{what}: an epoch of the train input is {batches} batches, which gradient_accumulation_steps="
            f"{accumulation} does not divide; an epoch must be whole steps"
        )
    return batches // accumulation


class _Wrapped:
    """What the infeed reads of a source besides iterating it, passed on to the one wrapped."""

    def __init__(self, source: Any) -> None:
        self.source: Any = source

    @property
    def prefers_inline_fetch(self) -> bool:
        return bool(getattr(self.source, "prefers_inline_fetch", False))

    @property
    def bad_examples_skipped(self) -> int:
        return int(getattr(self.source, "bad_examples_skipped", 0) or 0)

    def close(self) -> None:
        close = getattr(self.source, "close", None)
        if callable(close):
            close()


class FirstBatches(_Wrapped):
    """The first ``n`` batches of ``source`` (evaluation and prediction: no state to keep)."""

    def __init__(self, source: Any, n: int) -> None:
        super().__init__(source)
        self.n = n
        self._it: Iterator[Any] | None = None
        self._read = 0

    def __iter__(self) -> FirstBatches:
        self._it = iter(self.source)
        return self

    def __next__(self) -> Any:
        if self._it is None:
            iter(self)
        assert self._it is not None
        if self._read >= self.n:
            raise StopIteration
        self._read += 1
        return next(self._it)

    def __len__(self) -> int:
        return min(self.n, len(self.source)) if hasattr(self.source, "__len__") else self.n


class EpochWindow(_Wrapped):
    """The first ``keep`` batches of every epoch of ``source``, a source whose position is
    ``(epoch, batch)`` with ``advance`` (``stoker.data``'s); an epoch is those ``keep``."""

    def __init__(self, source: Any, keep: int) -> None:
        if not all(hasattr(source, a) for a in ("batch", "batches_per_epoch", "advance", "load_state_dict")):
            raise ConfigError(
                "RunConfig.limit_train_batches cuts every epoch of a source with an (epoch, batch) position, as "
                f"stoker.data's sources have; got a {type(source).__name__} (give train(steps=...) instead)"
            )
        super().__init__(source)
        self.keep = min(keep, int(self.source.batches_per_epoch))

    def __iter__(self) -> EpochWindow:
        iter(self.source)
        return self

    def __next__(self) -> Any:
        self._skip_rest()
        return next(self.source)

    def _skip_rest(self) -> None:
        """Past the window of its epoch, jump to the next epoch (reading nothing)."""
        source = self.source
        if source.batch >= self.keep and source.batch < source.batches_per_epoch:
            source.advance(source.batches_per_epoch - source.batch)

    def advance(self, batches: int) -> None:
        """Move ``batches`` of this window ahead (a resume's jump, as ``stoker.data``'s ``advance``)."""
        for _ in range(batches):
            self._skip_rest()
            self.source.advance(1)

    def __len__(self) -> int:
        return self.keep

    @property
    def batches_per_epoch(self) -> int:
        return self.keep

    # the position is the source's own: its state, restored and re-sharded by it
    def state_dict(self) -> Any:
        return self.source.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.source.load_state_dict(state)

    def reshard_state_dict(self, states: list[Any]) -> Any:
        return self.source.reshard_state_dict(states)


class OverfitBatches(_Wrapped):
    """The first ``keep`` batches ``source`` yields, over and over (``overfit_batches``): read once
    and kept (copied: a source may reuse its buffers); the state is the count yielded, as
    ``(epoch, batch)`` of epochs of ``keep`` batches."""

    def __init__(self, source: Any, keep: int) -> None:
        super().__init__(source)
        self.keep = keep
        self.yielded = 0
        self._kept: list[Any] = []
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> OverfitBatches:
        return self

    def __next__(self) -> Any:
        i = self.yielded % self.keep
        while len(self._kept) <= i:  # the first pass (also after a resume): read them, in order
            if self._it is None:
                self._it = iter(self.source)
            try:
                batch = next(self._it)
            except StopIteration:
                raise ConfigError(
                    f"RunConfig.overfit_batches={self.keep}: the train input has only {len(self._kept)} batches"
                ) from None
            self._kept.append(tree_map(_copy, batch))
        self.yielded += 1
        return self._kept[i]

    def __len__(self) -> int:
        return self.keep

    @property
    def batches_per_epoch(self) -> int:
        return self.keep

    def state_dict(self) -> dict[str, int]:
        epoch, batch = divmod(self.yielded, self.keep)
        return {"epoch": epoch, "batch": batch, "overfit_batches": self.keep}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state.get("overfit_batches", self.keep)) != self.keep:
            raise ConfigError(
                f"RunConfig.overfit_batches={self.keep}, but the checkpoint's run overfit "
                f"{state['overfit_batches']} batches; resume with the same number"
            )
        self.yielded = int(state["epoch"]) * self.keep + int(state["batch"])

    def advance(self, batches: int) -> None:
        self.yielded += batches

    def reshard_state_dict(self, states: list[dict[str, int]]) -> dict[str, int]:
        """The count yielded is the same on every replica (each repeats its own first batches)."""
        return dict(states[0])


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


__all__ = ["EpochWindow", "FirstBatches", "OverfitBatches", "count", "epoch_batches", "length_of", "limited"]
