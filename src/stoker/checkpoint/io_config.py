"""``CheckpointIO``: how checkpoints are written, as ``RunConfig(checkpoint_io=...)`` takes it.

What a checkpoint holds and where it goes (``model_dir``, ``save_checkpoints_*``,
``keep_checkpoint_max``) stays on ``RunConfig``, where TPUEstimator users look for it; this is
stoker's own part: whether the write runs on a background thread and how storage faults are
retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..storage.retry import RetryPolicy


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

    A bad value raises ``ValueError`` naming the field and what it accepts.
    """

    async_save: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.async_save, bool):
            raise ValueError(f"CheckpointIO.async_save must be True or False; got {self.async_save!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise ValueError(
                f"CheckpointIO.retry must be a stoker.storage.RetryPolicy; got {type(self.retry).__name__}"
            )


__all__ = ["CheckpointIO"]
