"""Checkpoints: the commit protocol and index, the files and their verification, warm start.

Owns everything a ``model_dir``'s ``ckpt-<step>/`` directories and ``checkpoint.json`` are made
of and read back through: :mod:`~stoker.checkpoint.index` (``checkpoint.json`` as a type:
schema, parse, encode, version), :mod:`~stoker.checkpoint.commit` (the commit protocols on
local disks and object stores, behind one interface), :mod:`~stoker.checkpoint.manager`
(``CheckpointManager``: saving, resuming, evaluation results, the ``finished.json`` marker),
:mod:`~stoker.checkpoint.retention` (what each index update keeps: retention, ``keep_best``,
evaluation results),
:mod:`~stoker.checkpoint.manifest` (each checkpoint's own ``manifest.json`` and ``evaluation.json``),
:mod:`~stoker.checkpoint.recovery` (a lost, damaged, stale or foreign index rebuilt from them),
:mod:`~stoker.checkpoint.verify` (``stoker checkpoint verify``/``repair``: every file checked),
:mod:`~stoker.checkpoint.warm_start` (weights from another run), :mod:`~stoker.checkpoint.files` (file
names, serialisation, sha256-verified loading), :mod:`~stoker.checkpoint.async_writer` (saves on
a background thread), :mod:`~stoker.checkpoint.io_config` (``CheckpointIO``: whether a run
writes them in the background, with which storage retries), :mod:`~stoker.checkpoint.safe_load`
(decoding that never runs code from a file) and ``stoker checkpoint``
(:mod:`~stoker.checkpoint.cli`). It may import :mod:`stoker.storage`, :mod:`stoker.errors` and
the sharded-checkpoint helpers of :mod:`stoker.distributed`; it never imports the engine, the
Estimator or anything above them.
See docs/checkpoints.md.
"""

from .commit import FINISHED_NAME, CommitProtocol, LocalDirectory, ObjectStore, commit_protocol
from .files import (
    CKPT_RE,
    INDEX_LOCK_NAME,
    MODEL_FILE,
    TRAIN_STATE_FILE,
    LoadedCheckpoint,
    check_state_fits,
    load_checkpoint,
    model_state_to_bytes,
    previous_retained,
    serialize_input_state,
    step_of,
)
from .index import (
    INDEX_FORMAT,
    INDEX_NAME,
    INDEX_VERSION,
    Best,
    CheckpointIndex,
    CheckpointRecord,
    Coverage,
)
from .io_config import CheckpointConfig, CheckpointIO
from .manager import CheckpointManager
from .warm_start import WarmStartReport, WarmStartSettings, warm_start

__all__ = [
    "CKPT_RE",
    "FINISHED_NAME",
    "INDEX_FORMAT",
    "INDEX_LOCK_NAME",
    "INDEX_NAME",
    "INDEX_VERSION",
    "MODEL_FILE",
    "TRAIN_STATE_FILE",
    "Best",
    "CheckpointConfig",
    "CheckpointIO",
    "CheckpointIndex",
    "CheckpointManager",
    "CheckpointRecord",
    "CommitProtocol",
    "Coverage",
    "LoadedCheckpoint",
    "LocalDirectory",
    "ObjectStore",
    "WarmStartReport",
    "WarmStartSettings",
    "check_state_fits",
    "commit_protocol",
    "load_checkpoint",
    "model_state_to_bytes",
    "previous_retained",
    "serialize_input_state",
    "step_of",
    "warm_start",
]
