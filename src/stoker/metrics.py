"""Streaming metrics: per-example statistics summed on the device, reduced once at the end.

A metric is called inside ``model_fn`` on one batch and returns a :class:`MetricUpdate` of
per-example statistics (tensors of shape ``[batch]``). The evaluation loop multiplies them by
the padding mask, adds them into float64 totals that stay on the device, sums the totals
across replicas and turns them into a number with :meth:`Metric.compute`. Because only sums of
per-example values are kept, a data set whose size is not a multiple of the batch gives the
same value as computing the metric over the whole set at once.

Write your own by subclassing :class:`Metric` and implementing ``update`` and ``compute``::

    class MeanAbsoluteError(stoker.metrics.Metric):
        def update(self, predictions, labels):
            err = (predictions - labels).abs().reshape(len(labels), -1)
            return {"total": err.sum(1), "count": torch.full_like(err[:, 0], err.shape[1])}

        def compute(self, totals):
            return totals["total"] / totals["count"]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .errors import ConfigError, UserCodeError


class Metric:
    """Base class: ``update`` gives per-example statistics, ``compute`` turns their sums into a value."""

    def update(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Per-example statistics of one batch: a dict of tensors of shape ``[batch]``."""
        raise NotImplementedError(f"{type(self).__name__} must implement update()")

    def compute(self, totals: Mapping[str, float]) -> float:
        """The metric's value from the statistics summed over the whole data set."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute()")

    def __call__(self, *args: torch.Tensor, **kwargs: torch.Tensor) -> MetricUpdate:
        with torch.no_grad():
            return MetricUpdate(self, self.update(*args, **kwargs))


@dataclass(slots=True)
class MetricUpdate:
    """One batch's contribution to a metric (what ``Metric.__call__`` returns)."""

    metric: Metric
    stats: dict[str, torch.Tensor]


def _per_example(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of each example's elements and how many there are, for any ``[batch, ...]`` tensor."""
    flat = values.reshape(values.shape[0], -1) if values.dim() > 0 else values.reshape(1, 1)
    count = torch.full((flat.shape[0],), flat.shape[1], dtype=torch.float64, device=flat.device)
    return flat.to(torch.float64).sum(1), count


def _ratio(totals: Mapping[str, float]) -> float:
    count = totals["count"]
    return float("nan") if count == 0 else totals["total"] / count


class Mean(Metric):
    """Mean of per-example values (of shape ``[batch, ...]``), optionally weighted per example."""

    def update(self, values: torch.Tensor, weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        total, count = _per_example(values.detach())
        if weights is not None:
            w = weights.detach().to(torch.float64).reshape(-1)
            total, count = total * w, count * w
        return {"total": total, "count": count}

    def compute(self, totals: Mapping[str, float]) -> float:
        return _ratio(totals)


class Accuracy(Metric):
    """Fraction of correct predictions; takes logits ``[batch, ..., classes]`` or class ids."""

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if predictions.dim() == labels.dim() + 1:
            predictions = predictions.argmax(-1)
        if predictions.shape != labels.shape:
            raise ConfigError(
                f"Accuracy: predictions of shape {list(predictions.shape)} do not match labels of "
                f"shape {list(labels.shape)}; pass logits [batch, classes] or class ids [batch]"
            )
        total, count = _per_example(predictions == labels)
        return {"total": total, "count": count}

    def compute(self, totals: Mapping[str, float]) -> float:
        return _ratio(totals)


class TopKAccuracy(Metric):
    """Fraction of examples whose label is among the ``k`` largest logits."""

    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise ConfigError(f"TopKAccuracy: k must be >= 1, got {k}")
        self.k = k

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        k = min(self.k, logits.shape[-1])
        top = logits.topk(k, dim=-1).indices
        hit = (top == labels.unsqueeze(-1)).any(-1)
        total, count = _per_example(hit)
        return {"total": total, "count": count}

    def compute(self, totals: Mapping[str, float]) -> float:
        return _ratio(totals)


class MeanSquaredError(Metric):
    """Mean of squared differences over every element of every example."""

    def update(self, predictions: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        diff = predictions.detach().to(torch.float64) - labels.detach().to(torch.float64).reshape(predictions.shape)
        total, count = _per_example(diff * diff)
        return {"total": total, "count": count}

    def compute(self, totals: Mapping[str, float]) -> float:
        return _ratio(totals)


class MetricAccumulator:
    """Sums ``MetricUpdate``s of many batches on the device, honouring a padding mask."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}
        self._totals: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, name: str, update: MetricUpdate | torch.Tensor, mask: torch.Tensor | None) -> None:
        if isinstance(update, torch.Tensor):
            update = Mean()(update)
        elif not isinstance(update, MetricUpdate):
            raise UserCodeError(
                f"eval_metrics[{name!r}] is a {type(update).__name__}; give a metric update "
                "(e.g. stoker.metrics.Accuracy()(logits, labels)) or a tensor of per-example values"
            )
        self._metrics.setdefault(name, update.metric)
        totals = self._totals.setdefault(name, {})
        for key, stat in update.stats.items():
            stat = stat.to(torch.float64)
            if mask is not None:
                if stat.shape[:1] != mask.shape:
                    raise ConfigError(
                        f"eval_metrics[{name!r}]: statistic {key!r} has shape {list(stat.shape)}, but the "
                        f"batch has {mask.shape[0]} rows; per-example statistics are needed to mask padding"
                    )
                stat = stat * mask
            summed = stat.sum()
            if key in totals:
                totals[key] += summed
            else:
                totals[key] = summed

    def names(self) -> list[str]:
        return list(self._metrics)

    def flat_totals(self) -> tuple[list[tuple[str, str]], torch.Tensor | None]:
        """All totals as one float64 vector (so replicas can sum them in one collective)."""
        keys = [(n, k) for n, t in self._totals.items() for k in t]
        if not keys:
            return keys, None
        return keys, torch.stack([self._totals[n][k] for n, k in keys])

    def results(self, keys: list[tuple[str, str]], values: list[float]) -> dict[str, float]:
        by_metric: dict[str, dict[str, float]] = {}
        for (name, key), value in zip(keys, values, strict=True):
            by_metric.setdefault(name, {})[key] = value
        return {name: float(self._metrics[name].compute(t)) for name, t in by_metric.items()}
