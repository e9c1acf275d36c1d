"""``stoker bench`` end to end on the models beyond the image classifiers' first set: NASNet-A,
NCF, DeepSpeech2 and SSD300, each on its own synthetic data and loss, two tiny steps on CPU."""

from __future__ import annotations

import math
import re

import pytest

from helpers.cli import run_main
from stoker.models import get_model_info

TOTAL_RE = re.compile(r"total images/sec: ([\d.]+)")
STEP_RE = re.compile(r"^2\timages/sec: [\d.]+ \+/- [\d.]+ \(jitter = [\d.]+\)\t([\d.]+)$", re.M)
TINY = [
    "bench",
    "--num_batches=2",
    "--batch_size=2",
    "--num_warmup_batches=0",
    "--display_every=1",
    "--peak_tflops=1",
    "--device=cpu",
]


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


def test_ncf_with_adam_runs_the_reference_loss_on_synthetic_ids(capsys: pytest.CaptureFixture[str]) -> None:
    """tf_cnn_benchmarks' NCF command line (scaled down): the data set follows from the model and
    the first loss is the two-column softmax of the synthetic labels at near-zero initial logits."""
    code, out, err = run_main(capsys, *TINY, "--model=ncf", "--optimizer=adam", "--weight_decay=0")
    first = re.search(r"^1\timages/sec: .*\t([\d.]+)$", out, re.M)
    assert_ran(code, out, err, "ncf", "movielens")
    assert first
    info = get_model_info("ncf", "movielens")
    _, labels = info.example_batch(2, seed=1234)  # the harness's default --tf_random_seed
    expected = sum(math.log(1 + math.exp(1 if y else -1)) for y in labels.tolist()) / 2
    assert float(first.group(1)) == pytest.approx(expected, abs=0.02)  # a plain sigmoid would give log 2


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--forward_only", "--forward_only: --model=ncf (movielens) is benchmarked in training only"),
        ("--mode=inference", "--mode: --model=ncf (movielens) is benchmarked in training only"),
        (
            "--print_training_accuracy",
            "--print_training_accuracy: --model=ncf (movielens) is benchmarked in training only",
        ),
        ("--data_dir=.", "--data_dir: --data_name=movielens is synthetic only"),
    ],
)
def test_training_only_models_refuse_other_modes(capsys: pytest.CaptureFixture[str], flag: str, message: str) -> None:
    code, _, err = run_main(capsys, "bench", "--model=ncf", "--device=cpu", flag)
    assert code == 2
    # a usage error: its one line, then where to read the flags
    *_, line, hint = err.splitlines()
    assert message in line and hint == "see stoker bench --help"


@pytest.mark.slow  # the reference's 3,494-frame utterances: about a teraFLOP per step at batch 2
def test_deepspeech2_librispeech_ctc(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, *TINY, "--model=deepspeech2", "--data_name=librispeech")
    loss = assert_ran(code, out, err, "deepspeech2", "librispeech")
    assert loss > 0


@pytest.mark.slow  # 300x300 images through ResNet-34 and the heads: seconds per step on a CPU
def test_ssd300_coco_multibox_loss(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, *TINY, "--model=ssd300", "--data_name=coco")
    loss = assert_ran(code, out, err, "ssd300", "coco")
    assert loss > 0
