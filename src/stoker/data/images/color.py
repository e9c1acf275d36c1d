"""tf_cnn_benchmarks' colour distortions: each example's parameters, and the batch op on the device.

:func:`color_params` turns an example's uniforms into the five numbers its distortion needs
(in the input workers); :func:`distort_color_batch` and :class:`~.normalize.ImagePreprocessor`
apply them batch-wise (in the step): brightness, saturation, hue, contrast in the order tf_cnn's
``distort_color`` picks, then the clip to [0, 1]. The tests hold them to
:func:`~.tf_reference.distort_color_reference`, TensorFlow's ops one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ...errors import ConfigError
from .crops import COLOR_PARAMS, COLOR_SLICE, TRAIN_DRAWS

#: tf_cnn's ``distort_color`` ranges (its TF 2 path, ``--nodistort_color_in_yiq``).
BRIGHTNESS_MAX_DELTA = 32.0 / 255.0
SATURATION_RANGE = (0.5, 1.5)
HUE_MAX_DELTA = 0.2
CONTRAST_RANGE = (0.5, 1.5)


def color_params(u: Sequence[float] | np.ndarray) -> np.ndarray:
    """float32 ``[COLOR_PARAMS]`` (or ``[N, COLOR_PARAMS]`` for rows ``[N, TRAIN_DRAWS]``).

    The columns: brightness delta in [-32/255, 32/255), saturation factor in [0.5, 1.5), hue
    delta in [-0.2, 0.2), contrast factor in [0.5, 1.5), and the order (0 or 1) of
    :func:`distort_color_reference`. tf_cnn picks the order by the parity of the example's
    ``batch_position``, a counter attached to each record before the shuffle, so a coin flip
    per example is the same distribution.
    """
    c = np.asarray(u, dtype=np.float64)[..., COLOR_SLICE]
    if c.shape[-1] != COLOR_PARAMS:
        raise ConfigError(f"color_params: needs rows of at least {TRAIN_DRAWS} uniforms; got {np.shape(u)}")
    out = np.empty(c.shape, dtype=np.float32)
    out[..., 0] = (2.0 * c[..., 0] - 1.0) * BRIGHTNESS_MAX_DELTA
    out[..., 1] = SATURATION_RANGE[0] + (SATURATION_RANGE[1] - SATURATION_RANGE[0]) * c[..., 1]
    out[..., 2] = (2.0 * c[..., 2] - 1.0) * HUE_MAX_DELTA
    out[..., 3] = CONTRAST_RANGE[0] + (CONTRAST_RANGE[1] - CONTRAST_RANGE[0]) * c[..., 3]
    out[..., 4] = np.floor(2.0 * c[..., 4])
    return out


def _adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    # (x - mean) * f + mean, as x * f + mean * (1 - f): one pass over the pixels.
    mean = x.mean(dim=(2, 3), keepdim=True)
    return torch.addcmul(mean * (1 - factor), x, factor)


def _adjust_saturation_hue(x: torch.Tensor, saturation: torch.Tensor, hue: torch.Tensor) -> torch.Tensor:
    """Saturation then hue of planar ``[N, 3, H, W]`` in one trip through HSV.

    TensorFlow makes two trips; one is the same up to rounding: scaling the saturation keeps
    each pixel's hue and value, and a pixel the saturation kernel greys out (value <= 0) has
    no hue left to rotate.
    """
    r, g, b = x.unbind(1)
    vmax = torch.maximum(torch.maximum(r, g), b)
    rng = vmax - torch.minimum(torch.minimum(r, g), b)
    # Hue in [0, 6) sectors; a grey pixel (rng 0) gets 0 / tiny = 0, TensorFlow's hue for grey.
    h = torch.where(
        r == vmax, g - b, torch.where(g == vmax, torch.add(b - r, rng, alpha=2), torch.add(r - g, rng, alpha=4))
    )
    h.div_(rng.clamp_min(1e-30)).add_(hue.view(-1, 1, 1) * 6).remainder_(6)
    # New chroma = clamp(s * factor, 0, 1) * v with s = rng / v, and 0 where v <= 0 (TensorFlow's s = 0).
    chroma = torch.minimum(rng.mul_(saturation.view(-1, 1, 1)), vmax).clamp_min_(0)
    base = vmax.sub_(chroma)
    out = torch.empty_like(x)
    # Each channel is base + chroma * (its level in the pure colour of hue h).
    torch.addcmul(base, chroma, (h - 3).abs_().sub_(1).clamp_(0, 1), out=out[:, 0])
    torch.addcmul(base, chroma, (h - 2).abs_().neg_().add_(2).clamp_(0, 1), out=out[:, 1])
    torch.addcmul(base, chroma, (h - 4).abs_().neg_().add_(2).clamp_(0, 1), out=out[:, 2])
    return out


def _distort(x: torch.Tensor, p: torch.Tensor, contrast_first: bool | torch.Tensor) -> torch.Tensor:
    """Brightness, then saturation and hue with contrast before (``contrast_first``) or after;
    ``contrast_first`` a per-image ``[N, 1, 1, 1]`` bool tensor or one bool for all."""
    contrast = p[:, 3].view(-1, 1, 1, 1)
    x = x + p[:, 0].view(-1, 1, 1, 1)
    if isinstance(contrast_first, torch.Tensor):
        x = torch.where(contrast_first, _adjust_contrast(x, contrast), x)
    elif contrast_first:
        x = _adjust_contrast(x, contrast)
    x = _adjust_saturation_hue(x, p[:, 1], p[:, 2])
    if isinstance(contrast_first, torch.Tensor):
        x = torch.where(contrast_first, x, _adjust_contrast(x, contrast))
    elif not contrast_first:
        x = _adjust_contrast(x, contrast)
    return x.clamp_(0, 1)


# step(images, params, contrast_first, out): writes its result into out and returns it.
_Step = Callable[[torch.Tensor, torch.Tensor, "bool | torch.Tensor", torch.Tensor], torch.Tensor]


def _by_order(x: torch.Tensor, p: torch.Tensor, step: _Step, memory_format: torch.memory_format) -> torch.Tensor:
    """``step(images, params, contrast_first, out)`` over the batch, into a new float32 tensor.

    On an accelerator the whole batch goes at once, the two orders merged with ``where``
    (no host synchronisation). On the CPU the images go one at a time, each from its input
    bytes to its output in one go, so that its temporaries stay in the core's cache (a third
    of the time of whole-batch passes; slices, not index tensors, whose gather and scatter
    cost a third of the time again).
    """
    contrast_first = p[:, 4] >= 0.5
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device, memory_format=memory_format)
    if x.device.type != "cpu":
        return step(x, p, contrast_first.view(-1, 1, 1, 1), out)
    for i, first in enumerate(contrast_first.tolist()):
        step(x[i : i + 1], p[i : i + 1], first, out[i : i + 1])
    return out


def distort_color_batch(x: torch.Tensor, color: torch.Tensor) -> torch.Tensor:
    """The colour distortion of a float ``[N, 3, H, W]`` batch in [0, 1], per-image parameters
    ``color`` ``[N, COLOR_PARAMS]`` (:func:`color_params`): float32, clipped to [0, 1], planar."""
    p = color.to(device=x.device, dtype=torch.float32)
    return _by_order(
        x,
        p,
        lambda xc, pc, first, out: out.copy_(_distort(xc.to(torch.float32).contiguous(), pc, first)),
        torch.contiguous_format,
    )


__all__ = [
    "BRIGHTNESS_MAX_DELTA",
    "CONTRAST_RANGE",
    "HUE_MAX_DELTA",
    "SATURATION_RANGE",
    "color_params",
    "distort_color_batch",
]
