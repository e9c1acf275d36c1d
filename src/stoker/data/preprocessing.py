"""tf_cnn_benchmarks' image preprocessing, PyTorch-native: crop boxes, flips, colour distortions.

What the seed's ``--distortions`` / ``--nodistortions`` / ``--resize_method`` mean, split in
two halves that run in different places:

- **Per example, in the input workers** (pure functions of the image size and the example's
  uniforms from :func:`~stoker.data.base.example_uniforms`): :func:`sample_distorted_box` is
  TensorFlow's ``sample_distorted_bounding_box`` as tf_cnn's ``train_image`` calls it (the
  training crop, with or without ``--distortions``), :func:`flip_of` its random left-right
  flip, :func:`eval_crop_box` the evaluation transform's source region, and
  :func:`color_params` the five numbers one example's colour distortion needs.
- **Per batch, in the step** (on the device): :class:`ImagePreprocessor` casts the uint8
  ``[N, H, W, 3]`` batch to float, applies the colour distortions batch-wise when given their
  parameters (brightness, saturation, hue, contrast in the order tf_cnn's ``distort_color``
  picks, then the clip to [0, 1]) and normalises, so only uint8 bytes cross process and
  host-to-device boundaries.

:func:`distort_color_reference` is the colour distortion of one image following TensorFlow's
kernels op by op (numpy, float32): the tests hold :class:`ImagePreprocessor` to it and it to
TensorFlow.

Layout of one training example's uniforms (``TRAIN_DRAWS`` of them): four per crop attempt
(aspect ratio, height, top, left) for ``MAX_ATTEMPTS`` attempts, then the flip
(``FLIP_INDEX``), then the colour parameters (``COLOR_SLICE``). A ``crop`` resize (no box
sampling) takes its two offsets from the first two.

This module does no file I/O and holds no state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from . import fused_normalize
from .base import DataError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: tf_cnn_benchmarks' own normalisation, ``x / 127.5 - 1`` (``normalized_image``), as mean and std.
TF_CNN_MEAN = (0.5, 0.5, 0.5)
TF_CNN_STD = (0.5, 0.5, 0.5)

#: tf_cnn's ``train_image`` arguments to ``sample_distorted_bounding_box``.
MIN_OBJECT_COVERED = 0.1
ASPECT_RATIO_RANGE = (0.75, 1.33)
AREA_RANGE = (0.05, 1.0)
MAX_ATTEMPTS = 100
#: Uniforms one crop attempt consumes: aspect ratio, height, top offset, left offset.
DRAWS_PER_ATTEMPT = 4
#: Where the flip's uniform sits in a training example's row.
FLIP_INDEX = DRAWS_PER_ATTEMPT * MAX_ATTEMPTS
#: Colour parameters per example: brightness delta, saturation factor, hue delta, contrast
#: factor, order (0: brightness, saturation, hue, contrast; 1: brightness, contrast,
#: saturation, hue).
COLOR_PARAMS = 5
COLOR_SLICE = slice(FLIP_INDEX + 1, FLIP_INDEX + 1 + COLOR_PARAMS)
#: Uniforms one training example consumes (crop attempts, flip, colour).
TRAIN_DRAWS = COLOR_SLICE.stop

#: tf_cnn's ``distort_color`` ranges (its TF 2 path, ``--nodistort_color_in_yiq``).
BRIGHTNESS_MAX_DELTA = 32.0 / 255.0
SATURATION_RANGE = (0.5, 1.5)
HUE_MAX_DELTA = 0.2
CONTRAST_RANGE = (0.5, 1.5)

#: tf_cnn's evaluation resize: the shorter side becomes ``image_size * 1.145`` (256 for 224).
EVAL_SCALE_FACTOR = 1.145

_F32 = np.float32


def _lrintf(x: np.float32) -> int:
    # C's lrintf under the default rounding mode: to nearest, ties to even (numpy's rint).
    return int(np.rint(x))


def _rand_float(u: float) -> np.float32:
    # TensorFlow's RandFloat keeps 23 random mantissa bits: a float32 in [0, 1) on a 2^-23 grid.
    return _F32(math.floor(u * 8388608.0) / 8388608.0)


def _uniform_int(u: float, n: int) -> int:
    # An integer in [0, n), as TensorFlow's SimplePhilox::Uniform(n).
    return min(int(u * n), n - 1)


class CropDraws(Protocol):
    """The random source of :func:`sample_distorted_box_from`: what one attempt draws."""

    def rand_float(self, attempt: int) -> np.float32:
        """A float32 in [0, 1) (the aspect ratio's draw)."""
        ...

    def uniform(self, attempt: int, slot: int, n: int) -> int:
        """An integer in [0, n): ``slot`` 1 is the height, 2 the top offset, 3 the left offset."""
        ...


class UniformDraws:
    """:class:`CropDraws` from a row of uniforms: attempt ``t`` reads ``u[4t:4t+4]``."""

    def __init__(self, u: Sequence[float] | np.ndarray) -> None:
        self.u = u

    def rand_float(self, attempt: int) -> np.float32:
        return _rand_float(float(self.u[DRAWS_PER_ATTEMPT * attempt]))

    def uniform(self, attempt: int, slot: int, n: int) -> int:
        return _uniform_int(float(self.u[DRAWS_PER_ATTEMPT * attempt + slot]), n)


def _random_crop(
    width: int,
    height: int,
    min_area_frac: np.float32,
    max_area_frac: np.float32,
    aspect: np.float32,
    draws: CropDraws,
    attempt: int,
) -> tuple[int, int, int, int] | None:
    """One attempt of TensorFlow's ``GenerateRandomCrop``: ``(x, y, w, h)`` or None if it fails.

    The arithmetic is float32 where TensorFlow's is, and the draws happen under the same
    conditions, so the same random stream gives the same box.
    """
    min_area = min_area_frac * _F32(width) * _F32(height)
    max_area = max_area_frac * _F32(width) * _F32(height)
    h = _lrintf(np.sqrt(min_area / aspect))
    max_h = _lrintf(np.sqrt(max_area / aspect))
    if _lrintf(_F32(max_h) * aspect) > width:
        # The largest height whose rounded width still fits (TensorFlow computes this in double).
        max_h = int((width + 0.5 - float(_F32(1e-7))) / float(aspect))
        if _lrintf(_F32(max_h) * aspect) > width:
            max_h -= 1
    max_h = min(max_h, height)
    h = min(h, max_h)
    if h < max_h:
        h += draws.uniform(attempt, 1, max_h - h + 1)
    w = _lrintf(_F32(h) * aspect)
    area = _F32(w * h)
    # Rounding may leave the area just outside the range: try one row more, then one less.
    if area < min_area:
        h += 1
        w = _lrintf(_F32(h) * aspect)
        area = _F32(w * h)
    if area > max_area:
        h -= 1
        w = _lrintf(_F32(h) * aspect)
        area = _F32(w * h)
    if area < min_area or area > max_area or w > width or h > height or w <= 0 or h <= 0:
        return None
    # Uniform(n) draws from [0, n): TensorFlow's crop never touches the bottom or right edge
    # unless it spans the whole side.
    y = draws.uniform(attempt, 2, height - h) if h < height else 0
    x = draws.uniform(attempt, 3, width - w) if w < width else 0
    return x, y, w, h


def _boxes_in_pixels(bbox: np.ndarray | Sequence[Sequence[float]] | None, width: int, height: int) -> list[tuple]:
    if bbox is None:
        return []
    boxes = np.asarray(bbox, dtype=np.float32).reshape(-1, 4)
    if boxes.size and (not np.all(boxes >= 0.0) or not np.all(boxes <= 1.0)):
        raise DataError(f"bounding box coordinates must be in [0, 1] (ymin, xmin, ymax, xmax); got {boxes.tolist()}")
    # TensorFlow truncates each scaled coordinate (float32) to an int.
    return [
        (int(xmin * _F32(width)), int(ymin * _F32(height)), int(xmax * _F32(width)), int(ymax * _F32(height)))
        for ymin, xmin, ymax, xmax in boxes
    ]


def _covers(crop: tuple[int, int, int, int], boxes: list[tuple], min_object_covered: np.float32) -> bool:
    x, y, w, h = crop
    if w * h < 1:
        return False
    for bx0, by0, bx1, by1 in boxes:
        object_area = _F32((bx1 - bx0) * (by1 - by0))
        if object_area < 1:
            continue
        ix0, iy0, ix1, iy1 = max(x, bx0), max(y, by0), min(x + w, bx1), min(y + h, by1)
        inter = _F32((ix1 - ix0) * (iy1 - iy0)) if ix0 <= ix1 and iy0 <= iy1 else _F32(0)
        if inter / object_area >= min_object_covered:
            return True
    return False


def _check_box_arguments(
    width: int,
    height: int,
    min_object_covered: float,
    aspect_ratio_range: tuple[float, float],
    area_range: tuple[float, float],
    max_attempts: int,
) -> None:
    if width < 1 or height < 1:
        raise ValueError(f"sample_distorted_box: the image size must be positive; got {width}x{height}")
    if max_attempts < 1:
        raise ValueError(f"sample_distorted_box: max_attempts must be >= 1; got {max_attempts}")
    if not (0 < area_range[0] <= area_range[1] <= 1):
        raise ValueError(f"sample_distorted_box: area_range must satisfy 0 < lo <= hi <= 1; got {area_range}")
    if not (0 < aspect_ratio_range[0] <= aspect_ratio_range[1]):
        raise ValueError(
            f"sample_distorted_box: aspect_ratio_range must satisfy 0 < lo <= hi; got {aspect_ratio_range}"
        )
    if min_object_covered < 0:
        raise ValueError(f"sample_distorted_box: min_object_covered must be >= 0; got {min_object_covered}")


def sample_distorted_box_from(
    width: int,
    height: int,
    draws: CropDraws,
    bbox: np.ndarray | Sequence[Sequence[float]] | None = None,
    *,
    min_object_covered: float = MIN_OBJECT_COVERED,
    aspect_ratio_range: tuple[float, float] = ASPECT_RATIO_RANGE,
    area_range: tuple[float, float] = AREA_RANGE,
    max_attempts: int = MAX_ATTEMPTS,
) -> tuple[int, int, int, int]:
    """:func:`sample_distorted_box` with any random source (the tests give it TensorFlow's own)."""
    _check_box_arguments(width, height, min_object_covered, aspect_ratio_range, area_range, max_attempts)
    boxes = _boxes_in_pixels(bbox, width, height) or [(0, 0, width, height)]
    lo_ratio, hi_ratio = _F32(aspect_ratio_range[0]), _F32(aspect_ratio_range[1])
    lo_area, hi_area = _F32(area_range[0]), _F32(area_range[1])
    covered = _F32(min_object_covered)
    for t in range(max_attempts):
        aspect = draws.rand_float(t) * (hi_ratio - lo_ratio) + lo_ratio
        crop = _random_crop(width, height, lo_area, hi_area, aspect, draws, t)
        if crop is not None and _covers(crop, boxes, covered):
            return crop
    return 0, 0, width, height


def sample_distorted_box(
    width: int,
    height: int,
    u: Sequence[float] | np.ndarray,
    bbox: np.ndarray | Sequence[Sequence[float]] | None = None,
    *,
    min_object_covered: float = MIN_OBJECT_COVERED,
    aspect_ratio_range: tuple[float, float] = ASPECT_RATIO_RANGE,
    area_range: tuple[float, float] = AREA_RANGE,
    max_attempts: int = MAX_ATTEMPTS,
) -> tuple[int, int, int, int]:
    """``(left, top, w, h)`` of TensorFlow's ``sample_distorted_bounding_box``, driven by ``u``.

    The algorithm of TensorFlow's kernel, as tf_cnn's ``train_image`` calls it (defaults: its
    arguments, ``use_image_if_no_bounding_boxes=True``): each attempt draws an aspect ratio
    uniformly from ``aspect_ratio_range``, derives the height range from ``area_range``,
    draws the height in it, rounds the width, then draws the offsets; it keeps the first crop
    covering at least ``min_object_covered`` of one of the boxes, and after ``max_attempts``
    failures returns the whole image. A uniform ``v`` stands for TensorFlow's float draw
    ``floor(v * 2**23) / 2**23`` and its integer draw in [0, n) ``floor(v * n)``.

    Args:
        width, height: the image's size in pixels.
        u: uniforms in [0, 1), at least ``4 * max_attempts``: attempt ``t`` reads
            ``u[4t:4t+4]`` (aspect ratio, height, top, left). A training row of
            :data:`TRAIN_DRAWS` uniforms can be passed whole.
        bbox: the example's object boxes, ``[K, 4]`` as TensorFlow orders them, ``(ymin, xmin,
            ymax, xmax)`` in [0, 1]; None or empty: the whole image is the object, so a crop
            must cover ``min_object_covered`` of the image's area.

    Raises:
        ValueError: an argument TensorFlow would refuse, or too few uniforms.
        DataError: a box coordinate outside [0, 1].
    """
    if len(u) < DRAWS_PER_ATTEMPT * max_attempts:
        raise ValueError(
            f"sample_distorted_box: needs {DRAWS_PER_ATTEMPT * max_attempts} uniforms for {max_attempts} "
            f"attempts; got {len(u)}"
        )
    return sample_distorted_box_from(
        width,
        height,
        UniformDraws(u),
        bbox,
        min_object_covered=min_object_covered,
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=max_attempts,
    )


def random_crop_box(width: int, height: int, image_size: int, u: Sequence[float] | np.ndarray) -> tuple[int, int]:
    """``(left, top)`` of an ``image_size`` square at a random place (``--resize_method=crop``).

    Reads ``u[0]`` (top) and ``u[1]`` (left); the image must be at least ``image_size`` on both
    sides (:class:`DataError` otherwise, naming the flag).
    """
    if width < image_size or height < image_size:
        raise DataError(
            f"--resize_method=crop needs images of at least {image_size}x{image_size}; got one of {width}x{height}"
        )
    return _uniform_int(float(u[1]), width - image_size + 1), _uniform_int(float(u[0]), height - image_size + 1)


def eval_resize_shape(width: int, height: int, image_size: int) -> tuple[int, int, int, int]:
    """``(resize_w, resize_h, left, top)`` of tf_cnn's evaluation transform.

    tf_cnn's ``eval_image`` resizes the whole image, keeping its aspect ratio, so that both
    sides are at least ``1.145 * image_size`` (256 for 224; float32 arithmetic, truncated),
    then slices the central ``image_size`` square at ``(left, top)`` of the resized image.
    """
    ratio = max(_F32(image_size) / _F32(height), _F32(image_size) / _F32(width))
    resize_h = int(_F32(height) * ratio * _F32(EVAL_SCALE_FACTOR))
    resize_w = int(_F32(width) * ratio * _F32(EVAL_SCALE_FACTOR))
    return resize_w, resize_h, (resize_w - image_size) // 2, (resize_h - image_size) // 2


def eval_crop_box(width: int, height: int, image_size: int) -> tuple[float, float, float, float]:
    """``(left, top, w, h)`` in source pixels (fractional) of tf_cnn's evaluation crop.

    The region of the original image that :func:`eval_resize_shape`'s central square covers:
    resizing this box to ``image_size`` gives the evaluation image (Pillow's ``resize(...,
    box=(left, top, left + w, top + h))`` takes it as is).
    """
    resize_w, resize_h, left, top = eval_resize_shape(width, height, image_size)
    sx, sy = width / resize_w, height / resize_h
    return left * sx, top * sy, image_size * sx, image_size * sy


#: tf_cnn's ``--resize_method`` names; ``round_robin`` cycles through the first four in this
#: order (its ``_RESIZE_METHOD_MAP``), ``crop`` takes an ``image_size`` square without resizing.
#: tf_cnn calls TensorFlow 1's ``resize_images`` (``align_corners=False``): the legacy mapping
#: ``source = i * in / out`` (no half-pixel centres) and no antialiasing. PyTorch's closest:
#: ``interpolate(mode="nearest")`` is identical; ``bilinear`` / ``bicubic`` (same a = -0.75
#: kernel) with ``antialias=False`` differ by the half-pixel shift; TensorFlow's ``area``
#: averages exact fractional source boxes (Pillow's ``BOX``; ``interpolate(mode="area")`` uses
#: integer bins). docs/data.md has the measured differences.
RESIZE_METHODS = ("nearest", "bilinear", "bicubic", "area", "round_robin", "crop")


def resize_method_for(resize_method: str, position: int) -> str:
    """The concrete method (``nearest``, ``bilinear``, ``bicubic``, ``area`` or ``crop``) for an
    example at ``position``: ``round_robin`` takes ``RESIZE_METHODS[position % 4]``.

    tf_cnn's ``position`` is its ``batch_position``: a counter modulo the batch size attached
    to each record in file order, before the shuffle, so it follows the example, not the slot
    of the batch it lands in; the example's index is the faithful equivalent.
    """
    if resize_method not in RESIZE_METHODS:
        raise ValueError(f"--resize_method must be one of {', '.join(RESIZE_METHODS)}; got {resize_method!r}")
    return RESIZE_METHODS[position % 4] if resize_method == "round_robin" else resize_method


def flip_of(u: Sequence[float] | np.ndarray) -> bool:
    """Whether a training example is mirrored left-right (``random_flip_left_right``: u < 0.5)."""
    return bool(u[FLIP_INDEX] < 0.5)


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
        raise ValueError(f"color_params: needs rows of at least {TRAIN_DRAWS} uniforms; got {np.shape(u)}")
    out = np.empty(c.shape, dtype=np.float32)
    out[..., 0] = (2.0 * c[..., 0] - 1.0) * BRIGHTNESS_MAX_DELTA
    out[..., 1] = SATURATION_RANGE[0] + (SATURATION_RANGE[1] - SATURATION_RANGE[0]) * c[..., 1]
    out[..., 2] = (2.0 * c[..., 2] - 1.0) * HUE_MAX_DELTA
    out[..., 3] = CONTRAST_RANGE[0] + (CONTRAST_RANGE[1] - CONTRAST_RANGE[0]) * c[..., 3]
    out[..., 4] = np.floor(2.0 * c[..., 4])
    return out


# ---------------------------------------------------------------------------------------------
# Colour distortions: the reference (one image, TensorFlow's kernels op by op) and the batch.


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


# The block of output rows ImagePreprocessor normalises at a time on a CPU: about one 224px image,
# so the float32 block stays in a core's L2 cache between the cast and the two arithmetic passes.
_NORMALIZE_BLOCK_BYTES = 1 << 20


class ImagePreprocessor(torch.nn.Module):
    """uint8 ``[N, H, W, 3]`` batches to normalised float32 ``[N, 3, H, W]``, on the input's device.

    ``forward(images, color=None)``: the float cast, then (when ``color`` is given) the colour
    distortions batch-wise, then ``(x - mean) / std`` with ``x`` in [0, 1]. Without ``color``
    it computes exactly what :func:`stoker.data.images.normalize_images` does (bitwise).
    ``channels_last``: the output in ``torch.channels_last`` memory format (the uint8 NHWC
    bytes permuted, no copy before the cast); else contiguous NCHW.

    ``distortions`` says whether ``color`` is expected: ``True`` without ``color``, or
    ``False`` with it, is a wiring mistake and raises ``ValueError``. The module holds no
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
            raise ValueError(f"ImagePreprocessor: mean and std need 3 values; got {mean!r} and {std!r}")
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
        :mod:`stoker.data.fused_normalize` builds, its one pass does it instead (bitwise the same)."""
        n, h, w, c = images.shape
        on_cpu, compiling = images.device.type == "cpu", torch.compiler.is_compiling()
        if on_cpu and not compiling and fused_normalize.available():
            # One pass instead of three, each value computed with the same float32 operations:
            # bitwise the same (stoker.data.fused_normalize).
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
            raise ValueError(
                f"ImagePreprocessor: expects uint8 images [N, H, W, 3]; got {images.dtype} {tuple(images.shape)}"
            )
        if self.distortions and color is None:
            raise ValueError("ImagePreprocessor(distortions=True) needs the batch's color parameters")
        if not self.distortions and color is not None:
            raise ValueError("ImagePreprocessor(distortions=False) was given color parameters")
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
            raise ValueError(
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


__all__ = [
    "AREA_RANGE",
    "ASPECT_RATIO_RANGE",
    "COLOR_PARAMS",
    "COLOR_SLICE",
    "DRAWS_PER_ATTEMPT",
    "EVAL_SCALE_FACTOR",
    "FLIP_INDEX",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MAX_ATTEMPTS",
    "MIN_OBJECT_COVERED",
    "RESIZE_METHODS",
    "TF_CNN_MEAN",
    "TF_CNN_STD",
    "TRAIN_DRAWS",
    "CropDraws",
    "ImagePreprocessor",
    "UniformDraws",
    "color_params",
    "distort_color_batch",
    "distort_color_reference",
    "eval_crop_box",
    "eval_resize_shape",
    "flip_of",
    "random_crop_box",
    "resize_method_for",
    "sample_distorted_box",
    "sample_distorted_box_from",
]
