"""Checkpoints: the commit protocol, the index, retention, best-by-metric.

Layout (a user-facing format, documented in docs/checkpoints.md)::

    model_dir/
      checkpoint.json              index: latest, retained checkpoints, best, sha256 of each file
                                   (``stoker.checkpoint.index``: the type that reads and writes it)
      checkpoint.lock              local model_dir: taken (flock) by every writer of the index
                                   (trainer, watching evaluator)
      finished.json                written when training reaches max_steps: {"step": N}; a watching
                                   evaluator stops once it has evaluated everything up to it
      ckpt-<step>/model.safetensors   weights, readable without stoker
      ckpt-<step>/train_state.pt      optimizer, schedule, scaler, RNGs, step, cache, hook state
      ckpt-<step>/input-<rank>.json   input pipeline position of each replica (.pt if not JSON)
      ckpt-<step>/dcp/                sharded runs: model and optimizer slices of every replica
                                      (torch.distributed.checkpoint) instead of model.safetensors
      ckpt-<step>/manifest.json       the checkpoint on its own: every file's sha256 and size
      ckpt-<step>/evaluation.json     what the index records about it after its commit
                                      (``stoker.checkpoint.manifest``)

A checkpoint exists once the index names it, and the index only ever names complete
checkpoints. How that is kept depends on the storage: a local directory renames, an object
store makes the index write the commit point (``stoker.checkpoint.commit``: one
``CommitProtocol``, chosen once when the manager opens). The manager adds what is the same on
both: the ``finished.json`` marker, and retention, ``keep_best`` and evaluation results, kept
by the one ``Retention`` every index update goes through (``stoker.checkpoint.retention``).

The index is never a single point of failure: its first read compares it with the checkpoint
folders and rebuilds it from their manifests when it is missing, unreadable, stale or foreign
(``stoker.checkpoint.recovery``), and a resume skips a damaged checkpoint for the newest one that
verifies (:meth:`CheckpointManager.load_for_resume`).

Leftovers of a crashed write (local temporary directories, object-store orphans) are removed at
a manager's first save, not when it opens: an evaluator opens a writing manager on a model_dir
while the trainer may be in the middle of a save.

Storage faults (``stoker.storage``) are retried when transient and otherwise raise
``StorageError`` naming the path and the cause; the half-written checkpoint is removed and the
previous one stays the latest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from .. import storage
from ..errors import CheckpointError, DamagedCheckpointError, StorageError
from ..storage.stores import DEFAULT_RETRY, Location, RetryPolicy, UrlPath
from .commit import FINISHED_NAME, CommitProtocol, commit_protocol, finished_json
from .compiled import CompiledBundle, remove_unreferenced, write_bundle
from .files import (
    CKPT_RE,
    INDEX_FORMAT,
    INDEX_LOCK_NAME,
    INDEX_NAME,
    MODEL_FILE,
    TRAIN_STATE_FILE,
    LoadedCheckpoint,
    check_state_fits,
    checkpoint_blobs,
    load_checkpoint,
    model_state_to_bytes,
    previous_retained,
    serialize_input_state,
    step_of,
)
from .index import Best, CheckpointIndex, CheckpointRecord, IndexChange, KeepBest, coverage_line
from .recovery import checked_index
from .retention import Retention

log = logging.getLogger("stoker")

T = TypeVar("T")


class CheckpointManager:
    """Owns ``model_dir``'s checkpoints and their index. Only the chief process writes.

    ``model_dir`` is a local path or an fsspec URL; ``retry`` says how storage faults are
    retried and how long one storage operation may take; ``keep_checkpoint_max`` and
    ``keep_best`` are its ``retention``'s (:class:`~stoker.checkpoint.retention.Retention`).
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | Location,
        *,
        keep_checkpoint_max: int = 5,
        keep_best: KeepBest | None = None,
        writer: bool = True,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.model_dir: Location = storage.location(model_dir)
        self.protocol: CommitProtocol = commit_protocol(self.model_dir, retry)
        self.retention = Retention(self.protocol, keep_checkpoint_max=keep_checkpoint_max, keep_best=keep_best)
        self.writer = writer
        self._leftovers_checked = False  # see the module docstring: at the first save, not here
        self._index_checked = False  # the first read compares the index with the folders (recovery)
        self._check_lock = threading.Lock()
        self._damaged: dict[str, str] = {}  # folder -> why: checkpoints found damaged by this process
        if isinstance(self.model_dir, UrlPath):
            storage.filesystem(self.model_dir)  # a missing extra (s3fs, gcsfs) is named now
        if writer:
            storage.makedirs(self.model_dir, retry)

    @property
    def retry(self) -> RetryPolicy:
        """How storage faults are retried (the commit protocol's: one policy for both)."""
        return self.protocol.retry

    @retry.setter
    def retry(self, policy: RetryPolicy) -> None:
        self.protocol.retry = policy

    # ---------------------------------------------------------------- index
    def index(self) -> CheckpointIndex:
        """``checkpoint.json`` as it is now (empty before the first checkpoint).

        The first read also checks that it describes the checkpoint folders, and rebuilds it
        from their manifests if it is missing, unreadable, stale or foreign
        (``stoker.checkpoint.recovery``): never a silent start over existing checkpoints.
        """
        if not self._index_checked:
            with self._check_lock:
                if not self._index_checked:
                    index = checked_index(self.protocol, writer=self.writer)
                    self._index_checked = True
                    return index
        return self.protocol.read_index()

    def records(self) -> list[CheckpointRecord]:
        """The retained checkpoints, by step."""
        return list(self.index().checkpoints)

    def latest_path(self) -> Location | None:
        """The latest checkpoint whose directory exists and that this process has not found damaged.

        Deleting a checkpoint's directory by hand makes the previous retained one the latest. A
        record newer than ``latest`` (one a resume skipped as damaged, until its step is saved
        again) is never the latest.
        """
        index = self.index()
        latest = index.record(index.latest) if index.latest else None
        records = [r for r in index.checkpoints if latest is None or r.step <= latest.step]
        for rec in reversed(records):
            if rec.directory in self._damaged:
                continue
            path = self.model_dir / rec.directory
            if storage.is_dir(path):
                if rec.name != index.latest and (latest is None or latest.directory not in self._damaged):
                    log.warning("%s is missing: resuming from the previous retained checkpoint %s", index.latest, path)
                return path
        return None

    def latest_step(self) -> int | None:
        latest = self.latest_path()
        return None if latest is None else step_of(latest)

    def load_for_resume(self) -> LoadedCheckpoint | None:
        """The newest checkpoint that verifies, loaded, for training to resume from (``None``:
        there is none yet).

        A damaged checkpoint (a file whose sha256 differs from its index record or manifest, or
        that is missing) is skipped with one warning naming it and the file, and the previous
        one tried; it stays on disk (and in the index) until its step is saved again. If every
        retained checkpoint is damaged, ``CheckpointError`` names them: never a start at step 0.
        """
        skipped: list[str] = []
        while (path := self.latest_path()) is not None:
            try:
                ckpt = load_checkpoint(path)
            except DamagedCheckpointError as e:
                self._damaged[path.name] = str(e)
                skipped.append(path.name)
                continue
            if skipped:
                why = "; ".join(self._damaged[d].split(" is corrupt: ", 1)[-1].split("; refusing")[0] for d in skipped)
                log.warning(
                    "%s damaged (%s): resuming from %s, the newest checkpoint that verifies; %s stays on disk "
                    "until its step is saved again",
                    " and ".join(skipped) + (" is" if len(skipped) == 1 else " are"),
                    why,
                    path,
                    " and ".join(skipped),
                )
            return ckpt
        if skipped:
            raise CheckpointError(
                f"every retained checkpoint in {self.model_dir} is damaged ({', '.join(skipped)}): nothing was "
                f"loaded or changed; `stoker checkpoint verify {self.model_dir}` names each damaged file"
            )
        return None

    def best(self) -> Best | None:
        return self.index().best

    @contextmanager
    def index_lock(self) -> Iterator[None]:
        """Hold ``model_dir``'s index lock: one read-modify-write of the index at a time.

        Two processes write the index (the trainer saving, an evaluator recording results), so
        every update reads, changes and replaces it under this lock; neither can lose the
        other's change (``stoker.checkpoint.commit``: how each storage locks).
        """
        with self.protocol.lock():
            yield

    def update_index(self, change: IndexChange[T]) -> T:
        """Apply ``change`` to the index under the lock, apply retention, write it atomically
        (:meth:`Retention.update <stoker.checkpoint.retention.Retention.update>`).

        ``change`` returns the new index and a result, which this returns. Checkpoints retention
        drops are deleted after the new index no longer names them. On an object store the
        write is conditional on the index being unchanged since it was read; if another writer
        got there first, ``change`` is applied again to the newer index.
        """
        if not self.writer:
            raise CheckpointError("this CheckpointManager was opened read-only (writer=False)")
        self.index()  # checked (and rebuilt if need be) before its first update
        return self.retention.update(change)

    # ---------------------------------------------------------------- finished marker
    def mark_finished(self, step: int) -> None:
        """Record that training reached its last step (``max_steps``): ``finished.json``.

        (A final checkpoint saved with ``save(..., finished=True)`` writes it in its own commit.)
        """
        self.protocol.write_marker(FINISHED_NAME, finished_json(step))

    def clear_finished(self) -> None:
        """Training goes on: remove ``finished.json`` (if any)."""
        self.protocol.remove_marker(FINISHED_NAME)

    def finished_step(self) -> int | None:
        """The step ``finished.json`` names, or ``None`` while training has not finished."""
        path = self.model_dir / FINISHED_NAME
        try:
            return int(json.loads(storage.read_bytes(path, self.retry))["step"])
        except (OSError, StorageError, ValueError, KeyError, TypeError):
            return None

    # ---------------------------------------------------------------- save
    def begin(self, step: int) -> Location:
        """A fresh directory for ``ckpt-<step>`` that other replicas may write into: locally a
        hidden temporary directory (renamed at commit), on an object store its unique prefix."""
        if not self._leftovers_checked:  # before this save's own directory exists
            self._leftovers_checked = True
            self.protocol.remove_leftovers(lambda: {r.directory for r in self.records()})
        return self.protocol.begin(step)

    def save(
        self,
        step: int,
        model_state: Mapping[str, torch.Tensor] | None,
        train_state: Mapping[str, Any],
        input_states: Mapping[int, Any] | None = None,
        tmp_dir: Location | None = None,
        finished: bool = False,
        ema_state: Mapping[str, torch.Tensor] | None = None,
        compiled: CompiledBundle | None = None,
        stop: bool = False,
    ) -> Location:
        """Write ``ckpt-<step>``, commit it in the index, apply retention. Returns its path.

        ``finished``: training ends with this checkpoint (``max_steps``): ``finished.json``
        (:meth:`mark_finished`) is written too, after the index names it; locally in the same
        commit, at the cost of no fsync of its own; on an object store right after the commit.

        ``ema_state``: ``RunConfig.ema``'s average, written as ``ema.safetensors``.

        ``stop``: written because the run was stopped (a signal), off the save schedule: its
        record says so, and retention drops it once a newer checkpoint exists.

        ``compiled``: the compiler's artifacts (``stoker.checkpoint.compiled``): the bundle is
        written under ``compiled/`` unless there already, and the checkpoint references it; a
        bundle that cannot be written is left out with a warning (the checkpoint is still saved).

        ``tmp_dir`` (from :meth:`begin`) may already hold files other replicas wrote (a sharded
        ``dcp/`` directory); they are hashed into the index like the chief's own files. A
        storage fault raises ``StorageError``; nothing of this checkpoint is left behind and
        the previous one stays the latest.
        """
        if not self.writer:
            raise CheckpointError("only the chief process writes checkpoints")
        name = f"ckpt-{step}"
        self.index()  # checked (and rebuilt if need be) before its first commit, or it would orphan the folders
        staging = tmp_dir if tmp_dir is not None else self.begin(step)
        self._damaged.pop(name, None)  # saved again: the new files replace a damaged folder of this name
        try:
            files: dict[str, str] = {}
            sizes: dict[str, int] = {}
            # Files other replicas wrote into the staging directory (a fresh one of our own is empty).
            for fname in storage.files_under(staging) if tmp_dir is not None else ():
                data = storage.read_bytes(staging / fname, self.retry)
                files[fname], sizes[fname] = hashlib.sha256(data).hexdigest(), len(data)
            blobs = checkpoint_blobs(model_state, train_state, input_states, ema_state)
            if compiled is not None:
                blobs += self._compiled_reference(compiled)
            for fname, data in blobs:
                files[fname], sizes[fname] = hashlib.sha256(data).hexdigest(), len(data)
            record = CheckpointRecord(
                name=name,
                step=step,
                time=time.time(),
                bytes=sum(sizes.values()),
                files=files,
                metrics={},
                dir=self.protocol.record_dir(staging),
                stop=stop,
            )
            final, removed = self.protocol.commit(staging, record, blobs, sizes, self.retention.retain, finished)
        except BaseException as e:
            storage.remove_tree(staging)
            if isinstance(e, (OSError, StorageError)):  # a storage fault: say where, why, and what is kept
                cause = str(e) if isinstance(e, StorageError) else storage.explain(e)
                raise StorageError(f"checkpoint {name} was not written: {cause}; {self._kept()}") from e
            raise
        self.retention.remove(removed)
        if removed:
            remove_unreferenced(self.model_dir, self.protocol.read_index())
        if finished and not self.protocol.finished_in_commit:
            # After the commit and outside the clean-up above: the index names this prefix now,
            # so a marker write that fails must raise without taking the checkpoint with it.
            self.mark_finished(step)
        return final

    def _compiled_reference(self, bundle: CompiledBundle) -> list[tuple[str, bytes]]:
        """The reference file to ``bundle`` (written first if need be); none if it cannot be written."""
        try:
            if write_bundle(self.model_dir, bundle, self.retry):
                log.info("compiled artifacts saved: %s (%.1f MB)", bundle.name, len(bundle.data) / 1e6)
        except (OSError, StorageError) as e:
            log.warning("compiled artifacts not saved with the checkpoint (%s): a resume compiles afresh", e)
            return []
        return [bundle.reference()]

    def _kept(self) -> str:
        try:
            latest = self.latest_path()
        except CheckpointError:
            return "the previous checkpoint, if any, stays the latest"
        return f"{str(latest)!r} stays the latest checkpoint" if latest else "no earlier checkpoint exists"

    def record_eval(self, step: int, metrics: Mapping[str, float], *, coverage: bool = False) -> bool:
        """Attach evaluation results to ``ckpt-<step>``; returns whether it became the best.

        Returns False (and records nothing) when the index no longer names the checkpoint,
        e.g. retention removed it before an evaluator got to it. ``coverage`` (a watching
        evaluator): the step is also counted in the index's ``coverage`` as evaluated (or, when
        the checkpoint is gone, as an evaluation computed and discarded), in the same write.
        """
        if not self.writer:
            return False
        kept = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and k != "global_step"}
        return bool(self.update_index(self.retention.evaluation(step, kept, coverage=coverage)))

    def apply_retention(self) -> None:
        """Run a retention pass now (an index update that changes nothing else): an evaluator
        that released its lease deletes what the lease kept, without waiting for the next save."""
        self.update_index(lambda index: (index, None))

    # ---------------------------------------------------------------- load
    def resolve(
        self, checkpoint_path: str | os.PathLike[str] | Location | None, name: str = "checkpoint_path"
    ) -> Location | None:
        """A checkpoint directory from ``None`` (latest here), a model_dir, or a ``ckpt-<step>`` dir;
        an error names the argument ``name`` it came from."""
        if checkpoint_path is None:
            return self.latest_path()
        return _checkpoint_at(storage.location(checkpoint_path), name)

    def load(self, path: Location) -> LoadedCheckpoint:
        """Read and verify a checkpoint directory (``weights_only`` loading only)."""
        return load_checkpoint(path)


def _checkpoint_at(p: Location, name: str) -> Location:
    """The checkpoint directory ``p`` names: the latest of a model_dir, or ``p`` itself; an error
    names the argument ``name`` it came from."""
    if storage.exists(p / INDEX_NAME) or any(CKPT_RE.match(n) for n in storage.listdir(p)):
        latest = CheckpointManager(p, writer=False).latest_path()
        if latest is None:
            raise CheckpointError(f"{name} {str(p)!r} holds no checkpoint yet")
        return latest
    if storage.exists(p / MODEL_FILE) or storage.is_dir(p / "dcp"):
        return p
    if not storage.exists(p):
        raise CheckpointError(f"{name} {str(p)!r} does not exist")
    raise CheckpointError(
        f"{name} {str(p)!r} is neither a model_dir (with {INDEX_NAME}) nor a checkpoint directory (with {MODEL_FILE})"
    )


__all__ = [
    "FINISHED_NAME",
    "INDEX_FORMAT",
    "INDEX_LOCK_NAME",
    "INDEX_NAME",
    "MODEL_FILE",
    "TRAIN_STATE_FILE",
    "CheckpointManager",
    "LoadedCheckpoint",
    "check_state_fits",
    "coverage_line",
    "load_checkpoint",
    "model_state_to_bytes",
    "previous_retained",
    "serialize_input_state",
]
