"""Decoding only the crop window of a JPEG: libjpeg-turbo's partial decompression.

tf.data's ``decode_and_crop_jpeg`` decodes only the rows and columns of the training crop;
a whole-image decoder (simplejpeg, Pillow) decodes everything and throws most of it away when
the crop is small. libjpeg-turbo (>= 1.5.1) can do the same as TensorFlow: ``jpeg_crop_scanline``
skips the IDCT of the columns left and right of the window, ``jpeg_skip_scanlines`` the rows
above it, and decoding stops after its last row. No Python binding that installs on this
project's machines exposes that (PyTurboJPEG 2.x needs libturbojpeg 3, the machines have
libjpeg-turbo 2.1; simplejpeg and imagecodecs decode whole images), so ``_jpeg_crop.c`` beside
this file is a ~170-line C function over the system's libjpeg, built on first use with the
system C compiler into the user cache and called through ``ctypes`` (which releases the GIL;
:mod:`stoker.data.native`).

Where there is no C compiler, no ``jpeglib.h`` or a libjpeg without partial decompression, the
build fails once (the reason is kept: :func:`unavailable_reason`), ``libjpeg-crop`` is not
offered and ``auto`` picks simplejpeg as before. ``STOKER_JPEG_CROP=0`` turns it off.

The pixels are those of a whole-image decode with the same settings (fast integer IDCT, plain
upsampling, the same DCT scale) cropped afterwards: bit for bit, tested against simplejpeg.
What a window decode cannot see is damage below the window's last row: a JPEG truncated there
decodes (TensorFlow's ``decode_and_crop_jpeg`` behaves the same); damage inside the window is a
:class:`~stoker.data.images.decoders.ImageDecodeError`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from ...errors import ImageDecodeError
from ..native import NativeLibrary

SOURCE = Path(__file__).with_name("_jpeg_crop.c")
_OK, _ERROR, _UNSUPPORTED = 0, 1, 2
_ERR_LEN = 200


def _declare(lib: ctypes.CDLL) -> None:
    c_int_p = ctypes.POINTER(ctypes.c_int)
    lib.stoker_jpeg_size.argtypes = [ctypes.c_char_p, ctypes.c_ulong, c_int_p, c_int_p, ctypes.c_char_p, ctypes.c_int]
    lib.stoker_jpeg_size.restype = ctypes.c_int
    lib.stoker_jpeg_decode_window.argtypes = [
        ctypes.c_char_p,  # data
        ctypes.c_ulong,  # size
        ctypes.c_int,  # scale_denom
        ctypes.c_int,  # x
        ctypes.c_int,  # y
        ctypes.c_int,  # w
        ctypes.c_int,  # h
        ctypes.c_void_p,  # out
        ctypes.c_long,  # out_stride
        ctypes.c_long,  # out_capacity
        c_int_p,  # out_w
        c_int_p,  # out_h
        ctypes.c_char_p,  # err
        ctypes.c_int,  # err_len
    ]
    lib.stoker_jpeg_decode_window.restype = ctypes.c_int


LIBRARY = NativeLibrary("jpeg_crop", SOURCE, switch="STOKER_JPEG_CROP", declare=_declare, libs=("jpeg",))


def library_path() -> Path:
    """Where the built library is kept: named by the source's hash and the machine, so an
    edited source or another architecture builds anew."""
    return LIBRARY.path()


def load() -> ctypes.CDLL | None:
    """The library, built first if needed; ``None`` where it cannot be (see :func:`unavailable_reason`)."""
    return LIBRARY.load()


def available() -> bool:
    """Whether the window decoder can be used here (builds it on the first call)."""
    return LIBRARY.available()


def unavailable_reason() -> str | None:
    """Why :func:`available` is false (``None`` while it is true); builds it first if needed."""
    return LIBRARY.unavailable_reason()


class WindowDecodeError(ImageDecodeError):
    """libjpeg refused the data (its message), or the JPEG is CMYK/YCCK (``unsupported``)."""

    def __init__(self, message: str, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


def jpeg_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` from the JPEG header."""
    lib = load()
    assert lib is not None, "check available() first"
    w, h, err = ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(_ERR_LEN)
    if lib.stoker_jpeg_size(data, len(data), ctypes.byref(w), ctypes.byref(h), err, _ERR_LEN) != _OK:
        raise WindowDecodeError(f"not a readable JPEG header: {err.value.decode(errors='replace')}")
    return w.value, h.value


def decode_window(data: bytes, scale: int, x: int, y: int, w: int, h: int) -> np.ndarray:
    """RGB uint8 ``[h', w', 3]``: the window at ``(x, y)`` of size ``w`` x ``h`` of the image decoded
    at ``1/scale`` (coordinates in scaled pixels; the window is clipped to the image).

    Raises:
        WindowDecodeError: corrupt data inside the window, a bad header, or (``unsupported``) a
            CMYK/YCCK JPEG, which libjpeg-turbo does not convert to RGB.
    """
    lib = load()
    assert lib is not None, "check available() first"
    out = np.empty((h, w, 3), dtype=np.uint8)
    ow, oh, err = ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(_ERR_LEN)
    rc = lib.stoker_jpeg_decode_window(
        data, len(data), scale, x, y, w, h, out.ctypes.data, w * 3, out.nbytes,
        ctypes.byref(ow), ctypes.byref(oh), err, _ERR_LEN,
    )  # fmt: skip
    if rc == _UNSUPPORTED:
        raise WindowDecodeError("CMYK/YCCK JPEG", unsupported=True)
    if rc != _OK:
        raise WindowDecodeError(err.value.decode(errors="replace") or f"libjpeg failed (code {rc})")
    return out if (oh.value, ow.value) == (h, w) else out[: oh.value, : ow.value]


__all__ = ["LIBRARY", "SOURCE", "WindowDecodeError", "available", "decode_window", "jpeg_size", "library_path", "load"]
