"""Where a run's files live: local directories and fsspec URLs, retried one way, and the lock object.

Owns the store operations (:mod:`~stoker.storage.stores`: read, write durably, list, remove,
conditional writes on object stores), how faults are retried and timed out
(:mod:`~stoker.storage.retry`), and the lock object that serialises index writers on a store
without conditional writes (:mod:`~stoker.storage.lock`). It is the bottom of the house: it
imports nothing of stoker but :mod:`stoker.errors`.
"""

from .retry import DEFAULT_RETRY, RetryPolicy, explain, is_transient
from .stores import (
    Location,
    UrlPath,
    check_dir,
    download,
    exists,
    file_sizes,
    files_under,
    filesystem,
    fsync_dir,
    is_dir,
    is_file,
    listdir,
    local_cache,
    location,
    makedirs,
    put_if,
    read_bytes,
    read_versioned,
    remove_tree,
    supports_conditional_writes,
    upload,
    url_lock,
    write_all,
)

__all__ = [
    "DEFAULT_RETRY",
    "Location",
    "RetryPolicy",
    "UrlPath",
    "check_dir",
    "download",
    "exists",
    "explain",
    "file_sizes",
    "files_under",
    "filesystem",
    "fsync_dir",
    "is_dir",
    "is_file",
    "is_transient",
    "listdir",
    "local_cache",
    "location",
    "makedirs",
    "put_if",
    "read_bytes",
    "read_versioned",
    "remove_tree",
    "supports_conditional_writes",
    "upload",
    "url_lock",
    "write_all",
]
