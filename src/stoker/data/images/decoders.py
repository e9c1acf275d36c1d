"""Decoding encoded images into crops: the decoders, DCT scaling, and the resize.

A training example needs only its crop, resized to ``image_size``. So the work is:

1. read the image's size from its header (no pixels decoded);
2. choose the crop box in full-image coordinates (the caller's sampler);
3. decode at the smallest DCT scale (1/8, 1/4, 1/2 or 1) at which the crop is still at least
   ``image_size`` on both sides: libjpeg-turbo's scaled IDCT skips most of the work for the
   large crops of typical training (a 500x375 image whose crop is >= 448 pixels decodes at half
   size, a quarter of the pixels), with the fast integer DCT (tf_cnn_benchmarks decodes with
   ``dct_method='INTEGER_FAST'`` too) and the fast chroma upsampling;
4. crop the box out of the scaled image and resize it with torch's uint8 kernels
   (``F.interpolate``, ``antialias=False``: TensorFlow's ``resize_images`` semantics, and the
   DCT scaling above leaves at most a factor 2 to shrink, where antialiasing changes little);
   flip by writing the rows reversed.

Decoding only the crop window (libjpeg-turbo's ``jpeg_crop_scanline`` / ``jpeg_skip_scanlines``,
as tf.data's ``decode_and_crop_jpeg`` does) is the ``libjpeg-crop`` decoder: no maintained Python
binding that installs here exposes it (PyTurboJPEG 2.x needs libturbojpeg 3, this machine has
libjpeg-turbo 2.1; simplejpeg and imagecodecs decode whole images), so :mod:`.jpeg_crop` builds
a small C function over the system libjpeg on first use. Its pixels are simplejpeg's, bit for bit.

Decoders (:data:`DECODERS`, measured per core by ``benchmarks/input_pipeline.py --decoders``):
``libjpeg-crop`` (the default where it builds), ``simplejpeg`` (libjpeg-turbo bundled in its
wheel; the default when the window decoder cannot be built) and ``pillow`` (always there;
``Image.draft`` gives it the same DCT scaling). Files that are not
JPEG (PNG, BMP) and JPEGs simplejpeg cannot convert (CMYK) go to Pillow. Both release the GIL
while decoding, but the resize and the Python between calls do not; threads against processes
is measured in ``docs/results/input_pipeline.md``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import ConfigError, ImageDecodeError

#: tf_cnn's ``--resize_method`` names; ``round_robin`` cycles through the first four in this
#: order (its ``_RESIZE_METHOD_MAP``) by the example's position, ``crop`` takes an ``image_size``
#: square without resizing. tf_cnn calls TensorFlow 1's ``resize_images``
#: (``align_corners=False``): the legacy mapping ``source = i * in / out`` (no half-pixel
#: centres) and no antialiasing. PyTorch's closest: ``interpolate(mode="nearest")`` is identical;
#: ``bilinear`` / ``bicubic`` (same a = -0.75 kernel) with ``antialias=False`` differ by the
#: half-pixel shift; TensorFlow's ``area`` averages exact fractional source boxes (Pillow's
#: ``BOX``; ``interpolate(mode="area")`` uses integer bins). docs/data.md has the measured differences.
RESIZE_MODES: tuple[str, ...] = ("nearest", "bilinear", "bicubic", "area")
RESIZE_METHODS: tuple[str, ...] = (*RESIZE_MODES, "round_robin", "crop")
#: DCT scale denominators libjpeg-turbo decodes cheaply, largest first.
_DCT_SCALES = (8, 4, 2, 1)


def resize_method_for(resize_method: str, position: int) -> str:
    """The concrete method (``nearest``, ``bilinear``, ``bicubic``, ``area`` or ``crop``) for an
    example at ``position``: ``round_robin`` takes ``RESIZE_METHODS[position % 4]``.

    tf_cnn's ``position`` is its ``batch_position``: a counter modulo the batch size attached
    to each record in file order, before the shuffle, so it follows the example, not the slot
    of the batch it lands in; the example's index is the faithful equivalent.
    """
    if resize_method not in RESIZE_METHODS:
        raise ConfigError(f"--resize_method must be one of {', '.join(RESIZE_METHODS)}; got {resize_method!r}")
    return RESIZE_METHODS[position % 4] if resize_method == "round_robin" else resize_method


class Decoder(Protocol):
    """An image decoder: ``size`` from the header, ``decode`` to RGB uint8 HWC at a DCT scale."""

    name: str
    #: The GIL is released for a whole training crop's decode (one C call), so decoding threads
    #: scale with the cores (``worker_kind="auto"`` then takes threads).
    releases_gil: bool

    def size(self, data: bytes) -> tuple[int, int]:
        """``(width, height)`` of the encoded image, from its header."""
        ...

    def decode(self, data: bytes, scale: int = 1) -> np.ndarray:
        """RGB uint8 ``[H, W, 3]`` at about ``1/scale`` of the full size (at least ``ceil(side/scale)``)."""
        ...


def is_jpeg(data: bytes) -> bool:
    """The bytes start with a JPEG start-of-image marker."""
    return data[:3] == b"\xff\xd8\xff"


def _pillow() -> Any:
    """Pillow's ``Image`` module, imported at first use: Pillow is the ``images`` extra, and
    ``stoker.data`` (so ``stoker.Estimator``) must import without it."""
    try:
        from PIL import Image
    except ImportError as e:
        raise ConfigError("decoding images needs Pillow: pip install 'stoker[images]'") from e
    return Image


def _pillow_reason(e: Exception) -> str:
    """What Pillow's error says about the bytes, without its in-memory file object's address."""
    if type(e).__name__ == "UnidentifiedImageError":  # its text names "<_io.BytesIO object at 0x...>"
        return "not an image format Pillow reads (JPEG, PNG, BMP, ...)"
    return f"{type(e).__name__}: {e}"


class PillowDecoder:
    """Pillow (libjpeg-turbo in its wheels): any format it reads; ``draft`` for JPEG DCT scaling."""

    name = "pillow"
    releases_gil = False  # several Python-level steps per image; 2 threads ran at 0.93x 2 processes

    def size(self, data: bytes) -> tuple[int, int]:
        pil = _pillow()
        try:
            with pil.open(io.BytesIO(data)) as im:
                return im.size
        except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, ... for bad bytes
            raise ImageDecodeError(_pillow_reason(e)) from e

    def decode(self, data: bytes, scale: int = 1) -> np.ndarray:
        pil = _pillow()
        try:
            with pil.open(io.BytesIO(data)) as im:
                if scale > 1 and im.format == "JPEG":
                    w, h = im.size
                    im.draft("RGB", (-(-w // scale), -(-h // scale)))  # the smallest DCT scale >= that size
                im.load()
                rgb = im if im.mode == "RGB" else im.convert("RGB")
                return np.asarray(rgb)
        except Exception as e:
            raise ImageDecodeError(_pillow_reason(e)) from e


class SimpleJpegDecoder:
    """simplejpeg (libjpeg-turbo in its wheel) for JPEGs, with the fast DCT and upsampling;
    everything else (PNG, CMYK JPEGs) through :class:`PillowDecoder`."""

    name = "simplejpeg"
    releases_gil = False  # held for the header parse; threads beat processes on one day, lost on another

    def __init__(self) -> None:
        self._fallback = PillowDecoder()

    def _header(self, data: bytes) -> tuple[int, int, str]:
        import simplejpeg

        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError as e:
            raise ImageDecodeError(f"not a readable JPEG header: {e}") from e
        return int(width), int(height), str(colorspace)

    def size(self, data: bytes) -> tuple[int, int]:
        if not is_jpeg(data):
            return self._fallback.size(data)
        width, height, _ = self._header(data)
        return width, height

    def decode(self, data: bytes, scale: int = 1) -> np.ndarray:
        import simplejpeg

        if not is_jpeg(data):
            return self._fallback.decode(data, scale)
        width, height, colorspace = self._header(data)
        if colorspace in ("CMYK", "YCCK"):
            return self._fallback.decode(data, scale)  # libjpeg-turbo does not convert these to RGB
        # min_width/min_height pick the smallest M/8 scale giving at least this size: exactly 1/scale.
        try:
            return simplejpeg.decode_jpeg(
                data,
                colorspace="RGB",
                fastdct=True,
                fastupsample=True,
                min_width=-(-width // scale),
                min_height=-(-height // scale),
            )
        except ValueError as e:  # strict mode: truncated data and corrupt entropy coding raise
            raise ImageDecodeError(f"corrupt or truncated JPEG: {e}") from e


class CropJpegDecoder:
    """libjpeg-turbo's partial decompression (:mod:`stoker.data.images.jpeg_crop`): only the crop
    window is decoded, at the DCT scale, with the fast IDCT and upsampling (simplejpeg's
    settings, and its pixels bit for bit); what is not a JPEG, and CMYK JPEGs, go to Pillow."""

    name = "libjpeg-crop"
    releases_gil = True  # one ctypes call decodes the window

    def __init__(self) -> None:
        from . import jpeg_crop

        if not jpeg_crop.available():
            raise ConfigError(f"decoder='libjpeg-crop' is not available here: {jpeg_crop.unavailable_reason()}")
        self._window = jpeg_crop.decode_window
        self._size = jpeg_crop.jpeg_size
        self._error = jpeg_crop.WindowDecodeError
        self._fallback = PillowDecoder()

    def size(self, data: bytes) -> tuple[int, int]:
        if not is_jpeg(data):
            return self._fallback.size(data)
        try:
            return self._size(data)
        except self._error as e:
            raise ImageDecodeError(str(e)) from e

    def decode_window(self, data: bytes, scale: int, x: int, y: int, w: int, h: int) -> np.ndarray:
        """RGB uint8 ``[h, w, 3]``: that window of the image decoded at ``1/scale`` (scaled pixels)."""
        if is_jpeg(data):
            try:
                return self._window(data, scale, x, y, w, h)
            except self._error as e:
                if not e.unsupported:
                    raise ImageDecodeError(f"corrupt or truncated JPEG: {e}") from e
        return self._fallback.decode(data, scale)[y : y + h, x : x + w]

    def decode(self, data: bytes, scale: int = 1) -> np.ndarray:
        width, height = self.size(data)
        return self.decode_window(data, scale, 0, 0, -(-width // scale), -(-height // scale))


def _simplejpeg_available() -> bool:
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return False
    return True


def _crop_available() -> bool:
    from . import jpeg_crop

    return jpeg_crop.available()


#: Decoder names and constructors, fastest first (``benchmarks/input_pipeline.py --decoders``).
DECODERS: dict[str, Callable[[], Decoder]] = {
    "libjpeg-crop": CropJpegDecoder,
    "simplejpeg": SimpleJpegDecoder,
    "pillow": PillowDecoder,
}


def available_decoders() -> list[str]:
    """The decoders that work here, fastest first."""
    works = {"libjpeg-crop": _crop_available, "simplejpeg": _simplejpeg_available}  # looked up at each call
    return [name for name in DECODERS if works.get(name, lambda: True)()]


def get_decoder(name: str = "auto") -> Decoder:
    """A decoder by name; ``auto``: the fastest installed (simplejpeg, else Pillow)."""
    if name == "auto":
        name = available_decoders()[0]
    if name not in DECODERS:
        raise ConfigError(f"decoder must be auto or one of {', '.join(DECODERS)}; got {name!r}")
    if name == "simplejpeg" and not _simplejpeg_available():
        raise ConfigError("decoder='simplejpeg' needs the simplejpeg package: pip install simplejpeg")
    return DECODERS[name]()  # libjpeg-crop raises its own ConfigError saying why it is unavailable


def dct_scale(box_w: float, box_h: float, size: int) -> int:
    """The largest DCT scale denominator (8, 4, 2 or 1) that keeps the crop >= ``size`` on both sides."""
    for d in _DCT_SCALES:
        if box_w / d >= size and box_h / d >= size:
            return d
    return 1


def _contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous, writable array (torch refuses to wrap read-only memory silently)."""
    return a if a.flags.c_contiguous and a.flags.writeable else np.array(a)


def resize_uint8(crop: np.ndarray, size: int, method: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 HWC ``crop`` resized to ``size`` x ``size`` with ``method`` (one of :data:`RESIZE_MODES`):
    uint8 ``[size, size, 3]`` (a strided view; copy it out), or ``out`` (uint8 ``[size, size, 3]``,
    contiguous) filled in place and returned."""
    x = torch.from_numpy(_contiguous(crop)).permute(2, 0, 1).unsqueeze(0)
    if x.shape[-2:] == (size, size):
        return x[0].permute(1, 2, 0) if out is None else out.copy_(x[0].permute(1, 2, 0))
    if out is not None and method in ("bilinear", "bicubic"):
        # The out overload writes straight into the HWC batch slot through torch's channels_last uint8
        # kernel: measured 0.13 ms for a 300x260 crop to 224, against 0.40 ms for interpolate's
        # NCHW result plus the copy into the slot (1 thread, 2026-11-25); the values are identical.
        upsample = torch.ops.aten.upsample_bilinear2d if method == "bilinear" else torch.ops.aten.upsample_bicubic2d
        upsample.out(x, [size, size], False, None, None, out=out.permute(2, 0, 1).unsqueeze(0))
        return out
    if method == "area":  # torch's area resize (adaptive average pooling) has no uint8 kernel
        y = F.interpolate(x.float(), size=(size, size), mode="area").round_().to(torch.uint8)
    elif method == "nearest":
        y = F.interpolate(x, size=(size, size), mode="nearest")
    else:
        y = F.interpolate(x, size=(size, size), mode=method, align_corners=False, antialias=False)
    return y[0].permute(1, 2, 0)


def decode_crop_resize(
    data: bytes,
    box: tuple[float, float, float, float],
    size: int,
    resize_method: str = "bilinear",
    flip: bool = False,
    *,
    decoder: Decoder | None = None,
    out: np.ndarray | torch.Tensor | None = None,
    image_wh: tuple[int, int] | None = None,
) -> np.ndarray:
    """The ``box = (left, top, width, height)`` region of the encoded image, resized to
    ``size`` x ``size`` (``resize_method``: one of :data:`RESIZE_MODES`, or ``crop``: the box is
    taken as is and must be ``size`` x ``size``), flipped left-right when ``flip``: uint8 ``[size, size, 3]``.

    Decodes at the smallest DCT scale that keeps the box at least ``size`` on both sides. Writes
    into ``out`` (uint8 ``[size, size, 3]``) when given and returns it. ``image_wh``: the image's
    ``(width, height)`` when the caller has read it from the header already.

    Raises:
        ImageDecodeError: the bytes are not a decodable image.
    """
    decoder = decoder or get_decoder()
    left, top, bw, bh = box
    scale = 1 if resize_method == "crop" else dct_scale(bw, bh, size)
    window: Callable[[bytes, int, int, int, int, int], np.ndarray] | None = getattr(decoder, "decode_window", None)
    if window is not None:  # only the window is decoded; libjpeg's scaled size is ceil(side / scale)
        width, height = image_wh or decoder.size(data)
        scaled_w, scaled_h = -(-width // scale), -(-height // scale)
        image: np.ndarray | None = None
    else:
        if scale > 1:
            width, height = image_wh or decoder.size(data)
        image = decoder.decode(data, scale)
        scaled_h, scaled_w = image.shape[:2]
        if scale == 1:
            width, height = scaled_w, scaled_h
    fx, fy = scaled_w / width, scaled_h / height
    x0, y0 = int(math.floor(left * fx)), int(math.floor(top * fy))
    x1 = max(x0 + 1, min(scaled_w, int(round((left + bw) * fx))))
    y1 = max(y0 + 1, min(scaled_h, int(round((top + bh) * fy))))
    if image is not None:
        crop = image[y0:y1, x0:x1]
    else:
        assert window is not None
        crop = window(data, scale, x0, y0, x1 - x0, y1 - y0)
    if resize_method == "crop":
        if crop.shape[:2] != (size, size):
            raise ImageDecodeError(f"is {scaled_w}x{scaled_h}, smaller than the {size}x{size} crop")
        result = torch.from_numpy(_contiguous(crop))
    elif out is not None and resize_method in ("bilinear", "bicubic"):
        target = torch.as_tensor(out)
        resize_uint8(crop, size, resize_method, out=target)
        if flip:
            target.copy_(target.flip(1))
        return out if isinstance(out, np.ndarray) else out.numpy()
    else:
        result = resize_uint8(crop, size, resize_method)
    if flip:
        result = result.flip(1)
    if out is None:
        return result.contiguous().numpy()
    torch.as_tensor(out).copy_(result)
    return out if isinstance(out, np.ndarray) else out.numpy()


__all__ = [
    "DECODERS",
    "RESIZE_METHODS",
    "RESIZE_MODES",
    "Decoder",
    "ImageDecodeError",
    "PillowDecoder",
    "SimpleJpegDecoder",
    "available_decoders",
    "decode_crop_resize",
    "dct_scale",
    "get_decoder",
    "is_jpeg",
    "resize_method_for",
    "resize_uint8",
]
