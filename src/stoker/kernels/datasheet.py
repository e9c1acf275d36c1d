"""Data-sheet peaks of NVIDIA GPUs: dense (no sparsity) bf16 tensor-core TFLOP/s by device name.

From NVIDIA's data sheets (RTX 4090: the Ada architecture whitepaper, bf16 with fp32
accumulation). V100 and T4 have no bf16: their fp16 tensor peak is given. The first match of
the device name (``torch.cuda.get_device_name()``) wins, so specific names come first.

Pure Python (no torch), so ``benchmarks/gpu_check.py`` reads it before it knows whether this
Python has torch; :func:`stoker.kernels.peak.device_peak` uses it for MFU on a GPU.
"""

from __future__ import annotations

import re

PEAK_BF16_TFLOPS: tuple[tuple[str, float, str], ...] = (
    (r"H100.*PCIe", 756.0, "H100 PCIe"),
    (r"H100.*NVL", 835.0, "H100 NVL"),
    (r"H200.*NVL", 835.0, "H200 NVL"),
    (r"GH200", 989.0, "GH200"),
    (r"H200", 989.0, "H200 SXM"),
    (r"H100", 989.0, "H100 SXM"),
    (r"A100", 312.0, "A100"),
    (r"L40S", 362.0, "L40S"),
    (r"\bL40\b", 181.0, "L40"),
    (r"\bL4\b", 121.0, "L4"),
    (r"\bA10\b", 125.0, "A10"),
    (r"RTX 4090", 165.2, "RTX 4090"),
    (r"V100.*PCIE", 112.0, "V100 PCIe (fp16 tensor; no bf16)"),
    (r"V100", 125.0, "V100 SXM2 (fp16 tensor; no bf16)"),
    (r"\bT4\b", 65.0, "T4 (fp16 tensor; no bf16)"),
)
PEAK_SOURCE = "NVIDIA data sheets, dense bf16 tensor core (no sparsity)"


def peak_bf16_tflops(device_name: str) -> tuple[float | None, str]:
    """(TFLOP/s, which entry) for a ``torch.cuda.get_device_name()``; ``(None, 'unknown peak')``."""
    for pattern, tflops, label in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return tflops, label
    return None, "unknown peak"


__all__ = ["PEAK_BF16_TFLOPS", "PEAK_SOURCE", "peak_bf16_tflops"]
