"""``StreamOptions``: how files on an object store are brought to this machine.

A source reading ``s3://``, ``gs://`` or ``az://`` data reads every file whole into a local cache
(:mod:`.cache`) and then reads it there as it would a local file; a read-ahead thread (:mod:`.readahead`)
fetches the files the next batches need before they are asked for. These are the knobs of that,
given to a source as ``ReadOptions(stream=StreamOptions(...))``; local files ignore them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..._cache import cache_dir
from ...errors import ConfigError
from ...storage import DEFAULT_RETRY, RetryPolicy

#: The default read-ahead: files the coming batches need, fetched until this many bytes are ahead.
READ_AHEAD_BYTES = 1 << 30


def _nonnegative_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, kw_only=True)
class StreamOptions:
    """How a source streams files from an object store: the local cache, the read-ahead, the retries.

    Args:
        cache_dir: the local folder the files are cached in, shared by every process of this
            machine that reads the same objects and kept across runs; ``None``:
            ``<stoker's cache>/data`` (``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else
            ``~/.cache/stoker``).
        cache_limit: bytes the cache may hold; the least recently used files are deleted beyond
            it. ``None``: half the space free on the cache's disk when the source is built, plus
            what the cache already holds.
        read_ahead_bytes: how far ahead of the batch being read files are fetched, in bytes of the
            files the coming batches need (at most half the cache limit); ``0``: no read-ahead.
        fetch_threads: files fetched at once by the read-ahead.
        retry: how a failed request is retried (:class:`stoker.storage.RetryPolicy`: transient
            faults with backoff, then an error naming the object).
        store_indexes: write each shard index a source builds beside its shard on the store
            (``<prefix>/.stoker-index/``), so another machine reads it instead of fetching the
            shard (:mod:`.indexes`); ``False``: read indexes found there, never write one. A store
            that refuses the write is left alone either way.
    """

    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | None = None
    read_ahead_bytes: int = READ_AHEAD_BYTES
    fetch_threads: int = 8
    retry: RetryPolicy = field(default=DEFAULT_RETRY)
    store_indexes: bool = True

    def __post_init__(self) -> None:
        if self.cache_limit is not None and not (_nonnegative_int(self.cache_limit) and self.cache_limit > 0):
            raise ConfigError(
                f"StreamOptions: cache_limit must be a positive number of bytes or None; got {self.cache_limit!r}"
            )
        if not _nonnegative_int(self.read_ahead_bytes):
            raise ConfigError(f"StreamOptions: read_ahead_bytes must be an integer >= 0; got {self.read_ahead_bytes!r}")
        if not (_nonnegative_int(self.fetch_threads) and self.fetch_threads >= 1):
            raise ConfigError(f"StreamOptions: fetch_threads must be a positive integer; got {self.fetch_threads!r}")
        if not isinstance(self.store_indexes, bool):
            raise ConfigError(f"StreamOptions: store_indexes must be True or False; got {self.store_indexes!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(f"StreamOptions: retry must be a stoker.storage.RetryPolicy; got {self.retry!r}")

    @property
    def cache_path(self) -> Path:
        """The cache folder these options name."""
        return Path(self.cache_dir) if self.cache_dir is not None else cache_dir() / "data"


__all__ = ["READ_AHEAD_BYTES", "StreamOptions"]
