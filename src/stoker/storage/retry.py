"""How storage faults are retried: transient or not, bounded retries with backoff, and a timeout.

Every operation on a store goes through :meth:`RetryPolicy.call`. A call runs on a small
``stoker-io`` thread pool so that one that never returns (a store that stops answering) can be
abandoned after ``timeout`` seconds; the pool is forgotten in a forked child, which has none of
its parent's threads. :func:`is_transient` decides what is retried, :func:`explain` says a cause
in words for the error that names the path.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import ConfigError, StorageError

log = logging.getLogger("stoker")
T = TypeVar("T")

_TRANSIENT_ERRNOS = {
    errno.EAGAIN,
    errno.EBUSY,
    errno.EINTR,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.EPIPE,
}
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "InternalError",
    "ServiceUnavailable",
    "RequestLimitExceeded",
    "500",
    "502",
    "503",
    "504",
}


@dataclass(kw_only=True, frozen=True)
class RetryPolicy:
    """How storage faults are retried.

    Attributes:
        attempts: tries of one operation before a transient fault becomes an error.
        backoff: seconds before the first retry; doubled each retry (with jitter), at most
            ``max_backoff``.
        timeout: seconds one operation may take before the store counts as not answering
            (0: no limit).
    """

    attempts: int = 5
    backoff: float = 0.2
    max_backoff: float = 10.0
    timeout: float = 600.0

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise ConfigError(f"RetryPolicy.attempts must be a positive integer; got {self.attempts!r}")
        for name in ("backoff", "max_backoff", "timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"RetryPolicy.{name} must be a number >= 0 (seconds); got {value!r}")

    def call(self, what: str, path: Any, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` with retries and a timeout; a failure raises ``StorageError``."""
        wait = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                return _with_timeout(self.timeout, fn, *args)
            except FutureTimeout as e:
                raise StorageError(f"cannot {what} {path}: the store did not answer within {self.timeout:g} s") from e
            except StorageError:
                raise
            except Exception as e:  # noqa: BLE001 - classified below
                if not is_transient(e) or attempt == self.attempts:
                    tries = f" after {attempt} attempts" if attempt > 1 else ""
                    raise StorageError(f"cannot {what} {path}{tries}: {explain(e)}") from e
                log.warning(
                    "%s %s failed (%s); retry %d of %d in %.2f s",
                    what,
                    path,
                    explain(e),
                    attempt,
                    self.attempts - 1,
                    wait,
                )
                time.sleep(wait * random.uniform(0.5, 1.0))
                wait = min(wait * 2, self.max_backoff)
        raise AssertionError("unreachable")


DEFAULT_RETRY = RetryPolicy()

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_pool)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="stoker-io")
        return _pool


def _with_timeout(timeout: float, fn: Callable[..., T], *args: Any) -> T:
    # A hung call cannot be interrupted; it is left on its worker thread and the caller told.
    if timeout <= 0 or threading.current_thread().name.startswith("stoker-io"):
        return fn(*args)
    return _executor().submit(fn, *args).result(timeout=timeout)


def is_transient(e: BaseException) -> bool:
    """Whether a fault may go away by itself (retried) rather than need a person (raised)."""
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
        return True
    code = getattr(e, "code", None)  # gcsfs's HttpError, after gcsfs's own retries
    if isinstance(code, int) and not isinstance(e, OSError) and (code >= 500 or code == 429):
        return True
    response = getattr(e, "response", None) or getattr(e.__cause__, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return code in _TRANSIENT_CODES or status >= 500
    return e.__cause__ is not None and e.__cause__ is not e and is_transient(e.__cause__)


def explain(e: BaseException) -> str:
    """The cause of a storage fault in words, with the system's message."""
    code = getattr(e, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device or quota exceeded ({e})"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"the location is read-only or not writable ({e})"
    return f"{type(e).__name__}: {e}"


__all__ = ["DEFAULT_RETRY", "RetryPolicy", "explain", "is_transient"]
