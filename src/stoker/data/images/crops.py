"""Where each example's crop comes from: the crop boxes and flips, drawn from its uniforms.

Pure functions of the image size and the example's uniforms from
:func:`~stoker.data.base.example_uniforms` (no I/O, no state), so a box is the same whichever
worker draws it and after any resume:

- torchvision's: :func:`random_resized_crop_box` (``RandomResizedCrop.get_params``) and
  :func:`center_crop_box` (resize the shorter side, centre-crop), ``crop="inception"``;
- tf_cnn_benchmarks': :func:`sample_distorted_box` (TensorFlow's
  ``sample_distorted_bounding_box`` as its ``train_image`` calls it), :func:`eval_crop_box`
  (its ``eval_image``), :func:`random_crop_box` (``--resize_method=crop``), :func:`flip_of`,
  ``crop="tf_cnn"``;
- :func:`source_box`: the box an image source decodes, given its options.

Layout of one tf_cnn training example's uniforms (:data:`TRAIN_DRAWS` of them): four per crop
attempt (aspect ratio, height, top, left) for :data:`MAX_ATTEMPTS` attempts, then the flip
(:data:`FLIP_INDEX`), then the colour parameters (:data:`COLOR_SLICE`, read by
:func:`stoker.data.images.color.color_params`). A ``crop`` resize (no box sampling) takes its
two offsets from the first two. An ``inception`` example uses :data:`INCEPTION_DRAWS`: ten tries
x (area, log-ratio), top, left, flip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ...errors import ConfigError, DataError

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

#: Uniforms an ``inception`` training example uses: 10 tries x (area, log-ratio), top, left, flip.
INCEPTION_DRAWS = 23
#: Where the flip's uniform sits in an ``inception`` example's row.
INCEPTION_FLIP_INDEX = 22

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
        raise ConfigError(f"sample_distorted_box: the image size must be positive; got {width}x{height}")
    if max_attempts < 1:
        raise ConfigError(f"sample_distorted_box: max_attempts must be >= 1; got {max_attempts}")
    if not (0 < area_range[0] <= area_range[1] <= 1):
        raise ConfigError(f"sample_distorted_box: area_range must satisfy 0 < lo <= hi <= 1; got {area_range}")
    if not (0 < aspect_ratio_range[0] <= aspect_ratio_range[1]):
        raise ConfigError(
            f"sample_distorted_box: aspect_ratio_range must satisfy 0 < lo <= hi; got {aspect_ratio_range}"
        )
    if min_object_covered < 0:
        raise ConfigError(f"sample_distorted_box: min_object_covered must be >= 0; got {min_object_covered}")


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
        ConfigError: an argument TensorFlow would refuse, or too few uniforms.
        DataError: a box coordinate outside [0, 1].
    """
    if len(u) < DRAWS_PER_ATTEMPT * max_attempts:
        raise ConfigError(
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


def flip_of(u: Sequence[float] | np.ndarray) -> bool:
    """Whether a training example is mirrored left-right (``random_flip_left_right``: u < 0.5)."""
    return bool(u[FLIP_INDEX] < 0.5)


def random_resized_crop_box(
    width: int,
    height: int,
    u: Sequence[float] | np.ndarray,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """``(left, top, w, h)`` of torchvision's ``RandomResizedCrop.get_params``, drawn from ``u``.

    ``u`` holds at least 22 uniforms in [0, 1): two per try (area, log aspect ratio) for ten
    tries, then the top and left offsets. Falls back to a central crop, as torchvision does.
    """
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(10):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u[2 * t])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[2 * t + 1])
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(u[20] * (height - h + 1))
            left = int(u[21] * (width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop_box(width: int, height: int, image_size: int, resize_to: int) -> tuple[float, float, float, float]:
    """Source box of "resize the shorter side to ``resize_to``, then centre-crop ``image_size``"."""
    if width <= height:
        new_w, new_h = resize_to, int(resize_to * height / width)
    else:
        new_w, new_h = int(resize_to * width / height), resize_to
    top = int(round((new_h - image_size) / 2.0))
    left = int(round((new_w - image_size) / 2.0))
    sx, sy = width / new_w, height / new_h
    return left * sx, top * sy, (left + image_size) * sx, (top + image_size) * sy


def source_box(
    width: int,
    height: int,
    u: np.ndarray | None,
    *,
    image_size: int,
    resize_method: str,
    crop: str,
    bbox: np.ndarray | tuple[float, float, float, float] | None = None,
    name: str = "an image",
) -> tuple[float, float, float, float]:
    """``(left, top, w, h)`` of the region an image source decodes: the random crop from ``u``,
    else the evaluation crop (``resize_method="crop"``: an ``image_size`` square, at random or
    centred). ``crop`` picks the sampler (``inception`` or ``tf_cnn``, which honours the
    example's object boxes ``bbox``); ``name`` names the image in errors."""
    size = image_size
    if resize_method == "crop":
        if width < size or height < size:
            raise DataError(f"--resize_method=crop needs images of at least {size}x{size}; {name} is {width}x{height}")
        if u is None:
            return (width - size) // 2, (height - size) // 2, size, size
        if crop == "tf_cnn":
            left, top = random_crop_box(width, height, size, u)
            return left, top, size, size
        return int(u[21] * (width - size + 1)), int(u[20] * (height - size + 1)), size, size
    if crop == "tf_cnn":
        if u is None:
            return eval_crop_box(width, height, size)
        boxes = None if bbox is None else np.asarray(bbox, dtype=np.float32).reshape(-1, 4)
        return sample_distorted_box(width, height, u, boxes)
    if u is None:
        x0, y0, x1, y1 = center_crop_box(width, height, size, int(round(size / 0.875)))
        return x0, y0, x1 - x0, y1 - y0
    return random_resized_crop_box(width, height, u)


__all__ = [
    "AREA_RANGE",
    "ASPECT_RATIO_RANGE",
    "COLOR_PARAMS",
    "COLOR_SLICE",
    "DRAWS_PER_ATTEMPT",
    "EVAL_SCALE_FACTOR",
    "FLIP_INDEX",
    "INCEPTION_DRAWS",
    "INCEPTION_FLIP_INDEX",
    "MAX_ATTEMPTS",
    "MIN_OBJECT_COVERED",
    "TRAIN_DRAWS",
    "CropDraws",
    "UniformDraws",
    "center_crop_box",
    "eval_crop_box",
    "eval_resize_shape",
    "flip_of",
    "random_crop_box",
    "random_resized_crop_box",
    "sample_distorted_box",
    "sample_distorted_box_from",
    "source_box",
]
