"""The CPU defaults' paths on CUDA (``make gpu-check`` runs these): the default data format is
NHWC there, channels_last and ``--compile=module`` train what NCHW eager trains, and real JPEGs
train from the CPU decoders or nvJPEG.
Skipped cleanly where torch sees no CUDA device; not yet run on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from stoker.bench import BenchConfig, run_benchmark
from stoker.bench.plan import build_plan
from stoker.bench.workload import resolve_workload
from stoker.data import synthetic_images

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_default_data_format_on_cuda_is_nhwc() -> None:
    cfg = BenchConfig(model="resnet20", data_name="cifar10", device="cuda")
    assert resolve_workload(cfg).data_format == "NHWC"


def _conv_bn_relu(params: dict[str, Any]) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )


def _losses(data_format: str, compile: bool | str = False) -> list[float]:
    cfg = BenchConfig(
        model="conv_bn_relu",
        batch_size=8,
        num_batches=5,
        num_warmup_batches=0,
        device="cuda",
        data_format=data_format,
        compile=compile,
        init_learning_rate=0.1,
        display_every=1000,
    )

    def input_fn(params: dict[str, Any]) -> Any:
        return synthetic_images(
            (3, 16, 16), 10, batch_size=params["batch_size"], device="cuda", seed=3, channels_last=cfg.channels_last
        )

    result = run_benchmark(cfg, model=_conv_bn_relu, num_classes=10, input_fn=input_fn, log=lambda line: None)
    assert result["data_format"] == data_format and result["num_steps"] == 5
    return result["losses"]


def test_channels_last_and_compiled_train_what_nchw_eager_trains() -> None:
    reference = torch.tensor(_losses("NCHW"))
    # cuDNN picks other kernels per layout (and TF32 may be on): agreement to 1e-3, not bitwise.
    torch.testing.assert_close(torch.tensor(_losses("NHWC")), reference, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(torch.tensor(_losses("NHWC", compile="module")), reference, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("decode_on_device", [False, True], ids=["cpu-workers", "nvjpeg"])
def test_real_jpegs_train_on_cuda_with_either_decoder(tmp_path: Path, decode_on_device: bool) -> None:
    """``--data_dir`` on CUDA: uint8 batches from the decoding workers (pinned, copied without
    blocking) or decoded by nvJPEG on the device; both train, the header names the decoder."""
    if decode_on_device:
        pytest.importorskip("torchvision.io", reason="nvJPEG decoding needs torchvision")
    from helpers.images import make_image_tree

    cfg = BenchConfig(
        model="trivial",
        data_dir=str(make_image_tree(tmp_path / "data", classes=2, per_class=8, size=130)),
        batch_size=8,
        num_batches=4,
        num_warmup_batches=1,
        device="cuda",
        decode_on_device=decode_on_device,
        display_every=1000,
    )
    lines: list[str] = []
    result = run_benchmark(cfg, log=lines.append)
    assert result["num_steps"] == 4 and all(np.isfinite(result["losses"]))
    (input_line,) = [line for line in lines if line.startswith("Input")]
    assert ("nvjpeg decoder" in input_line) == decode_on_device
    assert (
        input_line.split(":", 1)[1]
        .strip()
        .startswith(
            "0 decoding" if decode_on_device else f"{build_plan(cfg).input.data_workers.value} "  # type: ignore[union-attr]
        )
    )
