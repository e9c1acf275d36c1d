"""Heads: the loss, predictions and evaluation metrics shared by every candidate.

A head turns logits into a loss (per example or averaged), predictions and
``stoker.metrics`` updates. Every subnetwork trains on the head's loss of its own logits,
and every candidate ensemble's ``adanet_loss`` is the head's loss of the ensemble's logits
plus the complexity regulariser. ``Head.model_fn`` makes a head usable with a plain
``stoker.Estimator`` (the final ensemble, baselines).
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, UserCodeError
from ..metrics import Accuracy, MeanSquaredError, MetricUpdate
from ..spec import EstimatorSpec, ModeKeys
from .subnetwork import as_subnetwork

__all__ = ["BinaryClassHead", "Head", "MetricFn", "MultiClassHead", "RegressionHead"]

_METRIC_FN_ARGS = ("predictions", "features", "labels")


class Head(abc.ABC):
    """Loss, predictions and metrics of one task."""

    logits_dimension: int

    @abc.abstractmethod
    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """``reduction="mean"``: a scalar; ``"none"``: one loss per example, ``[batch]``."""

    @abc.abstractmethod
    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """Predictions of a batch, every tensor with the batch as its first dimension."""

    @abc.abstractmethod
    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, MetricUpdate]:
        """Evaluation metric updates of a batch (``stoker.metrics``)."""

    def model_fn(
        self, model: nn.Module, features: Any, labels: Any, mode: ModeKeys, params: dict[str, Any]
    ) -> EstimatorSpec:
        """A ``stoker.Estimator`` model_fn for a module returning logits (or a ``Subnetwork``)."""
        return self.spec(as_subnetwork(model(features)).logits, features, labels, mode)

    def spec(
        self, logits: torch.Tensor, features: Any, labels: Any, mode: ModeKeys, metric_fn: MetricFn | None = None
    ) -> EstimatorSpec:
        """The ``EstimatorSpec`` of ``logits`` in ``mode``; ``metric_fn`` adds evaluation metrics."""
        if mode == ModeKeys.TRAIN:  # the loss only: predictions would cost every step
            return EstimatorSpec(loss=self.loss(logits, labels))
        preds = self.predictions(logits)
        if mode == ModeKeys.PREDICT or labels is None:
            return EstimatorSpec(predictions=preds)
        return EstimatorSpec(
            loss=self.loss(logits, labels, "none"),
            predictions=preds,
            eval_metrics=self.eval_metrics(logits, features, labels, metric_fn),
        )

    def eval_metrics(
        self, logits: torch.Tensor, features: Any, labels: torch.Tensor, metric_fn: MetricFn | None = None
    ) -> dict[str, Any]:
        """The head's metrics, then ``metric_fn``'s (which win a name conflict, as in the original)."""
        metrics: dict[str, Any] = dict(self.metrics(logits, labels))
        if metric_fn is not None:
            metrics.update(metric_fn(self.predictions(logits), features, labels))
        return metrics


class MetricFn:
    """A user's ``metric_fn`` for the AdaNet Estimator: extra evaluation metrics.

    The function takes any of ``predictions`` (the head's predictions dict), ``features`` and
    ``labels``, by those names and in any order, and returns a dict ``name -> metric update``
    (a ``stoker.metrics`` metric called on the batch, e.g. ``TopKAccuracy(3)(logits, labels)``,
    or a per-example tensor, which is averaged). Padded rows of the last batch are masked out
    as for the head's own metrics.
    """

    def __init__(self, fn: Callable[..., Mapping[str, Any]]) -> None:
        if not callable(fn):
            raise UserCodeError(f"metric_fn must be callable; got {type(fn).__name__}")
        try:
            names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError) as e:
            raise UserCodeError(f"metric_fn: cannot read its signature ({e})") from e
        unknown = [n for n in names if n not in _METRIC_FN_ARGS]
        if unknown:
            raise ConfigError(
                f"metric_fn may take only predictions, features and labels (any of them, in any order); got {unknown}"
            )
        self.fn = fn
        self.names = names

    def __call__(self, predictions: Mapping[str, torch.Tensor], features: Any, labels: Any) -> dict[str, Any]:
        given = {"predictions": predictions, "features": features, "labels": labels}
        out = self.fn(**{n: given[n] for n in self.names})
        if not isinstance(out, Mapping) or not all(isinstance(k, str) for k in out):
            raise UserCodeError(
                f"metric_fn must return a dict of metric name -> metric update; got {type(out).__name__}"
            )
        return dict(out)


def _reduce(per_example: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return per_example.mean()
    if reduction == "none":
        return per_example
    raise ConfigError(f"reduction must be 'mean' or 'none'; got {reduction!r}")


class MultiClassHead(Head):
    """Softmax cross-entropy over ``n_classes`` classes; labels are class ids ``[batch]``."""

    def __init__(self, n_classes: int) -> None:
        if not isinstance(n_classes, int) or n_classes < 2:
            raise ConfigError(f"MultiClassHead: n_classes must be an integer >= 2; got {n_classes!r}")
        self.logits_dimension = n_classes

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if reduction == "mean":  # the fused mean is cheaper than a per-example loss then .mean()
            return F.cross_entropy(logits, labels)
        return _reduce(F.cross_entropy(logits, labels, reduction="none"), reduction)

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": logits, "probabilities": logits.softmax(-1), "class_ids": logits.argmax(-1)}

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, MetricUpdate]:
        return {"accuracy": Accuracy()(logits, labels)}


class BinaryClassHead(Head):
    """Logistic loss on one logit; labels are 0/1 of shape ``[batch]`` or ``[batch, 1]``."""

    logits_dimension = 1

    @staticmethod
    def _labels(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return labels.reshape(logits.shape).to(logits.dtype)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        target = self._labels(logits, labels)
        if reduction == "mean":
            return F.binary_cross_entropy_with_logits(logits, target)
        per_example = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
        return _reduce(per_example.reshape(per_example.shape[0], -1).mean(1), reduction)

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"logits": logits, "logistic": torch.sigmoid(logits), "class_ids": (logits > 0).long().reshape(-1)}

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, MetricUpdate]:
        return {"accuracy": Accuracy()((logits > 0).long().reshape(-1), labels.reshape(-1).long())}


class RegressionHead(Head):
    """Mean squared error on ``label_dimension`` outputs; labels ``[batch]`` or ``[batch, d]``."""

    def __init__(self, label_dimension: int = 1) -> None:
        if not isinstance(label_dimension, int) or label_dimension < 1:
            raise ConfigError(f"RegressionHead: label_dimension must be a positive integer; got {label_dimension!r}")
        self.logits_dimension = label_dimension

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        target = labels.reshape(logits.shape).to(logits.dtype)
        if reduction == "mean":
            return F.mse_loss(logits, target)
        per_example = F.mse_loss(logits, target, reduction="none")
        return _reduce(per_example.reshape(per_example.shape[0], -1).mean(1), reduction)

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"predictions": logits}

    def metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, MetricUpdate]:
        return {"mse": MeanSquaredError()(logits, labels)}
