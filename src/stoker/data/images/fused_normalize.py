"""One-pass normalisation of uint8 RGB batches on a CPU: ``(x - mean) / std`` into float32.

torch casts and normalises a uint8 image batch in three passes (the cast, the subtraction, the
division), each writing 4 bytes a value; a batch of 32 227x227 images is 20 MB of float32, so
even done in cache-sized blocks the three passes cost about twice the one pass that writes the
result once (2.4-2.7 ms against 3.8-4.7 ms a batch on one core of the 2-core AMD EPYC, AVX2,
2026-11-26). torch has no fused kernel for it and ``torch.compile`` of the same arithmetic was
slower (10.4 ms), so ``_fused_normalize.c`` beside this file does it, built on first use like
the window decoder (:mod:`stoker.data.native`). Each value gets the same float32 operations as
torch's path, so the result is bitwise the same; where the library cannot be built (or
``STOKER_FUSED_NORMALIZE=0``), :class:`~stoker.data.images.ImagePreprocessor` keeps its
torch path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ...errors import ConfigError, StateError
from ..native import NativeLibrary

SOURCE = Path(__file__).with_name("_fused_normalize.c")


def _declare(lib: ctypes.CDLL) -> None:
    lib.stoker_normalize_rgb.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.stoker_normalize_rgb.restype = None


# -O3: gcc vectorises the inner loop only from -O3 (at -O2 the pass ran at 0.3x, 8 ms a batch).
LIBRARY = NativeLibrary("fused_normalize", SOURCE, switch="STOKER_FUSED_NORMALIZE", declare=_declare, cflags=("-O3",))


def available() -> bool:
    """Whether the fused pass can be used here (builds it on the first call)."""
    return LIBRARY.available()


def unavailable_reason() -> str | None:
    """Why :func:`available` is false (``None`` while it is true)."""
    return LIBRARY.unavailable_reason()


def normalize_rgb(
    images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``(images - mean) / std`` as float32 ``[..., 3]``: ``images`` contiguous uint8 ``[..., 3]`` on
    the CPU, ``mean`` and ``std`` float32 with 3 values (one per channel). Writes into ``out``
    (contiguous float32 of the images' shape) when given.

    Raises:
        ConfigError: arguments of another dtype, device, layout or shape.
        StateError: the library is not available (check :func:`available` first).
    """
    if (
        images.dtype != torch.uint8
        or images.device.type != "cpu"
        or not images.is_contiguous()
        or images.shape[-1:] != (3,)
    ):
        raise ConfigError(
            f"normalize_rgb: images must be contiguous uint8 [..., 3] on the CPU; got {images.dtype} "
            f"{tuple(images.shape)} on {images.device}"
        )
    stats = []
    for name, t in (("mean", mean), ("std", std)):
        if t.numel() != 3:
            raise ConfigError(f"normalize_rgb: {name} must hold 3 values; got {t.numel()}")
        stats.append(t.detach().to(device="cpu", dtype=torch.float32).reshape(3).contiguous())
    if out is None:
        out = torch.empty(images.shape, dtype=torch.float32)
    elif out.dtype != torch.float32 or out.shape != images.shape or not out.is_contiguous() or out.device.type != "cpu":
        raise ConfigError(f"normalize_rgb: out must be contiguous float32 {tuple(images.shape)} on the CPU")
    lib = LIBRARY.load()
    if lib is None:
        raise StateError(f"normalize_rgb is not available here: {LIBRARY.unavailable_reason()}")
    lib.stoker_normalize_rgb(
        images.data_ptr(), out.data_ptr(), images.numel() // 3, stats[0].data_ptr(), stats[1].data_ptr()
    )
    return out


__all__ = ["LIBRARY", "SOURCE", "available", "normalize_rgb", "unavailable_reason"]
