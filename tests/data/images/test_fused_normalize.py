"""The one-pass CPU normalisation (stoker.data.images.fused_normalize): bitwise torch's three passes for
any pixel count (the vector loop's tail included), the ImagePreprocessor using it, argument
checks, and the torch path where the library is turned off or cannot be built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from stoker.data.images import fused_normalize, normalize_images
from stoker.data.images.normalize import IMAGENET_MEAN, IMAGENET_STD, TF_CNN_MEAN, TF_CNN_STD, ImagePreprocessor
from stoker.data.native import NativeLibrary

needs_build = pytest.mark.skipif(
    not fused_normalize.available(), reason=f"cannot be built here: {fused_normalize.unavailable_reason()}"
)


def _torch_reference(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    return images.to(torch.float32).sub(mean).div(std)


@needs_build
@pytest.mark.parametrize("pixels", [1, 7, 8, 9, 23, 64, 1000, 51529])
def test_every_value_is_torchs_bit_for_bit(pixels: int) -> None:
    gen = torch.Generator().manual_seed(pixels)
    images = torch.randint(0, 256, (pixels, 3), dtype=torch.uint8, generator=gen)
    images[0] = torch.tensor([0, 255, 128], dtype=torch.uint8)  # both ends and the middle
    for mean, std in (((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), (TF_CNN_MEAN, TF_CNN_STD)):
        m255 = torch.tensor(mean, dtype=torch.float32).mul(255)
        s255 = torch.tensor(std, dtype=torch.float32).mul(255)
        got = fused_normalize.normalize_rgb(images, m255, s255)
        assert got.dtype == torch.float32 and got.shape == images.shape
        assert torch.equal(got, _torch_reference(images, m255, s255))


@needs_build
def test_exact_values_and_the_out_argument() -> None:
    images = torch.tensor([[[0, 255, 51], [255, 0, 102]]], dtype=torch.uint8)
    out = torch.full((1, 2, 3), float("nan"))
    got = fused_normalize.normalize_rgb(images, torch.full((3,), 127.5), torch.full((3,), 127.5), out=out)
    assert got is out
    # (x - 127.5) / 127.5 in float32: 0 -> -1, 255 -> 1, 51 -> -0.6, 102 -> -0.2 (their float32 roundings)
    expected = torch.tensor([[[-1.0, 1.0, -0.6], [1.0, -1.0, -0.2]]], dtype=torch.float32)
    assert torch.equal(out, expected)


@needs_build
def test_bad_arguments_are_refused() -> None:
    m = torch.zeros(3)
    s = torch.ones(3)
    with pytest.raises(ValueError, match="contiguous uint8"):
        fused_normalize.normalize_rgb(torch.zeros(2, 3), m, s)  # float images
    with pytest.raises(ValueError, match="contiguous uint8"):
        fused_normalize.normalize_rgb(torch.zeros(2, 4, dtype=torch.uint8), m, s)  # 4 channels
    with pytest.raises(ValueError, match="contiguous uint8"):
        fused_normalize.normalize_rgb(torch.zeros(4, 3, dtype=torch.uint8)[::2], m, s)  # strided
    with pytest.raises(ValueError, match="mean must hold 3 values"):
        fused_normalize.normalize_rgb(torch.zeros(2, 3, dtype=torch.uint8), torch.zeros(4), s)
    with pytest.raises(ValueError, match="out must be contiguous float32"):
        fused_normalize.normalize_rgb(torch.zeros(2, 3, dtype=torch.uint8), m, s, out=torch.zeros(3, 3))


@needs_build
def test_the_preprocessor_uses_it_on_a_cpu_and_gives_normalize_images_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    real = fused_normalize.normalize_rgb

    def counting(images: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(images.shape))
        return real(images, *args)

    monkeypatch.setattr(fused_normalize, "normalize_rgb", counting)
    images = torch.randint(0, 256, (5, 13, 11, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    out = ImagePreprocessor()(images)
    assert calls == [(5, 13, 11, 3)]
    assert out.shape == (5, 3, 13, 11) and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, normalize_images(images, IMAGENET_MEAN, IMAGENET_STD))


def _fresh_library() -> NativeLibrary:
    """A library object like fused_normalize's, not yet loaded (the module's own keeps its first outcome)."""
    lib = fused_normalize.LIBRARY
    return NativeLibrary(lib.name, lib.source, switch=lib.switch, declare=fused_normalize._declare, cflags=lib.cflags)


def test_turned_off_or_unbuildable_the_torch_path_gives_the_same_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = torch.arange(2 * 9 * 5 * 3).remainder(256).to(torch.uint8).view(2, 9, 5, 3)
    with_it = ImagePreprocessor()(images)  # the fused pass where it builds, else the torch path
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path))

    monkeypatch.setenv("STOKER_FUSED_NORMALIZE", "0")
    off = _fresh_library()
    assert not off.available() and off.unavailable_reason() == "turned off by STOKER_FUSED_NORMALIZE=0"

    monkeypatch.delenv("STOKER_FUSED_NORMALIZE")
    monkeypatch.setenv("CC", sys.executable)  # a "compiler" that fails
    failing = _fresh_library()
    reason = failing.unavailable_reason() or ""
    assert not failing.available() and reason.startswith("OSError:") and "failed (exit" in reason
    assert not list((tmp_path / "ext").glob("*"))  # no half-built library left behind

    for lib in (off, failing):
        monkeypatch.setattr(fused_normalize, "LIBRARY", lib)
        assert not fused_normalize.available()
        assert torch.equal(ImagePreprocessor()(images), with_it)
