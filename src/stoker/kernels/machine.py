"""What this machine is, for measurements that hold only on it: CPU model and flags, and a
small JSON cache of measured figures keyed by all of that.

A figure measured here (a kernel's GFLOP/s, which of two kernels is faster for a shape) holds
for this CPU model, its instruction set, this torch build and this number of threads, so
:func:`machine_key` puts all four in the key. The cache lives in ``$STOKER_CACHE_DIR`` (else
``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``), one JSON file per kind of figure, read and
written by :mod:`stoker._cache` (a file that cannot be read or parsed is ignored with a log
line and replaced on the next store; stores are atomic).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from .._cache import cpu_fingerprint, cpu_info, load_figures, store_figure

#: CPU flags (``/proc/cpuinfo``) of the instructions that make a dtype's matmuls fast in oneDNN
BF16_FLAGS: tuple[str, ...] = ("avx512_bf16", "amx_bf16")
FP16_FLAGS: tuple[str, ...] = ("avx512_fp16", "amx_fp16")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or ``"unknown"``."""
    return cpu_info()[0]


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags (``/proc/cpuinfo``; empty where it cannot be read)."""
    return cpu_info()[1]


def cpu_has_fast(precision: str) -> bool:
    """Whether this CPU has instructions for fast ``precision`` (``"bf16"``/``"fp16"``) matmuls;
    ``fp32`` always is. Without them oneDNN and the BLAS convert to fp32 and back on each use."""
    if precision in ("bf16", "bf16-sr"):
        wanted = BF16_FLAGS
    elif precision == "fp16":
        wanted = FP16_FLAGS
    else:
        return True
    return any(flag in cpu_flags() for flag in wanted)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container or ``taskset`` narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cores(seconds: float = 0.2) -> float | None:
    """How many CPU cores other processes kept busy over ``seconds`` (``/proc/stat``; ``None``
    where it cannot be read). This process sleeps meanwhile, so it counts only the others."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]  # user .. steal: guest time is inside user
        return fields[3] + fields[4], sum(fields)  # idle + iowait, total

    try:
        idle0, total0 = sample()
        time.sleep(seconds)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0:
        return None
    return (1.0 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)


def machine_key(device: torch.device, dtype: str) -> str:
    """The key of figures measured for ``dtype`` on ``device`` with the current thread count."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        where = f"cuda|{torch.cuda.get_device_name(device)}|sm{major}{minor}"
    else:
        where = f"{cpu_fingerprint()}|{torch.get_num_threads()} threads"
    return f"{where}|torch {torch.__version__}|{dtype}"


def cache_load(name: str) -> dict[str, Any]:
    """The cache file ``name`` as a dict (:func:`stoker._cache.load_figures`: ``{}`` when it is
    missing; unreadable or not a JSON object, said once in a log line)."""
    return load_figures(name)


def cache_store(name: str, key: str, value: Any) -> None:
    """Set ``key`` in the cache file ``name``, atomically (:func:`stoker._cache.store_figure`)."""
    store_figure(name, key, value)


__all__ = [
    "BF16_FLAGS",
    "FP16_FLAGS",
    "cache_load",
    "cache_store",
    "cpu_flags",
    "cpu_has_fast",
    "busy_cores",
    "cpu_model",
    "machine_key",
    "usable_cores",
]
