"""Checkpoints: the commit protocol, the index, retention, best-by-metric, warm start.

Layout (a user-facing format, documented in docs/checkpoints.md)::

    model_dir/
      checkpoint.json              index: latest, retained checkpoints, best, sha256 of each file
      checkpoint.lock              local model_dir: taken (flock) by every writer of the index
                                   (trainer, watching evaluator)
      finished.json                written when training reaches max_steps: {"step": N}; a watching
                                   evaluator stops once it has evaluated everything up to it
      ckpt-<step>/model.safetensors   weights, readable without stoker
      ckpt-<step>/train_state.pt      optimizer, schedule, scaler, RNGs, step, cache, hook state
      ckpt-<step>/input-<rank>.json   input pipeline position of each replica (.pt if not JSON)
      ckpt-<step>/dcp/                sharded runs: model and optimizer slices of every replica
                                      (torch.distributed.checkpoint) instead of model.safetensors

Two commit protocols, one guarantee: a checkpoint exists once the index names it, and the
index only ever names complete checkpoints.

* **Local directory** (rename): the files go into a hidden temporary directory, every file
  fsynced, then it is renamed into place; only after that is the index replaced (temp +
  rename) under the index lock. The fsyncs that do not depend on each other (every file and
  the new index's temporary file) run concurrently, so the filesystem commits them together.
* **Object store** (no rename): the files go under a fresh prefix ``ckpt-<step>.<random>/``,
  are verified (listed back, sizes compared), and then the index is written, as the commit
  point, with a conditional write (S3 ``If-Match``/``If-None-Match``, GCS
  ``ifGenerationMatch``; on stores without them, under a lock object ``checkpoint.json.lock``,
  ``stoker.storage.lock``). A prefix no index names is an orphan of a crashed write and is
  removed by the next run's first save.

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
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # POSIX; elsewhere the index has one writer at a time by convention
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # no fcntl module here: checked for None where used

import torch
from torch import nn

from .. import storage
from ..errors import CheckpointError, StorageError
from ..storage import lock as store_lock
from ..storage.stores import DEFAULT_RETRY, Location, RetryPolicy, UrlPath
from . import safe_load
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
    record_dir,
    serialize_input_state,
    step_of,
)
from .lease import live_leases

log = logging.getLogger("stoker")

FINISHED_NAME = "finished.json"


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def _finished_json(step: int) -> bytes:
    return json.dumps({"step": int(step), "time": time.time()}).encode()


def _encode(index: Mapping[str, Any]) -> bytes:
    return json.dumps(index, indent=1, sort_keys=True).encode()


def _parse_index(data: bytes | None, where: Location) -> dict[str, Any]:
    if data is None:
        return {"format": INDEX_FORMAT, "latest": None, "best": None, "checkpoints": []}
    try:
        index = json.loads(data)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{where} is unreadable ({e}); restore it or remove model_dir") from e
    if index.get("format") != INDEX_FORMAT:
        raise CheckpointError(f"{where} has format {index.get('format')!r}; this stoker reads {INDEX_FORMAT!r}")
    return index


def _adding(record: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]]:
    """The index change that commits ``record``; it returns the directories it replaced."""

    def mutate(index: dict[str, Any]) -> list[str]:
        name = record["name"]
        replaced = [record_dir(r) for r in index["checkpoints"] if r["name"] == name]
        index["checkpoints"] = sorted(
            [r for r in index["checkpoints"] if r["name"] != name] + [record], key=lambda r: r["step"]
        )
        index["latest"] = name
        if index["best"] is not None and index["best"]["name"] == name:
            index["best"] = None  # the weights under this name changed; its old metric no longer applies
        return [d for d in replaced if d != record_dir(record)]

    return mutate


def _attach_eval(index: dict[str, Any], step: int, kept: dict[str, float], keep_best: tuple[str, str] | None) -> bool:
    """Put evaluation results on ``ckpt-<step>``'s record; whether it became the best."""
    name = f"ckpt-{step}"
    rec = next((r for r in index["checkpoints"] if r["name"] == name), None)
    if rec is None:
        return False
    rec["metrics"] = kept
    if keep_best is None:
        return False
    metric, mode = keep_best
    if metric not in kept:
        raise CheckpointError(
            f"RunConfig.keep_best names metric {metric!r}, but evaluation returned only {sorted(kept)}"
        )
    value = kept[metric]
    best = index["best"]
    if value != value:  # NaN never becomes the best
        return False
    if best is None or (value < best["value"] if mode == "min" else value > best["value"]):
        index["best"] = {"name": name, "step": step, "metric": metric, "mode": mode, "value": value}
        return True
    return False


COVERAGE_KINDS = ("evaluated", "superseded", "removed", "discarded")


def note_coverage(index: dict[str, Any], kind: str, step: int) -> None:
    """Count ``step`` under ``kind`` in the index's ``coverage`` (only once a watching evaluator
    has started one: ``{"evaluated", "superseded", "removed", "discarded"}``, lists of steps)."""
    cov = index.get("coverage")
    if cov is None:
        return
    steps = cov.setdefault(kind, [])
    if step not in steps:
        steps.append(step)


def start_coverage(index: dict[str, Any]) -> None:
    """Make the index count what a watching evaluator does with each checkpoint from now on."""
    cov = index.setdefault("coverage", {})
    for kind in COVERAGE_KINDS:
        cov.setdefault(kind, [])


def coverage_line(coverage: Mapping[str, list[int]] | None) -> str:
    """``N evaluated, N superseded, N removed before reading, N discarded``: an index's ``coverage``."""
    cov = coverage or {}
    return (
        f"{len(cov.get('evaluated', []))} evaluated, {len(cov.get('superseded', []))} superseded, "
        f"{len(cov.get('removed', []))} removed before reading, {len(cov.get('discarded', []))} discarded"
    )


def _remove_leftovers(model_dir: Path) -> None:
    """Remove temporary directories, index and ``finished.json`` files a crashed local save left
    behind (a final checkpoint writes the marker's temporary file with its own files)."""
    for p in model_dir.iterdir():
        if p.name.startswith((".tmp-ckpt-", ".trash-ckpt-")) and p.is_dir():
            storage.remove_tree(p)
        elif p.name.startswith((f".{INDEX_NAME}.", f".{FINISHED_NAME}.")) and p.name.endswith(".tmp"):
            p.unlink(missing_ok=True)


class CheckpointManager:
    """Owns ``model_dir``'s checkpoints and their index. Only the chief process writes.

    ``model_dir`` is a local path or an fsspec URL; ``retry`` says how storage faults are
    retried and how long one storage operation may take.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | Location,
        *,
        keep_checkpoint_max: int = 5,
        keep_best: tuple[str, str] | None = None,
        writer: bool = True,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.model_dir: Location = storage.location(model_dir)
        self.remote = isinstance(self.model_dir, UrlPath)
        self.keep_checkpoint_max = keep_checkpoint_max
        self.keep_best = keep_best
        self.writer = writer
        self.retry = retry
        self._leftovers_checked = False  # see the module docstring: at the first save, not here
        if isinstance(self.model_dir, UrlPath):  # self.remote, spelled out so the type narrows
            storage.filesystem(self.model_dir)  # a missing extra (s3fs, gcsfs) is named now
        if writer:
            storage.makedirs(self.model_dir, retry)

    # ---------------------------------------------------------------- index
    def index(self) -> dict[str, Any]:
        path = self.model_dir / INDEX_NAME
        if isinstance(path, UrlPath):
            return _parse_index(storage.read_versioned(path, self.retry)[0], path)
        if not path.exists():
            return _parse_index(None, path)
        try:
            return _parse_index(path.read_bytes(), path)
        except OSError as e:
            raise CheckpointError(f"{path} is unreadable ({e}); restore it or remove model_dir") from e

    def records(self) -> list[dict[str, Any]]:
        return list(self.index()["checkpoints"])

    def latest_path(self) -> Location | None:
        """The newest indexed checkpoint whose directory exists.

        Deleting a checkpoint's directory by hand (e.g. one refused as corrupt) makes the
        previous retained one the latest.
        """
        index = self.index()
        for rec in reversed(index["checkpoints"]):
            path = self.model_dir / record_dir(rec)
            if storage.is_dir(path):
                if rec["name"] != index["latest"]:
                    log.warning(
                        "%s is missing: resuming from the previous retained checkpoint %s", index["latest"], path
                    )
                return path
        return None

    def latest_step(self) -> int | None:
        latest = self.latest_path()
        return None if latest is None else step_of(latest)

    def best(self) -> dict[str, Any] | None:
        return self.index()["best"]

    @contextmanager
    def index_lock(self) -> Iterator[None]:
        """Hold ``model_dir``'s index lock: one read-modify-write of the index at a time.

        Two processes write the index (the trainer saving, an evaluator recording results), so
        every update reads, changes and replaces it under this lock; neither can lose the
        other's change. Locally an advisory ``flock`` on a lock file beside the index (released
        by the kernel when the holder dies, so a kill -9 never leaves it stuck); on a store
        ``stoker.storage.lock.index_lock``: a process-wide lock, as conditional writes (S3, GCS)
        guard against other processes, plus a lock object on stores without them.
        """
        if isinstance(self.model_dir, UrlPath):
            with store_lock.index_lock(self.model_dir / INDEX_NAME, self.retry):
                yield
            return
        self.model_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.model_dir / INDEX_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def update_index(self, mutate: Callable[[dict[str, Any]], Any]) -> Any:
        """Apply ``mutate`` to the index under the lock, apply retention, write it atomically.

        Returns what ``mutate`` returned. Checkpoints retention drops are deleted after the new
        index no longer names them. On an object store the write is conditional on the index
        being unchanged since it was read; if another writer got there first, ``mutate`` is
        applied again to the newer index.
        """
        if not self.writer:
            raise CheckpointError("this CheckpointManager was opened read-only (writer=False)")
        path = self.model_dir / INDEX_NAME
        if isinstance(path, UrlPath):
            with self.index_lock():
                for _ in range(50):
                    data, version = storage.read_versioned(path, self.retry)
                    index = _parse_index(data, path)
                    result = mutate(index)
                    removed = self._retain(index)
                    if storage.put_if(path, _encode(index), version, self.retry):
                        break
                    time.sleep(0.05)  # another writer's update landed first: redo on top of it
                else:
                    raise StorageError(f"cannot write {path}: it kept changing under 50 conditional writes")
        else:
            with self.index_lock():
                index = self.index()
                result = mutate(index)
                removed = self._retain(index)
                tmp = _temp_name(path)
                storage.write_all([(tmp, _encode(index))], self.retry)
                os.replace(tmp, path)
                storage.fsync_dir(path.parent)
        self._remove(removed)
        return result

    # ---------------------------------------------------------------- finished marker
    def mark_finished(self, step: int) -> None:
        """Record that training reached its last step (``max_steps``): ``finished.json``.

        (A final checkpoint saved with ``save(..., finished=True)`` writes it in its own commit.)
        """
        data = _finished_json(step)
        path = self.model_dir / FINISHED_NAME
        if isinstance(path, Path):  # temp + rename: a reader never sees half a file
            tmp = _temp_name(path)
            storage.write_all([(tmp, data)], self.retry)
            os.replace(tmp, path)
        else:  # an object store's put is atomic
            storage.write_all([(path, data)], self.retry)

    def clear_finished(self) -> None:
        """Training goes on: remove ``finished.json`` (if any)."""
        path = self.model_dir / FINISHED_NAME
        if isinstance(path, Path):
            path.unlink(missing_ok=True)
        elif storage.exists(path):
            storage.remove_tree(path)

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
            if isinstance(self.model_dir, Path):
                _remove_leftovers(self.model_dir)
            else:
                self._remove_orphans()
        if isinstance(self.model_dir, UrlPath):
            return self.model_dir / f"ckpt-{step}.{uuid.uuid4().hex[:8]}"
        tmp = self.model_dir / f".tmp-ckpt-{step}-{uuid.uuid4().hex[:8]}"
        self.retry.call("create the directory", tmp, tmp.mkdir)
        return tmp

    def save(
        self,
        step: int,
        model_state: Mapping[str, torch.Tensor] | None,
        train_state: Mapping[str, Any],
        input_states: Mapping[int, Any] | None = None,
        tmp_dir: Location | None = None,
        finished: bool = False,
    ) -> Location:
        """Write ``ckpt-<step>``, commit it in the index, apply retention. Returns its path.

        ``finished``: training ends with this checkpoint (``max_steps``): ``finished.json``
        (:meth:`mark_finished`) is written too, after the index names it; locally in the same
        commit, at the cost of no fsync of its own; on an object store right after the commit.

        ``tmp_dir`` (from :meth:`begin`) may already hold files other replicas wrote (a sharded
        ``dcp/`` directory); they are hashed into the index like the chief's own files. A
        storage fault raises ``StorageError``; nothing of this checkpoint is left behind and
        the previous one stays the latest.
        """
        if not self.writer:
            raise CheckpointError("only the chief process writes checkpoints")
        name = f"ckpt-{step}"
        staging = tmp_dir if tmp_dir is not None else self.begin(step)
        try:
            files: dict[str, str] = {}
            sizes: dict[str, int] = {}
            # Files other replicas wrote into the staging directory (a fresh one of our own is empty).
            for fname in storage.files_under(staging) if tmp_dir is not None else ():
                data = storage.read_bytes(staging / fname, self.retry)
                files[fname], sizes[fname] = hashlib.sha256(data).hexdigest(), len(data)
            blobs = checkpoint_blobs(model_state, train_state, input_states)
            for fname, data in blobs:
                files[fname], sizes[fname] = hashlib.sha256(data).hexdigest(), len(data)
            record = {
                "name": name,
                "step": step,
                "time": time.time(),
                "bytes": sum(sizes.values()),
                "files": files,
                "metrics": {},
            }
            if isinstance(staging, UrlPath):
                record["dir"] = staging.name
                final, removed = self._commit_remote(staging, record, blobs, sizes)
            else:
                final, removed = _commit_local(self, staging, record, blobs, finished)
        except BaseException as e:
            storage.remove_tree(staging)
            if isinstance(e, (OSError, StorageError)):  # a storage fault: say where, why, and what is kept
                cause = str(e) if isinstance(e, StorageError) else storage.explain(e)
                raise StorageError(f"checkpoint {name} was not written: {cause}; {self._kept()}") from e
            raise
        self._remove(removed)
        if finished and isinstance(staging, UrlPath):
            # After the commit and outside the clean-up above: the index names this prefix now,
            # so a marker write that fails must raise without taking the checkpoint with it.
            self.mark_finished(step)
        return final

    def _kept(self) -> str:
        try:
            latest = self.latest_path()
        except CheckpointError:
            return "the previous checkpoint, if any, stays the latest"
        return f"{str(latest)!r} stays the latest checkpoint" if latest else "no earlier checkpoint exists"

    def _commit_remote(
        self, prefix: UrlPath, record: dict[str, Any], blobs: list[tuple[str, bytes]], sizes: Mapping[str, int]
    ) -> tuple[UrlPath, list[str]]:
        storage.write_all([(prefix / f, d) for f, d in blobs], self.retry)
        listed = storage.file_sizes(prefix, self.retry)
        wrong = sorted(f for f, n in sizes.items() if listed.get(f) != n)
        if wrong:
            raise StorageError(f"{prefix}: {', '.join(wrong)} did not arrive complete (sizes listed back differ)")
        replaced = self.update_index(_adding(record))  # the commit point
        return prefix, replaced

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

        def mutate(index: dict[str, Any]) -> bool:
            named = any(r["name"] == f"ckpt-{step}" for r in index["checkpoints"])
            became_best = _attach_eval(index, step, kept, self.keep_best)
            if coverage:
                start_coverage(index)
                note_coverage(index, "evaluated" if named else "discarded", step)
            return became_best

        return bool(self.update_index(mutate))

    def _retain(self, index: dict[str, Any]) -> list[str]:
        """Drop from ``index`` the records retention no longer keeps; return their directories.

        Kept: the newest ``keep_checkpoint_max``, the best, the latest, and any checkpoint a
        live evaluation lease names (``stoker.checkpoint.lease``; listed only when there is
        something to drop). With an evaluator's ``coverage`` in the index, a dropped
        checkpoint that was neither evaluated nor superseded is counted as removed before
        reading.
        """
        records = index["checkpoints"]
        keep = {r["name"] for r in records}
        if self.keep_checkpoint_max > 0:
            keep = {r["name"] for r in records[-self.keep_checkpoint_max :]}
        if index["best"] is not None:
            keep.add(index["best"]["name"])
        keep.add(index["latest"])
        if any(r["name"] not in keep for r in records):
            leased = {lease.dir for lease in live_leases(self.model_dir, self.retry)}
            keep |= {r["name"] for r in records if record_dir(r) in leased}
        dropped = [r for r in records if r["name"] not in keep]
        for r in dropped:
            if not r.get("metrics") and not r.get("superseded"):
                note_coverage(index, "removed", int(r["step"]))
        index["checkpoints"] = [r for r in records if r["name"] in keep]
        return [record_dir(r) for r in dropped]

    def apply_retention(self) -> None:
        """Run a retention pass now (an index update that changes nothing else): an evaluator
        that released its lease deletes what the lease kept, without waiting for the next save."""
        self.update_index(lambda index: None)

    def _remove(self, dirs: list[str]) -> None:
        # Delete only after the index no longer names them: a crash here leaves a harmless orphan.
        for d in dirs:
            storage.remove_tree(self.model_dir / d)

    def _remove_orphans(self) -> None:
        """Remove the ``ckpt-<step>.<random>`` prefixes of crashed writes no index names."""
        named = {record_dir(r) for r in self.records()}
        for entry in storage.listdir(self.model_dir):
            m = CKPT_RE.match(entry)
            if m and m.group(2) and entry not in named:
                log.info("removing %s: an unfinished checkpoint write no index names", self.model_dir / entry)
                storage.remove_tree(self.model_dir / entry)

    # ---------------------------------------------------------------- load
    def resolve(self, checkpoint_path: str | os.PathLike[str] | Location | None) -> Location | None:
        """A checkpoint directory from ``None`` (latest here), a model_dir, or a ``ckpt-<step>`` dir."""
        if checkpoint_path is None:
            return self.latest_path()
        p = storage.location(checkpoint_path)
        if storage.exists(p / INDEX_NAME):
            latest = CheckpointManager(p, writer=False).latest_path()
            if latest is None:
                raise CheckpointError(f"{p} holds no checkpoint yet")
            return latest
        if storage.exists(p / MODEL_FILE) or storage.is_dir(p / "dcp"):
            return p
        raise CheckpointError(
            f"checkpoint_path {str(p)!r} is neither a model_dir (with {INDEX_NAME}) nor a "
            f"checkpoint directory (with {MODEL_FILE})"
        )

    def load(self, path: Location) -> LoadedCheckpoint:
        """Read and verify a checkpoint directory (``weights_only`` loading only)."""
        return load_checkpoint(path)


def _commit_local(
    manager: CheckpointManager,
    tmp: Path,
    record: dict[str, Any],
    blobs: list[tuple[str, bytes]],
    finished: bool = False,
) -> tuple[Path, list[str]]:
    """The rename protocol (module docstring): ``CheckpointManager.save`` on a local model_dir.

    With ``finished``, ``finished.json`` is written and fsynced with the files and renamed into
    place after the index, so the last directory fsync makes both durable.
    """
    assert isinstance(manager.model_dir, Path)
    name, files = record["name"], record["files"]
    # The index that will name this checkpoint is known now: its temporary file is written
    # and fsynced together with the checkpoint's files, and renamed into place only once
    # the checkpoint directory is. The index lock is held from this read to that rename,
    # so another writer's update (an evaluator's result) is neither lost nor overwritten.
    with manager.index_lock():
        index = manager.index()
        _adding(record)(index)
        removed = manager._retain(index)
        index_path = manager.model_dir / INDEX_NAME
        index_tmp = _temp_name(index_path)
        finished_path = manager.model_dir / FINISHED_NAME
        finished_tmp = _temp_name(finished_path)
        extra = [(finished_tmp, _finished_json(record["step"]))] if finished else []
        try:
            written = storage.write_all(
                [(tmp / f, d) for f, d in blobs] + [(index_tmp, _encode(index))] + extra, manager.retry
            )
            if written[: len(blobs)] != [files[f] for f, _ in blobs]:
                raise CheckpointError(f"{name}: a file's sha256 changed while it was written")
            storage.fsync_dir(tmp)
            final = manager.model_dir / name
            if final.exists():  # re-saving a step (e.g. after a resume): swap the old one out
                trash = manager.model_dir / f".trash-{name}-{uuid.uuid4().hex[:8]}"
                os.replace(final, trash)
                os.replace(tmp, final)
                storage.remove_tree(trash)
            else:
                os.replace(tmp, final)
            storage.fsync_dir(manager.model_dir)  # the checkpoint is in place before the index names it
            os.replace(index_tmp, index_path)
            if finished:
                os.replace(finished_tmp, finished_path)
            storage.fsync_dir(manager.model_dir)
        except BaseException:
            index_tmp.unlink(missing_ok=True)
            finished_tmp.unlink(missing_ok=True)
            raise
    return final, removed


# ---------------------------------------------------------------------------- warm start
@dataclass(kw_only=True)
class WarmStartSettings:
    """Initialise some weights from another run before training starts (TF's ``WarmStartSettings``).

    Attributes:
        ckpt_to_initialize_from: a model_dir, a ``ckpt-<step>`` directory or a ``.safetensors`` file.
        vars_to_warm_start: a regular expression (or list of them) selecting the model's
            parameter names to take; default all.
        var_name_to_prev_var_name: the name in the source for a model name, where they differ.
    """

    ckpt_to_initialize_from: str | os.PathLike[str]
    vars_to_warm_start: str | list[str] = ".*"
    var_name_to_prev_var_name: Mapping[str, str] = field(default_factory=dict)


@dataclass
class WarmStartReport:
    """Which weights a warm start took, and which it could not find or fit."""

    loaded: list[str]
    not_found: list[str]
    shape_mismatch: list[str]


def warm_start(model: nn.Module, settings: WarmStartSettings | str | os.PathLike[str]) -> WarmStartReport:
    """Copy matching weights from a checkpoint or safetensors file into ``model``."""
    if not isinstance(settings, WarmStartSettings):
        settings = WarmStartSettings(ckpt_to_initialize_from=settings)
    src = storage.location(settings.ckpt_to_initialize_from)
    if src.suffix == ".safetensors" and storage.is_file(src):
        source = safe_load.decode(storage.read_bytes(src), src.name, str(src), None)
    else:
        resolved = CheckpointManager(src, writer=False).resolve(src) if storage.exists(src) else None
        if resolved is None:
            raise CheckpointError(f"warm_start_from: {str(src)!r} does not exist")
        loaded = load_checkpoint(resolved)
        if loaded.model_state is not None:
            source = loaded.model_state
        else:
            from ..distributed.sharded import consolidate

            assert loaded.dcp_dir is not None  # no model_state: a sharded checkpoint, in dcp_dir
            source = consolidate(loaded.dcp_dir)
    patterns = settings.vars_to_warm_start
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    selected = [re.compile(p) for p in patterns]
    own = model.state_dict()
    report = WarmStartReport([], [], [])
    updates: dict[str, torch.Tensor] = {}
    for name, tensor in own.items():
        if not any(p.fullmatch(name) for p in selected):
            continue
        prev = settings.var_name_to_prev_var_name.get(name, name)
        if prev not in source:
            report.not_found.append(name)
        elif source[prev].shape != tensor.shape:
            report.shape_mismatch.append(f"{name}: {list(source[prev].shape)} vs {list(tensor.shape)}")
        else:
            updates[name] = source[prev]
            report.loaded.append(name)
    model.load_state_dict(updates, strict=False)
    if report.not_found or report.shape_mismatch:
        log.warning(
            "warm start from %s: %d weights loaded, not found: %s, shape mismatch: %s",
            src,
            len(report.loaded),
            report.not_found or "none",
            report.shape_mismatch or "none",
        )
    else:
        log.info("warm start from %s: %d weights loaded", src, len(report.loaded))
    return report


__all__ = [
    "INDEX_FORMAT",
    "INDEX_LOCK_NAME",
    "INDEX_NAME",
    "MODEL_FILE",
    "TRAIN_STATE_FILE",
    "CheckpointManager",
    "LoadedCheckpoint",
    "WarmStartReport",
    "WarmStartSettings",
    "check_state_fits",
    "load_checkpoint",
    "model_state_to_bytes",
    "previous_retained",
    "serialize_input_state",
    "warm_start",
]
