"""``stoker bench`` without ``--data_format``: the model's default layout on the device (NHWC,
channels_last, for image models; NCHW for the rest), said in the header, overridden by the
flag, and training the same function as NCHW within fp32 tolerance."""

from __future__ import annotations

import pytest
import torch

from helpers.cli import run_main
from stoker import resolve as rules
from stoker.bench import BenchConfig, run_benchmark
from stoker.bench.workload import resolve_workload
from stoker.models import ModelInfo, get_model_info
from stoker.resolve import CPU_NCHW_MODELS


def default_data_format(info: ModelInfo | None, device: torch.device) -> tuple[str, str]:
    choice = rules.data_format(
        image_model=None if info is None else info.is_classifier,
        model="" if info is None else info.name,
        device_type=device.type,
    )
    return choice.value, choice.reason


CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize(
    ("model", "dataset"),
    [("trivial", "imagenet"), ("resnet20", "cifar10"), ("resnet50", "imagenet"), ("inception3", "imagenet")],
)
def test_image_models_default_to_channels_last(model: str, dataset: str) -> None:
    info = get_model_info(model, dataset)
    assert model not in CPU_NCHW_MODELS
    assert default_data_format(info, CPU)[0] == "NHWC"
    assert default_data_format(info, CUDA)[0] == "NHWC"


def test_the_cpu_exceptions_and_the_models_without_images_keep_nchw(monkeypatch: pytest.MonkeyPatch) -> None:
    info = get_model_info("vgg16", "imagenet")
    assert {"vgg11", "vgg16", "vgg19"} <= CPU_NCHW_MODELS  # measured 1.2-1.5x faster NCHW on the CPU
    fmt, why = default_data_format(info, CPU)
    assert (fmt, why) == ("NCHW", "faster for vgg16 on the CPU")
    monkeypatch.setattr(rules, "CPU_NCHW_MODELS", frozenset())
    assert default_data_format(info, CPU)[0] == "NHWC"  # the table decides, nothing else
    assert default_data_format(info, CUDA)[0] == "NHWC"  # the table is the CPU's only
    assert default_data_format(get_model_info("ncf", "movielens"), CPU) == ("NCHW", "ncf does not take images")
    assert default_data_format(None, CPU)[0] == "NCHW"  # a caller's own model


def test_flag_overrides_and_left_out_is_resolved_before_the_run() -> None:
    base = BenchConfig(model="resnet20", data_name="cifar10", device="cpu")
    assert base.data_format is None and not base.channels_last
    assert resolve_workload(base).data_format == "NHWC"
    assert resolve_workload(base.replace(data_format="NCHW")).data_format == "NCHW"
    assert "data format" not in " ".join(resolve_workload(base.replace(data_format="NHWC")).defaults_used)
    with pytest.raises(ValueError, match="data_format"):
        BenchConfig(data_format="NWHC")


def test_header_and_results_name_the_chosen_format(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "--model=trivial", "--data_name=cifar10", "--batch_size=4", "--num_batches=1"]
    args += ["--num_warmup_batches=0", "--device=cpu", "--peak_tflops=1"]
    code, out, _ = run_main(capsys, *args)
    assert code == 0
    lines = out.splitlines()
    assert "Data format: NHWC" in lines
    why = "channels_last: faster for convolutions on the CPU; --data_format overrides"
    assert " " * 13 + f"data format NHWC ({why})" in lines
    code, out, _ = run_main(capsys, *args, "--data_format=NCHW")
    assert code == 0 and "Data format: NCHW" in out.splitlines() and "data format NHWC" not in out


def _losses(data_format: str | None) -> list[float]:
    cfg = BenchConfig(
        model="resnet20",
        data_name="cifar10",
        batch_size=4,
        num_batches=4,
        num_warmup_batches=0,
        device="cpu",
        data_format=data_format,
        init_learning_rate=0.05,
        display_every=1000,
    )
    result = run_benchmark(cfg, log=lambda line: None)
    assert result["data_format"] == (data_format or "NHWC")
    return result["losses"]


def test_the_default_trains_what_nchw_trains() -> None:
    nchw, default = _losses("NCHW"), _losses(None)
    assert len(default) == 4
    # Same weights, data and updates; only the order of the floating-point sums differs.
    torch.testing.assert_close(torch.tensor(default), torch.tensor(nchw), rtol=1e-4, atol=1e-5)
    assert default == _losses("NHWC")  # the default is exactly the NHWC run
