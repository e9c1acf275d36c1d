"""The commit protocols: how a checkpoint and the index that names it reach a model_dir.

One guarantee, two protocols: a checkpoint exists once the index names it, and the index only
ever names complete checkpoints. :class:`CommitProtocol` is the interface the manager uses;
:func:`commit_protocol` picks the implementation once, from what the model_dir's storage can
do (:data:`PROTOCOLS`, the first whose ``supports`` holds):

Either way a checkpoint's ``manifest.json`` (``stoker.checkpoint.manifest``) is part of its
commit: it exists once every file is complete, and before the index names the checkpoint.

* :class:`LocalDirectory` (a filesystem: atomic rename, ``fsync``, ``flock``): the files and
  the manifest go into a hidden temporary directory, every file fsynced, then it is renamed into place; only
  after that is the index replaced (temp + rename) under the index lock. The fsyncs that do
  not depend on each other (every file and the new index's temporary file) run concurrently,
  so the filesystem commits them together.
* :class:`ObjectStore` (no rename): the files go under a fresh prefix ``ckpt-<step>.<random>/``,
  are verified (listed back, sizes compared), the manifest written, and then the index, as the commit
  point, with a conditional write (S3 ``If-Match``/``If-None-Match``, GCS
  ``ifGenerationMatch``; on stores without them, under a lock object ``checkpoint.json.lock``,
  ``stoker.storage.lock``). A prefix no index names is an orphan of a crashed write and is
  removed by the next run's first save.

Retention is the manager's (``stoker.checkpoint.retention``: it knows ``keep_checkpoint_max``,
``keep_best`` and the leases): every index update applies the ``retain`` function it is handed,
inside the same write.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import ClassVar, TypeVar

try:  # POSIX; elsewhere the index has one writer at a time by convention
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # no fcntl module here: checked for None where used

from .. import storage
from ..errors import CheckpointError, StorageError
from ..storage import lock as store_lock
from ..storage.stores import Location, RetryPolicy, UrlPath
from .files import CKPT_RE, INDEX_LOCK_NAME
from .index import INDEX_NAME, CheckpointIndex, CheckpointRecord, IndexChange, repair_hint
from .manifest import MANIFEST_NAME, Manifest

log = logging.getLogger("stoker")

T = TypeVar("T")
FINISHED_NAME = "finished.json"
Retain = Callable[[CheckpointIndex], tuple[CheckpointIndex, list[str]]]
"""Retention: the index without what it no longer keeps, and the directories it dropped."""
Blobs = Sequence[tuple[str, bytes]]
Rebuild = Callable[[bytes | None], tuple[CheckpointIndex, str | None] | None]
"""Recovery's rewrite of an index: given the stored index's bytes (``None``: there is none), the
index to write instead and the name to keep the old bytes under (``None``: not kept), or
``None`` to leave the index as it is."""


def temp_name(path: Path) -> Path:
    """A hidden temporary sibling of ``path``, for temp + rename."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


class CommitProtocol(ABC):
    """How one kind of storage reads and replaces a model_dir's index and commits checkpoints.

    ``finished_in_commit``: whether :meth:`commit` writes ``finished.json`` itself (else the
    manager writes it right after the commit).
    """

    finished_in_commit: ClassVar[bool]

    def __init__(self, model_dir: Location, retry: RetryPolicy) -> None:
        self.model_dir = model_dir
        self.retry = retry
        self.index_path = model_dir / INDEX_NAME

    @staticmethod
    @abstractmethod
    def supports(model_dir: Location) -> bool:
        """Whether this protocol can commit in ``model_dir``'s storage."""

    @abstractmethod
    def read_index(self) -> CheckpointIndex:
        """The index as stored now (empty when there is none yet)."""

    @abstractmethod
    def lock(self) -> AbstractContextManager[None]:
        """Hold the index lock: one read-modify-write of the index at a time."""

    @abstractmethod
    def update(self, change: IndexChange[T], retain: Retain) -> tuple[T, list[str]]:
        """Apply ``change`` then ``retain`` to the index and replace it atomically; return what
        ``change`` returned and the directories retention dropped (to delete after)."""

    @abstractmethod
    def begin(self, step: int) -> Location:
        """A fresh staging directory for ``ckpt-<step>`` that other replicas may write into."""

    @abstractmethod
    def commit(
        self,
        staging: Location,
        record: CheckpointRecord,
        blobs: Blobs,
        sizes: Mapping[str, int],
        retain: Retain,
        finished: bool,
    ) -> tuple[Location, list[str]]:
        """Write ``blobs`` into ``staging`` and commit ``record`` in the index; return the
        checkpoint's final location and the directories to delete after. ``sizes``: the size of
        every file of the checkpoint (the chief's blobs and what other replicas wrote)."""

    @abstractmethod
    def remove_leftovers(self, named: Callable[[], set[str]]) -> None:
        """Remove what a crashed write left behind (``named``: the directories the index names)."""

    @abstractmethod
    def rewrite(self, rebuild: Rebuild) -> CheckpointIndex | None:
        """Under the index lock: replace the index with what ``rebuild`` makes of the stored one,
        keeping the old bytes first where it says so; the index written, or ``None`` if left."""

    @abstractmethod
    def write_own_file(self, directory: str, name: str, data: bytes) -> bool:
        """Write a checkpoint's file about itself (``evaluation.json``, a repaired manifest) into
        its folder ``directory`` so that a reader never sees half of it; False if the folder is gone."""

    @abstractmethod
    def write_marker(self, name: str, data: bytes) -> None:
        """Write a small file (``finished.json``) so that a reader never sees half of it."""

    @abstractmethod
    def remove_marker(self, name: str) -> None:
        """Remove a small file written by :meth:`write_marker`, if present."""

    def record_dir(self, staging: Location) -> str | None:
        """The ``dir`` a record of ``staging`` carries (``None``: its name is its directory)."""
        return None


class LocalDirectory(CommitProtocol):
    """The rename protocol on a local filesystem (module docstring)."""

    finished_in_commit = True

    @staticmethod
    def supports(model_dir: Location) -> bool:
        return isinstance(model_dir, Path)

    def _dir(self) -> Path:
        assert isinstance(self.model_dir, Path)
        return self.model_dir

    def read_index(self) -> CheckpointIndex:
        path = self._dir() / INDEX_NAME
        if not path.exists():
            return CheckpointIndex()
        try:
            data = path.read_bytes()
        except OSError as e:
            raise CheckpointError(f"{path} is unreadable ({e}); {repair_hint(str(path))}") from e
        return CheckpointIndex.parse(data, str(path))

    @contextmanager
    def lock(self) -> Iterator[None]:
        """An advisory ``flock`` on a lock file beside the index: released by the kernel when
        the holder dies, so a kill -9 never leaves it stuck."""
        self._dir().mkdir(parents=True, exist_ok=True)
        fd = os.open(self._dir() / INDEX_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def update(self, change: IndexChange[T], retain: Retain) -> tuple[T, list[str]]:
        path = self._dir() / INDEX_NAME
        with self.lock():
            index, result = change(self.read_index())
            index, removed = retain(index)
            tmp = temp_name(path)
            storage.write_all([(tmp, index.encode())], self.retry)
            os.replace(tmp, path)
            storage.fsync_dir(path.parent)
        return result, removed

    def begin(self, step: int) -> Location:
        tmp = self._dir() / f".tmp-ckpt-{step}-{uuid.uuid4().hex[:8]}"
        self.retry.call("create the directory", tmp, tmp.mkdir)
        return tmp

    def commit(
        self,
        staging: Location,
        record: CheckpointRecord,
        blobs: Blobs,
        sizes: Mapping[str, int],
        retain: Retain,
        finished: bool,
    ) -> tuple[Location, list[str]]:
        """With ``finished``, ``finished.json`` is written and fsynced with the files and renamed
        into place after the index, so the last directory fsync makes both durable."""
        assert isinstance(staging, Path)
        model_dir = self._dir()
        # The index that will name this checkpoint is known now: its temporary file is written
        # and fsynced together with the checkpoint's files, and renamed into place only once
        # the checkpoint directory is. The index lock is held from this read to that rename,
        # so another writer's update (an evaluator's result) is neither lost nor overwritten.
        with self.lock():
            current = self.read_index()
            manifest = Manifest.of(record, sizes, current)  # written with the files: renamed with them
            index, _ = current.adding(record)
            index, removed = retain(index)
            index_path, finished_path = model_dir / INDEX_NAME, model_dir / FINISHED_NAME
            index_tmp, finished_tmp = temp_name(index_path), temp_name(finished_path)
            extra = [(finished_tmp, finished_json(record.step))] if finished else []
            own = [(staging / MANIFEST_NAME, manifest.encode())]
            try:
                written = storage.write_all(
                    [(staging / f, d) for f, d in blobs] + own + [(index_tmp, index.encode())] + extra, self.retry
                )
                if written[: len(blobs)] != [record.files[f] for f, _ in blobs]:
                    raise CheckpointError(f"{record.name}: a file's sha256 changed while it was written")
                storage.fsync_dir(staging)
                final = self._rename_into_place(staging, record.name)
                storage.fsync_dir(model_dir)  # the checkpoint is in place before the index names it
                os.replace(index_tmp, index_path)
                if finished:
                    os.replace(finished_tmp, finished_path)
                storage.fsync_dir(model_dir)
            except BaseException:
                index_tmp.unlink(missing_ok=True)
                finished_tmp.unlink(missing_ok=True)
                raise
        return final, removed

    def _rename_into_place(self, staging: Path, name: str) -> Path:
        final = self._dir() / name
        if final.exists():  # re-saving a step (e.g. after a resume): swap the old one out
            trash = self._dir() / f".trash-{name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            os.replace(staging, final)
            storage.remove_tree(trash)
        else:
            os.replace(staging, final)
        return final

    def rewrite(self, rebuild: Rebuild) -> CheckpointIndex | None:
        path = self._dir() / INDEX_NAME
        with self.lock():
            try:
                data = path.read_bytes() if path.exists() else None
            except OSError as e:
                raise CheckpointError(f"{path} is unreadable ({e}); {repair_hint(str(path))}") from e
            plan = rebuild(data)
            if plan is None:
                return None
            index, keep = plan
            jobs = [(temp_name(path), index.encode())]
            if keep is not None and data is not None:
                jobs.append((temp_name(path.with_name(keep)), data))
            try:
                storage.write_all(jobs, self.retry)
                if len(jobs) == 2:  # the old bytes are kept before they are replaced
                    os.replace(jobs[1][0], path.with_name(keep or ""))
                os.replace(jobs[0][0], path)
                storage.fsync_dir(path.parent)
            finally:
                for tmp, _ in jobs:
                    tmp.unlink(missing_ok=True)
        return index

    def write_own_file(self, directory: str, name: str, data: bytes) -> bool:
        folder = self._dir() / directory
        if not folder.is_dir():
            return False
        path = folder / name
        tmp = temp_name(path)
        try:
            storage.write_all([(tmp, data)], self.retry)
            os.replace(tmp, path)
        except (OSError, StorageError):
            tmp.unlink(missing_ok=True)
            if not folder.is_dir():  # retention deleted it meanwhile
                return False
            raise
        storage.fsync_dir(folder)
        return True

    def remove_leftovers(self, named: Callable[[], set[str]]) -> None:
        """Temporary directories, index and ``finished.json`` files of a crashed save (a final
        checkpoint writes the marker's temporary file with its own files)."""
        for p in self._dir().iterdir():
            if p.name.startswith((".tmp-ckpt-", ".trash-ckpt-")) and p.is_dir():
                storage.remove_tree(p)
            elif p.name.startswith((f".{INDEX_NAME}.", f".{FINISHED_NAME}.")) and p.name.endswith(".tmp"):
                p.unlink(missing_ok=True)

    def write_marker(self, name: str, data: bytes) -> None:
        path = self._dir() / name
        tmp = temp_name(path)  # temp + rename: a reader never sees half a file
        storage.write_all([(tmp, data)], self.retry)
        os.replace(tmp, path)

    def remove_marker(self, name: str) -> None:
        (self._dir() / name).unlink(missing_ok=True)


class ObjectStore(CommitProtocol):
    """The index-as-commit-point protocol on an object store (module docstring)."""

    finished_in_commit = False
    ATTEMPTS = 50

    @staticmethod
    def supports(model_dir: Location) -> bool:
        return isinstance(model_dir, UrlPath)

    def _path(self) -> UrlPath:
        assert isinstance(self.index_path, UrlPath)
        return self.index_path

    def read_index(self) -> CheckpointIndex:
        """Read without the lock. On a store without conditional writes a write in progress can
        be read half done, so an index that does not parse there is read again under the lock,
        which its writer holds until the write is whole: only what is unreadable then is damaged."""
        path = self._path()
        try:
            return CheckpointIndex.parse(storage.read_versioned(path, self.retry)[0], str(path))
        except CheckpointError:
            if storage.supports_conditional_writes(path):
                raise  # one conditional PUT is atomic: what was read is what is stored
        with self.lock():
            data = storage.read_versioned(path, self.retry)[0]
        return CheckpointIndex.parse(data, str(path))

    @contextmanager
    def lock(self) -> Iterator[None]:
        """``stoker.storage.lock.index_lock``: a process-wide lock, as conditional writes (S3,
        GCS) guard against other processes, plus a lock object on stores without them."""
        with store_lock.index_lock(self._path(), self.retry):
            yield

    def update(self, change: IndexChange[T], retain: Retain) -> tuple[T, list[str]]:
        """The write is conditional on the index being unchanged since it was read; if another
        writer got there first, ``change`` is applied again to the newer index."""
        path = self._path()
        with self.lock():
            for _ in range(self.ATTEMPTS):
                data, version = storage.read_versioned(path, self.retry)
                index, result = change(CheckpointIndex.parse(data, str(path)))
                index, removed = retain(index)
                if storage.put_if(path, index.encode(), version, self.retry):
                    return result, removed
                time.sleep(0.05)  # another writer's update landed first: redo on top of it
        raise StorageError(f"cannot write {path}: it kept changing under {self.ATTEMPTS} conditional writes")

    def begin(self, step: int) -> Location:
        return self.model_dir / f"ckpt-{step}.{uuid.uuid4().hex[:8]}"

    def record_dir(self, staging: Location) -> str | None:
        return staging.name

    def commit(
        self,
        staging: Location,
        record: CheckpointRecord,
        blobs: Blobs,
        sizes: Mapping[str, int],
        retain: Retain,
        finished: bool,
    ) -> tuple[Location, list[str]]:
        storage.write_all([(staging / f, d) for f, d in blobs], self.retry)
        listed = storage.file_sizes(staging, self.retry)
        wrong = sorted(f for f, n in sizes.items() if listed.get(f) != n)
        if wrong:
            raise StorageError(f"{staging}: {', '.join(wrong)} did not arrive complete (sizes listed back differ)")
        # The manifest last, once every file is known complete: a prefix without one is an
        # unfinished write. Only this trainer moves ``latest``, so the index read now names the parent.
        manifest = Manifest.of(record, sizes, self.read_index())
        storage.write_all([(staging / MANIFEST_NAME, manifest.encode())], self.retry)
        replaced, removed = self.update(lambda index: index.adding(record), retain)  # the commit point
        return staging, replaced + removed

    def rewrite(self, rebuild: Rebuild) -> CheckpointIndex | None:
        """Conditional on the index being unchanged since it was read, like :meth:`update`."""
        path = self._path()
        with self.lock():
            for _ in range(self.ATTEMPTS):
                data, version = storage.read_versioned(path, self.retry)
                plan = rebuild(data)
                if plan is None:
                    return None
                index, keep = plan
                if keep is not None and data is not None:
                    storage.write_all([(self.model_dir / keep, data)], self.retry)
                if storage.put_if(path, index.encode(), version, self.retry):
                    return index
                time.sleep(0.05)
        raise StorageError(f"cannot write {path}: it kept changing under {self.ATTEMPTS} conditional writes")

    def write_own_file(self, directory: str, name: str, data: bytes) -> bool:
        # One PUT is atomic. Into a prefix retention has just deleted, it leaves an orphan the
        # next save removes (the index names no such prefix).
        storage.write_all([(self.model_dir / directory / name, data)], self.retry)
        return True

    def remove_leftovers(self, named: Callable[[], set[str]]) -> None:
        """The ``ckpt-<step>.<random>`` prefixes of crashed writes no index names."""
        kept = named()
        for entry in storage.listdir(self.model_dir):
            m = CKPT_RE.match(entry)
            if m and m.group(2) and entry not in kept:
                log.info("removing %s: an unfinished checkpoint write no index names", self.model_dir / entry)
                storage.remove_tree(self.model_dir / entry)

    def write_marker(self, name: str, data: bytes) -> None:
        storage.write_all([(self.model_dir / name, data)], self.retry)  # an object store's put is atomic

    def remove_marker(self, name: str) -> None:
        path = self.model_dir / name
        if storage.exists(path):
            storage.remove_tree(path)


PROTOCOLS: tuple[type[CommitProtocol], ...] = (LocalDirectory, ObjectStore)


def commit_protocol(model_dir: Location, retry: RetryPolicy) -> CommitProtocol:
    """The commit protocol for ``model_dir``'s storage: the first of :data:`PROTOCOLS` it supports."""
    for protocol in PROTOCOLS:
        if protocol.supports(model_dir):
            return protocol(model_dir, retry)
    raise CheckpointError(f"no commit protocol supports {model_dir!r}: a local path or an fsspec URL is needed")


def finished_json(step: int) -> bytes:
    """``finished.json``'s bytes: ``{"step": N, "time": T}``."""
    return json.dumps({"step": int(step), "time": time.time()}).encode()


__all__ = [
    "FINISHED_NAME",
    "PROTOCOLS",
    "CommitProtocol",
    "LocalDirectory",
    "ObjectStore",
    "Rebuild",
    "Retain",
    "commit_protocol",
    "finished_json",
    "temp_name",
]
