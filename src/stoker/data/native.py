"""The input pipeline's C helpers: small C sources beside this package, built on first use.

Some of the input pipeline's inner loops have no library that does them here (a JPEG window
decode, :mod:`stoker.data.images.jpeg_crop`; a one-pass uint8-to-float normalisation,
:mod:`stoker.data.images.fused_normalize`). Each is one C file with a plain C interface (no Python
headers, so one build serves every Python), compiled with the system C compiler into the user
cache (``~/.cache/stoker/ext/``, or ``$STOKER_CACHE_DIR/ext``) the first time it is asked for,
and called through ``ctypes``, which releases the GIL for the call.

A build that fails (no compiler, a missing header or library) fails once per process: the
reason is kept (:meth:`NativeLibrary.unavailable_reason`) and the caller takes its pure
Python/torch path, which computes the same result. Each library has an environment switch that
turns it off (``STOKER_JPEG_CROP=0``, ``STOKER_FUSED_NORMALIZE=0``).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from .._cache import cache_dir


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


class NativeLibrary:
    """One C source built into a shared library on first use and loaded with ``ctypes``.

    ``name`` names the built file (``<name>-<hash>.so``, the hash over the source, the flags and
    the machine, so an edited source or another architecture builds anew); ``cflags`` and
    ``libs`` (``-l`` names) go to the compiler; ``switch``: the environment variable whose value
    ``0`` turns the library off; ``declare`` sets the functions' ``argtypes`` and ``restype``.
    """

    def __init__(
        self,
        name: str,
        source: Path,
        *,
        switch: str,
        declare: Callable[[ctypes.CDLL], None],
        cflags: Sequence[str] = ("-O2",),
        libs: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.source = source
        self.switch = switch
        self.cflags = tuple(cflags)
        self.libs = tuple(libs)
        self._declare = declare
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._reason: str | None = None  # why it is unavailable, once a load was tried and failed

    def path(self) -> Path:
        """Where the built library is kept."""
        key = self.source.read_bytes() + " ".join(self.cflags + self.libs).encode() + platform.machine().encode()
        return cache_dir() / "ext" / f"{self.name}-{hashlib.sha256(key).hexdigest()[:16]}.so"

    def _build(self, target: Path) -> None:
        cc = compiler()
        if cc is None:
            raise OSError("no C compiler (cc, gcc or clang; or $CC) to build it with")
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{self.name}-", suffix=".so")
        os.close(fd)
        try:
            # -z defs: a missing symbol (an old libjpeg, say) fails here, not at the first call
            libs = [f"-l{lib}" for lib in self.libs]
            cmd = [cc, *self.cflags, "-shared", "-fPIC", "-Wl,-z,defs", str(self.source), *libs, "-o", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                tail = " ".join((proc.stderr or proc.stdout).split())[-300:]
                raise OSError(f"{' '.join(cmd[:1])} failed (exit {proc.returncode}): {tail}")
            os.replace(tmp, target)  # atomic: a process loading it meanwhile sees the old state or the whole file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def load(self) -> ctypes.CDLL | None:
        """The library, built first if needed; ``None`` where it cannot be (see :meth:`unavailable_reason`)."""
        if self._lib is not None or self._reason is not None:
            return self._lib
        with self._lock:
            if self._lib is not None or self._reason is not None:
                return self._lib
            if os.environ.get(self.switch, "1") == "0":
                self._reason = f"turned off by {self.switch}=0"
                return None
            try:
                path = self.path()
                if not path.exists():
                    self._build(path)
                lib = ctypes.CDLL(str(path))
                self._declare(lib)
                self._lib = lib
            except (OSError, subprocess.SubprocessError, AttributeError) as e:
                self._reason = f"{type(e).__name__}: {e}"
        return self._lib

    def available(self) -> bool:
        """Whether the library can be used here (builds it on the first call)."""
        return self.load() is not None

    def unavailable_reason(self) -> str | None:
        """Why :meth:`available` is false (``None`` while it is true)."""
        self.load()
        return self._reason


__all__ = ["NativeLibrary", "compiler"]
