"""The batch builder of encoded-image sources (``stoker.data.images.source`` and its
``ExampleDecoder``): uint8 and float outputs, shared-memory worker slots (bitwise the main
process's batches), resume with workers, bad JPEGs named and replaced, pinned batches, and GPU
decoding against the CPU path."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from helpers.images import smooth_jpeg_tree
from stoker.data import DataError, ImageOptions, ReadOptions, image_folder
from stoker.data.images import COLOR_PARAMS, ImagePreprocessor
from stoker.data.images.decoders import (
    available_decoders,
    get_decoder,
)


@pytest.mark.parametrize("crop", ["inception", "tf_cnn"])
def test_float_output_is_the_preprocessor_of_the_uint8_output(tmp_path: Path, crop: str) -> None:
    root = smooth_jpeg_tree(tmp_path)
    for distortions in (False, True):
        read, image = ReadOptions(batch_size=6, seed=4), ImageOptions(image_size=24, crop=crop, distortions=distortions)
        as_float = image_folder(root, read=read, image=image)
        as_uint8 = image_folder(root, read=read, image=dataclasses.replace(image, output="uint8"))
        pre = ImagePreprocessor(distortions=distortions, channels_last=False)
        for _ in range(4):
            (xf, yf), (xu, yu) = next(as_float), next(as_uint8)
            assert torch.equal(yf, yu)
            if distortions:
                assert xu["images"].dtype == torch.uint8 and xu["color"].shape == (6, COLOR_PARAMS)
                assert torch.equal(xf, pre(xu["images"], xu["color"]))
            else:
                assert xu.dtype == torch.uint8 and xu.shape == (6, 24, 24, 3)
                assert torch.equal(xf, pre(xu))


@pytest.mark.parametrize("output", ["uint8", "float32"])
def test_shared_memory_slots_give_bitwise_the_main_process_batches(tmp_path: Path, output: str) -> None:
    root = smooth_jpeg_tree(tmp_path, per_class=7)
    read = ReadOptions(batch_size=4, seed=2)
    image = ImageOptions(image_size=16, output=output, crop="tf_cnn", distortions=True)
    reference = image_folder(root, read=read, image=image)
    expected = [next(reference) for _ in range(11)]  # 14 examples: 3 batches an epoch, across 3 epochs
    src = image_folder(root, read=dataclasses.replace(read, num_workers=2, worker_kind="process"), image=image)
    got = [next(iter(src)) for _ in range(11)]
    ring = src._workers.ring
    assert ring is not None and ring.count == 2 * 2 + 2  # prefetch 2 x 2 workers, plus the one being read
    src.close()
    # Every batch kept to the end still holds its values: none aliases a slot the workers reused.
    for (xe, ye), (xg, yg) in zip(expected, got, strict=True):
        if output == "uint8":
            assert torch.equal(xe["images"], xg["images"]) and torch.equal(xe["color"], xg["color"])
        else:
            assert torch.equal(xe, xg)
        assert torch.equal(ye, yg)


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_resume_with_workers_is_exact(tmp_path: Path, kind: str) -> None:
    root = smooth_jpeg_tree(tmp_path, per_class=7)

    def make():
        return image_folder(
            root,
            read=ReadOptions(batch_size=4, seed=5, num_workers=2, worker_kind=kind),
            image=ImageOptions(image_size=16, output="uint8", crop="tf_cnn"),
        )

    straight = make()
    expected = [next(iter(straight)) for _ in range(8)]
    first = make()
    for _ in range(4):
        next(iter(first))
    state = first.state_dict()
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    got = [next(iter(resumed)) for _ in range(4)]
    for (xe, ye), (xg, yg) in zip(expected[4:], got, strict=True):
        assert torch.equal(xe, xg) and torch.equal(ye, yg)
    straight.close()
    resumed.close()


@pytest.mark.parametrize("decoder", available_decoders())
@pytest.mark.parametrize("workers", [0, 2])
def test_bad_jpeg_names_the_file_the_example_and_the_fault(tmp_path: Path, decoder: str, workers: int) -> None:
    # workers: processes for pillow and simplejpeg, threads for libjpeg-crop (worker_kind="auto")
    root = smooth_jpeg_tree(tmp_path, per_class=3)
    bad = root / "class_1" / "img_001.jpg"  # example 4 in file order
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])  # the header intact, the scan cut short
    src = image_folder(
        root,
        read=ReadOptions(batch_size=6, num_workers=workers),
        image=ImageOptions(image_size=16, decoder=decoder),
        train=False,
    )
    # the evaluation crop (the centre 87.5 %) reaches into the missing half, so the window decoder sees it too
    fault = "image file is truncated" if decoder == "pillow" else "corrupt or truncated JPEG: Premature end"
    with pytest.raises(DataError, match=rf"image_folder: cannot read image {bad} \(example 4\): .*{fault}"):
        next(iter(src))
    src.close()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_skipped_bad_examples_are_identical_after_a_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    root = smooth_jpeg_tree(tmp_path, per_class=5)
    (root / "class_0" / "img_002.jpg").write_bytes(b"\xff\xd8\xff not really a jpeg")

    def make():
        return image_folder(
            root,
            read=ReadOptions(batch_size=3, seed=1, skip_bad_examples=True, num_workers=2, worker_kind=kind),
            image=ImageOptions(image_size=16, output="uint8"),
        )

    straight = make()
    expected = [next(iter(straight)) for _ in range(9)]  # 3 epochs: the bad one is met once each
    assert straight.bad_examples_skipped == 3
    first = make()
    for _ in range(4):
        next(iter(first))
    state = first.state_dict()
    first.close()
    with caplog.at_level(logging.WARNING, logger="stoker"):
        resumed = make()
        resumed.load_state_dict(state)
        got = [next(iter(resumed)) for _ in range(5)]
    for (xe, ye), (xg, yg) in zip(expected[4:], got, strict=True):
        assert torch.equal(xe, xg) and torch.equal(ye, yg)
    assert resumed.bad_examples_skipped == 2  # epochs 1 and 2 (the resume started inside epoch 1)
    assert any("img_002.jpg (example 2)" in r.getMessage() for r in caplog.records), caplog.records
    straight.close()
    resumed.close()


def test_decode_on_device_without_cuda_says_what_it_needs(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    root = smooth_jpeg_tree(tmp_path, per_class=2)
    with pytest.raises(ValueError, match="decode_on_device needs a CUDA device"):
        image_folder(root, read=ReadOptions(batch_size=2), image=ImageOptions(decode_on_device=True))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_decode_on_device_matches_the_cpu_path(tmp_path: Path) -> None:
    pytest.importorskip("torchvision.io", reason="nvJPEG decoding needs torchvision")
    import torch.nn.functional as F

    root = smooth_jpeg_tree(tmp_path, per_class=4)
    read, image = ReadOptions(batch_size=4, seed=3), ImageOptions(image_size=32, output="uint8", crop="tf_cnn")
    cpu = image_folder(root, read=read, image=image)
    gpu = image_folder(root, read=read, image=dataclasses.replace(image, decode_on_device=True))
    pillow = get_decoder("pillow")

    def full_resolution_reference(source: Any, epoch: int) -> torch.Tensor:
        # What the GPU path computes, on the CPU: the same crop boxes and flips, a whole-image decode
        # (no DCT scaling) and a float bilinear resize. The CPU path itself decodes at a reduced DCT
        # scale with the fast integer IDCT: on this noisy test content it differs from any full
        # decode by ~5 levels on average (simplejpeg against Pillow: 4.6-4.9), so it is no reference.
        idx = np.arange(4)
        planned = source._each_example(
            epoch, idx, source.examples.uniforms(epoch, idx), lambda k, u, j: source._plan_example(k, u)
        )
        out = []
        for _, (example, ((left, top, bw, bh), flip, _)) in planned:
            image = torch.from_numpy(np.array(pillow.decode(example.data))).permute(2, 0, 1)
            x0, y0 = int(left), int(top)
            crop = image[:, y0 : max(y0 + 1, int(round(top + bh))), x0 : max(x0 + 1, int(round(left + bw)))]
            y = F.interpolate(crop[None].float(), size=(32, 32), mode="bilinear", align_corners=False)
            hwc = y[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0)
            out.append(hwc.flip(1) if flip else hwc)
        return torch.stack(out)

    for epoch in range(3):
        (xc, yc), (xg, yg) = cpu.load_batch(torch.arange(4), epoch), gpu.load_batch(torch.arange(4), epoch)
        assert xg.device.type == "cuda" and xg.dtype == torch.uint8 and xg.shape == xc.shape
        assert torch.equal(yc, yg.cpu())
        # nvJPEG's IDCT and chroma upsampling are not libjpeg's: close, not equal (H200, torchvision
        # 0.26: 2.74 at most over these batches, max 22 on this noisy content; a wrong flip or box: > 60)
        diff = (xg.cpu().int() - full_resolution_reference(gpu, epoch).int()).abs().float()
        assert diff.mean() < 4, f"batch {epoch}: mean |nvJPEG - Pillow| {diff.mean():.2f}, max {diff.max():.0f}"


def test_skipped_examples_reach_the_summaries(tmp_path: Path) -> None:
    from helpers.images import make_estimator
    from stoker.summary import read_metrics_csv

    root = smooth_jpeg_tree(tmp_path / "data", classes=3, per_class=4)
    (root / "class_1" / "img_000.jpg").write_bytes(b"garbage")
    est = make_estimator(tmp_path / "run", iterations_per_loop=2, log_every_n_steps=2, summaries=True)

    def input_fn(params: dict) -> object:
        return image_folder(
            root,
            read=ReadOptions(skip_bad_examples=True, seed=1).for_replica(params),
            image=ImageOptions(image_size=16),
        )

    est.train(input_fn, max_steps=6)  # batch 8 of 12 examples: one epoch a step and a half
    rows = [r for r in read_metrics_csv(tmp_path / "run") if r["tag"] == "bad_examples_skipped"]
    assert rows and all(r["value"] >= 1 for r in rows)
    assert [r["value"] for r in rows] == sorted(r["value"] for r in rows)  # a running count


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("workers", [0, 2])
def test_uint8_batches_come_pinned_for_a_cuda_infeed(tmp_path: Path, workers: int) -> None:
    root = smooth_jpeg_tree(tmp_path, per_class=4)
    read, image = ReadOptions(batch_size=4, seed=3), ImageOptions(image_size=16, output="uint8")
    pinned = image_folder(
        root, read=dataclasses.replace(read, num_workers=workers), image=dataclasses.replace(image, pin_memory=True)
    )
    plain = image_folder(root, read=read, image=image)
    for _ in range(3):
        (xp, yp), (x, y) = next(iter(pinned)), next(plain)
        assert xp.is_pinned() and xp.pin_memory() is xp  # the infeed's pin_memory() then copies nothing
        assert torch.equal(xp, x) and torch.equal(yp, y)
    pinned.close()
