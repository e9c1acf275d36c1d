"""TensorFlow's colour ops, one by one, in numpy (float32): the reference the fast paths are held to.

:func:`distort_color_reference` is the colour distortion of one image following TensorFlow's
kernels op by op (``adjust_brightness``, ``adjust_saturation``, ``adjust_hue``,
``adjust_contrast``, their RGB/HSV conversions): the tests hold
:func:`~.color.distort_color_batch` and :class:`~.normalize.ImagePreprocessor` to it, and it to
TensorFlow. Nothing in the input pipeline calls it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_F32 = np.float32


def _rgb_to_hsv_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    v = np.maximum(r, np.maximum(g, b))
    rng = v - np.minimum(r, np.minimum(g, b))
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(v > 0, rng / v, _F32(0)).astype(_F32)
        norm = _F32(1) / (_F32(6) * rng)
        h = np.where(
            r == v, norm * (g - b), np.where(g == v, norm * (b - r) + _F32(2 / 6), norm * (r - g) + _F32(4 / 6))
        ).astype(_F32)
    h = np.where(rng <= 0, _F32(0), h)
    h = np.where(h < 0, h + _F32(1), h).astype(_F32)
    return h, s, v


def _hsv_to_rgb_reference(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    c = s * v
    m = v - c
    dh = h * _F32(6)
    category = dh.astype(np.int32)
    fmodu = np.mod(dh, _F32(2))
    fmodu = np.where(fmodu <= 0, fmodu + _F32(2), fmodu)
    xx = c * (_F32(1) - np.abs(fmodu - _F32(1)))
    zero = np.zeros_like(c)
    table = {0: (c, xx, zero), 1: (xx, c, zero), 2: (zero, c, xx), 3: (zero, xx, c), 4: (xx, zero, c), 5: (c, zero, xx)}
    out = np.repeat(m[..., None], 3, axis=-1).astype(_F32)  # TensorFlow's default case: (0, 0, 0) + m
    for k, (rr, gg, bb) in table.items():
        sel = category == k
        out[..., 0] = np.where(sel, rr + m, out[..., 0])
        out[..., 1] = np.where(sel, gg + m, out[..., 1])
        out[..., 2] = np.where(sel, bb + m, out[..., 2])
    return out


def _adjust_saturation_reference(x: np.ndarray, factor: np.float32) -> np.ndarray:
    h, s, v = _rgb_to_hsv_reference(x)
    return _hsv_to_rgb_reference(h, np.clip(s * factor, _F32(0), _F32(1)), v)


def _adjust_hue_reference(x: np.ndarray, delta: np.float32) -> np.ndarray:
    # TensorFlow's hue kernel keeps each pixel's min and max and rotates the hue in [0, 6).
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    vmax = np.maximum(r, np.maximum(g, b))
    vmin = np.minimum(r, np.minimum(g, b))
    h, _, _ = _rgb_to_hsv_reference(x)
    h = h * _F32(6) + delta * _F32(6)
    h = np.where(h < 0, h + _F32(6), h)
    h = np.where(h >= 6, h - _F32(6), h).astype(_F32)
    category = h.astype(np.int32)
    ratio = h - category
    ratio = np.where(category % 2 == 1, _F32(1) - ratio, ratio)
    mid = vmin + ratio * (vmax - vmin)
    rows = {
        0: (vmax, mid, vmin),
        1: (mid, vmax, vmin),
        2: (vmin, vmax, mid),
        3: (vmin, mid, vmax),
        4: (mid, vmin, vmax),
    }
    out = np.stack([vmax, vmin, mid], axis=-1).astype(_F32)  # category 5
    for k, (rr, gg, bb) in rows.items():
        sel = category == k
        out[..., 0] = np.where(sel, rr, out[..., 0])
        out[..., 1] = np.where(sel, gg, out[..., 1])
        out[..., 2] = np.where(sel, bb, out[..., 2])
    return out


def _adjust_contrast_reference(x: np.ndarray, factor: np.float32) -> np.ndarray:
    mean = x.mean(axis=(0, 1), dtype=np.float64).astype(_F32)
    return ((x - mean) * factor + mean).astype(_F32)


def distort_color_reference(image: np.ndarray, params: Sequence[float] | np.ndarray) -> np.ndarray:
    """One image's colour distortion, TensorFlow's ops one by one: float32 ``[H, W, 3]`` in [0, 1].

    ``image``: uint8 ``[H, W, 3]`` (0-255) or float ``[H, W, 3]`` in [0, 1]; ``params``: one row
    of :func:`color_params`. Order 0 is brightness, saturation, hue, contrast; order 1 is
    brightness, contrast, saturation, hue (tf_cnn's ``distort_fn_0`` / ``distort_fn_1`` in
    RGB, its TF 2 path); no clipping between the ops, one clip to [0, 1] at the end.
    """
    x = np.asarray(image)
    x = x.astype(_F32) / _F32(255) if x.dtype == np.uint8 else x.astype(_F32)
    brightness, saturation, hue, contrast, order = (_F32(p) for p in params)
    x = x + brightness
    if order >= 0.5:
        x = _adjust_contrast_reference(x, contrast)
    x = _adjust_hue_reference(_adjust_saturation_reference(x, saturation), hue)
    if order < 0.5:
        x = _adjust_contrast_reference(x, contrast)
    return np.clip(x, _F32(0), _F32(1))


__all__ = ["distort_color_reference"]
