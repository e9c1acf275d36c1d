"""What a ``model_fn`` returns, and the modes it is called in."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


class ModeKeys(str, enum.Enum):
    """The three modes a ``model_fn`` is called in (string-valued, so ``mode == "train"`` works)."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "predict"

    def __str__(self) -> str:
        return self.value


HostCall = Mapping[str, torch.Tensor] | tuple[Callable[..., Any], Any]


@dataclass(slots=True)
class EstimatorSpec:
    """The result of one ``model_fn`` call.

    Attributes:
        loss: TRAIN: a scalar tensor to minimise. EVAL: a scalar, or per-example losses of
            shape ``[batch]`` (needed for an exact loss when the last batch is padded).
        predictions: PREDICT (and optionally EVAL): a dict of tensors whose first dimension
            is the batch, or a zero-argument function returning that dict, called the first
            time ``spec.predictions`` is read. stoker reads predictions only in PREDICT mode
            (and ``export``), so ``predictions=lambda: {...}`` lets a model_fn that returns
            them in every mode (TPUEstimator style) skip computing them in TRAIN and EVAL.
        eval_metrics: EVAL: a dict ``name -> metric update`` as returned by calling a
            ``stoker.metrics.Metric`` (e.g. ``Accuracy()(logits, labels)``), or a tensor of
            per-example values that is averaged.
        host_call: TRAIN: values to log, read once per device loop. Either a dict
            ``name -> scalar tensor`` (each step's value is kept), or the TPUEstimator form
            ``(fn, tensors)``: at the end of each loop ``fn`` is called on the host with every
            tensor stacked over the loop's steps, and may return a dict of floats to log.
        cache: state carried to the next step's ``model_fn`` as ``params["cache"]`` (a tensor
            or a tuple of tensors); stoker detaches it and saves it in checkpoints.
    """

    # Where ``predictions`` is kept (the property below resolves a function). A plain slot, so
    # that ``torch.compile`` (``compile="step"``) traces building a spec: it cannot trace a
    # slot descriptor's ``__set__``. First, because ``__init__`` sets init=False fields in order.
    _predictions: Any = field(default=None, init=False, repr=False, compare=False)
    loss: torch.Tensor | None = None
    predictions: Mapping[str, torch.Tensor] | Callable[[], Mapping[str, torch.Tensor]] | None = None
    eval_metrics: Mapping[str, Any] = field(default_factory=dict)
    host_call: HostCall | None = None
    cache: torch.Tensor | tuple[torch.Tensor, ...] | None = None


# ``predictions`` given as a function is resolved where it is read: ``_predictions`` keeps what
# was given, and a property in front of the ``predictions`` field calls a function once and
# keeps its result.
def _get_predictions(spec: EstimatorSpec) -> Mapping[str, torch.Tensor] | None:
    value = spec._predictions
    if callable(value):
        value = value()
        spec._predictions = value
    return value


def _set_predictions(spec: EstimatorSpec, value: Any) -> None:
    spec._predictions = value


EstimatorSpec.predictions = property(  # type: ignore[assignment,misc]  # a property replaces the dataclass field
    _get_predictions, _set_predictions, doc="The predictions dict (a function given is called on first read)."
)
