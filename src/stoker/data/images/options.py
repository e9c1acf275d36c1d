"""``ImageOptions``: what an encoded-image source makes of each image, one frozen value.

Image folders and TFRecord shards build their batches alike (:class:`~.source.EncodedImageSource`):
the crop, the resize, the colour distortions, the decoder and the form of the batch are the
fields of :class:`ImageOptions`, given to a source as ``image=`` beside how it reads
(``read=``, :class:`~stoker.data.ReadOptions`). A new image option is a field here and its use
in the batch builder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import ConfigError
from .decoders import DECODERS, RESIZE_METHODS
from .normalize import IMAGENET_MEAN, IMAGENET_STD

#: What an encoded-image source yields: ``float32`` normalised NCHW (the default) or the ``uint8`` NHWC batch.
OUTPUTS: tuple[str, ...] = ("float32", "uint8")
#: Training crop samplers: torchvision's ``RandomResizedCrop`` box, or tf_cnn_benchmarks'.
CROPS: tuple[str, ...] = ("inception", "tf_cnn")


@dataclass(frozen=True, kw_only=True)
class ImageOptions:
    """How an encoded-image source turns each example into a row of its batch.

    Args:
        image_size: side of the square output images.
        augment: random crop and flip (``None``: when training); ``False`` on training data gives
            the evaluation transform (tf_cnn_benchmarks' ``--nodistortions``).
        crop: ``inception`` (torchvision's random-resized-crop box, area 8%-100%, aspect
            3/4-4/3; evaluation resizes the shorter side to ``image_size / 0.875``) or ``tf_cnn``
            (tf_cnn_benchmarks' training and evaluation boxes, around the example's object boxes,
            :mod:`stoker.data.images.crops`).
        resize_method: ``bilinear``, ``nearest``, ``bicubic``, ``area``, ``round_robin`` (the
            four by the example's index) or ``crop`` (no resizing).
        distortions: also tf_cnn's colour distortions (brightness, saturation, hue, contrast) on
            augmented batches: applied in the loader for ``float32``; with ``uint8`` the features
            are ``{"images", "color"}`` for an ``ImagePreprocessor(distortions=True)``.
        output: ``float32`` (normalised NCHW) or ``uint8`` (NHWC as decoded, normalised on the
            device by :class:`~stoker.data.images.ImagePreprocessor`).
        decoder: ``auto`` (``libjpeg-crop`` or ``simplejpeg``, whichever builds this source's
            crops faster, timed on 16 of its examples; Pillow where neither works:
            :mod:`stoker.data.images.auto_decoder`), ``libjpeg-crop``, ``simplejpeg`` or ``pillow``.
        decode_on_device: ``True`` (or a CUDA device name): decode batches with nvJPEG on the
            GPU and crop and resize them there (needs torchvision with CUDA); no worker processes.
        pin_memory: ``uint8`` batches in pinned host memory (for a CUDA infeed; needs CUDA).
        mean, std: the normalisation of ``float32`` batches (default ImageNet's).
    """

    image_size: int = 224
    augment: bool | None = None
    crop: str = "inception"
    resize_method: str = "bilinear"
    distortions: bool = False
    output: str = "float32"
    decoder: str = "auto"
    decode_on_device: bool | str = False
    pin_memory: bool = False
    mean: Sequence[float] = field(default=IMAGENET_MEAN)
    std: Sequence[float] = field(default=IMAGENET_STD)

    def __post_init__(self) -> None:
        size = self.image_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"ImageOptions: image_size must be a positive integer; got {size!r}")
        for name, value, allowed in (
            ("resize_method", self.resize_method, RESIZE_METHODS),
            ("output", self.output, OUTPUTS),
            ("crop", self.crop, CROPS),
            ("decoder", self.decoder, ("auto", *DECODERS)),
        ):
            if value not in allowed:
                raise ConfigError(f"ImageOptions: {name} must be one of {', '.join(allowed)}; got {value!r}")
        # Tuples, so that options stay hashable (and equal when given as lists).
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))


__all__ = ["CROPS", "OUTPUTS", "ImageOptions"]
