"""``FileSet``: the files a source reads, local ones in place, object-store ones through the cache.

A source holds one :class:`FileSet` and asks it for file ``k`` as a local path
(:meth:`FileSet.local`) or its bytes (:meth:`FileSet.read_bytes`); a local file is itself, an
object-store one is its copy in the machine's :class:`~.cache.ShardCache`, fetched on first use
(and ahead of use by the source's :class:`~.readahead.ReadAhead`). So everything after that is a
local read, whatever the store, and the source's code never asks which kind it holds.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

from ...storage import UrlPath, filesystem, location
from .cache import ShardCache
from .listing import DataFile, is_remote, local_file, remote_file
from .options import StreamOptions
from .readahead import ReadAhead


def as_data_file(path: Any) -> DataFile:
    """``path`` (a :class:`DataFile`, a local path or a URL) as a :class:`DataFile`."""
    if isinstance(path, DataFile):
        return path
    place = location(path)
    return remote_file(place) if isinstance(place, UrlPath) else local_file(place)


class FileSet:
    """The files ``files`` read through ``stream``'s cache where they are on an object store.

    Args:
        files: the files, in the source's order.
        stream: the cache and read-ahead settings (:class:`~.options.StreamOptions`).
    """

    def __init__(self, files: Sequence[DataFile], stream: StreamOptions | None = None) -> None:
        self.files = list(files)
        self.stream = StreamOptions() if stream is None else stream
        self._remote = [is_remote(f.url) for f in self.files]
        #: Whether any file is on an object store (read through the cache).
        self.remote = any(self._remote)
        self._cache: ShardCache | None = None
        self._ahead: ReadAhead | None = None

    def __len__(self) -> int:
        return len(self.files)

    @property
    def cache(self) -> ShardCache:
        """The machine's cache these files go through (made on first use)."""
        if self._cache is None:
            self._cache = ShardCache(self.stream)
        return self._cache

    def name(self, k: int) -> str:
        """File ``k`` as printed: its path or URL."""
        return self.files[k].url

    def size(self, k: int) -> int:
        return self.files[k].size

    def local(self, k: int) -> Path:
        """A local path holding file ``k``'s bytes (fetched into the cache now if it is remote and not there)."""
        if not self._remote[k]:
            return Path(self.files[k].url)
        return self.cache.get(self.files[k])

    def cached(self, k: int) -> bool:
        """Whether file ``k`` can be read without a request (local, or in the cache)."""
        return not self._remote[k] or self.cache.holds(self.files[k])

    def fetch(self, k: int) -> None:
        """Bring file ``k`` into the cache (nothing for a local file)."""
        if self._remote[k] and not self.cache.holds(self.files[k]):
            self.cache.fetch(self.files[k])

    def open_fd(self, k: int) -> int:
        """An open read-only file descriptor of file ``k`` (its cached copy when remote; a copy
        another process evicts between the lookup and the open is fetched again)."""
        if not self._remote[k]:
            return os.open(self.files[k].url, os.O_RDONLY | os.O_CLOEXEC)
        for _ in range(3):
            try:
                return os.open(self.cache.get(self.files[k]), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # evicted meanwhile: an open file survives eviction, a path does not
        return os.open(self.cache.fetch(self.files[k]), os.O_RDONLY | os.O_CLOEXEC)

    def open(self, k: int) -> IO[bytes]:
        """File ``k`` opened for reading (binary)."""
        return os.fdopen(self.open_fd(k), "rb")

    def read_bytes(self, k: int) -> bytes:
        """File ``k``'s bytes."""
        with self.open(k) as f:
            return f.read()

    def read_range(self, k: int, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of file ``k``: read in place when it is local or cached, else one
        ranged request to the store, the file not fetched (for a few scattered reads, such as the
        ``decoder="auto"`` probe's: fetching whole shards for them would fetch the data set)."""
        if self.cached(k):
            fd = self.open_fd(k)
            try:
                return os.pread(fd, end - start, start)
            finally:
                os.close(fd)
        url = location(self.files[k].url)
        assert isinstance(url, UrlPath)
        fs = filesystem(url, who="data")
        key = fs._strip_protocol(str(url))
        return self.stream.retry.call("read", url, lambda: bytes(fs.cat_file(key, start=start, end=end)))

    def ahead(self, ks: Iterable[int]) -> None:
        """Fetch the remote files among ``ks`` (the order they will be read in) ahead of their
        reads, in the background, within the read-ahead budget (:class:`~.readahead.ReadAhead`)."""
        if not self.remote:
            return
        if self._ahead is None:
            budget = min(self.stream.read_ahead_bytes, self.cache.limit // 2)
            self._ahead = ReadAhead(self, threads=self.stream.fetch_threads, budget=budget)
        self._ahead.want(k for k in ks if self._remote[k])

    def folder(self) -> str | None:
        """The folder (or URL prefix) that directly holds every file, or ``None`` when they are spread."""
        parents = {f.url.rstrip("/").rsplit("/", 1)[0] for f in self.files}
        return parents.pop() if len(parents) == 1 else None


T = TypeVar("T")


def index_all(files: FileSet, index: Callable[[int], T], *, desc: str, progress: bool = True) -> Iterator[T]:
    """``index(k)`` of every file of ``files``, in order, behind a progress bar (shown when it
    takes over a second, ``progress=False``: never): object-store files, fetched to be indexed, on
    ``fetch_threads`` threads at once; local ones in turn."""
    from tqdm.auto import tqdm

    ks = range(len(files))
    with ThreadPoolExecutor(files.stream.fetch_threads, thread_name_prefix="stoker-io-index") as pool:
        jobs = pool.map(index, ks) if files.remote else map(index, ks)
        yield from tqdm(jobs, total=len(ks), desc=desc, unit="shard", delay=1.0, disable=None if progress else True)


class OpenFiles:
    """Read-only descriptors of a :class:`FileSet`'s files, opened at first use; the ``max_open``
    most recently used stay open. A copy or an unpickled one holds none: descriptors mean nothing
    in another process, and another thread's reader may close its own at any time."""

    def __init__(self, files: FileSet, max_open: int = 64) -> None:
        self.files = files
        self.max_open = max_open
        self._open: OrderedDict[int, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def fd(self, k: int) -> int:
        """File ``k``'s descriptor (``OSError`` when it cannot be opened)."""
        fd = self._open.get(k)
        if fd is not None:
            self._open.move_to_end(k)
            return fd
        fd = self.files.open_fd(k)
        self._open[k] = fd
        if len(self._open) > self.max_open:
            os.close(self._open.popitem(last=False)[1])
        return fd

    def close(self) -> None:
        """Close every open descriptor (reads reopen them)."""
        while self._open:
            os.close(self._open.popitem()[1])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        return state

    def __copy__(self) -> OpenFiles:
        view = object.__new__(OpenFiles)
        view.__dict__.update(self.__getstate__())
        return view

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: os may be gone
            pass


__all__ = ["OpenFiles", "index_all", "FileSet", "as_data_file"]
