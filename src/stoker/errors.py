"""Errors stoker raises for things a user can fix. Each message says what to change."""

from __future__ import annotations


class StokerError(Exception):
    """Base class for stoker's own errors."""


class CheckpointError(StokerError):
    """A checkpoint is missing, does not fit the model, or is unreadable."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file's sha256 does not match the index: it is refused, never loaded."""


class StorageError(CheckpointError):
    """Storage refused or lost a write or read (full disk, read-only directory, a store that
    stopped answering or kept failing); the message names the path and the cause. The
    checkpoint being written is not committed; the previous one stays the latest."""


class NanLossError(StokerError):
    """Training produced a non-finite loss; the last good checkpoint is kept."""

    def __init__(self, step: int, value: float, checkpoint: str | None) -> None:
        kept = f"; the last good checkpoint is {checkpoint!r}" if checkpoint else ""
        super().__init__(f"loss is {value} at step {step}: training stopped{kept}")
        self.step = step
        self.value = value
        self.checkpoint = checkpoint


class ModelFnError(StokerError, TypeError):
    """``model_fn`` has the wrong signature or returned something stoker cannot use."""


class ExportError(StokerError):
    """A model that cannot be exported as asked (missing packages, a shape torch.export cannot
    keep dynamic, an export directory that holds something else)."""
