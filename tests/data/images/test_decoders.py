"""The CPU decoders (``stoker.data.images.decoders``): exact crops, flips and nearest resizes, the
resize into a batch row equal to the returned image, the DCT scale, the decoders agreeing and
``auto``'s fixed order, and tf_cnn's ``round_robin`` resize order."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.images import smooth_jpeg
from stoker.data.images import decoders as jpeg_module
from stoker.data.images.decoders import (
    available_decoders,
    dct_scale,
    decode_crop_resize,
    get_decoder,
    resize_method_for,
)


def coordinate_png(width: int = 40, height: int = 30) -> bytes:
    """Lossless image whose pixel (y, x) is (x, y, 7): every crop, flip and nearest resize is checkable."""
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[..., 0] = np.arange(width)[None, :]
    pixels[..., 1] = np.arange(height)[:, None]
    pixels[..., 2] = 7
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("decoder", ["simplejpeg", "pillow"])
def test_crop_flip_and_nearest_resize_are_exact(decoder: str) -> None:
    data, dec = coordinate_png(), get_decoder(decoder)
    out = decode_crop_resize(data, (10, 5, 8, 8), 8, "crop", flip=False, decoder=dec)
    assert out.shape == (8, 8, 3) and out.dtype == np.uint8
    assert out[..., 0].tolist() == [list(range(10, 18))] * 8 and out[:, 0, 1].tolist() == list(range(5, 13))
    flipped = decode_crop_resize(data, (10, 5, 8, 8), 8, "crop", flip=True, decoder=dec)
    assert np.array_equal(flipped, out[:, ::-1])
    # nearest, 16x16 -> 8x8: output column j reads source column 2j
    near = decode_crop_resize(data, (10, 4, 16, 16), 8, "nearest", decoder=dec)
    assert near[0, :, 0].tolist() == [10 + 2 * j for j in range(8)] and near[:, 0, 1].tolist() == [
        4 + 2 * i for i in range(8)
    ]
    into = np.zeros((8, 8, 3), dtype=np.uint8)
    assert decode_crop_resize(data, (10, 5, 8, 8), 8, "crop", decoder=dec, out=into) is into and np.array_equal(
        into, out
    )


@pytest.mark.parametrize("method", ["bilinear", "bicubic", "nearest", "area"])
@pytest.mark.parametrize("flip", [False, True])
def test_resizing_into_the_batch_slot_equals_the_returned_image(method: str, flip: bool) -> None:
    """The slot path (bilinear and bicubic written in place by torch's channels_last kernel) gives the
    very bytes of the path that returns a new array, and of interpolate on the NCHW crop."""
    data, dec = smooth_jpeg(160, 120), get_decoder("simplejpeg")
    box = (13, 7, 117, 93)
    returned = decode_crop_resize(data, box, 56, method, flip, decoder=dec)
    slot = np.full((56, 56, 3), 255, dtype=np.uint8)
    assert decode_crop_resize(data, box, 56, method, flip, decoder=dec, out=slot) is slot
    assert np.array_equal(slot, returned)
    if method in ("bilinear", "bicubic"):
        crop = torch.from_numpy(np.ascontiguousarray(dec.decode(data, 1)[7:100, 13:130])).permute(2, 0, 1)[None]
        expected = torch.nn.functional.interpolate(crop, size=(56, 56), mode=method, align_corners=False)
        expected = expected[0].permute(1, 2, 0)
        assert np.array_equal(slot, (expected.flip(1) if flip else expected).numpy())


def test_dct_scale_picks_the_largest_scale_that_keeps_the_crop_large_enough() -> None:
    assert [dct_scale(w, h, 224) for w, h in ((500, 375), (448, 448), (1000, 900), (1800, 1800), (447, 900))] == [
        1,
        2,
        4,
        8,
        1,
    ]
    data = smooth_jpeg(480, 360)
    for name in available_decoders():
        dec = get_decoder(name)
        assert dec.size(data) == (480, 360)
        assert dec.decode(data, 2).shape == (180, 240, 3) and dec.decode(data, 4).shape == (90, 120, 3)
        # a crop >= 2x the output decodes at half size and still lands close to the full decode's result
        full = decode_crop_resize(data, (0, 0, 480, 360), 100, "area", decoder=dec)
        assert full.shape == (100, 100, 3)


def test_decoders_agree_and_auto_takes_the_fastest_available(monkeypatch: pytest.MonkeyPatch) -> None:
    data = smooth_jpeg()
    box = (7, 3, 100, 80)
    a = decode_crop_resize(data, box, 32, "bilinear", decoder=get_decoder("simplejpeg")).astype(int)
    b = decode_crop_resize(data, box, 32, "bilinear", decoder=get_decoder("pillow")).astype(int)
    assert np.abs(a - b).mean() < 2 and np.abs(a - b).max() <= 12  # fast vs accurate integer DCT
    # as where no window decoder can be built (its own tests: tests/data/images/test_jpeg_crop.py)
    monkeypatch.setattr(jpeg_module, "_crop_available", lambda: False)
    assert get_decoder().name == "simplejpeg" and available_decoders() == ["simplejpeg", "pillow"]
    monkeypatch.setattr(jpeg_module, "_simplejpeg_available", lambda: False)
    assert get_decoder().name == "pillow" and available_decoders() == ["pillow"]
    with pytest.raises(ValueError, match="pip install simplejpeg"):
        get_decoder("simplejpeg")
    with pytest.raises(ValueError, match="auto or one of libjpeg-crop, simplejpeg, pillow; got 'turbo'"):
        get_decoder("turbo")


def test_resize_method_for_round_robin_cycles_tf_cnns_order() -> None:
    assert [resize_method_for("round_robin", i) for i in range(6)] == [
        "nearest",
        "bilinear",
        "bicubic",
        "area",
        "nearest",
        "bilinear",
    ]
    assert resize_method_for("bicubic", 3) == "bicubic"
    with pytest.raises(ValueError, match="--resize_method must be one of nearest, bilinear"):
        resize_method_for("lanczos", 0)
