"""Checkpoints: the commit protocol and index, the files and their verification, warm start.

Owns everything a ``model_dir``'s ``ckpt-<step>/`` directories and ``checkpoint.json`` are made
of and read back through: :mod:`~stoker.checkpoint.manager` (the commit protocol on local disks
and object stores, retention, ``keep_best``, warm start), :mod:`~stoker.checkpoint.files` (file
names, serialisation, sha256-verified loading), :mod:`~stoker.checkpoint.async_writer` (saves on
a background thread), :mod:`~stoker.checkpoint.io_config` (``CheckpointIO``: whether a run
writes them in the background, with which storage retries), :mod:`~stoker.checkpoint.safe_load`
(decoding that never runs code from a file) and ``stoker checkpoint``
(:mod:`~stoker.checkpoint.cli`). It may import :mod:`stoker.storage`, :mod:`stoker.errors` and
the sharded-checkpoint helpers of :mod:`stoker.distributed`; it never imports the engine, the
Estimator or anything above them.
See docs/checkpoints.md.
"""

from .files import (
    CKPT_RE,
    INDEX_FORMAT,
    INDEX_LOCK_NAME,
    INDEX_NAME,
    MODEL_FILE,
    TRAIN_STATE_FILE,
    LoadedCheckpoint,
    check_state_fits,
    load_checkpoint,
    model_state_to_bytes,
    previous_retained,
    record_dir,
    serialize_input_state,
    step_of,
)
from .io_config import CheckpointIO
from .manager import (
    FINISHED_NAME,
    CheckpointManager,
    WarmStartReport,
    WarmStartSettings,
    warm_start,
)

__all__ = [
    "CKPT_RE",
    "FINISHED_NAME",
    "INDEX_FORMAT",
    "INDEX_LOCK_NAME",
    "INDEX_NAME",
    "MODEL_FILE",
    "TRAIN_STATE_FILE",
    "CheckpointIO",
    "CheckpointManager",
    "LoadedCheckpoint",
    "WarmStartReport",
    "WarmStartSettings",
    "check_state_fits",
    "load_checkpoint",
    "model_state_to_bytes",
    "previous_retained",
    "record_dir",
    "serialize_input_state",
    "step_of",
    "warm_start",
]
