"""``stoker bench`` end to end on the models beyond the image classifiers' first set: NASNet-A,
NCF, DeepSpeech2 and SSD300, each on its own synthetic data and loss, two tiny steps on CPU."""

from __future__ import annotations

import re

import pytest

from stoker.cli import main

TOTAL_RE = re.compile(r"total images/sec: ([\d.]+)")
STEP_RE = re.compile(r"^2\timages/sec: [\d.]+ \+/- [\d.]+ \(jitter = [\d.]+\)\t([\d.]+)$", re.M)
TINY = ["bench", "--num_batches=2", "--batch_size=2", "--num_warmup_batches=0", "--display_every=1",
        "--peak_tflops=1", "--device=cpu"]


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_ran(code: int, out: str, err: str, model: str, dataset: str) -> float:
    """The run exited 0, printed its model and data set, two timed steps and the total; the loss."""
    assert code == 0, err
    assert re.search(rf"^Model: +{re.escape(model)}$", out, re.M), out
    assert re.search(rf"^Dataset: +{dataset} \(synthetic\)$", out, re.M), out
    assert TOTAL_RE.search(out), out
    assert "GFLOP per image" in out
    step = STEP_RE.search(out)
    assert step, out
    return float(step.group(1))


def test_nasnet_cifar10(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, *TINY, "--model=nasnet", "--data_name=cifar10")
    assert_ran(code, out, err, "nasnet", "cifar10")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["nasnet", "nasnetlarge"])
def test_nasnet_imagenet(capsys: pytest.CaptureFixture[str], model: str) -> None:
    code, out, err = run_main(capsys, *TINY, f"--model={model}", "--data_name=imagenet")
    assert_ran(code, out, err, model, "imagenet")
