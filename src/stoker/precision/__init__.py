"""Numeric precision: one ``Precision`` object per mode, and fp16's loss scaling.

Master weights stay fp32 in ``fp32``, ``bf16`` and ``fp16``; only the forward (and its
backward) runs in the lower precision. ``bf16-sr`` keeps the weights themselves in bf16 and
runs the same bf16 autocast; its update is :mod:`stoker.memory.stochastic_rounding`'s. fp16
scales the loss (static or dynamic, ``LossScale``; see ``loss_scale.py``).

- ``modes.py``: the ``Precision`` interface (convert the module and the optimizer, the forward
  context, loss scaling, the optimizer step, its checkpoint state) and one class per mode:
  ``FP32Precision``, ``BF16Precision``, ``FP16Precision``, ``BF16SRPrecision``.
- ``loss_scale.py``: ``LossScale`` (how ``RunConfig.loss_scale`` holds the setting) and
  ``LossScaler`` (the running state fp16 builds from it).

The package imports only ``stoker.errors`` and ``stoker.memory`` (a leaf).
"""

from .loss_scale import LossScale, LossScaler
from .modes import (
    PRECISIONS,
    BF16Precision,
    BF16SRPrecision,
    FP16Precision,
    FP32Precision,
    Precision,
    autocast_context,
    compute_dtype,
    make_precision,
    precision_names,
)

__all__ = [
    "PRECISIONS",
    "BF16Precision",
    "BF16SRPrecision",
    "FP16Precision",
    "FP32Precision",
    "LossScale",
    "LossScaler",
    "Precision",
    "autocast_context",
    "compute_dtype",
    "make_precision",
    "precision_names",
]
