"""Retention: what every update of ``model_dir``'s index keeps, and the files that follow it.

``CheckpointManager`` makes each index update (a save's commit, an evaluation result, a
retention pass) through its ``Retention``, which owns ``keep_checkpoint_max`` and ``keep_best``:

* :meth:`Retention.retain` drops the records retention no longer keeps, inside the same write
  (the commit protocol applies it, ``stoker.checkpoint.commit``);
* :meth:`Retention.evaluation` is the change an evaluation result makes: its record's results,
  the best by ``keep_best``, an evaluator's ``coverage``;
* :meth:`Retention.update` writes each changed checkpoint's ``evaluation.json`` before the index
  that changes it (a checkpoint's own files always hold at least what the index does: recovery
  rebuilds from them), and deletes the dropped folders only after the new index no longer
  names them (a crash between the two leaves a harmless orphan).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TypeVar

from .. import storage
from ..errors import StorageError
from .commit import CommitProtocol
from .index import CheckpointIndex, IndexChange, KeepBest
from .io_config import keep_best_rule
from .lease import live_leases
from .manifest import EVALUATION_NAME, Evaluation

log = logging.getLogger("stoker")

T = TypeVar("T")


class Retention:
    """Which checkpoints ``protocol``'s model_dir keeps.

    Args:
        protocol: the model_dir's commit protocol (its index, files and retries).
        keep_checkpoint_max: how many of the newest checkpoints to keep (0 keeps all).
        keep_best: ``(metric, "min" | "max")``: the best checkpoint by it is kept too;
            ``(metric, "min" | "max", k)``: the ``k`` best (Lightning's ``save_top_k``).
    """

    def __init__(
        self,
        protocol: CommitProtocol,
        *,
        keep_checkpoint_max: int = 5,
        keep_best: KeepBest | None = None,
    ) -> None:
        self.protocol = protocol
        self.keep_checkpoint_max = keep_checkpoint_max
        self.keep_best = None if keep_best is None else keep_best_rule(keep_best)

    def update(self, change: IndexChange[T]) -> T:
        """Apply ``change`` then :meth:`retain` to the index, write it, delete what retention dropped."""

        def mirrored(index: CheckpointIndex) -> tuple[CheckpointIndex, T]:
            new, result = change(index)
            self.mirror(index, new)
            return new, result

        result, removed = self.protocol.update(mirrored, self.retain)
        self.remove(removed)
        return result

    def retain(self, index: CheckpointIndex) -> tuple[CheckpointIndex, list[str]]:
        """``index`` without the records retention no longer keeps; and their directories.

        Kept: the newest ``keep_checkpoint_max``, the best, the ``k`` best by ``keep_best``'s
        metric (:meth:`CheckpointIndex.top`, read from the records' own results, so an index
        rebuilt from ``evaluation.json`` files keeps the same ones), the latest, and any
        checkpoint a live evaluation lease names (``stoker.checkpoint.lease``; listed only when
        there is something to drop). With an evaluator's ``coverage`` in the index, a dropped
        checkpoint that was neither evaluated nor superseded is counted as removed before
        reading.

        A stop checkpoint (``CheckpointRecord.stop``: written off the save schedule because the
        run was stopped) serves only the resume: once a newer checkpoint exists it is not among
        the newest and is dropped, unless it is the best, top-k or leased; so a run stopped and
        rerun keeps the checkpoints the uninterrupted run keeps.
        """
        records = index.checkpoints
        newest = max((r.step for r in records), default=0)
        counted = [r for r in records if not (r.stop and r.step < newest)]
        keep = {r.name for r in counted}
        if self.keep_checkpoint_max > 0:
            keep = {r.name for r in counted[-self.keep_checkpoint_max :]}
        if index.best is not None:
            keep.add(index.best.name)
        if self.keep_best is not None and len(self.keep_best) == 3:
            metric, mode, k = self.keep_best
            keep |= {r.name for r in index.top(metric, mode, k)}
        if index.latest is not None:
            keep.add(index.latest)
        if any(r.name not in keep for r in records):
            leased = {lease.dir for lease in live_leases(self.protocol.model_dir, self.protocol.retry)}
            keep |= {r.name for r in records if r.directory in leased}
        index, dropped = index.keeping(keep)
        return index, [r.directory for r in dropped]

    def remove(self, dirs: list[str]) -> None:
        """Delete the checkpoint directories ``dirs`` (once the index no longer names them)."""
        for d in dirs:
            storage.remove_tree(self.protocol.model_dir / d)

    def evaluation(self, step: int, metrics: Mapping[str, float], *, coverage: bool = False) -> IndexChange[bool]:
        """The change that puts ``metrics`` on ``ckpt-<step>``'s record (if the index still names
        it) and returns whether it became the best; ``coverage``: the step is also counted in the
        index's ``coverage`` as evaluated (or, the checkpoint gone, as discarded)."""

        def change(index: CheckpointIndex) -> tuple[CheckpointIndex, bool]:
            named = index.record(f"ckpt-{step}") is not None
            index, became_best = index.with_evaluation(step, metrics, self.keep_best)
            if coverage:
                index = index.counting_coverage().counting("evaluated" if named else "discarded", step)
            return index, became_best

        return change

    def mirror(self, old: CheckpointIndex, new: CheckpointIndex) -> None:
        """Write ``evaluation.json`` of every checkpoint whose results, ``superseded`` mark or
        claim to be the best ``new`` changes: before the index itself, so a checkpoint's own
        files always hold at least what the index does (recovery rebuilds from them)."""
        now = time.time()
        for rec in new.checkpoints:
            mine = Evaluation.of(rec, new, now)
            before = old.record_in(rec.directory)
            if mine is None or mine.same_content(None if before is None else Evaluation.of(before, old, now)):
                continue
            try:
                self.protocol.write_own_file(rec.directory, EVALUATION_NAME, mine.encode())
            except (OSError, StorageError) as e:  # the index still holds it; only its copy is missing
                log.warning("could not write %s (%s)", self.protocol.model_dir / rec.directory / EVALUATION_NAME, e)


__all__ = ["Retention"]
