"""stoker's cache folder: one convention for every cache (built C helpers, measured figures).

A leaf: it imports nothing of stoker, so every layer (``stoker.data``, ``stoker.kernels``,
``stoker.bench``) may import it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """stoker's cache folder: ``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    if os.environ.get("STOKER_CACHE_DIR"):
        return Path(os.environ["STOKER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stoker"


__all__ = ["cache_dir"]
