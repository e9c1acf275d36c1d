"""Checkpointing's settings: ``CheckpointIO`` and the ``CheckpointConfig`` slice.

``CheckpointIO`` is how checkpoints are written, as ``RunConfig(checkpoint_io=...)`` takes it:
whether the write runs on a background thread and how storage faults are retried.
``CheckpointConfig`` is checkpointing's slice of a ``RunConfig``: where checkpoints go, how
often, how many are kept, and the ``CheckpointIO``. The user spells its fields flat on
``RunConfig`` (``model_dir``, ``save_checkpoints_steps``, ...), where TPUEstimator users look for
them; the Estimator hands the slice to what checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..storage.retry import RetryPolicy
from .index import KeepBest

#: the checkpoint interval when neither ``save_checkpoints_steps`` nor ``save_checkpoints_secs`` is set
DEFAULT_SAVE_SECS = 600.0


@dataclass(frozen=True, kw_only=True)
class CheckpointIO:
    """How checkpoints are written.

    Attributes:
        async_save: write checkpoints on a background thread: the loop waits only for a copy
            of the state (``stoker.checkpoint.async_writer``); a failed write stops training at
            the next loop boundary with the previous checkpoint still the latest. Sharded
            (``dcp/``) checkpoints are always written synchronously.
        retry: how storage faults are retried and how long one storage operation may take
            (``stoker.storage.RetryPolicy``; default 5 attempts, backoff from 0.2 s, 600 s
            timeout).

    A bad value raises ``ConfigError`` (a ``ValueError``) naming the field and what it accepts.
    """

    async_save: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.async_save, bool):
            raise ConfigError(f"CheckpointIO.async_save must be True or False; got {self.async_save!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(
                f"CheckpointIO.retry must be a stoker.storage.RetryPolicy; got {type(self.retry).__name__}"
            )


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Checkpointing's slice of a ``RunConfig`` (its fields keep ``RunConfig``'s names).

    Attributes:
        model_dir: where checkpoints go (``None``: a run kept in memory).
        save_checkpoints_steps / save_checkpoints_secs: the interval (at most one; with
            neither, every ``DEFAULT_SAVE_SECS`` seconds, which the slice fills in).
        keep_checkpoint_max: the newest checkpoints retained (0 keeps all).
        keep_best: ``(metric, "min" | "max")``: also retain the best evaluated checkpoint;
            ``(metric, "min" | "max", k)``: the ``k`` best.
        io: how checkpoints are written (``RunConfig.checkpoint_io``).
    """

    model_dir: str | None = None
    save_checkpoints_steps: int | None = None
    save_checkpoints_secs: float | None = None
    keep_checkpoint_max: int = 5
    keep_best: KeepBest | None = None
    io: CheckpointIO = field(default_factory=CheckpointIO)

    def __post_init__(self) -> None:
        if not isinstance(self.io, CheckpointIO):
            raise ConfigError(
                "RunConfig.checkpoint_io must be a stoker.checkpoint.CheckpointIO(async_save=..., retry=...); "
                f"got {self.io!r}"
            )
        if self.model_dir is not None:
            object.__setattr__(self, "model_dir", os.fspath(self.model_dir))
        if not isinstance(self.keep_checkpoint_max, int) or self.keep_checkpoint_max < 0:
            raise ConfigError(
                f"RunConfig.keep_checkpoint_max must be >= 0 (0 keeps all), got {self.keep_checkpoint_max}"
            )
        steps, secs = self.save_checkpoints_steps, self.save_checkpoints_secs
        if steps is not None and secs is not None:
            raise ConfigError(
                "RunConfig: set at most one of save_checkpoints_steps and save_checkpoints_secs "
                f"(got {steps} and {secs})"
            )
        if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
            raise ConfigError(f"RunConfig.save_checkpoints_steps must be a positive integer; got {steps!r}")
        if secs is not None and not secs > 0:
            raise ConfigError(f"RunConfig.save_checkpoints_secs must be > 0, got {secs}")
        if steps is None and secs is None:
            object.__setattr__(self, "save_checkpoints_secs", DEFAULT_SAVE_SECS)
        if self.keep_best is not None:
            object.__setattr__(self, "keep_best", keep_best_rule(self.keep_best))


def keep_best_rule(best: object) -> KeepBest:
    """``RunConfig.keep_best`` checked and held as ``(metric, mode)``, or ``(metric, mode, k)`` for
    ``k`` > 1 (``k`` = 1 is the pair: one best)."""
    if isinstance(best, (tuple, list)) and len(best) in (2, 3) and best[1] in ("min", "max"):
        k = best[2] if len(best) == 3 else 1
        if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
            metric, mode = str(best[0]), str(best[1])
            return (metric, mode) if k == 1 else (metric, mode, k)
    raise ConfigError(
        "RunConfig.keep_best must be (metric_name, 'min' | 'max'), or (metric_name, 'min' | 'max', k) "
        f"to keep the k best (k >= 1); got {best!r}"
    )


__all__ = ["DEFAULT_SAVE_SECS", "CheckpointConfig", "CheckpointIO", "keep_best_rule"]
