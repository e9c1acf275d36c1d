"""What a subnetwork module returns for a batch: :class:`Subnetwork`, and its checks.

The lowest of the AdaNet modules: ensembles are made of these outputs, and builders (in
``subnetwork.py``, which re-exports these names) receive the previous ensemble, so this type
lives apart from both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError, UserCodeError


@dataclass
class Subnetwork:
    """One forward pass of a subnetwork on a batch.

    Attributes:
        last_layer: the activations feeding the logits, ``[batch, ..., width]``; a MATRIX
            mixture weight maps it to the ensemble's logits.
        logits: ``[batch, ..., logits_dimension]``.
        complexity: ``r(h)`` in AdaNet's regulariser (a float or a 0-dim tensor), e.g.
            ``sqrt(depth)``; 0 means "no complexity penalty beyond ``adanet_beta``".
        shared: anything the generator of the next iteration should see through
            ``previous_ensemble.weighted_subnetworks[i].subnetwork.shared`` (e.g. a depth).
    """

    last_layer: torch.Tensor
    logits: torch.Tensor
    complexity: float | torch.Tensor = 0.0
    shared: Any = None


def as_subnetwork(output: Any) -> Subnetwork:
    """A module's output as a ``Subnetwork``: a bare tensor is both logits and last layer."""
    if isinstance(output, Subnetwork):
        return output
    if isinstance(output, torch.Tensor):
        return Subnetwork(last_layer=output, logits=output, complexity=0.0)
    raise UserCodeError(
        "a subnetwork module must return a stoker.adanet.Subnetwork or a logits tensor; it returned a "
        f"{type(output).__name__}"
    )


def complexity_value(subnetwork: Subnetwork) -> float:
    """The complexity as a Python float (checked once, when the candidate is built)."""
    c = subnetwork.complexity
    value = float(c.detach().reshape(()).item()) if isinstance(c, torch.Tensor) else float(c)
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"Subnetwork.complexity must be a finite number >= 0; got {value}")
    return value


__all__ = ["Subnetwork", "as_subnetwork", "complexity_value"]
