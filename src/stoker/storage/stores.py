"""Where checkpoints live: a local directory or any fsspec URL, with faults handled one way.

``model_dir`` may be a local path (today's code path: ``os`` calls, fsyncs, atomic renames) or
an fsspec URL (``s3://``, ``gs://``, ``file://``, ``memory://``). A remote location is held as
a :class:`UrlPath`, a pure path that prints as its URL, so ``/``, ``.name`` and ``.parent``
work on both kinds and the code above this module never asks which kind it holds; the
functions here (:func:`read_bytes`, :func:`exists`, :func:`listdir`, ...) dispatch on it.

Every operation that touches storage goes through :meth:`RetryPolicy.call`:

* transient faults (``EAGAIN``, ``EBUSY``, ``ETIMEDOUT``, connection resets, HTTP 5xx and
  throttling from an object store) are retried a bounded number of times, with exponential
  backoff, each retry logged;
* an operation that does not finish within ``timeout`` seconds (a store that stops answering)
  is abandoned;
* anything else, or the last failed retry, raises :class:`~stoker.errors.StorageError` naming
  the path and the cause in words (``no space left on the device or quota exceeded``,
  ``read-only or not writable``, ``did not answer within 30 s``).

The commit protocols built on this (rename locally, index-as-commit-point on object stores)
are in ``stoker.checkpoint``; see docs/checkpoints.md.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import wait
from pathlib import Path, PurePath, PurePosixPath
from typing import Any, TypeVar

from ..errors import ConfigError, StorageError
from .retry import DEFAULT_RETRY, RetryPolicy, _executor, _pool_lock, explain, is_transient

log = logging.getLogger("stoker")
T = TypeVar("T")

# Extras that provide a protocol, for the error when one is missing.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure", "abfss": "azure"}


class UrlPath(PurePosixPath):
    """A location in an fsspec filesystem (``s3://bucket/run``), with pure-path arithmetic.

    Stored as ``s3:/bucket/run`` (a pure path keeps one slash), printed as the URL.
    """

    def __str__(self) -> str:
        scheme, _, rest = super().__str__().partition(":/")
        return f"{scheme}://{rest}"

    def __fspath__(self) -> str:  # an fsspec location is not a local file
        raise TypeError(f"{self} is not a local path")

    @property
    def protocol(self) -> str:
        return self.parts[0].rstrip(":")


Location = Path | UrlPath


def location(path: str | os.PathLike[str] | PurePath) -> Location:
    """``path`` as a local ``Path``, or a ``UrlPath`` for a URL with a protocol (``file://`` and
    ``local://`` are local)."""
    if isinstance(path, (Path, UrlPath)):
        return path
    text = str(path)
    scheme, sep, rest = text.partition("://")
    if not sep or "/" in scheme or len(scheme) < 2:
        return Path(text)
    if scheme in ("file", "local"):  # fsspec's two names for the local filesystem
        return Path("/" + rest.lstrip("/"))
    return UrlPath(f"{scheme}:/{rest.strip('/')}")


def filesystem(path: UrlPath, *, who: str = "model_dir") -> Any:
    """The fsspec filesystem of ``path``; a missing optional extra is named (``who``: what the
    path is, for the message: ``model_dir``, ``data``)."""
    try:
        import fsspec
    except ImportError as e:  # pragma: no cover - fsspec comes with torch
        raise StorageError(f"{who} {str(path)!r} needs fsspec: pip install fsspec") from e
    try:
        return fsspec.filesystem(path.protocol)
    except (ImportError, ValueError) as e:
        extra = _EXTRAS.get(path.protocol)
        hint = f"pip install 'stoker[{extra}]'" if extra else f"install the fsspec implementation of {path.protocol}://"
        raise StorageError(
            f"{who} {str(path)!r}: the {path.protocol}:// protocol is not available ({e}); {hint}"
        ) from e


def _key(path: UrlPath) -> str:
    return str(filesystem(path)._strip_protocol(str(path)))


# ---------------------------------------------------------------------------- local files
def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems do not allow opening directories
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` and fsync it; return its sha256."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def _write_one(path: Location, data: bytes, retry: RetryPolicy) -> str:
    if isinstance(path, UrlPath):
        retry.call("write", path, lambda: filesystem(path).pipe_file(_key(path), data))
        return hashlib.sha256(data).hexdigest()
    # module lookup at call time: tests wrap _write_durably to inject faults
    return retry.call("write", path, lambda: _write_durably(path, data))


def write_all(jobs: Sequence[tuple[Location, bytes]], retry: RetryPolicy = DEFAULT_RETRY) -> list[str]:
    """Write (and locally fsync) each ``(path, data)`` concurrently; their sha256s, in order.

    fsync releases the GIL and the filesystem commits concurrent fsyncs together; object
    stores take concurrent uploads. Each write is retried on its own; if they have not all
    finished within ``retry.timeout`` the store counts as not answering. Raises the first
    error after every write has finished.
    """
    if len(jobs) == 1 and threading.current_thread().name.startswith("stoker-io"):
        return [_write_one(*jobs[0], retry)]
    futures = [_executor().submit(_write_one, path, data, retry) for path, data in jobs]
    done, pending = wait(futures, timeout=retry.timeout if retry.timeout > 0 else None)
    if pending:
        stuck = [str(path) for (path, _), f in zip(jobs, futures, strict=True) if f in pending]
        raise StorageError(f"cannot write {stuck[0]}: the store did not answer within {retry.timeout:g} s")
    for f in futures:
        e = f.exception()
        if e is not None:
            raise e
    return [f.result() for f in futures]


# ---------------------------------------------------------------------------- both kinds
def read_bytes(path: Location, retry: RetryPolicy = DEFAULT_RETRY) -> bytes:
    if isinstance(path, UrlPath):
        return retry.call("read", path, lambda: filesystem(path).cat_file(_key(path)))
    return path.read_bytes()


def exists(path: Location) -> bool:
    if isinstance(path, UrlPath):
        return bool(DEFAULT_RETRY.call("look up", path, lambda: filesystem(path).exists(_key(path))))
    return path.exists()


def is_dir(path: Location) -> bool:
    if isinstance(path, UrlPath):
        return bool(DEFAULT_RETRY.call("look up", path, lambda: filesystem(path).isdir(_key(path))))
    return path.is_dir()


def is_file(path: Location) -> bool:
    if isinstance(path, UrlPath):
        return bool(DEFAULT_RETRY.call("look up", path, lambda: filesystem(path).isfile(_key(path))))
    return path.is_file()


def listdir(path: Location) -> list[str]:
    """Names directly under ``path`` (empty when it does not exist)."""
    if isinstance(path, UrlPath):
        fs = filesystem(path)
        try:
            entries = DEFAULT_RETRY.call("list", path, lambda: fs.ls(_key(path), detail=False, refresh=True))
        except StorageError as e:
            if isinstance(e.__cause__, FileNotFoundError):
                return []
            raise
        return sorted({str(p).rstrip("/").rsplit("/", 1)[-1] for p in entries})
    return sorted(p.name for p in path.iterdir()) if path.is_dir() else []


def files_under(path: Location) -> list[str]:
    """Every file below ``path``, as sorted relative POSIX names."""
    if isinstance(path, UrlPath):
        fs = filesystem(path)
        base = _key(path).rstrip("/") + "/"
        found = DEFAULT_RETRY.call("list", path, lambda: fs.find(_key(path)))
        return sorted(str(p)[len(base) :] for p in found if str(p).startswith(base))
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


def file_sizes(path: Location, retry: RetryPolicy = DEFAULT_RETRY) -> dict[str, int]:
    """``{relative name: size}`` of every file below ``path``, as the storage lists them."""
    if isinstance(path, UrlPath):
        fs = filesystem(path)
        base = _key(path).rstrip("/") + "/"

        def find() -> dict[str, Any]:
            fs.invalidate_cache(_key(path))
            return fs.find(_key(path), detail=True)

        found = retry.call("list", path, find)
        return {k[len(base) :]: int(v.get("size") or 0) for k, v in found.items() if k.startswith(base)}
    return {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file()}


def check_dir(path: str | os.PathLike[str] | Location, name: str, *, writable: bool = True) -> None:
    """Raise a one-line :class:`~stoker.errors.ConfigError` naming ``name`` (``"model_dir"``,
    ``"--train_dir"``) when ``path`` cannot be a directory stoker uses: a file, a path under a
    file, a directory (or its nearest existing parent) that is read-only or not writable when
    ``writable``, or an object-store URL whose bucket does not exist. It only looks: nothing is
    created, so a refused path is left as it was."""
    where = location(path)
    if isinstance(where, UrlPath):
        _check_bucket(where, name)
        return
    if where.exists() and not where.is_dir():
        advice = "; give a directory (created if missing)" if writable else ""
        raise ConfigError(f"{name} {str(path)!r} is a file, not a directory{advice}")
    existing = next(p for p in (where, *where.absolute().parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        raise ConfigError(f"{name} {str(path)!r} cannot be created: {str(existing)!r} is a file, not a directory")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        # access() answers EROFS for a read-only mount, even to root; statvfs says which it was
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "is on a read-only file system" if read_only else "is not writable by this user"
        if existing != where:
            why = f"cannot be created: {str(existing)!r} {why}"
        raise ConfigError(f"{name} {str(path)!r} {why}; give a writable directory")


def _check_bucket(path: UrlPath, name: str) -> None:
    """A bucket that surely does not exist is refused; any doubt (no rights to look, a store
    that does not answer) is left to the first real operation, which names its cause."""
    if path.protocol not in _EXTRAS or len(path.parts) < 2:
        return  # memory:// and the like have no buckets
    bucket = path.parts[1]
    try:
        fs = filesystem(path)
        found = RetryPolicy(attempts=1, timeout=30.0).call("look up", path, lambda: fs.exists(bucket))
    except Exception:  # noqa: BLE001 - see the docstring
        return
    if not found:
        raise ConfigError(
            f"{name} {str(path)!r}: the bucket {bucket!r} does not exist (or these credentials cannot see it); "
            "create it first"
        )


def makedirs(path: Location, retry: RetryPolicy = DEFAULT_RETRY) -> None:
    if isinstance(path, UrlPath):
        return  # object stores have no directories
    retry.call("create the directory", path, lambda: path.mkdir(parents=True, exist_ok=True))


def remove_tree(path: Location) -> None:
    """Delete ``path`` and everything below it; errors are logged, not raised (cleanup only)."""
    try:
        if isinstance(path, UrlPath):
            fs = filesystem(path)
            if fs.exists(_key(path)):
                fs.rm(_key(path), recursive=True)
        else:
            import shutil

            shutil.rmtree(path, ignore_errors=True)
    except Exception as e:  # noqa: BLE001 - a leftover is harmless and removed next start
        log.warning("could not remove %s (%s); it is removed at the next start", path, explain(e))


# ---------------------------------------------------------------------------- conditional writes
_url_locks: dict[str, threading.Lock] = {}


def url_lock(path: UrlPath) -> threading.Lock:
    """A process-wide lock for ``path``: part of ``stoker.storage.lock.index_lock``, for the threads of one process."""
    with _pool_lock:
        return _url_locks.setdefault(str(path), threading.Lock())


def _conditional_store(fs: Any) -> str | None:
    """``"s3"`` or ``"gcs"`` for the filesystems whose conditional writes stoker uses, else None."""
    names = {c.__name__ for c in type(fs).__mro__}  # gcsfs may hand out a subclass (ExtendedGcsFileSystem)
    return "s3" if "S3FileSystem" in names else "gcs" if "GCSFileSystem" in names else None


def supports_conditional_writes(path: UrlPath) -> bool:
    """Whether the store can write an object only if its version is unchanged (S3 If-Match, GCS generations)."""
    return _conditional_store(filesystem(path)) is not None


def read_versioned(path: UrlPath, retry: RetryPolicy = DEFAULT_RETRY) -> tuple[bytes | None, str | None]:
    """``path``'s content and version (S3: ETag, GCS: generation), or ``(None, None)`` when it does not exist."""
    fs, key = filesystem(path), _key(path)
    kind = _conditional_store(fs)

    def read() -> tuple[bytes | None, str | None]:
        fs.invalidate_cache(key)
        try:
            # The version before the content: if another writer replaces the object in between,
            # the content is newer than the version and the conditional write fails (then
            # redone), never the other way round, which would lose that writer's update.
            info = fs.info(key)
            data = fs.cat_file(key)
        except FileNotFoundError:
            return None, None
        if kind == "gcs":
            return data, str(info["generation"])
        return data, info.get("ETag") or info.get("generation")

    return retry.call("read", path, read)


def _gcs_put(fs: Any, key: str, data: bytes, generation: str) -> None:
    """Upload ``data`` to ``key`` with the precondition ``ifGenerationMatch=generation``.

    ``"0"``: only if no live object exists. A failed precondition is HTTP 412, which gcsfs
    raises as ``FileExistsError`` (older releases: ``HttpError`` with ``code`` 412). gcsfs's
    ``pipe_file`` offers only the ``"0"`` case (``mode="create"``), so this is the JSON API's
    multipart upload, as gcsfs's own ``simple_upload`` sends it, with the parameter added.
    """
    from urllib.parse import quote

    bucket, name, _ = fs.split_path(key)
    boundary = f"stoker-{uuid.uuid4().hex}"  # random: cannot occur in the data
    head = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps({'name': name})}\r\n"
        f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    body = head.encode() + data + f"\r\n--{boundary}--\r\n".encode()
    out = fs.call(
        "POST",
        f"{fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
        uploadType="multipart",
        ifGenerationMatch=generation,
        headers={"Content-Type": f'multipart/related; boundary="{boundary}"'},
        data=body,
        json_out=True,
    )
    if int(out.get("size", len(data))) != len(data):
        raise OSError(errno.EIO, f"the store kept {out.get('size')} of {len(data)} bytes")


def put_if(path: UrlPath, data: bytes, version: str | None, retry: RetryPolicy = DEFAULT_RETRY) -> bool:
    """Write ``path`` only if it still has ``version`` (``None``: only if it does not exist).

    Returns False when another writer changed it first (HTTP 412). S3: ``If-None-Match: *`` /
    ``If-Match: <ETag>``; GCS: ``ifGenerationMatch=0`` / ``ifGenerationMatch=<generation>``.
    On other stores it writes unconditionally: callers hold ``stoker.storage.lock.index_lock``.
    """
    fs, key = filesystem(path), _key(path)
    kind = _conditional_store(fs)

    def put() -> bool:
        try:
            if kind == "gcs":
                _gcs_put(fs, key, data, version or "0")
            elif kind is None:
                fs.pipe_file(key, data)
            elif version is None:
                fs.pipe_file(key, data, mode="create")
            else:
                fs.pipe_file(key, data, IfMatch=version)
        except Exception as e:  # noqa: BLE001 - s3fs and gcsfs map HTTP 412 to several types
            text = f"{type(e).__name__} {e} {e.__cause__}"
            if (
                isinstance(e, FileExistsError)
                or getattr(e, "code", None) == 412
                or any(t in text for t in ("PreconditionFailed", "412", "ConditionalRequestConflict"))
            ):
                return False
            raise
        finally:
            fs.invalidate_cache(key)
        return True

    return retry.call("write", path, put)


def upload(local: Path, remote: UrlPath, retry: RetryPolicy = DEFAULT_RETRY) -> None:
    """Copy the local file ``local`` to ``remote`` (whole)."""
    data = local.read_bytes()
    retry.call("write", remote, lambda: filesystem(remote).pipe_file(_key(remote), data))


def download(remote: UrlPath, local: Path, retry: RetryPolicy = DEFAULT_RETRY) -> bool:
    """Copy ``remote`` to the local file ``local``; False when ``remote`` does not exist."""
    if not exists(remote):
        return False
    local.write_bytes(read_bytes(remote, retry))
    return True


def local_cache(path: UrlPath) -> Path:
    """A local directory that mirrors ``path`` for writers that need real files (summaries)."""
    import tempfile

    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"stoker-{os.getuid() if hasattr(os, 'getuid') else 0}" / digest
    cache.mkdir(parents=True, exist_ok=True)
    return cache


__all__ = [
    "DEFAULT_RETRY",
    "Location",
    "RetryPolicy",
    "UrlPath",
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
    "download",
]
