"""Where a source's files are: local paths and object-store URLs listed one way.

A file is a :class:`DataFile`: its location as given (a path, or a URL such as
``s3://bucket/train-00000-of-01024``), its size and its *version*, what changes when its content
does (an object's ETag or generation, a local file's modification time). The cache keys a copy by
all three, so a replaced object is fetched again, never read stale. Listing goes through
:mod:`stoker.storage` (fsspec for URLs, with its retries), so any store fsspec knows works with its
own credentials: ``s3://`` (``s3fs``: the AWS environment variables and config files),
``gs://`` (``gcsfs``: Application Default Credentials), ``az://`` / ``abfs://`` (``adlfs``: the
``AZURE_STORAGE_*`` variables). ``file://`` URLs are local paths.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Any, NamedTuple

from ...errors import DataError
from ...storage import DEFAULT_RETRY, Location, RetryPolicy, UrlPath, filesystem, location

PathLike = str | os.PathLike[str]

# What an object store reports that changes when the object does, by store (s3fs, gcsfs, adlfs, local).
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified", "mtime", "created")


class DataFile(NamedTuple):
    """One file a source reads: where (a local path or a URL, as printed), its size and its version."""

    url: str
    size: int
    version: str

    @property
    def name(self) -> str:
        """The file's own name (the last part of its path)."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]


def where(path: PathLike | PurePath) -> Location:
    """``path`` as a local ``Path`` or a :class:`~stoker.storage.UrlPath` (``file://`` is local)."""
    return location(path)


def is_remote(path: PathLike | PurePath) -> bool:
    """Whether ``path`` is an object-store URL (not a local path or ``file://``)."""
    return isinstance(location(path), UrlPath)


def _key(path: UrlPath) -> str:
    return str(filesystem(path, who="data")._strip_protocol(str(path)))


def _version(info: dict[str, Any]) -> str:
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value not in (None, ""):
            return str(value)
    return ""


def local_file(path: PathLike) -> DataFile:
    """A local file as a :class:`DataFile` (its version: the modification time in ns)."""
    stat = os.stat(path)
    return DataFile(str(path), int(stat.st_size), str(stat.st_mtime_ns))


def remote_file(url: UrlPath, retry: RetryPolicy = DEFAULT_RETRY) -> DataFile:
    """The object at ``url`` as a :class:`DataFile`; a :class:`DataError` when there is none."""
    fs = filesystem(url, who="data")

    def info() -> dict[str, Any] | None:
        try:
            return dict(fs.info(_key(url), refresh=True))
        except FileNotFoundError:
            return None

    found = retry.call("look up", url, info)
    if found is None or found.get("type") == "directory":
        raise DataError(f"{url} does not exist")
    return DataFile(str(url), int(found.get("size") or 0), _version(found))


def list_files(
    folder: Location, *, recursive: bool = False, retry: RetryPolicy = DEFAULT_RETRY
) -> list[tuple[str, DataFile]]:
    """``(relative POSIX name, file)`` of every file in ``folder`` (below it with ``recursive``),
    sorted by name; names with a hidden part (``.stoker-index/...``) are left out. Empty when the
    folder does not exist."""
    if not isinstance(folder, UrlPath):
        return _list_local(Path(folder), recursive)
    fs = filesystem(folder, who="data")
    base = _key(folder).rstrip("/") + "/"

    def find() -> dict[str, Any]:
        fs.invalidate_cache(base.rstrip("/"))
        try:
            return dict(fs.find(base, maxdepth=None if recursive else 1, withdirs=False, detail=True))
        except FileNotFoundError:
            return {}

    found = retry.call("list", folder, find)
    out = []
    for key, info in found.items():
        key = str(key)
        if not key.startswith(base) or info.get("type") == "directory":
            continue
        rel = key[len(base) :]
        if not rel or any(part.startswith(".") for part in rel.split("/")):
            continue
        out.append((rel, DataFile(f"{folder}/{rel}", int(info.get("size") or 0), _version(info))))
    return sorted(out)


def _list_local(folder: Path, recursive: bool) -> list[tuple[str, DataFile]]:
    if not folder.is_dir():
        return []
    if not recursive:
        names = [e.name for e in os.scandir(folder) if e.is_file() and not e.name.startswith(".")]
        return sorted((n, local_file(folder / n)) for n in names)
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            if not f.startswith("."):
                path = Path(dirpath, f)
                out.append((path.relative_to(folder).as_posix(), local_file(path)))
    return sorted(out)


def is_folder(path: PathLike | PurePath) -> bool:
    """Whether ``path`` is a local folder or an object-store prefix holding objects."""
    place = location(path)
    if isinstance(place, UrlPath):
        fs = filesystem(place, who="data")
        return bool(DEFAULT_RETRY.call("look up", place, lambda: fs.isdir(_key(place))))
    return place.is_dir()


def files_of(paths: PathLike | Sequence[PathLike], *, recursive: bool = True) -> list[DataFile]:
    """The files ``paths`` name, in the order given: a file is itself, a folder its files (sorted,
    hidden ones left out, below it with ``recursive``); a path that names neither is a
    :class:`DataError`."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[DataFile] = []
    for item in items:
        place = location(item)
        if isinstance(place, UrlPath):
            inside = list_files(place, recursive=recursive)
            out.extend(f for _, f in inside) if inside else out.append(remote_file(place))
        elif place.is_file():
            out.append(local_file(place))
        elif place.is_dir():
            out.extend(f for _, f in _list_local(place, recursive))
        else:
            raise DataError(f"{item} does not exist")
    return out


__all__ = [
    "DataFile",
    "PathLike",
    "files_of",
    "is_folder",
    "is_remote",
    "list_files",
    "local_file",
    "remote_file",
    "where",
]
