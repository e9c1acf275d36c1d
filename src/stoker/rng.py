"""Capture and restore every random number generator that decides a run's future."""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU, and CUDA or MPS where present) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # What torch.manual_seed does, for the backends this machine has: it also imports and asks
    # every other backend (~100-170 us a call); training seeds several times per train().
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # lazy: applied when CUDA initialises, as manual_seed does
    if torch.backends.mps.is_available():
        torch.mps.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The state of every global RNG, in types ``torch.load(weights_only=True)`` accepts."""
    version, internal, gauss = random.getstate()
    # The legacy tuple (the default, legacy=True): numpy's stub picks its legacy=False overload, a dict.
    legacy = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    kind, keys, pos, has_gauss, cached = legacy
    state: dict[str, Any] = {
        # Python's 625 state words as one int64 tensor: a list of ints pickles and (above all)
        # unpickles with weights_only several times slower.
        "python": [version, torch.from_numpy(np.fromiter(internal, np.int64, len(internal))), gauss],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    if isinstance(internal, torch.Tensor):
        internal = internal.tolist()  # a list in checkpoints written before the tensor form
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
        else:  # a different number of GPUs: restore the ones both runs have
            for i, s in enumerate(cuda_states[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(s, i)
