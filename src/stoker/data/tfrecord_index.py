"""The offset index of TFRecord shards: records read by number, the index cached per shard.

One index per shard, ``(offset, length)`` of every record, built once by reading the
12-byte headers (length checksums checked; the data is checked when read) and cached in
``<shard folder>/.stoker-index/<shard>.idx`` (a hidden folder, so ``train-*-of-*`` globs,
TensorFlow's included, never match it). When the data folder is read-only the index goes to
``$XDG_CACHE_HOME/stoker/tfrecord-index/<hash of the folder's path>/`` (``~/.cache`` when
unset); ``index_dir=`` puts it elsewhere. Each index records its shard's size and
modification time (ns); an index whose shard has changed is rebuilt, never trusted.

Shards on an object store (``s3://``, ``gs://``, ...) are read from their copies in the machine's
cache (:mod:`stoker.data.stream`); their indexes are kept in ``<cache>/index/`` (or ``index_dir=``),
named by the object's URL and checked by its size and version (ETag, generation), and beside the
shards on the store (``<prefix>/.stoker-index/<shard>.idx``, :mod:`stoker.data.stream.indexes`):
every process of a machine, every later run and every other machine reuses the index the first
one built (a new machine reads the small index objects, on ``fetch_threads`` threads, and
fetches shards only as batches need them), and a replaced object is indexed again. Shards
without an index anywhere are fetched and indexed on ``fetch_threads`` threads at once.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .base import DataError
from .stream import DataFile, FileSet, StreamOptions, as_data_file
from .stream.cache import cache_name
from .stream.files import OpenFiles, index_all
from .stream.indexes import INDEX_FOLDER, read_store_index, write_local_index, write_store_index
from .tfrecord_io import _FOOTER, _HEADER, _check_header, _where, check_record, read_record

log = logging.getLogger("stoker")

_INDEX_MAGIC = b"STKTFRI1"


@dataclass(frozen=True)
class ShardIndex:
    """Where each record of one shard starts and how long its data is.

    Attributes:
        path: the shard (its URL when it is on an object store).
        offsets / lengths: uint64 per record (the offset of its header; the length of its data).
        error: what broke the framing after the last indexed record (a truncated tail, a corrupt
            length), or ``None`` when the whole file is whole records.
        index_path: where the index is cached (``None`` when no location was writable).
        built: ``True`` when it was built now, ``False`` when read from the cache.
    """

    path: Path | str
    offsets: np.ndarray
    lengths: np.ndarray
    error: str | None
    index_path: Path | None
    built: bool

    def __len__(self) -> int:
        return len(self.offsets)


def _scan(path: Path) -> tuple[np.ndarray, np.ndarray, str | None]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return _scan_fd(fd, path)
    finally:
        os.close(fd)


def _scan_fd(fd: int, path: Path | str) -> tuple[np.ndarray, np.ndarray, str | None]:
    """The records of the open TFRecord file ``fd`` (``path``: its name in messages)."""
    offsets: list[int] = []
    lengths: list[int] = []
    error = None
    size = os.fstat(fd).st_size
    offset = 0
    while offset < size:
        try:
            length = _check_header(os.pread(fd, _HEADER.size, offset), path, len(offsets), offset)
            end = offset + _HEADER.size + length + _FOOTER
            if end > size:
                raise DataError(
                    f"{_where(path, len(offsets), offset)}: truncated: the record needs {end - offset} bytes, "
                    f"the file holds {size - offset} from there"
                )
        except DataError as e:
            error = str(e)  # the framing is lost: nothing after this point can be found
            break
        offsets.append(offset)
        lengths.append(length)
        offset = end
    return np.asarray(offsets, dtype=np.uint64), np.asarray(lengths, dtype=np.uint64), error


def index_locations(shard: Path, index_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where the index of ``shard`` is looked for, in order (the first writable one is written)."""
    name = shard.name + ".idx"
    if index_dir is not None:
        return [Path(index_dir) / name]
    folder = shard.resolve().parent
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    digest = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    return [folder / INDEX_FOLDER / name, cache / "stoker" / "tfrecord-index" / digest / name]


def _stamp(stat: os.stat_result) -> dict[str, Any]:
    """What identifies a local shard's content in its index: size and modification time."""
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _encode(stamp: dict[str, Any], offsets: np.ndarray, lengths: np.ndarray, error: str | None) -> bytes:
    meta = json.dumps({**stamp, "count": len(offsets), "error": error}).encode()
    arrays = offsets.astype("<u8").tobytes() + lengths.astype("<u8").tobytes()
    return _INDEX_MAGIC + struct.pack("<I", len(meta)) + meta + arrays


def _decode(raw: bytes, shard: Path | str, stamp: dict[str, Any], index_path: Path | None) -> ShardIndex | None:
    """The index in ``raw`` when it is one of a shard with ``stamp``; ``None`` when stale or damaged."""
    try:
        if not raw.startswith(_INDEX_MAGIC):
            return None
        (size,) = struct.unpack_from("<I", raw, len(_INDEX_MAGIC))
        start = len(_INDEX_MAGIC) + 4
        meta = json.loads(raw[start : start + size])
        if any(meta.get(key) != value for key, value in stamp.items()):
            return None  # the shard changed: stale
        n = int(meta["count"])
        arrays = np.frombuffer(raw, dtype="<u8", count=2 * n, offset=start + size)
    except (ValueError, KeyError, struct.error):
        return None  # damaged: rebuild
    return ShardIndex(shard, arrays[:n].copy(), arrays[n:].copy(), meta["error"], index_path, built=False)


def _load(index_path: Path, shard: Path | str, stamp: dict[str, Any]) -> ShardIndex | None:
    try:
        raw = index_path.read_bytes()
    except OSError:
        return None  # missing or unreadable: rebuild
    return _decode(raw, shard, stamp, index_path)


def _store(
    index_path: Path, stamp: dict[str, Any], offsets: np.ndarray, lengths: np.ndarray, error: str | None
) -> bool:
    return write_local_index(index_path, _encode(stamp, offsets, lengths, error))


def shard_index(shard: str | os.PathLike[str], *, index_dir: str | os.PathLike[str] | None = None) -> ShardIndex:
    """The index of ``shard``: the cached one when it matches the shard's size and mtime, else
    built now and cached at the first writable location of :func:`index_locations`."""
    shard = Path(shard)
    try:
        stat = shard.stat()
    except OSError as e:
        raise DataError(f"TFRecord file {shard}: cannot read it: {e}") from None
    locations = index_locations(shard, index_dir)
    for location in locations:
        cached = _load(location, shard, _stamp(stat))
        if cached is not None:
            return cached
    offsets, lengths, error = _scan(shard)
    where = next((loc for loc in locations if _store(loc, _stamp(stat), offsets, lengths, error)), None)
    if where is None:
        log.warning("TFRecord index of %s could not be cached (tried %s)", shard, ", ".join(map(str, locations)))
    return ShardIndex(shard, offsets, lengths, error, where, built=True)


def remote_shard_index(files: FileSet, k: int, *, index_dir: str | os.PathLike[str] | None = None) -> ShardIndex:
    """The index of file ``k`` of ``files`` (an object-store shard): the one in the machine's
    cache (``<cache>/index/``, or ``index_dir``), else the one beside the shard on the store
    (:mod:`stoker.data.stream.indexes`), when its size and version match; else built now from
    the shard's copy in the cache (fetched if need be) and kept in both places."""
    file = files.files[k]
    stamp = {"size": file.size, "version": file.version}  # the URL is in the cache name (and the store's place)
    folder = Path(index_dir) if index_dir is not None else files.cache.root / "index"
    index_path = folder / f"{cache_name(file)}.idx"
    cached = _load(index_path, file.url, stamp)
    if cached is not None:
        return cached
    raw = read_store_index(file, ".idx", files.stream.retry)
    shared = None if raw is None else _decode(raw, file.url, stamp, index_path)
    if shared is not None and raw is not None:
        stored = write_local_index(index_path, raw)  # the next process of this machine asks nothing
        return shared if stored else dataclasses.replace(shared, index_path=None)
    fd = files.open_fd(k)  # fetched now; an open copy survives another thread's eviction, a path not
    try:
        offsets, lengths, error = _scan_fd(fd, file.url)  # messages name the object, not its copy
    finally:
        os.close(fd)
    data = _encode(stamp, offsets, lengths, error)
    stored = write_local_index(index_path, data)
    if files.stream.store_indexes:
        write_store_index(file, ".idx", data, files.stream.retry)
    if not stored:
        log.warning("TFRecord index of %s could not be cached in %s", file.url, folder)
    return ShardIndex(file.url, offsets, lengths, error, index_path if stored else None, built=True)


class RecordShards:
    """The records of several shards as one sequence, read by global number (``pread``).

    Record ``i`` is record ``i - start[k]`` of shard ``k`` (shards in the given order). Open
    files are cached (at most ``max_open`` at once); a copy for a worker process carries the
    index, not the files. Shards on an object store are read from the machine's cache
    (:mod:`stoker.data.stream`); :meth:`ahead` fetches the shards of coming records early.

    Args:
        paths: the shard files: local paths, URLs or :class:`~stoker.data.stream.DataFile` s.
        index_dir: where to cache the indexes (default: see the module doc).
        lenient: a shard whose framing breaks (a truncated tail, a corrupt length) contributes
            the records before the break, with a warning; otherwise it raises :class:`DataError`.
        progress: show a tqdm bar when indexing takes more than a second (on a terminal).
        stream: the cache and read-ahead of object-store shards (default
            :class:`~stoker.data.stream.StreamOptions`).
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str] | DataFile],
        *,
        index_dir: str | os.PathLike[str] | None = None,
        lenient: bool = False,
        progress: bool = True,
        max_open: int = 64,
        stream: StreamOptions | None = None,
    ) -> None:
        self.files = FileSet([as_data_file(p) for p in paths], stream)
        #: The shards as printed: local paths, or URLs.
        self.paths: list[Path | str] = [f.url if self.files.remote else Path(f.url) for f in self.files.files]
        self.indexes: list[ShardIndex] = []
        for index in self._index_all(index_dir, progress):
            if index.error is not None:
                if not lenient:
                    raise DataError(f"{index.error} (skip_bad_examples=True reads the {len(index)} records before it)")
                log.warning("%s; reading the %d records before it", index.error, len(index))
            self.indexes.append(index)
        counts = np.array([len(i) for i in self.indexes], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._fds = OpenFiles(self.files, max_open)

    def _index_all(self, index_dir: str | os.PathLike[str] | None, progress: bool) -> Iterable[ShardIndex]:
        """Every shard's index, in order; object-store shards on ``fetch_threads`` threads at once."""
        if self.files.remote:
            self._warn_if_over_the_cache()

        def index(k: int) -> ShardIndex:
            if self.files.remote:
                return remote_shard_index(self.files, k, index_dir=index_dir)
            return shard_index(self.paths[k], index_dir=index_dir)

        return index_all(self.files, index, desc="indexing TFRecord shards", progress=progress)

    def _warn_if_over_the_cache(self) -> None:
        total = sum(f.size for f in self.files.files)
        if total > self.files.cache.limit:
            log.warning(
                "the TFRecord shards (%.1f GiB) exceed the stream cache's limit (%.1f GiB, %s): a shuffled "
                "epoch reads every shard, so each epoch fetches them again; give StreamOptions(cache_limit=...) "
                "room for the data set, or a cache_dir on a larger disk",
                total / 2**30,
                self.files.cache.limit / 2**30,
                self.files.cache.root,
            )

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def remote(self) -> bool:
        """Whether the shards are on an object store (read through the cache)."""
        return self.files.remote

    def ahead(self, records: Iterable[int]) -> None:
        """Fetch the object-store shards of ``records`` (in the order they will be read) into the
        cache in the background, within the read-ahead budget; nothing for local shards."""
        if not self.files.remote:
            return
        ids = np.searchsorted(self.starts, np.fromiter(records, dtype=np.int64), side="right") - 1
        self.files.ahead(dict.fromkeys(int(k) for k in ids))  # first use first, once each

    def locate(self, i: int) -> tuple[int, int]:
        """``(shard number, record number in that shard)`` of global record ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"record {i} of {len(self)}")
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return k, i - int(self.starts[k])

    def describe(self, i: int) -> str:
        """``TFRecord file <shard>: record <n> at byte <offset>``, for messages."""
        k, j = self.locate(i)
        return _where(self.paths[k], j, int(self.indexes[k].offsets[j]))

    def read(self, i: int) -> bytes:
        """The data of global record ``i``, both checksums checked."""
        k, j = self.locate(i)
        index = self.indexes[k]
        return read_record(self._fd(k), index.path, j, int(index.offsets[j]), int(index.lengths[j]))

    def read_one(self, i: int) -> bytes:
        """:meth:`read` for a lone record (the ``decoder="auto"`` probe's): an object-store shard
        the cache does not hold is not fetched, the record is read with one ranged request."""
        k, j = self.locate(i)
        index = self.indexes[k]
        offset, length = int(index.offsets[j]), int(index.lengths[j])
        if self.files.cached(k):
            return self.read(i)
        framed = self.files.read_range(k, offset, offset + _HEADER.size + length + _FOOTER)
        return check_record(framed, index.path, j, offset, length)

    def _fd(self, k: int) -> int:
        try:
            return self._fds.fd(k)
        except OSError as e:
            raise DataError(f"TFRecord file {self.paths[k]}: cannot open it: {e}") from None

    def close(self) -> None:
        """Close the open files (reads reopen them)."""
        self._fds.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fds"] = copy.copy(self._fds)  # none open: descriptors mean nothing in another process
        return state


__all__ = ["INDEX_FOLDER", "RecordShards", "ShardIndex", "index_locations", "remote_shard_index", "shard_index"]
