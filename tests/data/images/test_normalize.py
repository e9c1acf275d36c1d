"""The float cast and normalisation of uint8 batches (``stoker.data.images.normalize``):
exact values, bitwise ``normalize_images`` on every path (row-wise, in blocks, any strides),
colour distortions before the normalisation, the wiring refused when wrong, CUDA as the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.images import color_test_image, color_test_params, distorted_01
from stoker.data.base import example_uniforms
from stoker.data.images import fused_normalize, normalize, normalize_images
from stoker.data.images.color import color_params
from stoker.data.images.crops import COLOR_PARAMS, TRAIN_DRAWS
from stoker.data.images.normalize import IMAGENET_MEAN, IMAGENET_STD, TF_CNN_MEAN, TF_CNN_STD, ImagePreprocessor


def test_normalisation_exact_values() -> None:
    images = torch.tensor([[[[0, 255, 51], [255, 0, 102]]]], dtype=torch.uint8)  # [1, 1, 2, 3]
    out = ImagePreprocessor(TF_CNN_MEAN, TF_CNN_STD)(images)
    assert out.shape == (1, 3, 1, 2) and out.dtype == torch.float32
    # tf_cnn's x / 127.5 - 1: 0 -> -1, 255 -> 1, 51 -> -0.6, 102 -> -0.2 (float32 of (x - 127.5) / 127.5)
    expected = (np.array([[0, 255], [255, 0], [51, 102]], np.float32) - np.float32(127.5)) / np.float32(127.5)
    np.testing.assert_array_equal(out[0, :, 0].numpy(), expected)
    assert out[0, 0, 0, 0].item() == -1.0 and out[0, 0, 0, 1].item() == 1.0


@pytest.mark.parametrize("channels_last", [True, False])
def test_without_colour_it_is_normalize_images_bitwise(channels_last: bool) -> None:
    images = torch.randint(0, 256, (4, 9, 7, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = ImagePreprocessor(channels_last=channels_last)(images)
    assert torch.equal(out, normalize_images(images, IMAGENET_MEAN, IMAGENET_STD))
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    distorted = ImagePreprocessor(distortions=True, channels_last=channels_last)(
        images, torch.from_numpy(color_params(example_uniforms(0, 0, np.arange(4), TRAIN_DRAWS)))
    )
    assert distorted.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert ImagePreprocessor().state_dict() == {}


def test_row_wise_normalisation_follows_the_width_and_takes_any_strides() -> None:
    """The channels_last path normalises image rows against constants repeated along a row; a
    batch of another width, or a non-contiguous one (a slice), gives what the broadcast gives."""
    pre = ImagePreprocessor()
    gen = torch.Generator().manual_seed(1)
    for shape in ((2, 5, 7, 3), (3, 4, 11, 3), (2, 5, 7, 3)):
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        assert torch.equal(pre(images), normalize_images(images, IMAGENET_MEAN, IMAGENET_STD))
    wide = torch.randint(0, 256, (2, 6, 10, 3), dtype=torch.uint8, generator=gen)
    part = wide[:, :, 2:8]  # not contiguous
    assert torch.equal(pre(part), normalize_images(part.contiguous(), IMAGENET_MEAN, IMAGENET_STD))


def test_a_batch_larger_than_a_block_is_normalised_in_blocks_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU the rows are normalised a cache-sized block at a time; a block that does not divide
    the rows (here 5 rows of 30 values, the last block short) gives the whole-batch result."""
    monkeypatch.setattr(normalize, "_NORMALIZE_BLOCK_BYTES", 5 * 4 * 30)
    monkeypatch.setattr(fused_normalize, "available", lambda: False)  # the torch path, where it builds too
    images = torch.randint(0, 256, (3, 7, 10, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    out = ImagePreprocessor()(images)
    assert torch.equal(out, normalize_images(images, IMAGENET_MEAN, IMAGENET_STD))
    assert out.is_contiguous(memory_format=torch.channels_last) and out.shape == (3, 3, 7, 10)


def test_distorted_output_is_normalised_distorted_image() -> None:
    img, params = color_test_image(), color_test_params()
    pre = ImagePreprocessor(distortions=True)
    out = pre(torch.from_numpy(img)[None].repeat(len(params), 1, 1, 1), torch.from_numpy(params))
    x01 = distorted_01(img, params)
    mean, std = np.array(IMAGENET_MEAN, np.float32), np.array(IMAGENET_STD, np.float32)
    np.testing.assert_allclose(out.permute(0, 2, 3, 1).numpy(), (x01 - mean) / std, atol=1e-5)


def test_wiring_mistakes_are_refused() -> None:
    images = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    color = torch.zeros(2, COLOR_PARAMS)
    with pytest.raises(ValueError, match="uint8"):
        ImagePreprocessor()(images.float())
    with pytest.raises(ValueError, match="needs the batch's color"):
        ImagePreprocessor(distortions=True)(images)
    with pytest.raises(ValueError, match="was given color"):
        ImagePreprocessor()(images, color)
    with pytest.raises(ValueError, match=r"color must be \[N, 5\]"):
        ImagePreprocessor(distortions=True)(images, color[:1])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_it_matches_the_cpu() -> None:
    img, params = color_test_image(), color_test_params()
    images = torch.from_numpy(img)[None].repeat(len(params), 1, 1, 1)
    color = torch.from_numpy(params)
    for pre, args in ((ImagePreprocessor(), (images,)), (ImagePreprocessor(distortions=True), (images, color))):
        cpu = pre(*args)
        gpu = pre(*(a.cuda() for a in args))  # the module is not moved: it follows its input
        assert gpu.is_cuda
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=0)
