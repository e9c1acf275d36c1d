"""The harness's model side, shared by the training and the inference runners: the zoo model
the flags name, tf_cnn_benchmarks' classification ``model_fn``, and the ``model_fn`` of the
models that train with their own loss (NCF, DeepSpeech2, SSD300)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..metrics import Accuracy, TopKAccuracy
from ..models import LossFn, create_model
from ..spec import EstimatorSpec, ModeKeys
from .config import BenchConfig
from .workload import Workload

ModelFactory = Callable[[dict[str, Any]], nn.Module]


def bench_model_fn(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor | None, mode: ModeKeys, params: dict[str, Any]
) -> EstimatorSpec:
    """Softmax cross-entropy classification, as tf_cnn_benchmarks' image models.

    TRAIN: the loss reported is tf_cnn_benchmarks' ``total_loss``, cross-entropy +
    ``weight_decay`` x L2 (``sum(w^2) / 2`` over every trainable parameter), or its ``base_loss``
    (the cross-entropy alone) with ``params["report_base_loss"]``, and with
    ``print_training_accuracy`` the batch's top-1 / top-5 are ``host_call`` values (read once
    per loop). The L2 term's gradient, ``weight_decay * w``, is added by the optimizer (see
    ``optim.py``): the same update as differentiating the term, for a fraction of the cost.
    EVAL: per-example losses and exact top-1 / top-5 metrics. PREDICT: per-example top-1 /
    top-5 hits (or the classes without labels).
    """
    if params["channels_last"] and features.dim() == 4:
        features = features.contiguous(memory_format=torch.channels_last)  # a no-op when it already is
    logits = model(features)
    if mode == ModeKeys.PREDICT:
        if labels is None:
            return EstimatorSpec(predictions={"classes": logits.argmax(-1)})
        top1, top5 = _hits(logits, labels)
        return EstimatorSpec(predictions={"top_1": top1, "top_5": top5})
    assert labels is not None
    if mode == ModeKeys.EVAL:
        return EstimatorSpec(
            loss=F.cross_entropy(logits.float(), labels, reduction="none"),
            eval_metrics={
                "top_1_accuracy": Accuracy()(logits, labels),
                "top_5_accuracy": TopKAccuracy(5)(logits, labels),
            },
        )
    loss = F.cross_entropy(logits.float(), labels)
    if params["weight_decay"] and not params.get("report_base_loss"):
        loss = loss + params["weight_decay"] * l2_loss(model)  # a constant here: reported, not differentiated
    host_call = None
    if params["print_training_accuracy"]:
        with torch.no_grad():
            top1, top5 = _hits(logits, labels)
            host_call = {"top_1_accuracy": top1.float().mean(), "top_5_accuracy": top5.float().mean()}
    return EstimatorSpec(loss=loss, host_call=host_call)


class TaskModelFn:
    """The ``model_fn`` of a zoo model with its own ``loss`` (``ModelInfo.loss``).

    TRAIN: that loss, plus ``weight_decay`` x L2 as in :func:`bench_model_fn` (reported, not
    differentiated); EVAL: the loss; PREDICT: the model's outputs (``output_<i>`` for a tuple).
    A class rather than a closure, so the Estimator's ``model_fn`` pickles with its loss.
    """

    def __init__(self, loss: LossFn) -> None:
        self.loss = loss

    def __call__(
        self, model: nn.Module, features: Any, labels: Any, mode: ModeKeys, params: dict[str, Any]
    ) -> EstimatorSpec:
        outputs = model(features)
        if mode == ModeKeys.PREDICT:
            if isinstance(outputs, torch.Tensor):
                return EstimatorSpec(predictions={"outputs": outputs})
            return EstimatorSpec(predictions={f"output_{i}": out for i, out in enumerate(outputs)})
        loss = self.loss(outputs, labels)
        if mode == ModeKeys.TRAIN and params["weight_decay"]:
            loss = loss + params["weight_decay"] * l2_loss(model)
        return EstimatorSpec(loss=loss)


@torch.no_grad()
def l2_loss(model: nn.Module) -> torch.Tensor:
    """``sum(w^2) / 2`` over the trainable parameters (TensorFlow's ``tf.nn.l2_loss`` summed),
    as a value without gradient."""
    params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    # One fused norm per parameter list instead of a Python loop of small kernels.
    return 0.5 * torch.stack(torch._foreach_norm(params)).float().square().sum()


def _hits(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
    return top5[:, 0] == labels, (top5 == labels.unsqueeze(-1)).any(-1)


def zoo_model(cfg: BenchConfig, workload: Workload) -> ModelFactory:
    """A factory of the ``--model`` zoo model, channels-last for ``--data_format=NHWC``."""

    def factory(params: dict[str, Any]) -> nn.Module:
        model = create_model(cfg.model, dataset=workload.dataset, num_classes=workload.num_classes)
        if not cfg.channels_last:
            return model
        # Module.to(memory_format=...) works, but torch's stub has no overload with memory_format alone
        return model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]

    return factory


def model_fn_for(workload: Workload) -> Callable[..., EstimatorSpec]:
    """The ``model_fn`` of the workload's model: the classifier's, or one with the model's own loss."""
    info = workload.model_info
    if info is None or info.loss is None:
        return bench_model_fn
    return TaskModelFn(info.loss)


__all__ = ["ModelFactory", "TaskModelFn", "bench_model_fn", "l2_loss", "model_fn_for", "zoo_model"]
