"""tf_cnn_benchmarks' image preprocessing, PyTorch-native, under one name: crop boxes, flips,
colour distortions and the normalisation.

What the seed's ``--distortions`` / ``--nodistortions`` / ``--resize_method`` mean, split in
two halves that run in different places, each in its own module of :mod:`stoker.data.images`:

- **Per example, in the input workers** (pure functions of the image size and the example's
  uniforms from :func:`~stoker.data.base.example_uniforms`), :mod:`stoker.data.images.crops`:
  :func:`sample_distorted_box` is TensorFlow's ``sample_distorted_bounding_box`` as tf_cnn's
  ``train_image`` calls it, :func:`flip_of` its random left-right flip, :func:`eval_crop_box`
  the evaluation transform's source region; :func:`color_params`
  (:mod:`stoker.data.images.color`) the five numbers one example's colour distortion needs.
- **Per batch, in the step** (on the device): :class:`ImagePreprocessor`
  (:mod:`stoker.data.images.normalize`) casts the uint8 ``[N, H, W, 3]`` batch to float,
  applies the colour distortions batch-wise when given their parameters and normalises, so
  only uint8 bytes cross process and host-to-device boundaries.

:func:`distort_color_reference` (:mod:`stoker.data.images.tf_reference`) is the colour
distortion of one image following TensorFlow's kernels op by op: the tests hold
:class:`ImagePreprocessor` to it and it to TensorFlow. :func:`resize_method_for` and
:data:`RESIZE_METHODS` come from :mod:`stoker.data.images.decoders`.
"""

from .images.color import (
    BRIGHTNESS_MAX_DELTA,
    CONTRAST_RANGE,
    HUE_MAX_DELTA,
    SATURATION_RANGE,
    color_params,
    distort_color_batch,
)
from .images.crops import (
    AREA_RANGE,
    ASPECT_RATIO_RANGE,
    COLOR_PARAMS,
    COLOR_SLICE,
    DRAWS_PER_ATTEMPT,
    EVAL_SCALE_FACTOR,
    FLIP_INDEX,
    MAX_ATTEMPTS,
    MIN_OBJECT_COVERED,
    TRAIN_DRAWS,
    CropDraws,
    UniformDraws,
    eval_crop_box,
    eval_resize_shape,
    flip_of,
    random_crop_box,
    sample_distorted_box,
    sample_distorted_box_from,
)
from .images.decoders import RESIZE_METHODS, resize_method_for
from .images.normalize import IMAGENET_MEAN, IMAGENET_STD, TF_CNN_MEAN, TF_CNN_STD, ImagePreprocessor
from .images.tf_reference import distort_color_reference

__all__ = [
    "AREA_RANGE",
    "ASPECT_RATIO_RANGE",
    "BRIGHTNESS_MAX_DELTA",
    "COLOR_PARAMS",
    "COLOR_SLICE",
    "CONTRAST_RANGE",
    "DRAWS_PER_ATTEMPT",
    "EVAL_SCALE_FACTOR",
    "FLIP_INDEX",
    "HUE_MAX_DELTA",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MAX_ATTEMPTS",
    "MIN_OBJECT_COVERED",
    "RESIZE_METHODS",
    "SATURATION_RANGE",
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
