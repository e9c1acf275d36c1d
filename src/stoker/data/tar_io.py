"""Tar shards in the WebDataset layout: the member index, samples read by number, the writer.

**Layout** (WebDataset's): a shard is a tar file whose regular-file members are grouped into
samples by key. A member ``dir/abc.jpg`` has the key ``dir/abc`` and the extension ``jpg`` (the
name up to the first dot of its last part, and the rest, lower-cased); consecutive members with
the same key are one sample (``abc.jpg``, ``abc.cls``, ``abc.json``), and a key seen again after
another, or an extension repeated within a key, starts a new sample, as WebDataset reads them.
Members without an extension, directories and links belong to no sample. A ``.cls`` member holds
the sample's class as a decimal integer.

**The index**: the first read of a shard scans its headers (the data is skipped, ``.cls`` members
excepted; plain ustar headers are parsed here, PAX records and GNU long names by :mod:`tarfile`)
and records every member's name, data offset and size, where each sample starts and its
``.cls`` label, then caches that as ``<shard folder>/.stoker-index/<shard>.tidx`` (a hidden
folder: ``*.tar`` globs never match it), or in ``<stoker's cache>/tar-index/`` when that folder
is not writable; an object-store shard's goes to ``tar-index/`` in its stream cache
(:mod:`stoker.data.stream`) and beside the shard on the store, ``<prefix>/.stoker-index/<shard>.tidx``
(:mod:`stoker.data.stream.indexes`: a new machine reads it instead of fetching the shard), and
``index_dir=`` puts the local copy elsewhere. The index records
the shard's size and version (a local file's modification time, an object's ETag or generation):
an index whose shard changed is rebuilt, never trusted. So a sample is one ``pread`` of each
member it needs, wherever in the shard it lies, and an exact resume mid-shard reads nothing
before it.

A header that is not a tar header, a member whose data runs past the end of the shard or a
``.cls`` member that is not an integer raise :class:`~stoker.data.DataError` naming the shard, the
member and the byte offset; with ``lenient=True`` a shard whose headers break contributes the
samples before the break, with a warning.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import io
import json
import logging
import os
import re
import struct
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._cache import cache_dir
from ..errors import ConfigError
from ..storage import Location, UrlPath, upload
from .base import DataError
from .stream import DataFile, FileSet, StreamOptions, as_data_file, list_files
from .stream.files import OpenFiles, index_all
from .stream.indexes import INDEX_FOLDER, read_store_index, write_local_index, write_store_index
from .stream.listing import where

log = logging.getLogger("stoker")

_INDEX_MAGIC = b"STKTARI1"
#: A sample's label member (WebDataset's convention: the class index as decimal text).
LABEL_EXT = "cls"
#: ``labels`` entries of samples with no ``.cls`` member / an unreadable one.
NO_LABEL, BAD_LABEL = -1, -2
# WebDataset's key rule (its ``base_plus_ext``): the key is everything before the first dot of the last part.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_BLOCK = tarfile.BLOCKSIZE


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name (the extension lower-cased), ``None`` when it has none."""
    found = _KEY_EXT.match(name)
    return None if found is None else (found.group(1), found.group(2).lower())


@dataclass(frozen=True)
class TarIndex:
    """Where the members of one shard are and how they group into samples.

    Attributes:
        shard: the shard.
        names: member names in tar order (members of samples only).
        offsets / sizes: uint64 per member: where its data starts, how long it is.
        starts: int64, one more than there are samples: sample ``s`` is members ``starts[s]:starts[s + 1]``.
        labels: int64 per sample: its ``.cls`` value, :data:`NO_LABEL` or :data:`BAD_LABEL`.
        error: what broke the headers after the last indexed sample, or ``None``.
        index_path: where it is cached (``None`` when nowhere was writable).
        built: built now (``False``: read from the cache).
    """

    shard: DataFile
    names: list[str]
    offsets: np.ndarray
    sizes: np.ndarray
    starts: np.ndarray
    labels: np.ndarray
    error: str | None
    index_path: Path | None
    built: bool

    def __len__(self) -> int:
        return len(self.starts) - 1

    def members(self, s: int) -> range:
        """Member numbers of sample ``s``."""
        return range(int(self.starts[s]), int(self.starts[s + 1]))


class _Scan:
    """The index as the scan builds it, member by member."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.offsets: list[int] = []
        self.sizes: list[int] = []
        self.starts: list[int] = []
        self.labels: list[int] = []
        self._key: str | None = None
        self._exts: set[str] = set()
        #: The shard's size in bytes.
        self.size = 0

    def add(self, name: str, key: str, ext: str, offset: int, size: int, label: int | None) -> None:
        if key != self._key or ext in self._exts:  # a new sample (WebDataset's group_by_keys)
            self.starts.append(len(self.names))
            self.labels.append(NO_LABEL)
            self._key, self._exts = key, set()
        self._exts.add(ext)
        self.names.append(name)
        self.offsets.append(offset)
        self.sizes.append(size)
        if label is not None:
            self.labels[-1] = label


def _read_label(fd: int, offset: int, size: int) -> int:
    if size > 64:
        return BAD_LABEL
    try:
        return int(os.pread(fd, size, offset).decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return BAD_LABEL


def _add_member(scan: _Scan, fd: int, name: str, at: tuple[int, int], size: int, shown: str) -> str | None:
    """Add the regular file ``name`` (its header and data at ``at``) to ``scan``; the error when
    its data runs past the end of the shard."""
    header, data = at
    if data + size > scan.size:
        return (
            f"tar shard {shown}: member {name!r} at byte {header} is truncated: it needs "
            f"{data + size - header} bytes, the shard holds {scan.size - header} from there"
        )
    parts = split_name(name)
    if parts is None or (name.startswith("__") and "/" not in name):
        return None  # no extension, or WebDataset's __meta__ files: no sample's member
    label = _read_label(fd, data, size) if parts[1] == LABEL_EXT else None
    scan.add(name, *parts, data, size, label)
    return None


def _scan(path: Path, shown: str) -> tuple[_Scan, str | None]:
    """Every sample member of the tar file ``path``; the error that stopped the scan, if any."""
    # Unbuffered: the scan seeks past every member's data; a buffered file would refill per header.
    with open(path, "rb", buffering=0) as f:
        fast = _scan_ustar(f.fileno(), shown)
        return fast if fast is not None else _scan_tarfile(f, shown)


_REGULAR = (b"0", b"\0", b"7")
#: Headers that change the next one (PAX records, GNU long names) or sparse files: read by tarfile.
_TARFILE_TYPES = (b"x", b"g", b"X", b"L", b"K", b"S")


def _scan_ustar(fd: int, shown: str) -> tuple[_Scan, str | None] | None:
    """:func:`_scan` of a tar of plain ustar headers, each parsed here (about 5x tarfile's speed);
    ``None`` when the shard holds something tarfile reads better (long names, PAX records, sizes
    in base 256, no tar header at all)."""
    scan = _Scan()
    scan.size = size = os.fstat(fd).st_size
    offset, last = 0, "its start"
    while offset < size:
        buf = os.pread(fd, _BLOCK, offset)
        if not buf.strip(b"\0"):
            return scan, None  # the end-of-archive blocks
        where = f"tar shard {shown}: malformed member header at byte {offset} after {last}"
        if len(buf) < _BLOCK:
            return scan, f"{where}: truncated ({len(buf)} of {_BLOCK} bytes)"
        try:
            stored = int(buf[148:156].strip(b" \0"), 8)
        except ValueError:
            stored = -1
        if sum(buf) - sum(buf[148:156]) + 8 * ord(" ") != stored:
            return None if offset == 0 else (scan, f"{where}: bad checksum")
        kind = buf[156:157]
        if kind in _TARFILE_TYPES or buf[124] & 0x80:
            return None
        try:
            length = int(buf[124:136].strip(b" \0") or b"0", 8)
        except ValueError:
            return scan, f"{where}: bad size field"
        name = buf[:100].split(b"\0", 1)[0]
        if prefix := buf[345:500].split(b"\0", 1)[0]:  # ustar's long names, joined as tarfile joins them
            name = prefix + b"/" + name
        text = name.decode("utf-8", "surrogateescape")
        last = f"member {text!r}"
        if kind in _REGULAR and not (kind == b"\0" and text.endswith("/")):  # V7 marks folders by a "/"
            error = _add_member(scan, fd, text, (offset, offset + _BLOCK), length, shown)
            if error is not None:
                return scan, error
        offset += _BLOCK + -(-length // _BLOCK) * _BLOCK
    return scan, None


def _scan_tarfile(f: Any, shown: str) -> tuple[_Scan, str | None]:
    """:func:`_scan` by tarfile's reader, for every header it knows."""
    scan = _Scan()
    scan.size = os.fstat(f.fileno()).st_size
    try:
        tar = tarfile.open(fileobj=f, mode="r:")
    except tarfile.TarError as e:
        raise DataError(f"tar shard {shown}: not a tar file: {e}") from None
    last = "its start"
    while True:
        try:
            info = tar.next()
        except tarfile.TarError as e:
            return scan, f"tar shard {shown}: malformed member header at byte {tar.offset} after {last}: {e}"
        if info is None:
            break
        vars(tar)["members"].clear()  # tarfile keeps every header it read; the index is all that is needed
        last = f"member {info.name!r}"
        if info.isreg():
            error = _add_member(scan, f.fileno(), info.name, (info.offset, info.offset_data), info.size, shown)
            if error is not None:
                return scan, error
    # tarfile ends quietly at a header that is not one (past the first): only zeros may follow.
    f.seek(tar.offset)
    if f.read(_BLOCK).strip(b"\0"):
        return scan, f"tar shard {shown}: malformed member header at byte {tar.offset} after {last}: not a tar header"
    return scan, None


def index_locations(
    shard: DataFile, index_dir: str | os.PathLike[str] | None = None, *, remote_root: Path | None = None
) -> list[Path]:
    """Where the index of ``shard`` is looked for, in order (the first writable one is written):
    ``index_dir``; else beside a local shard, then stoker's cache; for an object-store shard
    (``remote_root``: its stream cache's folder) there."""
    name = shard.name + ".tidx"
    if index_dir is not None:
        return [Path(index_dir) / name]
    remote = remote_root is not None
    folder = shard.url.rsplit("/", 1)[0] if remote else str(Path(shard.url).resolve().parent)
    digest = hashlib.sha256(folder.encode()).hexdigest()[:16]
    cached = (remote_root if remote_root is not None else cache_dir()) / "tar-index" / digest / name
    return [cached] if remote else [Path(folder) / INDEX_FOLDER / name, cached]


def _decode(raw: bytes, shard: DataFile, index_path: Path | None) -> TarIndex | None:
    """The index in ``raw`` when it is one of ``shard`` as it is now; ``None`` when stale or damaged."""
    try:
        if not raw.startswith(_INDEX_MAGIC):
            return None
        (size,) = struct.unpack_from("<I", raw, len(_INDEX_MAGIC))
        start = len(_INDEX_MAGIC) + 4
        meta = json.loads(raw[start : start + size])
        if meta["size"] != shard.size or meta["version"] != shard.version:
            return None  # the shard changed: stale
        m, n = len(meta["names"]), int(meta["samples"])
        arrays = np.frombuffer(raw, dtype="<i8", count=2 * m + 2 * n + 1, offset=start + size)
    except (ValueError, KeyError, TypeError, struct.error):
        return None  # damaged: rebuild
    offsets, sizes = arrays[:m].astype(np.uint64), arrays[m : 2 * m].astype(np.uint64)
    starts, labels = arrays[2 * m : 2 * m + n + 1].copy(), arrays[2 * m + n + 1 :].copy()
    return TarIndex(shard, meta["names"], offsets, sizes, starts, labels, meta["error"], index_path, built=False)


def _load(index_path: Path, shard: DataFile) -> TarIndex | None:
    try:
        raw = index_path.read_bytes()
    except OSError:
        return None  # missing or unreadable: rebuild
    return _decode(raw, shard, index_path)


def _index_bytes(index: TarIndex) -> bytes:
    meta = {"size": index.shard.size, "version": index.shard.version, "samples": len(index), "error": index.error}
    head = json.dumps({**meta, "names": index.names}).encode()
    arrays = [index.offsets, index.sizes, index.starts, index.labels]
    body = b"".join(np.asarray(a).astype("<i8").tobytes() for a in arrays)
    return _INDEX_MAGIC + struct.pack("<I", len(head)) + head + body


def _shared(shard: DataFile, stream: StreamOptions, locations: Sequence[Path]) -> TarIndex | None:
    """The index kept beside the object-store shard ``shard`` on the store, when it matches; kept
    at the first writable of ``locations`` too, so the next process of this machine asks nothing."""
    raw = read_store_index(shard, ".tidx", stream.retry)
    found = None if raw is None else _decode(raw, shard, None)
    if found is None or raw is None:
        return None
    where = next((loc for loc in locations if write_local_index(loc, raw)), None)
    return dataclasses.replace(found, index_path=where)


def tar_index(
    shard: DataFile,
    local: Callable[[], Path],
    *,
    index_dir: str | os.PathLike[str] | None = None,
    remote_root: Path | None = None,
    stream: StreamOptions | None = None,
) -> TarIndex:
    """The index of ``shard``: the cached one when it matches the shard's size and version, else
    (``stream`` given: an object-store shard) the one beside it on the store
    (:mod:`stoker.data.stream.indexes`), else built from ``local()`` (a local path holding its
    bytes, asked for only then: a remote shard is fetched only to build it), cached at the first
    writable location of :func:`index_locations` and (``stream.store_indexes``) put on the store."""
    locations = index_locations(shard, index_dir, remote_root=remote_root)
    for location in locations:
        cached = _load(location, shard)
        if cached is not None:
            return cached
    if stream is not None and (shared := _shared(shard, stream, locations)) is not None:
        return shared
    for _ in range(2):
        try:
            scan, error = _scan(local(), shard.url)
            break
        except FileNotFoundError:
            continue  # a cached copy evicted by another thread's fetch before it was opened: fetched again
    else:
        scan, error = _scan(local(), shard.url)
    starts = np.asarray([*scan.starts, len(scan.names)], dtype=np.int64)
    index = TarIndex(
        shard,
        scan.names,
        np.asarray(scan.offsets, dtype=np.uint64),
        np.asarray(scan.sizes, dtype=np.uint64),
        starts,
        np.asarray(scan.labels, dtype=np.int64),
        error,
        None,
        built=True,
    )
    data = _index_bytes(index)
    where = next((loc for loc in locations if write_local_index(loc, data)), None)
    if stream is not None and stream.store_indexes:
        write_store_index(shard, ".tidx", data, stream.retry)
    if where is None:
        log.warning("tar index of %s could not be cached (tried %s)", shard.url, ", ".join(map(str, locations)))
    return dataclasses.replace(index, index_path=where)


class TarShards:
    """The samples of several tar shards as one sequence, read by global number (``pread``).

    Sample ``i`` is sample ``i - start[k]`` of shard ``k`` (shards in the given order). Open files
    are cached (at most ``max_open``); a copy for a worker process carries the index, not the files.

    Args:
        shards: the shard files: local paths, URLs or :class:`~stoker.data.stream.DataFile` s
            (object-store ones are read from the machine's cache, :mod:`stoker.data.stream`).
        index_dir: where to cache the indexes (default: see the module doc).
        lenient: a shard whose headers break contributes the samples before the break, with a
            warning; otherwise it raises :class:`DataError`.
        progress: a tqdm bar when indexing takes more than a second (on a terminal).
        stream: the cache and read-ahead of object-store shards.
    """

    def __init__(
        self,
        shards: Sequence[str | os.PathLike[str] | DataFile],
        *,
        index_dir: str | os.PathLike[str] | None = None,
        lenient: bool = False,
        progress: bool = True,
        max_open: int = 64,
        stream: StreamOptions | None = None,
    ) -> None:
        self.files = FileSet([as_data_file(p) for p in shards], stream)
        self.indexes: list[TarIndex] = []
        for index in self._index_all(index_dir, progress):
            if index.error is not None:
                if not lenient:
                    raise DataError(f"{index.error} (skip_bad_examples=True reads the {len(index)} samples before it)")
                log.warning("%s; reading the %d samples before it", index.error, len(index))
            self.indexes.append(index)
        counts = np.array([len(i) for i in self.indexes], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._fds = OpenFiles(self.files, max_open)

    def _index_all(self, index_dir: str | os.PathLike[str] | None, progress: bool) -> Iterator[TarIndex]:
        """Every shard's index, in order; object-store shards on ``fetch_threads`` threads at once."""
        root = self.files.cache.root if self.files.remote else None
        stream = self.files.stream if self.files.remote else None

        def index(k: int) -> TarIndex:
            local = functools.partial(self.files.local, k)
            return tar_index(self.files.files[k], local, index_dir=index_dir, remote_root=root, stream=stream)

        return index_all(self.files, index, desc="indexing tar shards", progress=progress)

    @property
    def remote(self) -> bool:
        """Whether the shards are on an object store (read through the cache)."""
        return self.files.remote

    def ahead(self, samples: Iterable[int]) -> None:
        """Fetch the object-store shards of ``samples`` (in the order they will be read) into the
        cache in the background, within the read-ahead budget; nothing for local shards."""
        if not self.files.remote:
            return
        ids = np.searchsorted(self.starts, np.fromiter(samples, dtype=np.int64), side="right") - 1
        self.files.ahead(dict.fromkeys(int(k) for k in ids))  # first use first, once each

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, i: int) -> tuple[int, int]:
        """``(shard number, sample number in that shard)`` of global sample ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} of {len(self)}")
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return k, i - int(self.starts[k])

    def labels(self) -> np.ndarray:
        """Every sample's ``.cls`` label (:data:`NO_LABEL` / :data:`BAD_LABEL` where there is none)."""
        return np.concatenate([index.labels for index in self.indexes])

    def describe(self, i: int, member: int | None = None) -> str:
        """``tar shard <url>: member '<name>' at byte <offset>`` (the sample's first member by default)."""
        k, s = self.locate(i)
        index = self.indexes[k]
        m = index.members(s)[0] if member is None else member
        return f"tar shard {index.shard.url}: member {index.names[m]!r} at byte {int(index.offsets[m])}"

    def extensions(self, i: int) -> dict[str, int]:
        """Sample ``i``'s members by extension: ``{ext: member number in its shard}``."""
        k, s = self.locate(i)
        index = self.indexes[k]
        return {split_name(index.names[m])[1]: m for m in index.members(s)}  # type: ignore[index]

    def read_member(self, i: int, member: int, *, one: bool = False) -> bytes:
        """The data of member ``member`` of sample ``i``'s shard (one ``pread``); ``one``: a lone
        read (the ``decoder="auto"`` probe's), of an object-store shard the cache does not hold
        with one ranged request, the shard not fetched."""
        k, _ = self.locate(i)
        index = self.indexes[k]
        offset, size = int(index.offsets[member]), int(index.sizes[member])
        if one and not self.files.cached(k):
            data = self.files.read_range(k, offset, offset + size)
        else:
            data = os.pread(self._fd(k), size, offset)
        if len(data) != size:
            raise DataError(
                f"{self.describe(i, member)}: truncated: it needs {size} bytes, the shard holds {len(data)} "
                "from there; the shard changed after it was indexed"
            )
        return data

    def sample(self, i: int) -> dict[str, bytes]:
        """Sample ``i`` as WebDataset gives it: ``{"__key__": key, ext: data, ...}`` (the key as bytes)."""
        members = self.extensions(i)
        k, s = self.locate(i)
        key = split_name(self.indexes[k].names[self.indexes[k].members(s)[0]])[0]  # type: ignore[index]
        return {"__key__": key.encode(), **{ext: self.read_member(i, m) for ext, m in members.items()}}

    def _fd(self, k: int) -> int:
        try:
            return self._fds.fd(k)
        except OSError as e:
            raise DataError(f"tar shard {self.files.name(k)}: cannot open it: {e}") from None

    def close(self) -> None:
        """Close the open files (reads reopen them)."""
        self._fds.close()

    def __copy__(self) -> TarShards:
        view = object.__new__(TarShards)
        view.__dict__.update(self.__getstate__())  # its own open files: another thread may close an old one
        return view

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fds"] = copy.copy(self._fds)  # none open: descriptors mean nothing in another process
        return state


# ---------------------------------------------------------------------- writing


def _encode(key: str, ext: str, value: Any) -> bytes:
    """A sample value as a member's bytes: bytes as they are, text as UTF-8, an int as decimal
    text (a ``.cls``), a dict or list as JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value)).encode()
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True).encode()
    raise ConfigError(
        f"write_tar_shards: sample {key!r}: {ext!r} is a {type(value).__name__}; give bytes, str, int, dict or list"
    )


def _members(sample: Mapping[str, Any]) -> tuple[str, list[tuple[str, bytes]]]:
    """A sample's key and its members ``(name, data)``, checked so they read back as this sample."""
    key = sample.get("__key__")
    if not isinstance(key, str) or not key or "." in key.rsplit("/", 1)[-1] or key.startswith("/"):
        raise ConfigError(
            f"write_tar_shards: every sample needs a '__key__' string without a dot in its last part "
            f"(the key is the member name up to the first dot); got {key!r}"
        )
    members = []
    for ext, value in sample.items():
        if ext == "__key__":
            continue
        if not ext or "/" in ext or ext != ext.lower():
            raise ConfigError(f"write_tar_shards: sample {key!r}: extension {ext!r} must be lower-case, without '/'")
        members.append((f"{key}.{ext}", _encode(key, ext, value)))
    if not members:
        raise ConfigError(f"write_tar_shards: sample {key!r} has no members besides '__key__'")
    return key, members


def _tar_bytes(members: Sequence[tuple[str, bytes]]) -> int:
    """The bytes ``members`` add to a tar file: a header block each (three more for a PAX header
    when a name is long or not ASCII), the data padded to whole blocks."""
    total = 0
    for name, data in members:
        pax = len(name) > 100 or not name.isascii()
        total += _BLOCK * (1 + 3 * pax + -(-len(data) // _BLOCK))
    return total


class _ShardWriter:
    """One shard being written under a hidden temporary name, renamed when complete."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        self.file = open(self.tmp, "wb")  # noqa: SIM115 - closed by finish/abort
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.PAX_FORMAT)
        self.samples = 0

    def add(self, members: Sequence[tuple[str, bytes]]) -> None:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o444, 0  # the same bytes every time
            self.tar.addfile(info, io.BytesIO(data))
        self.samples += 1

    def size_with(self, members: Sequence[tuple[str, bytes]]) -> int:
        """The shard's size on disk were ``members`` added: the end-of-archive blocks, padded to
        tar's 10 KiB records."""
        size = self.file.tell() + _tar_bytes(members) + 2 * _BLOCK
        return -(-size // tarfile.RECORDSIZE) * tarfile.RECORDSIZE

    def finish(self) -> None:
        self.tar.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)


class _Destination:
    """Where finished shards go: a local folder (renamed into place) or an object-store prefix
    (written in a local temporary folder, then uploaded whole: an object appears complete or not)."""

    def __init__(self, out_dir: str | os.PathLike[str], prefix: str) -> None:
        self.place = where(out_dir)
        self.prefix = prefix
        self.remote = isinstance(self.place, UrlPath)
        self._tmp = tempfile.TemporaryDirectory(prefix="stoker-tar-shards-") if self.remote else None
        self.folder = Path(self._tmp.name) if self._tmp is not None else Path(self.place)
        self.folder.mkdir(parents=True, exist_ok=True)

    def existing(self) -> list[str]:
        """The ``<prefix>-*.tar`` shards already there."""
        return [n for n, _ in list_files(self.place) if n.startswith(f"{self.prefix}-") and n.endswith(".tar")]

    def start(self, k: int) -> _ShardWriter:
        return _ShardWriter(self.folder / f"{self.prefix}-{k:06d}.tar")

    def keep(self, shard: _ShardWriter) -> Location:
        """Close ``shard`` and put it in place; where it is."""
        shard.finish()
        if not isinstance(self.place, UrlPath):
            return shard.path
        target = self.place / shard.path.name
        upload(shard.path, target)
        shard.path.unlink()
        return target

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


def write_tar_shards(
    out_dir: str | os.PathLike[str],
    samples: Iterable[Mapping[str, Any]],
    *,
    prefix: str = "shard",
    samples_per_shard: int | None = None,
    max_shard_bytes: int | None = 1 << 30,
) -> list[Location]:
    """Write ``samples`` as tar shards ``out_dir/<prefix>-000000.tar``, ``-000001.tar`` ... in the
    WebDataset layout; returns where they are (``Path`` s, or ``UrlPath`` s on an object store).

    Each sample is a mapping ``{"__key__": "abc", "jpg": b"...", "cls": 3, "json": {...}}``: member
    ``abc.<ext>`` per other entry, in the mapping's order; bytes are written as they are, ``str``
    as UTF-8, ``int`` as decimal text, ``dict`` / ``list`` as JSON. A shard is closed when it holds
    ``samples_per_shard`` samples or the next sample would take it over ``max_shard_bytes`` (a
    sample is never split; ``None``: no limit). Each shard is written under a hidden temporary name
    and renamed when complete, so a reader listing ``*.tar`` never sees a half-written one; with an
    object-store ``out_dir`` (``s3://bucket/prefix``) each is uploaded whole once complete. Headers
    hold no time or owner: the same samples give the same bytes.

    Raises:
        ConfigError: a bad limit, a sample without a usable ``__key__`` or with a value of another
            type, or ``out_dir`` already holding ``<prefix>-*.tar`` shards (old shards beyond the
            new last one would be read with them).
    """
    for name, limit in (("samples_per_shard", samples_per_shard), ("max_shard_bytes", max_shard_bytes)):
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ConfigError(f"write_tar_shards: {name} must be a positive integer or None; got {limit!r}")
    out = _Destination(out_dir, prefix)
    if stale := sorted(out.existing()):
        out.close()
        raise ConfigError(
            f"write_tar_shards: {out.place} already holds {len(stale)} {prefix}-*.tar shard(s) ({stale[0]} ...); "
            "write to an empty folder or give another prefix"
        )
    written: list[Location] = []
    shard: _ShardWriter | None = None
    previous = None
    try:
        for sample in samples:
            key, members = _members(sample)
            if key == previous:  # read back, the two would be one sample
                raise ConfigError(f"write_tar_shards: two samples in a row have the key {key!r}; keys must differ")
            previous = key
            if shard is not None and (
                (samples_per_shard is not None and shard.samples >= samples_per_shard)
                or (max_shard_bytes is not None and shard.size_with(members) > max_shard_bytes)
            ):
                written.append(out.keep(shard))
                shard = None
            if shard is None:
                shard = out.start(len(written))
            shard.add(members)
        if shard is not None:
            written.append(out.keep(shard))
            shard = None
    finally:
        if shard is not None:
            shard.abort()
        out.close()
    return written


__all__ = [
    "BAD_LABEL",
    "INDEX_FOLDER",
    "LABEL_EXT",
    "NO_LABEL",
    "TarIndex",
    "TarShards",
    "index_locations",
    "split_name",
    "tar_index",
    "write_tar_shards",
]
