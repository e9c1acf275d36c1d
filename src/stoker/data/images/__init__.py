"""Image sources and their preprocessing: one module per concern.

- :mod:`.options`: :class:`ImageOptions`, what each image becomes (size, crop, resize, colour
  distortions, decoder, output), one frozen value every image source takes;
- :mod:`.folder`: :func:`image_folder` (one folder per class, the ImageNet layout) and the scan
  of such a tree;
- :mod:`.source`: :class:`EncodedImageSource`, the batch builder that image folders and
  TFRecords (:mod:`stoker.data.tfrecord`) share: per example a crop box, a window decode, a
  resize into a uint8 batch; then the batch's normalisation;
- :mod:`.crops`: the crop boxes and flips, drawn from each example's uniforms (torchvision's
  and tf_cnn_benchmarks' samplers, the evaluation boxes);
- :mod:`.normalize`: :data:`IMAGENET_MEAN` / :data:`IMAGENET_STD`, :func:`normalize_images` and
  :class:`~.normalize.ImagePreprocessor` (the float cast and normalisation, on any device);
- :mod:`.color`: tf_cnn_benchmarks' colour distortions (parameters per example, the batch op);
- :mod:`.tf_reference`: TensorFlow's colour ops one by one in numpy, the reference the tests
  hold the batch op to;
- :mod:`.pillow`: the Pillow reference transform (:func:`decode_rgb`, :func:`augment_image`);
- :mod:`.decoders`: the CPU decoders (Pillow, simplejpeg, the window decoder), DCT scaling and
  the resize; :mod:`.jpeg_crop`: libjpeg's window decode, a small C function built on first use
  (:mod:`stoker.data.native`); :mod:`.gpu_decode`: nvJPEG on the GPU;
- :mod:`.fused_normalize`: the one-pass CPU normalisation, a C function built on first use.

:mod:`stoker.data.preprocessing` gathers tf_cnn_benchmarks' preprocessing names from here.
"""

from .crops import center_crop_box, random_resized_crop_box
from .decoders import RESIZE_METHODS
from .folder import IMAGE_EXTENSIONS, ImageFolderSource, image_folder, scan_image_folder
from .normalize import IMAGENET_MEAN, IMAGENET_STD, normalize_images
from .options import CROPS, OUTPUTS, ImageOptions
from .pillow import RESIZE_FILTERS, augment_image, decode_rgb
from .source import EncodedExample, EncodedImageSource

__all__ = [
    "CROPS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_EXTENSIONS",
    "OUTPUTS",
    "RESIZE_FILTERS",
    "RESIZE_METHODS",
    "EncodedExample",
    "EncodedImageSource",
    "ImageFolderSource",
    "ImageOptions",
    "augment_image",
    "center_crop_box",
    "decode_rgb",
    "image_folder",
    "normalize_images",
    "random_resized_crop_box",
    "scan_image_folder",
]
