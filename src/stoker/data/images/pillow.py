"""The Pillow reference transform: decode a file to RGB and augment it torchvision's way.

:func:`augment_image` is what the image sources compute, done the slow, obvious way with Pillow
(the sources decode at a DCT scale and resize with torch, :mod:`stoker.data.images.decoders`):
``benchmarks/input_pipeline.py`` measures against it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from ...errors import DataError
from .crops import center_crop_box, random_resized_crop_box


def decode_rgb(path: str, what: str = "image_folder") -> Image.Image:
    """The image at ``path`` decoded to RGB; a :class:`DataError` naming the file if it cannot be."""
    try:
        with Image.open(path) as im:
            im.load()
            return im if im.mode == "RGB" else im.convert("RGB")
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, zlib.error ... for bad files
        raise DataError(f"{what}: cannot read image {path}: {type(e).__name__}: {e}") from e


#: ``resize_method`` names and Pillow's filters, for :func:`augment_image` (the Pillow reference
#: transform; the sources resize with torch, see :mod:`stoker.data.images.decoders`).
RESIZE_FILTERS: dict[str, Image.Resampling] = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "area": Image.Resampling.BOX,  # TensorFlow's AREA: each output pixel averages its source box
}


def augment_image(
    im: Image.Image,
    image_size: int,
    u: Sequence[float] | np.ndarray | None,
    *,
    resize_method: str = "bilinear",
    position: int = 0,
) -> np.ndarray:
    """``image_size`` square uint8 HWC array: train augmentation from ``u``, or eval centre crop if None.

    ``resize_method`` picks the filter (``round_robin``: by ``position``, the example's place
    in its batch); ``crop`` takes an ``image_size`` square without resizing (at a random place
    drawn from ``u``, else the centre), so the image must be at least that large.
    """
    width, height = im.size
    if resize_method == "crop":
        if width < image_size or height < image_size:
            raise DataError(
                f"--resize_method=crop needs images of at least {image_size}x{image_size}; "
                f"{getattr(im, 'filename', 'an image')} is {width}x{height}"
            )
        top = int(u[20] * (height - image_size + 1)) if u is not None else (height - image_size) // 2
        left = int(u[21] * (width - image_size + 1)) if u is not None else (width - image_size) // 2
        arr = np.asarray(im.crop((left, top, left + image_size, top + image_size)))
    else:
        if resize_method == "round_robin":
            resample = list(RESIZE_FILTERS.values())[position % len(RESIZE_FILTERS)]
        else:
            resample = RESIZE_FILTERS[resize_method]
        if u is None:
            box: tuple[float, float, float, float] = center_crop_box(
                width, height, image_size, int(round(image_size / 0.875))
            )
        else:
            left, top, w, h = random_resized_crop_box(width, height, u)
            box = (left, top, left + w, top + h)
        arr = np.asarray(im.resize((image_size, image_size), resample, box=box))
    if u is not None and u[22] < 0.5:
        arr = arr[:, ::-1]
    return arr


__all__ = ["RESIZE_FILTERS", "augment_image", "decode_rgb"]
