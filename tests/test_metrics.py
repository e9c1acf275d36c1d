"""Streaming metrics: exact values, masks, and writing your own."""

from __future__ import annotations

import pytest
import torch

from stoker import metrics


def total(metric: metrics.Metric, batches: list[tuple], masks: list[torch.Tensor | None]) -> float:
    acc = metrics.MetricAccumulator()
    for args, mask in zip(batches, masks, strict=True):
        acc.add("m", metric(*args), None if mask is None else mask.double())
    keys, totals = acc.flat_totals()
    return acc.results(keys, totals.tolist())["m"]


def test_accuracy_with_padding_mask_is_exact():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [5.0, 0.0], [9.0, 0.0]])
    labels = torch.tensor([0, 1, 1, 1])
    # the last row is padding: 2 of 3 real rows correct
    assert total(metrics.Accuracy(), [(logits, labels)], [torch.tensor([1, 1, 1, 0])]) == 2 / 3
    assert total(metrics.Accuracy(), [(logits.argmax(-1), labels)], [None]) == 2 / 4


def test_top_k_mean_and_mse():
    logits = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, 3.0]])
    assert total(metrics.TopKAccuracy(2), [(logits, torch.tensor([1, 0]))], [None]) == 0.5
    assert total(metrics.Mean(), [(torch.tensor([1.0, 2.0]),), (torch.tensor([6.0]),)], [None, None]) == 3.0
    # MSE over every element: (1 + 4 + 0 + 9) / 4
    pred, lab = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[0.0, 0.0], [3.0, 1.0]])
    assert total(metrics.MeanSquaredError(), [(pred, lab)], [None]) == 14 / 4
    assert total(metrics.Mean(), [(torch.tensor([1.0, 3.0]), torch.tensor([3.0, 1.0]))], [None]) == 1.5


def test_streaming_equals_whole_set():
    g = torch.Generator().manual_seed(0)
    pred, lab = torch.randn(103, 4, generator=g), torch.randn(103, 4, generator=g)
    batches, masks = [], []
    for i in range(0, 103, 10):  # ragged last batch padded to 10 with a mask
        p, l_ = pred[i : i + 10], lab[i : i + 10]
        n = p.shape[0]
        pad = 10 - n
        batches.append((torch.cat([p, p[:1].expand(pad, 4)]), torch.cat([l_, l_[:1].expand(pad, 4)])))
        masks.append(torch.arange(10) < n)
    whole = ((pred.double() - lab.double()) ** 2).mean().item()
    assert total(metrics.MeanSquaredError(), batches, masks) == pytest.approx(whole, rel=1e-12)


def test_custom_metric():
    class MaxAbs(metrics.Metric):
        def update(self, x):  # noqa: ANN001, ANN201
            return {"count": torch.ones(x.shape[0]), "total": x.abs()}

        def compute(self, totals):  # noqa: ANN001, ANN201
            return totals["total"] / totals["count"]

    assert total(MaxAbs(), [(torch.tensor([-1.0, 3.0]),)], [None]) == 2.0


def test_bad_metric_inputs():
    with pytest.raises(ValueError, match="do not match labels"):
        metrics.Accuracy()(torch.zeros(3, 2), torch.zeros(4, dtype=torch.long))
    acc = metrics.MetricAccumulator()
    with pytest.raises(TypeError, match="give a metric update"):
        acc.add("m", 0.5, None)  # type: ignore[arg-type]
