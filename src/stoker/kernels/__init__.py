"""Kernel choices measured on the machine a run lands on: the honest peak and fast linears.

- :mod:`~stoker.kernels.machine`: the CPU model and flags (fast bf16/fp16 instructions), a
  key for "this machine, this torch, these threads", and the JSON cache of measured figures.
- :mod:`~stoker.kernels.peak`: the practical peak for MFU, the fastest of the BLAS gemm,
  oneDNN's linear and a channels_last 3x3 convolution, measured once per machine.
- :mod:`~stoker.kernels.fp16_cost`: what fp16 training costs against fp32 (and bf16) on this
  CPU, measured once per machine; the line a run in fp16 on a CPU says.
- :mod:`~stoker.kernels.datasheet`: NVIDIA GPUs' data-sheet bf16 peaks (pure Python), which
  :func:`~stoker.kernels.peak.device_peak` quotes MFU against on a GPU.
- :mod:`~stoker.kernels.linear`: ``nn.Linear`` on oneDNN's inner product where it beats the
  BLAS (``RunConfig(fast_linear=...)``, ``stoker bench --fast_linear``).
- :mod:`~stoker.kernels.sgd_in_backward`: plain SGD applied inside those layers' weight-gradient
  product (``RunConfig(sgd_in_backward=...)``, ``stoker bench --sgd_in_backward``).

This package imports nothing of stoker but its errors, :mod:`stoker._cache` (the cache folder's
one convention) and :mod:`stoker.resolve` (``Choice``, for the rules of ``fast_linear`` and
``sgd_in_backward`` that a run records): the engine, the harness and benchmarks call it.
"""

from .linear import (
    FAST_LINEAR_MODES,
    LinearChoice,
    OneDNNLinear,
    OneDNNLinearFunction,
    describe_choices,
    use_fast_linear,
    use_plain_linear,
)
from .machine import cpu_flags, cpu_has_fast, machine_key
from .peak import Peak, measured_peak
from .sgd_in_backward import SGD_IN_BACKWARD_MODES, update_in_backward, updating_in_backward

__all__ = [
    "FAST_LINEAR_MODES",
    "LinearChoice",
    "OneDNNLinear",
    "OneDNNLinearFunction",
    "Peak",
    "SGD_IN_BACKWARD_MODES",
    "cpu_flags",
    "cpu_has_fast",
    "describe_choices",
    "machine_key",
    "measured_peak",
    "update_in_backward",
    "use_fast_linear",
    "updating_in_backward",
    "use_plain_linear",
]
