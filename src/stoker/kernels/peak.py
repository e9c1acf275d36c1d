"""The practical peak of a device for a dtype: the fastest kernel torch actually uses for it.

MFU divides achieved FLOP/s by a peak; a peak below what the model's own kernels reach gives
an MFU above 100 %, one above them hides slowness. On a CPU the fastest kernel differs by
machine: MKL's sgemm wins on some (AVX2 EPYC: ~140 GFLOP/s against oneDNN's ~125), oneDNN's
inner product or 3x3 convolution on others (AVX-512 EPYC: 472 and 509 against MKL's 206). So
the peak is *measured*: the BLAS gemm (what ``a @ b`` and ``nn.Linear`` call), oneDNN's linear
(``torch.ops.mkldnn._linear_pointwise``) and a 3x3 convolution in channels_last (what oneDNN
runs for convnets; cuDNN on CUDA), each in the compute dtype, and the fastest of them is the
peak. It is measured once per machine (:func:`stoker.kernels.machine.machine_key`: device
model, CPU flags, torch version, threads, dtype) and kept in ``peaks.json`` in the cache
directory.

Every kernel has a time budget (default 1 s): it starts on a small problem and doubles it
while one call stays well inside the budget, so a kernel that runs emulated (fp16 on most CPUs:
~2 GFLOP/s) is measured on a small size in a second instead of minutes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .machine import cache_load, cache_store, machine_key

PEAKS_FILE = "peaks.json"
DEFAULT_BUDGET_S = 1.0
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_memo: dict[str, Peak] = {}


@dataclass(frozen=True)
class Peak:
    """A measured peak: the fastest kernel's GFLOP/s and every kernel's figure.

    Attributes:
        gflops: the peak, GFLOP/s of the fastest kernel.
        kernel: which kernel set it, e.g. ``"oneDNN conv3x3 channels_last fp32"``.
        measured: the date it was measured (``YYYY-MM-DD``).
        cached: whether it was read from the cache rather than measured in this process.
        kernels: GFLOP/s of each kernel measured (a kernel torch has no implementation of is absent).
    """

    gflops: float
    kernel: str
    measured: str
    cached: bool = False
    kernels: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        """``"oneDNN conv3x3 channels_last fp32, measured 2026-11-25, cached"``."""
        return f"{self.kernel}, measured {self.measured}" + (", cached" if self.cached else "")

    def to_dict(self) -> dict[str, Any]:
        return {"gflops": self.gflops, "kernel": self.kernel, "measured": self.measured, "kernels": self.kernels}


def time_kernel(make: Callable[[int], tuple[Callable[[], object], float]], scales: list[int], budget_s: float) -> float:
    """GFLOP/s of the fastest call of a kernel, within about ``budget_s`` seconds.

    ``make(scale)`` returns ``(call, flop)``. The scale grows along ``scales`` while one call
    takes under a tenth of the budget; the last scale reached is timed for the rest of the
    budget (at least 3 calls). The fastest call counts: noise only slows.
    """
    start = time.perf_counter()
    call, flop, one = None, 0.0, math.inf
    for scale in scales:
        call, flop = make(scale)
        call()  # warm-up: thread pool, kernel selection, reorders
        t0 = time.perf_counter()
        call()
        one = time.perf_counter() - t0
        if one > budget_s / 10 or time.perf_counter() - start > budget_s / 2:
            break
    assert call is not None
    best, calls = one, 1
    while calls < 3 or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
        calls += 1
        if calls >= 50:
            break
    return flop / best / 1e9


def _synced(device: torch.device, fn: Callable[[], object]) -> Callable[[], object]:
    if device.type != "cuda":
        return fn

    def call() -> object:
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return call


def _gemm(device: torch.device, dtype: torch.dtype) -> Callable[[int], tuple[Callable[[], object], float]]:
    def make(n: int) -> tuple[Callable[[], object], float]:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        # a @ b.T, as nn.Linear multiplies: in bf16 on an AVX2 CPU 13x faster than a @ b (4 vs 0.3 GFLOP/s)
        return _synced(device, lambda: torch.mm(a, b.t())), 2.0 * n**3

    return make


def _onednn_linear(dtype: torch.dtype) -> Callable[[int], tuple[Callable[[], object], float]]:
    def make(n: int) -> tuple[Callable[[], object], float]:
        x = torch.randn(n, n).to(dtype)
        w = torch.randn(n, n).to(dtype)
        return (lambda: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")), 2.0 * n**3

    return make


def _conv3x3(device: torch.device, dtype: torch.dtype) -> Callable[[int], tuple[Callable[[], object], float]]:
    channels, size = 256, 14  # a resnet50 stage-3 convolution

    def make(batch: int) -> tuple[Callable[[], object], float]:
        x = torch.randn(batch, channels, size, size, device=device).to(dtype, memory_format=torch.channels_last)
        w = torch.randn(channels, channels, 3, 3, device=device).to(dtype, memory_format=torch.channels_last)

        def call() -> object:
            with torch.no_grad():
                return F.conv2d(x, w, padding=1)

        return _synced(device, call), 2.0 * batch * channels * size * size * channels * 9

    return make


def measure_kernels(device: torch.device, precision: str, budget_s: float = DEFAULT_BUDGET_S) -> dict[str, float]:
    """GFLOP/s of each kernel torch uses for ``precision`` on ``device`` (each within ``budget_s``)."""
    dtype = _DTYPES["bf16" if precision == "bf16-sr" else precision]
    name = "bf16" if precision == "bf16-sr" else precision
    gemm_sizes = [256, 512, 1024, 2048] + ([4096, 8192] if device.type == "cuda" else [])
    batches = [1, 2, 4, 8, 16, 32] + ([64, 128] if device.type == "cuda" else [])
    cuda = device.type == "cuda"
    figures: dict[str, float] = {}
    with torch.no_grad():
        figures[("cuBLAS" if cuda else "BLAS") + f" gemm {name}"] = time_kernel(
            _gemm(device, dtype), gemm_sizes, budget_s
        )
        if not cuda:
            try:
                figures[f"oneDNN linear {name}"] = time_kernel(_onednn_linear(dtype), gemm_sizes, budget_s)
            except (RuntimeError, AttributeError):  # no oneDNN, or no inner product for this dtype on this CPU
                pass
        conv_label = ("cuDNN" if cuda else "oneDNN") + f" conv3x3 channels_last {name}"
        try:
            figures[conv_label] = time_kernel(_conv3x3(device, dtype), batches, budget_s)
        except RuntimeError:
            pass
    return figures


def measured_peak(
    device: torch.device, precision: str = "fp32", *, budget_s: float = DEFAULT_BUDGET_S, use_cache: bool = True
) -> Peak:
    """This machine's peak for ``precision`` on ``device``: from the cache, or measured and cached.

    ``use_cache=False`` measures again (and replaces the cached figure).
    """
    key = machine_key(device, "bf16" if precision == "bf16-sr" else precision)
    if use_cache:
        if key in _memo:
            return _memo[key]
        entry = cache_load(PEAKS_FILE).get(key)
        peak = _from_entry(entry)
        if peak is not None:
            _memo[key] = peak
            return peak
    figures = measure_kernels(device, precision, budget_s)
    kernel = max(figures, key=figures.__getitem__)
    peak = Peak(gflops=figures[kernel], kernel=kernel, measured=time.strftime("%Y-%m-%d"), kernels=figures)
    cache_store(PEAKS_FILE, key, peak.to_dict())
    _memo[key] = Peak(peak.gflops, peak.kernel, peak.measured, cached=True, kernels=figures)  # later uses: cached
    return peak


def device_peak(device: torch.device, precision: str = "fp32") -> tuple[float, str]:
    """``(GFLOP/s, source)``: the peak MFU is quoted against on ``device`` for ``precision``.

    On an NVIDIA GPU in bf16, bf16-sr or fp16, the data sheet's dense tensor-core peak
    (:mod:`stoker.kernels.datasheet`), as MFU is quoted elsewhere for GPUs; anywhere else (a
    CPU, fp32, a GPU the table does not know), this machine's :func:`measured_peak`.
    """
    if device.type == "cuda" and precision in ("bf16", "bf16-sr", "fp16"):
        from .datasheet import peak_bf16_tflops

        tflops, label = peak_bf16_tflops(torch.cuda.get_device_name(device))
        if tflops is not None:
            return tflops * 1000.0, f"{label} data sheet, dense {'fp16' if precision == 'fp16' else 'bf16'}"
    peak = measured_peak(device, precision)
    return peak.gflops, f"measured: {peak.describe()}"


def _from_entry(entry: object) -> Peak | None:
    """A cached entry as a ``Peak`` (``None`` if it is not a well-formed one)."""
    if not isinstance(entry, dict):
        return None
    try:
        gflops = float(entry["gflops"])
        kernels = {str(k): float(v) for k, v in dict(entry.get("kernels", {})).items()}
        peak = Peak(gflops, str(entry["kernel"]), str(entry["measured"]), cached=True, kernels=kernels)
    except (KeyError, TypeError, ValueError):
        return None
    return peak if gflops > 0 and math.isfinite(gflops) else None


__all__ = ["DEFAULT_BUDGET_S", "PEAKS_FILE", "Peak", "device_peak", "measure_kernels", "measured_peak", "time_kernel"]
