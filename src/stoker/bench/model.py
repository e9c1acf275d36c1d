"""The harness's model side, shared by the training and the inference runners: the zoo model
the flags name, tf_cnn_benchmarks' classification ``model_fn``, and the ``model_fn`` of the
models that train with their own loss (NCF, DeepSpeech2, SSD300)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data.images import TF_CNN_MEAN, TF_CNN_STD, ImagePreprocessor
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
    features = device_images(features, params)
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


_PREPROCESSORS: dict[tuple[Any, ...], ImagePreprocessor] = {}


def device_images(features: Any, params: dict[str, Any]) -> Any:
    """Real-data image batches, as the input pipeline hands them over (uint8 ``[N, H, W, 3]``, or
    ``{"images": ..., "color": ...}`` with colour distortions), made normalised float32
    ``[N, 3, H, W]`` where they are, on the device: the float cast, tf_cnn's colour distortions
    and its normalisation to [-1, 1] (:class:`~stoker.data.images.ImagePreprocessor`),
    channels-last for ``--data_format=NHWC``. Float features (synthetic data) pass unchanged.

    Doing it in the step, not in the input workers, moves a quarter of the bytes between
    processes and to the GPU, and on a GPU the cast and normalisation cost nothing.
    """
    color = None
    images = features
    if isinstance(features, dict) and "images" in features:
        images, color = features["images"], features.get("color")
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        return features
    key = (images.device, color is not None, bool(params.get("channels_last")))
    pre = _PREPROCESSORS.get(key)
    if pre is None:  # one per device and layout; its constants live on the device
        pre = ImagePreprocessor(
            TF_CNN_MEAN, TF_CNN_STD, distortions=color is not None, channels_last=bool(params.get("channels_last"))
        ).to(images.device)
        _PREPROCESSORS[key] = pre
    return pre(images, color)


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


def fp16_weights(factory: ModelFactory) -> ModelFactory:
    """``--fp16_vars``: the model's weights in fp16, updated in place (no fp32 master copy)."""
    return lambda params: factory(params).half()


def model_fn_for(workload: Workload) -> Callable[..., EstimatorSpec]:
    """The ``model_fn`` of the workload's model: the classifier's, or one with the model's own loss."""
    info = workload.model_info
    if info is None or info.loss is None:
        return bench_model_fn
    return TaskModelFn(info.loss)


__all__ = [
    "ModelFactory",
    "TaskModelFn",
    "bench_model_fn",
    "device_images",
    "fp16_weights",
    "l2_loss",
    "model_fn_for",
    "zoo_model",
]
