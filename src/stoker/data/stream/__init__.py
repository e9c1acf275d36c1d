"""Files on local disk or an object store, read one way: listed, cached, fetched ahead.

A source names its data by a local path or a URL (``s3://``, ``gs://``, ``az://``, ``file://``);
:func:`files_of` / :func:`list_files` list them (fsspec for URLs, each store with its own
credentials), a :class:`FileSet` opens them: a local file in place, an object-store file from
its copy in the machine's :class:`ShardCache` (fetched whole, once per machine, kept across runs,
bounded), fetched ahead of use by a :class:`ReadAhead`. So the decoders read local files
whatever the store. :func:`open_file` and :func:`local_path` do the same for one file.

- :mod:`.options`: :class:`StreamOptions` (cache folder and limit, read-ahead, retries);
- :mod:`.listing`: :class:`DataFile` (url, size, version) and listing;
- :mod:`.cache`: the cache (atomic renames, file locks, LRU eviction);
- :mod:`.readahead`: the fetching threads;
- :mod:`.indexes`: shard indexes kept beside the shards on the store (a new machine reads them);
- :mod:`.files`: :class:`FileSet`.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO

from .cache import ShardCache
from .files import FileSet, as_data_file
from .listing import DataFile, PathLike, files_of, is_folder, is_remote, list_files, local_file, remote_file
from .options import READ_AHEAD_BYTES, StreamOptions
from .readahead import ReadAhead


def open_file(path: PathLike | DataFile, stream: StreamOptions | None = None) -> IO[bytes]:
    """``path`` (a local path, a URL or a :class:`DataFile`) opened for binary reading: a local
    file in place, an object-store one from the cache (fetched now when it is not there)."""
    return FileSet([as_data_file(path)], stream).open(0)


def local_path(path: PathLike | DataFile, stream: StreamOptions | None = None) -> Path:
    """A local path holding ``path``'s bytes: itself when local, its cached copy when remote (a
    copy the cache may evict later: open it soon, or use :func:`open_file`)."""
    return FileSet([as_data_file(path)], stream).local(0)


__all__ = [
    "READ_AHEAD_BYTES",
    "DataFile",
    "FileSet",
    "PathLike",
    "ReadAhead",
    "ShardCache",
    "StreamOptions",
    "as_data_file",
    "files_of",
    "is_folder",
    "is_remote",
    "list_files",
    "local_file",
    "local_path",
    "open_file",
    "remote_file",
]
