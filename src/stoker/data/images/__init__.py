"""Image sources and their preprocessing: one module per concern.

- :mod:`.options`: :class:`ImageOptions`, what each image becomes (size, crop, resize, colour
  distortions, decoder, output), one frozen value every image source takes;
- :mod:`.folder`: :func:`image_folder` (one folder per class, the ImageNet layout) and the scan
  of such a tree; :mod:`.tfrecord`: :func:`imagenet_tfrecords` (tf_cnn_benchmarks' ImageNet
  TFRecord shards, read without TensorFlow) and :func:`write_imagenet_tfrecords`; :mod:`.tar_shards`:
  :func:`tar_shards` (tar shards in the WebDataset layout) and :func:`write_image_tar_shards`;
- :mod:`.source`: :class:`EncodedImageSource`, the batch builder both share: which examples go
  into which rows of a uint8 batch, built by which worker, bad ones replaced; then the batch's
  normalisation; :mod:`.examples`: :class:`ExampleDecoder`, what one example becomes (its
  uniforms, crop box and flip, the window decode and resize into its row);
- :mod:`.crops`: the crop boxes and flips, drawn from each example's uniforms (torchvision's
  and tf_cnn_benchmarks' samplers, the evaluation boxes);
- :mod:`.normalize`: :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`, tf_cnn's :data:`TF_CNN_MEAN` /
  :data:`TF_CNN_STD`, :func:`normalize_images` and :class:`ImagePreprocessor` (the float cast and
  normalisation, on any device);
- :mod:`.color`: tf_cnn_benchmarks' colour distortions (parameters per example, the batch op);
- :mod:`.tf_reference`: TensorFlow's colour ops one by one in numpy, the reference the tests
  hold the batch op to;
- :mod:`.decoders`: the CPU decoders (Pillow, simplejpeg, the window decoder), DCT scaling and
  the resize; :mod:`.auto_decoder`: ``decoder="auto"``'s timing; :mod:`.jpeg_crop`: libjpeg's
  window decode, a small C function built on first use (:mod:`stoker.data.native`);
  :mod:`.gpu_decode`: nvJPEG on the GPU;
- :mod:`.fused_normalize`: the one-pass CPU normalisation, a C function built on first use.

**tf_cnn_benchmarks' preprocessing** (what its ``--distortions`` / ``--nodistortions`` /
``--resize_method`` mean) is here, in two halves that run in different places:

- *per example, in the input workers* (pure functions of the image size and the example's
  uniforms from :func:`~stoker.data.example_uniforms`, ``TRAIN_DRAWS`` of them), :mod:`.crops`:
  :func:`sample_distorted_box` is TensorFlow's ``sample_distorted_bounding_box`` as tf_cnn's
  ``train_image`` calls it, :func:`flip_of` its random left-right flip, :func:`eval_crop_box` /
  :func:`eval_resize_shape` the evaluation transform's region; :func:`color_params`
  (:mod:`.color`) the five numbers one example's colour distortion needs;
- *per batch, in the step* (on the device): :class:`ImagePreprocessor` casts the uint8
  ``[N, H, W, 3]`` batch to float, applies the colour distortions batch-wise
  (:func:`distort_color_batch`) when given their parameters and normalises, so only uint8 bytes
  cross process and host-to-device boundaries.
"""

from .color import color_params, distort_color_batch
from .crops import (
    COLOR_PARAMS,
    TRAIN_DRAWS,
    center_crop_box,
    eval_crop_box,
    eval_resize_shape,
    flip_of,
    random_crop_box,
    random_resized_crop_box,
    sample_distorted_box,
)
from .decoders import RESIZE_METHODS, resize_method_for
from .examples import EncodedExample, ExampleDecoder
from .folder import IMAGE_EXTENSIONS, ImageFolderSource, image_folder, scan_image_folder
from .normalize import IMAGENET_MEAN, IMAGENET_STD, TF_CNN_MEAN, TF_CNN_STD, ImagePreprocessor, normalize_images
from .options import CROPS, OUTPUTS, ImageOptions
from .source import EncodedImageSource
from .tar_shards import TarShardSource, tar_shards, write_image_tar_shards
from .tfrecord import TFRecordImageSource, imagenet_tfrecords, write_imagenet_tfrecords

__all__ = [
    "COLOR_PARAMS",
    "CROPS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_EXTENSIONS",
    "OUTPUTS",
    "RESIZE_METHODS",
    "TF_CNN_MEAN",
    "TF_CNN_STD",
    "TRAIN_DRAWS",
    "EncodedExample",
    "EncodedImageSource",
    "ExampleDecoder",
    "ImageFolderSource",
    "ImageOptions",
    "ImagePreprocessor",
    "TFRecordImageSource",
    "TarShardSource",
    "center_crop_box",
    "color_params",
    "distort_color_batch",
    "eval_crop_box",
    "eval_resize_shape",
    "flip_of",
    "image_folder",
    "imagenet_tfrecords",
    "normalize_images",
    "random_crop_box",
    "random_resized_crop_box",
    "resize_method_for",
    "sample_distorted_box",
    "scan_image_folder",
    "tar_shards",
    "write_image_tar_shards",
    "write_imagenet_tfrecords",
]
