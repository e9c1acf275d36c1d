"""``InputPlan``: the global batch of each mode, what ``input_fn`` sees, and the infeed it feeds.

The user gives global batch sizes; every replica (and every accumulation micro-batch) gets an
equal share, and a size that does not divide is refused when the Estimator is built, not at
the first step. ``input_fn(params)`` is called with the user's params plus ``batch_size``
(per replica), ``num_replicas``, ``replica_index`` and ``cache``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..config.slices import InputConfig
from ..data._tree import batch_rows
from ..distributed import Strategy
from ..errors import ConfigError, DataError, UserCodeError
from ..rng import rng_state, seed_everything, set_rng_state
from ..spec import ModeKeys
from .infeed import Batch, Infeed
from .limits import epoch_batches, limited

InputFn = Callable[[dict[str, Any]], Iterable[Any]]


class InputPlan:
    """Per-replica batches, ``input_fn`` params and infeeds for the three modes."""

    def __init__(
        self,
        *,
        params: dict[str, Any],
        config: InputConfig,
        strategy: Strategy,
        train_batch_size: int | None,
        eval_batch_size: int | None = None,
        predict_batch_size: int | None = None,
    ) -> None:
        self.params = params
        self.config = config
        self.strategy = strategy
        self.train_batch_size = check_batch_size("train_batch_size", train_batch_size)
        self.eval_batch_size = check_batch_size("eval_batch_size", eval_batch_size) or self.train_batch_size
        self.predict_batch_size = check_batch_size("predict_batch_size", predict_batch_size) or self.eval_batch_size
        for mode in ModeKeys:
            if self.global_batch(mode) is not None:
                self.per_replica(mode)  # fail now, not at the first call

    def global_batch(self, mode: ModeKeys) -> int | None:
        return {ModeKeys.TRAIN: self.train_batch_size, ModeKeys.EVAL: self.eval_batch_size}.get(
            mode, self.predict_batch_size
        )

    def per_replica(self, mode: ModeKeys) -> int:
        """The batch one replica's ``input_fn`` yields in ``mode`` (one micro-batch when training)."""
        what = f"{mode.value}_batch_size"
        global_batch = self.global_batch(mode)
        if global_batch is None:
            call = {ModeKeys.TRAIN: "train", ModeKeys.EVAL: "evaluate"}.get(mode, "predict")
            raise ConfigError(
                f"{call}: the Estimator needs {what}" + ("" if mode is ModeKeys.TRAIN else " (or train_batch_size)")
            )
        world = self.strategy.num_replicas
        accumulation = self.config.gradient_accumulation_steps if mode is ModeKeys.TRAIN else 1
        if global_batch % (world * accumulation):
            detail = f"{world} replicas" + (f" x {accumulation} accumulation steps" if accumulation > 1 else "")
            raise ConfigError(
                f"{what}={global_batch} is not divisible by {world * accumulation} ({detail}); "
                f"use a multiple of {world * accumulation}"
            )
        micro = self.config.microbatches if mode is ModeKeys.TRAIN else 1
        if (global_batch // world) % micro:
            raise ConfigError(
                f"{what}={global_batch} gives {global_batch // world} examples per replica ({world} replicas), "
                f"which PipelineConfig.microbatches={micro} does not divide; use a multiple of {world * micro}"
            )
        return global_batch // (world * accumulation)

    def mode_params(self, mode: ModeKeys) -> dict[str, Any]:
        """The params ``model_fn`` and ``input_fn`` see in ``mode`` (a fresh dict each call)."""
        params = dict(self.params)
        params["batch_size"] = self.per_replica(mode)
        params["num_replicas"] = self.strategy.num_replicas
        params["replica_index"] = self.strategy.replica_index
        params["cache"] = None
        return params

    def infeed(self, input_fn: InputFn, mode: ModeKeys, params: dict[str, Any], restore: Any = None) -> Infeed:
        """Call ``input_fn(params)`` and wrap what it returns in an ``Infeed`` to the device."""
        if not callable(input_fn):
            raise UserCodeError(f"input_fn must be a function params -> iterable; got {type(input_fn).__name__}")
        cfg = self.config
        # input_fn and iter() run with freshly seeded global RNGs, so an input pipeline that
        # draws from them when it is built does so identically in a fresh and a resumed run.
        with isolated_rng(cfg.seed):
            source = limited(input_fn(params), mode, cfg.limits)  # RunConfig's quick-run limits, if any
            return Infeed(
                source,
                device=self.strategy.device,
                prefetch_depth=cfg.prefetch_depth,  # the Infeed decides whether a thread pays
                snapshot_every=cfg.snapshot_every,
                pad_to=None if mode is ModeKeys.TRAIN else params["batch_size"],
                restore=restore,
                what=f"{mode.value} input_fn",
            )

    def epoch_steps(self, input_fn: InputFn, what: str) -> int:
        """The optimizer steps of one epoch of ``input_fn``'s train input, as a train run reads it
        (``limit_train_batches``, ``overfit_batches``), the same on every replica; ``what`` (the
        argument that needs it) is named in the error when the input does not know its length.
        ``input_fn`` is called once more for it, and what it returns closed."""
        with isolated_rng(self.config.seed):
            source = limited(input_fn(self.mode_params(ModeKeys.TRAIN)), ModeKeys.TRAIN, self.config.limits)
        try:
            steps = epoch_batches(source, self.config.gradient_accumulation_steps, what)
        finally:
            close = getattr(source, "close", None)
            if callable(close):
                close()
        if self.strategy.world_size > 1:
            everyone = self.strategy.all_gather_object(steps)
            if len(set(everyone)) > 1:
                raise ConfigError(f"{what}: the replicas' train inputs have epochs of {everyone} steps; give them one")
        return steps

    def in_lockstep(self, infeed: Infeed) -> Iterator[Batch]:
        """The infeed's batches; with several replicas, padded out with fully masked copies of
        the last batch until every replica's data has ended (collectives need all replicas)."""
        if self.strategy.world_size == 1:
            yield from infeed
            return
        last: Batch | None = None
        while True:
            batch = next(infeed, None)
            if not self.strategy.any_replica(batch is not None):
                return
            if batch is None:
                if last is None:
                    raise DataError(
                        f"replica {self.strategy.rank} got no data at all: shard the input so every "
                        "replica has at least one batch (params['num_replicas'], params['replica_index'])"
                    )
                mask = torch.zeros(batch_rows(last.features) or 0, dtype=torch.bool, device=self.strategy.device)
                batch = Batch(last.features, last.labels, mask, 0)
            last = batch
            yield batch


def check_batch_size(name: str, value: int | None) -> int | None:
    """``value`` if it is a positive int (or ``None``); else a ``ConfigError`` naming ``name``."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a positive integer; got {value!r}")
    return value


@contextlib.contextmanager
def isolated_rng(seed: int) -> Iterator[None]:
    """Run a block with freshly seeded global RNGs, then put the previous states back."""
    saved = rng_state()
    seed_everything(seed)
    try:
        yield
    finally:
        set_rng_state(saved)


__all__ = ["InputFn", "InputPlan", "check_batch_size", "isolated_rng"]
