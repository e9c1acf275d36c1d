"""``stoker bench`` and the kernels it runs on: the notes on slow low precision, the peak it names,
the MFU note above 100 %, and the Linear lines (stoker.kernels)."""

from __future__ import annotations

import pytest

from helpers.cli import run_main
from stoker._cache import cache_dir
from stoker.bench import report
from stoker.kernels.peak import Peak

QUICK = ["bench", "--model=trivial", "--data_name=cifar10", "--batch_size=8", "--device=cpu", "--num_batches=2"]
FIGURES = {"fp32": 145.0, "bf16": 20.0, "fp16": 2.4}


@pytest.fixture
def slow_cpu(monkeypatch):
    """A CPU with neither fast bf16 nor fast fp16 and the figures measured on an AVX2 EPYC."""
    monkeypatch.setattr(report, "cpu_has_fast", lambda precision: precision == "fp32")
    monkeypatch.setattr(
        report,
        "measured_peak",
        lambda device, precision: Peak(FIGURES[precision], f"BLAS gemm {precision}", "2026-11-25"),
    )


def test_bf16_on_a_cpu_without_bf16_instructions_prints_its_note(capsys, slow_cpu):
    code, out, _ = run_main(capsys, *QUICK, "--precision=bf16", "--peak_tflops=1")
    assert code == 0
    notes = [line for line in out.splitlines() if line.startswith("Note: bf16")]
    assert notes == [
        "Note: bf16 runs emulated on this CPU (no avx512_bf16 or amx_bf16 in /proc/cpuinfo): bf16 kernels reach "
        "20.0 GFLOP/s here against 145.0 in fp32, so this run is slower than --precision=fp32 would be"
    ]
    assert "Peak:        1000.0 GFLOP/s (--peak_tflops)" in out.splitlines()
    assert "total images/sec" in out  # the run still runs


def test_use_fp16_on_a_cpu_says_what_fp16_costs_here_before_the_header(capsys, monkeypatch):
    from stoker.kernels import fp16_cost as cost_module
    from stoker.kernels.fp16_cost import COST_FILE, Fp16Cost

    xeon = Fp16Cost({"conv": 100.0, "linear": 1.2}, {"conv": 1.2, "linear": 1.0}, "2026-12-04", cached=True)
    monkeypatch.setattr(report, "fp16_cost", lambda: xeon)  # an Intel Xeon with avx512_fp16 (issue 47)
    monkeypatch.setattr(cost_module, "_said", set())
    code, out, err = run_main(capsys, *QUICK, "--use_fp16", "--peak_tflops=1")
    assert code == 0
    lines = out.splitlines()
    note = (
        "Note: fp16 on this CPU: a convolution's forward+backward takes 100x fp32's time, a linear layer's 1.2x "
        f"(bf16: 1.2x, 1.0x; measured on one thread once per machine, cached in {cache_dir() / COST_FILE}); "
        "--precision=bf16 (fp32's exponent range, no loss scaling) trains faster here (this run stays in fp16, "
        "as asked)"
    )
    assert [line for line in lines if "fp16 on this CPU" in line] == [note]  # once: not again from the Estimator
    assert lines.index(note) < next(i for i, line in enumerate(lines) if line.startswith("PyTorch:"))
    assert "fp16 on this CPU" not in err
    assert any(line.startswith("Precision:   fp16") for line in lines) and "total images/sec" in out  # honoured


def test_no_note_where_the_cpu_has_the_instructions_or_on_fp32(capsys, monkeypatch):
    monkeypatch.setattr(report, "cpu_has_fast", lambda precision: True)
    assert report.precision_notes("bf16", report.torch.device("cpu")) == []
    assert report.precision_notes("fp32", report.torch.device("cpu")) == []


def test_the_header_names_the_kernel_that_set_the_measured_peak(capsys, monkeypatch):
    peak = Peak(155.0, "oneDNN conv3x3 channels_last fp32", "2026-11-25", cached=True)
    monkeypatch.setattr(report, "measured_peak", lambda device, precision: peak)
    # NCHW: under the NHWC default trivial's first layer is a FlattenDense over the channels_last
    # batch, not an nn.Linear, and only two shapes would be listed.
    code, out, _ = run_main(capsys, *QUICK, "--fast_linear=on", "--data_format=NCHW")
    assert code == 0
    lines = out.splitlines()
    assert "Peak:        155.0 GFLOP/s (oneDNN conv3x3 channels_last fp32, measured 2026-11-25, cached)" in lines
    assert "peak GFLOP/s: 155.0 (oneDNN conv3x3 channels_last fp32, measured 2026-11-25, cached)" in lines
    assert "Linear:      nn.Linear on oneDNN's inner product where it has the dtype (--fast_linear=on)" in lines
    after = lines[lines.index("Done warm up") + 1 :]
    assert after[:3] == [  # trivial: flatten -> 1 unit -> 4096 -> 10 classes, batch 8; largest first
        "Linear:      8x4096->10 fp32 train: oneDNN (forced on)",
        " " * 13 + "8x1->4096 fp32 train: oneDNN (forced on)",
        " " * 13 + "8x3072->1 fp32 train: oneDNN (forced on)",
    ]


def test_off_prints_no_choices(capsys):
    code, out, _ = run_main(capsys, *QUICK, "--fast_linear=off", "--peak_tflops=1")
    assert code == 0
    assert "Linear:      nn.Linear on the BLAS (--fast_linear=off)" in out.splitlines()
    assert sum(line.startswith("Linear:") for line in out.splitlines()) == 1


@pytest.mark.parametrize(
    ("source", "note"),
    [
        ("--peak_tflops", "the peak is --peak_tflops, below what this run reached"),
        ("oneDNN linear fp32, measured 2026-11-25", "the peak is the fastest kernel measured on one problem size"),
    ],
)
def test_an_mfu_above_100_percent_on_a_cpu_says_why(source, note):
    result = {"mode": "training", "device": "cpu", "num_steps": 1, "images_per_sec": 10.0}
    result.update(gflop_per_image=30.0, gflop_per_image_forward=10.0, achieved_gflops=300.0)
    result.update(peak_gflops=150.0, peak_source=source, mfu=2.0)
    mfu = report.summary_lines(result)[-1]
    assert mfu.startswith("MFU: 200.0 % (above 100 %: " + note)
    assert report.summary_lines({**result, "mfu": 0.5})[-1] == "MFU: 50.0 %"
