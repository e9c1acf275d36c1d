"""stoker's cache folder: one convention for every cache (built C helpers, measured figures).

A leaf: it imports nothing of stoker, so every layer (``stoker.data``, ``stoker.kernels``,
``stoker.bench``) may import it.

Measured figures that hold only on this machine (a kernel's speed, which JPEG decoder is faster
on a data set, what fp16 costs) are kept in small JSON files here, one per kind of figure, each a
mapping from a key to the figure. The key names everything the figure depends on (the CPU model
and flags, :func:`cpu_fingerprint`; the torch and library versions; the setting), so a restart on
the same machine reads the figure instead of measuring it again and another machine, or another
version, measures anew. A file that cannot be read or parsed is ignored with one log line and
replaced at the next store; every store writes a temporary file and renames it into place, so a
reader never sees half a file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger("stoker")
_lock = threading.Lock()
_said: set[tuple[str, str]] = set()  # (file, problem) already logged: one line per process


def cache_dir() -> Path:
    """stoker's cache folder: ``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    if os.environ.get("STOKER_CACHE_DIR"):
        return Path(os.environ["STOKER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stoker"


@functools.cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first processor in ``/proc/cpuinfo``; ``("unknown", {})`` elsewhere."""
    model, flags = "unknown", frozenset[str]()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model == "unknown":
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
                if model != "unknown" and flags:
                    break
    except OSError:
        pass
    return model, flags


def cpu_fingerprint() -> str:
    """This CPU for a cache key: its model name and a hash of its instruction-set flags."""
    model, flags = cpu_info()
    return f"cpu|{model}|flags {hashlib.sha256(' '.join(sorted(flags)).encode()).hexdigest()[:12]}"


def load_figures(name: str) -> dict[str, Any]:
    """The figures file ``name`` in :func:`cache_dir` as a dict; ``{}`` when it is missing, and
    when it is unreadable or not a JSON object (said once in a log line: it is measured again)."""
    path = cache_dir() / name
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        return _ignored(path, f"cannot be read ({e.strerror or e})")
    try:
        data = json.loads(text)
    except ValueError as e:
        return _ignored(path, f"is not JSON ({e})")
    return data if isinstance(data, dict) else _ignored(path, f"holds a {type(data).__name__}, not a mapping")


def _ignored(path: Path, problem: str) -> dict[str, Any]:
    if (str(path), problem) not in _said:
        _said.add((str(path), problem))
        log.warning("stoker cache %s %s: ignored, the figures are measured again and it is rewritten", path, problem)
    return {}


def store_figure(name: str, key: str, value: Any) -> None:
    """Set ``key`` in the figures file ``name`` (atomically replaced). A cache that cannot be
    written is skipped: the figure is measured again next time."""
    with _lock:
        data = load_figures(name)
        data[key] = value
        path = cache_dir() / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            pass


__all__ = ["cache_dir", "cpu_fingerprint", "cpu_info", "load_figures", "store_figure"]
