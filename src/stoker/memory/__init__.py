"""Memory: activation recompute, bf16 weights with stochastic rounding, and the meters that measure them.

Owns :mod:`~stoker.memory.recompute` (``RunConfig(recompute=...)``: which modules recompute
their activations in the backward pass), :mod:`~stoker.memory.stochastic_rounding` (bf16
weights updated with stochastic rounding, its state checkpointed), :mod:`~stoker.memory.meters`
(bytes of saved activations, parameters and optimizer state) and :mod:`~stoker.memory.host`
(keeping freed host memory in the process instead of returning it to the system each step).
It imports only torch, the standard library and stoker's errors. See docs/memory.md.
"""

from .host import host_memory_kept, keep_freed_host_memory
from .meters import SavedActivations, optimizer_state_tensors, state_bytes, tensor_bytes
from .recompute import RecomputeSpec, apply_recompute, recomputed_modules, select_modules
from .stochastic_rounding import StochasticRounding, stochastic_round_bf16, to_bf16

__all__ = [
    "RecomputeSpec",
    "SavedActivations",
    "StochasticRounding",
    "apply_recompute",
    "host_memory_kept",
    "keep_freed_host_memory",
    "optimizer_state_tensors",
    "recomputed_modules",
    "select_modules",
    "state_bytes",
    "stochastic_round_bf16",
    "tensor_bytes",
    "to_bf16",
]
