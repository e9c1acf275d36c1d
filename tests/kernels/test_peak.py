"""The measured peak (stoker.kernels.peak): each kernel within its time budget, the fastest one
is the peak, and it is cached per machine (a corrupt cache is ignored and rewritten)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from stoker._cache import cache_dir
from stoker.kernels import machine, peak


@pytest.fixture(autouse=True)
def _no_memo(monkeypatch):  # the cache directory is the test's own (conftest.py)
    monkeypatch.setattr(peak, "_memo", {})


def test_time_kernel_grows_the_problem_only_while_a_call_is_short():
    seen = []

    def make(scale: int):
        seen.append(scale)
        return (lambda: time.sleep(0.01 * scale)), 1e9 * scale  # 0.1 GFLOP per ms: 100 GFLOP/s at every scale

    start = time.perf_counter()
    gflops = peak.time_kernel(make, [1, 2, 4, 8, 16, 32], budget_s=0.3)
    assert seen == [1, 2, 4]  # 40 ms is over a tenth of the budget: no larger problem
    assert time.perf_counter() - start < 1.0
    assert 60 < gflops <= 100.5  # sleep overshoots a little, never undershoots


def test_the_fastest_kernel_sets_the_peak_and_is_cached(monkeypatch):
    calls = []
    figures = {"BLAS gemm fp32": 140.0, "oneDNN linear fp32": 125.0, "oneDNN conv3x3 channels_last fp32": 155.0}
    monkeypatch.setattr(peak, "measure_kernels", lambda d, p, b: calls.append(p) or dict(figures))
    cpu = torch.device("cpu")
    first = peak.measured_peak(cpu, "fp32")
    assert (first.gflops, first.kernel, first.cached) == (155.0, "oneDNN conv3x3 channels_last fp32", False)
    assert first.describe() == f"oneDNN conv3x3 channels_last fp32, measured {time.strftime('%Y-%m-%d')}"
    assert peak.measured_peak(cpu, "fp32").cached and calls == ["fp32"]
    monkeypatch.setattr(peak, "_memo", {})  # a new process: read from the file
    again = peak.measured_peak(cpu, "fp32")
    assert again.cached and again.kernels == figures and calls == ["fp32"]
    assert again.describe().endswith(", cached")
    stored = json.loads((cache_dir() / peak.PEAKS_FILE).read_text())
    assert list(stored) == [machine.machine_key(cpu, "fp32")]
    assert peak.measured_peak(cpu, "bf16-sr").kernel == "oneDNN conv3x3 channels_last fp32" and calls[-1] == "bf16-sr"


@pytest.mark.parametrize("content", ["{half", "[1, 2]", '{"KEY": {"gflops": "x"}}', '{"KEY": {"gflops": -1}}'])
def test_a_corrupt_cache_is_measured_again_and_rewritten(monkeypatch, content):
    cpu = torch.device("cpu")
    path = cache_dir() / peak.PEAKS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(content.replace("KEY", machine.machine_key(cpu, "fp32")))
    monkeypatch.setattr(peak, "measure_kernels", lambda d, p, b: {"BLAS gemm fp32": 99.0})
    assert not peak.measured_peak(cpu, "fp32").cached
    assert json.loads(path.read_text())[machine.machine_key(cpu, "fp32")]["gflops"] == 99.0
    assert [p.name for p in path.parent.iterdir()] == [peak.PEAKS_FILE]  # no temporary file left


def test_the_key_names_cpu_flags_torch_threads_and_dtype():
    key = machine.machine_key(torch.device("cpu"), "bf16")
    assert key.startswith(f"cpu|{machine.cpu_model()}|flags ")
    assert key.endswith(f"|{torch.get_num_threads()} threads|torch {torch.__version__}|bf16")


def test_slow_fp16_is_measured_within_its_budget():
    """fp16 matmuls run at ~2 GFLOP/s on CPUs without fp16 instructions: the budget bounds the measurement
    (a 2048 matmul alone would take seconds there; the figure before this: minutes for a whole run)."""
    start = time.perf_counter()
    figures = peak.measure_kernels(torch.device("cpu"), "fp16", budget_s=0.2)
    assert time.perf_counter() - start < 10.0
    assert "BLAS gemm fp16" in figures and all(v > 0 for v in figures.values())


def test_cpu_has_fast_reads_the_flags(monkeypatch):
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert machine.cpu_has_fast("bf16") and machine.cpu_has_fast("bf16-sr") and machine.cpu_has_fast("fp32")
    assert not machine.cpu_has_fast("fp16")
    monkeypatch.setattr(machine, "cpu_flags", lambda: frozenset({"amx_fp16"}))
    assert machine.cpu_has_fast("fp16") and not machine.cpu_has_fast("bf16")
