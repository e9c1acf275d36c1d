"""The float cast and normalisation of uint8 image batches: :class:`ImagePreprocessor`,
:func:`normalize_images`, and the mean and std they use.

:class:`ImagePreprocessor` runs in the step, on the batch's device (or in the loader for
``output="float32"``), so only uint8 bytes cross process and host-to-device boundaries. It has
three paths to the same numbers: on a CPU the one-pass C function of
:mod:`stoker.data.images.fused_normalize` where it builds (compiled on first use into the user cache),
else torch's three passes over cache-sized blocks of image rows; elsewhere (an accelerator, a
compiled step) one broadcast. With colour parameters it applies tf_cnn's distortions first
(:mod:`.color`). All paths give bitwise :func:`normalize_images`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...errors import ConfigError
from . import fused_normalize
from .color import _by_order, _distort
from .crops import COLOR_PARAMS

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: tf_cnn_benchmarks' own normalisation, ``x / 127.5 - 1`` (``normalized_image``), as mean and std.
TF_CNN_MEAN = (0.5, 0.5, 0.5)
TF_CNN_STD = (0.5, 0.5, 0.5)


def normalize_images(batch: np.ndarray | torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 ``[N, H, W, C]`` (0-255) to float32 NCHW ``(x / 255 - mean) / std``, contiguous."""
    # Reorder the uint8 bytes first, then convert: cheaper than converting a strided view.
    x = torch.as_tensor(batch).permute(0, 3, 1, 2).contiguous().to(torch.float32)
    m = torch.tensor(mean, dtype=torch.float32).mul_(255).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).mul_(255).view(1, -1, 1, 1)
    return x.sub_(m).div_(s)


# The block of output rows ImagePreprocessor normalises at a time on a CPU: about one 224px image,
# so the float32 block stays in a core's L2 cache between the cast and the two arithmetic passes.
_NORMALIZE_BLOCK_BYTES = 1 << 20


class ImagePreprocessor(torch.nn.Module):
    """uint8 ``[N, H, W, 3]`` batches to normalised float32 ``[N, 3, H, W]``, on the input's device.

    ``forward(images, color=None)``: the float cast, then (when ``color`` is given) the colour
    distortions batch-wise, then ``(x - mean) / std`` with ``x`` in [0, 1]. Without ``color``
    it computes exactly what :func:`normalize_images` does (bitwise).
    ``channels_last``: the output in ``torch.channels_last`` memory format (the uint8 NHWC
    bytes permuted, no copy before the cast); else contiguous NCHW.

    ``distortions`` says whether ``color`` is expected: ``True`` without ``color``, or
    ``False`` with it, is a wiring mistake and raises :class:`~stoker.errors.ConfigError`. The module holds no
    state (``state_dict`` is empty).
    """

    # Buffers (register_buffer, not persistent: derived from the arguments), typed for the checker.
    mean255: torch.Tensor
    std255: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        *,
        distortions: bool = False,
        channels_last: bool = True,
    ) -> None:
        super().__init__()
        if len(mean) != 3 or len(std) != 3:
            raise ConfigError(f"ImagePreprocessor: mean and std need 3 values; got {mean!r} and {std!r}")
        self.distortions = bool(distortions)
        self.channels_last = bool(channels_last)
        # The same constants, computed the same way, as normalize_images: bitwise-equal output.
        m, sd = torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
        self.register_buffer("mean255", m.mul(255).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std255", sd.mul(255).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("mean", m.view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", sd.view(1, 3, 1, 1), persistent=False)
        self._rows: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def _normalize_rows(self, images: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std`` of contiguous NHWC uint8 ``images`` as float32 NHWC, computed on
        image rows: the same arithmetic per element as the ``[1, 3, 1, 1]`` broadcast (bitwise),
        but the constants repeated along a row of ``W x 3`` values, so each kernel's inner loop
        runs over a whole row instead of the 3 channels of one pixel (a CPU vectorises it; the
        broadcast ran 3-wide: 8 ms a pass over a 224px batch of 32 on one core). On a CPU where
        :mod:`stoker.data.images.fused_normalize` builds, its one pass does it instead (bitwise the same)."""
        n, h, w, c = images.shape
        on_cpu, compiling = images.device.type == "cpu", torch.compiler.is_compiling()
        if on_cpu and not compiling and fused_normalize.available():
            # One pass instead of three, each value computed with the same float32 operations:
            # bitwise the same (stoker.data.images.fused_normalize).
            return fused_normalize.normalize_rgb(images, self.mean255.view(3), self.std255.view(3))
        key = (w, images.device)
        rows = self._rows.get(key)
        if rows is None:
            rows = (
                self.mean255.to(images.device).view(3).repeat(w),
                self.std255.to(images.device).view(3).repeat(w),
            )
            self._rows = {key: rows}  # one width and device at a time: the batch shape is fixed
        mean_row, std_row = rows
        flat = images.reshape(n * h, w * c)
        step = self._chunk_rows(w * c)
        if not on_cpu or n * h <= step or compiling:
            # (A compiler fuses the three passes into one kernel: blocks would only lengthen its graph.)
            return flat.to(torch.float32).sub_(mean_row).div_(std_row).view(n, h, w, c)
        # On a CPU the three passes run over one cache-sized block of rows at a time: the block
        # written by the cast is still in cache for the subtraction and the division, instead of
        # three trips through memory over the whole batch (224px, batch 32, one thread: 3.9 ms
        # against 6.3 ms, 2026-11-26). Each element gets the same operations: bitwise the same.
        out = torch.empty(flat.shape, dtype=torch.float32, device=flat.device)
        for start in range(0, n * h, step):
            block = out[start : start + step]
            block.copy_(flat[start : start + step]).sub_(mean_row).div_(std_row)
        return out.view(n, h, w, c)

    @staticmethod
    def _chunk_rows(row_values: int) -> int:
        """Rows of ``row_values`` float32 values that fill :data:`_NORMALIZE_BLOCK_BYTES`."""
        return max(1, _NORMALIZE_BLOCK_BYTES // (4 * row_values))

    def forward(self, images: torch.Tensor, color: torch.Tensor | None = None) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] != 3:
            raise ConfigError(
                f"ImagePreprocessor: expects uint8 images [N, H, W, 3]; got {images.dtype} {tuple(images.shape)}"
            )
        if self.distortions and color is None:
            raise ConfigError("ImagePreprocessor(distortions=True) needs the batch's color parameters")
        if not self.distortions and color is not None:
            raise ConfigError("ImagePreprocessor(distortions=False) was given color parameters")
        x = images.permute(0, 3, 1, 2)  # a channels_last view of the NHWC bytes
        dev = x.device
        if color is None:
            if self.channels_last and images.is_contiguous():
                return self._normalize_rows(images).permute(0, 3, 1, 2)
            if not self.channels_last:
                x = x.contiguous()
            # to() keeps the strides: channels_last stays channels_last.
            return x.to(torch.float32).sub_(self.mean255.to(dev)).div_(self.std255.to(dev))
        if color.dim() != 2 or color.shape != (images.shape[0], COLOR_PARAMS):
            raise ConfigError(
                f"ImagePreprocessor: color must be [N, {COLOR_PARAMS}] for {images.shape[0]} images; "
                f"got {tuple(color.shape)}"
            )
        mean, std = self.mean.to(dev), self.std.to(dev)

        def step(xc: torch.Tensor, pc: torch.Tensor, first: bool | torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            # Planar float in [0, 1] (the colour ops work on whole channels), distorted, then
            # normalised straight into the output's layout (no separate layout copy).
            planar = xc.contiguous().to(torch.float32).div_(255)
            return torch.div(_distort(planar, pc, first).sub_(mean), std, out=out)

        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        return _by_order(x, color.to(device=dev, dtype=torch.float32), step, fmt)


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "TF_CNN_MEAN", "TF_CNN_STD", "ImagePreprocessor", "normalize_images"]
