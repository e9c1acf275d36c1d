"""Shard indexes kept beside their shards on the object store, so a new machine fetches no shard to index it.

A source that reads records or samples by number needs each shard's index (a TFRecord shard's
record offsets, a tar shard's member offsets), built once by reading the whole shard. For a shard
on an object store the index is looked for, in order:

1. in the machine's stream cache (``<cache>/index/``, ``<cache>/tar-index/``): no request;
2. beside the shard on the store, ``<prefix>/.stoker-index/<shard name><suffix>`` (a hidden
   folder: listings of shards leave it out): one small GET, then kept in the machine's cache too;
3. built from the shard (fetched whole into the cache), then written to the machine's cache and,
   once, to the store (``StreamOptions(store_indexes=False)``: never written there).

Each index names the shard's size and version (ETag, generation): an index of a replaced shard
does not match, is never used, and is built again and written over (a store that gives its
objects no version keeps no index beside them). A PUT is atomic on an object
store (the object appears whole or not at all), so two machines building the same index at once
write the same bytes and either one's is right. A store that refuses the write (a read-only
bucket, a denied PUT) is said once per folder in an info line and left alone: the index stays in
the machine's cache, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from ...errors import StorageError
from ...storage import RetryPolicy, UrlPath, filesystem, location
from .listing import DataFile

log = logging.getLogger("stoker")

#: The hidden folder beside the shards that holds their indexes (locally and on a store).
INDEX_FOLDER = ".stoker-index"

_refused: set[str] = set()  # folders whose store refused an index: not asked again by this process
_refused_lock = threading.Lock()


def store_index_url(file: DataFile, suffix: str) -> UrlPath:
    """Where the index of the object-store shard ``file`` is kept on the store."""
    place = location(file.url)
    assert isinstance(place, UrlPath)
    return place.parent / INDEX_FOLDER / f"{file.name}{suffix}"


def _key(url: UrlPath) -> str:
    return str(filesystem(url, who="data")._strip_protocol(str(url)))


def read_store_index(file: DataFile, suffix: str, retry: RetryPolicy) -> bytes | None:
    """The bytes of ``file``'s index on the store, ``None`` when there is none or it cannot be read
    (then it is built: never an error), or when the store gives ``file`` no version (an index
    shared by every machine must tell a replaced shard of the same size from the old one)."""
    if not file.version:
        return None
    url = store_index_url(file, suffix)
    fs = filesystem(url, who="data")

    def get() -> bytes | None:
        try:
            # start=0: one ranged GET; for a whole object s3fs asks its size first (a HEAD more per shard).
            return bytes(fs.cat_file(_key(url), start=0))
        except (FileNotFoundError, PermissionError):
            return None

    try:
        return retry.call("read", url, get)
    except StorageError as e:
        log.debug("the shard index %s could not be read (%s); indexing the shard", url, e)
        return None


def write_store_index(file: DataFile, suffix: str, data: bytes, retry: RetryPolicy) -> bool:
    """Put ``data`` as ``file``'s index on the store (one PUT: atomic); ``False`` when the store
    refuses it (said once per folder, at info level) or refused one before in this process, and
    when the store gives ``file`` no version (see :func:`read_store_index`)."""
    url = store_index_url(file, suffix)
    folder = str(url.parent.parent)
    if folder in _refused or not file.version:
        return False
    fs = filesystem(url, who="data")
    try:
        retry.call("write", url, lambda: fs.pipe_file(_key(url), data))
        return True
    except (StorageError, OSError) as e:
        with _refused_lock:
            first = folder not in _refused
            _refused.add(folder)
        if first:
            log.info(
                "shard indexes are kept in this machine's stream cache only: %s refused %s (%s)",
                folder,
                url.name,
                e,
            )
        return False


def write_local_index(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` atomically (a temporary name, then a rename: processes writing
    the same index at once are harmless); ``False`` when the folder is not writable."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # its folder could not be made: nothing was written
        return False


__all__ = ["INDEX_FOLDER", "read_store_index", "store_index_url", "write_local_index", "write_store_index"]
