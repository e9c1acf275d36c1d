"""A test fsspec store, ``shared://``, that several processes see: files under one local directory.

Not a test module. It stands for a store with no conditional writes (webdav, sftp, a network
filesystem mounted through fsspec) that a trainer and an evaluator in different processes
share; ``file://`` is a local path to stoker (flock), ``memory://`` lives in one process.
Its ``open(..., "xb")`` is the local ``O_EXCL`` create. The directory is
``$STOKER_SHARED_STORE`` (set it in every process, then call :func:`register`).
"""

from __future__ import annotations

import os

import fsspec
from fsspec.implementations.local import LocalFileSystem

ROOT_ENV = "STOKER_SHARED_STORE"


class SharedStore(LocalFileSystem):
    """``shared://bucket/key`` is ``$STOKER_SHARED_STORE/bucket/key``."""

    protocol = "shared"

    def __init__(self, **kwargs: object) -> None:
        super().__init__(auto_mkdir=True, **kwargs)

    @classmethod
    def _strip_protocol(cls, path):  # noqa: ANN001, ANN206
        path = str(path)
        for prefix in ("shared://", "shared:"):
            if path.startswith(prefix):
                path = path.removeprefix(prefix)
                break
        root = os.environ[ROOT_ENV].rstrip("/")
        return path if path.startswith(root + "/") or path == root else f"{root}/{path.lstrip('/')}".rstrip("/")

    def unstrip_protocol(self, name: str) -> str:
        root = os.environ[ROOT_ENV].rstrip("/")
        return "shared://" + name.removeprefix(root).lstrip("/")


def register() -> None:
    fsspec.register_implementation("shared", SharedStore, clobber=True)
