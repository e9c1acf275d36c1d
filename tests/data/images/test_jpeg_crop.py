"""The window decoder (``libjpeg-crop``, stoker.data.images.jpeg_crop): the pixels of a whole-image
decode cropped afterwards, bit for bit, for every DCT scale, subsampling, progressive and
grayscale files; clipping; damage inside and outside the window; fallbacks; an unavailable build."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.images import noisy_jpeg
from helpers.processes import PYTHON, python_env
from stoker.data.images import jpeg_crop
from stoker.data.images.decoders import ImageDecodeError, available_decoders, decode_crop_resize, get_decoder

pytestmark = pytest.mark.skipif(
    not jpeg_crop.available(), reason=f"the window decoder cannot be built here: {jpeg_crop.unavailable_reason()}"
)


VARIANTS = {
    "4:2:0": {},
    "4:4:4": {"subsampling": 0},
    "4:2:2": {"subsampling": 1},
    "progressive": {"progressive": True},
    "grayscale": {"gray": True},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_windows_are_the_whole_decode_cropped_bit_for_bit(variant: str) -> None:
    pytest.importorskip("simplejpeg")
    data = noisy_jpeg(**VARIANTS[variant])
    whole = get_decoder("simplejpeg")
    rng = np.random.default_rng(1)
    for scale in (1, 2, 4, 8):
        full = whole.decode(data, scale)
        height, width = full.shape[:2]
        assert jpeg_crop.decode_window(data, scale, 0, 0, width, height).tobytes() == full.tobytes()
        for _ in range(12):
            x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
            w, h = int(rng.integers(1, width - x + 1)), int(rng.integers(1, height - y + 1))
            got = jpeg_crop.decode_window(data, scale, x, y, w, h)
            assert got.shape == (h, w, 3) and np.array_equal(got, full[y : y + h, x : x + w]), (scale, x, y, w, h)


def test_decode_crop_resize_gives_simplejpegs_result_for_every_method() -> None:
    pytest.importorskip("simplejpeg")
    data, crop, plain = noisy_jpeg(500, 375), get_decoder("libjpeg-crop"), get_decoder("simplejpeg")
    boxes = [(0, 0, 500, 375), (13.7, 5.2, 460.1, 330.9), (250.5, 100.25, 60.3, 41.7), (3, 7, 224, 224)]
    for box in boxes:
        for method in ("nearest", "bilinear", "bicubic", "area"):
            for size in (24, 224):
                for flip in (False, True):
                    a = decode_crop_resize(data, box, size, method, flip, decoder=crop)
                    b = decode_crop_resize(data, box, size, method, flip, decoder=plain)
                    assert np.array_equal(a, b), (box, method, size, flip)
    exact = decode_crop_resize(data, (3, 7, 224, 224), 224, "crop", decoder=crop)
    assert np.array_equal(exact, plain.decode(data)[7:231, 3:227])


def test_windows_are_clipped_to_the_image_and_bad_windows_refused() -> None:
    data = noisy_jpeg()
    assert jpeg_crop.decode_window(data, 1, 200, 150, 50, 50).shape == (7, 3, 3)
    assert jpeg_crop.decode_window(data, 8, 0, 0, 1000, 1000).shape == (20, 26, 3)  # ceil(157/8), ceil(203/8)
    for args in ((3, 0, 0, 5, 5), (1, 203, 0, 5, 5), (1, -1, 0, 5, 5), (1, 0, 0, 0, 5)):
        with pytest.raises(jpeg_crop.WindowDecodeError):
            jpeg_crop.decode_window(data, *args)


def test_damage_inside_the_window_is_an_error_and_below_it_is_not_seen() -> None:
    data = noisy_jpeg(400, 400)
    cut = data[: len(data) // 2]  # the scan ends about halfway down
    decoder = get_decoder("libjpeg-crop")
    with pytest.raises(ImageDecodeError, match="corrupt or truncated JPEG: Premature end of JPEG file"):
        decoder.decode_window(cut, 1, 0, 300, 100, 100)
    top = decoder.decode_window(cut, 1, 0, 0, 400, 40)  # as tf.data's decode_and_crop_jpeg: not read, not seen
    assert np.array_equal(top, decoder.decode_window(data, 1, 0, 0, 400, 40))
    with pytest.raises(ImageDecodeError, match="not a readable JPEG header"):
        decoder.size(b"\xff\xd8\xff\xe0 garbage")


def test_png_and_cmyk_go_to_pillow() -> None:
    decoder, pillow = get_decoder("libjpeg-crop"), get_decoder("pillow")
    png = io.BytesIO()
    Image.fromarray(np.arange(40 * 30 * 3, dtype=np.uint8).reshape(30, 40, 3)).save(png, format="PNG")
    window = decoder.decode_window(png.getvalue(), 1, 5, 6, 10, 11)
    assert np.array_equal(window, pillow.decode(png.getvalue())[6:17, 5:15])
    cmyk = io.BytesIO()
    Image.fromarray(np.full((16, 24, 4), 60, dtype=np.uint8), mode="CMYK").save(cmyk, format="JPEG")
    assert decoder.size(cmyk.getvalue()) == (24, 16)
    assert np.array_equal(decoder.decode(cmyk.getvalue()), pillow.decode(cmyk.getvalue()))


def test_auto_prefers_the_window_decoder() -> None:
    assert available_decoders()[0] == "libjpeg-crop" and get_decoder().name == "libjpeg-crop"


def _in_a_fresh_process(code: str, **env: str) -> str:
    proc = subprocess.run(
        [PYTHON, "-c", code], env={**python_env(), **env}, capture_output=True, text=True, timeout=120, check=True
    )
    return proc.stdout.strip()


def test_without_a_build_it_is_not_offered_and_says_why(tmp_path: Path) -> None:
    code = (
        "from stoker.data.images.decoders import available_decoders, get_decoder\n"
        "print(available_decoders())\n"
        "try:\n    get_decoder('libjpeg-crop')\nexcept ValueError as e:\n    print(e)\n"
    )
    off = _in_a_fresh_process(code, STOKER_JPEG_CROP="0").splitlines()
    assert "libjpeg-crop" not in off[0] and "turned off by STOKER_JPEG_CROP=0" in off[1]
    failing = _in_a_fresh_process(code, STOKER_CACHE_DIR=str(tmp_path), CC=sys.executable).splitlines()
    assert "libjpeg-crop" not in failing[0]
    assert "not available here: OSError:" in failing[1] and "failed (exit" in failing[1]
    assert not list((tmp_path / "ext").glob("*"))  # no half-built library left behind


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; the build itself runs in the no-build test
def test_the_build_lands_in_the_cache_once(tmp_path: Path) -> None:
    code = "from stoker.data.images import jpeg_crop\nprint(jpeg_crop.available(), jpeg_crop.library_path())"
    first = _in_a_fresh_process(code, STOKER_CACHE_DIR=str(tmp_path))
    assert first.startswith("True ") and Path(first.split(" ", 1)[1]).parent == tmp_path / "ext"
    built = os.stat(first.split(" ", 1)[1]).st_mtime_ns
    assert _in_a_fresh_process(code, STOKER_CACHE_DIR=str(tmp_path)) == first
    assert os.stat(first.split(" ", 1)[1]).st_mtime_ns == built  # loaded, not rebuilt
