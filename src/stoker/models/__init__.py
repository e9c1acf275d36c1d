"""stoker's model zoo: the CNNs of tf_cnn_benchmarks, rebuilt as plain PyTorch modules.

Models are looked up by name and dataset::

    from stoker.models import create_model, list_models

    list_models("cifar10")                      # ['alexnet', 'densenet100_k12', ...]
    model = create_model("resnet50")            # ImageNet, 1001 logits, 224x224 input
    model = create_model("resnet56", dataset="cifar10", num_classes=100)

Every image classifier takes ``[B, 3, H, W]`` float images (``get_model_info(name,
dataset).image_size`` says which ``H = W``) in either memory format and returns
``[B, num_classes]`` logits. The models of other data sets (``ncf`` on MovieLens,
``deepspeech2`` on LibriSpeech, ``ssd300`` on COCO) take their own inputs, which
``get_model_info(...).example_batch(n)`` makes, and train with their registered ``loss``.
Adding a model is a factory decorated with ``register_model``; see ``registry.py``. An entry also
owns the model's defaults in tf_cnn_benchmarks (batch size, learning rate and the kind of its
schedule, ``schedules.py``), which ``stoker bench`` trains with when no flag says otherwise. The zoo
imports nothing of stoker but its errors: its models are plain ``nn.Module`` s any PyTorch code can use.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

# Importing the family modules registers their models.
from . import (  # noqa: F401
    alexnet,
    deepspeech,
    densenet,
    googlenet,
    inception,
    lenet,
    mobilenet,
    nasnet,
    ncf,
    overfeat,
    resnet,
    ssd,
    trivial,
    vgg,
)
from .registry import (
    DATASETS,
    DEFAULT_NUM_CLASSES,
    EXAMPLES_PER_EPOCH,
    LR_SCHEDULES,
    LossFn,
    ModelInfo,
    SyntheticBatchFn,
    create_model,
    get_model_info,
    list_models,
    register_model,
)

__all__ = [
    "DATASETS",
    "DEFAULT_NUM_CLASSES",
    "EXAMPLES_PER_EPOCH",
    "LR_SCHEDULES",
    "LossFn",
    "ModelInfo",
    "SyntheticBatchFn",
    "count_parameters",
    "create_model",
    "example_flops",
    "get_model_info",
    "list_models",
    "model_flops",
    "register_model",
]


def count_parameters(model: nn.Module) -> int:
    """Number of parameter elements in ``model`` (batch-norm running statistics are buffers,
    not parameters, so they are not counted). Works on meta-device models."""
    return sum(p.numel() for p in model.parameters())


def model_flops(model: nn.Module, image_size: int = 0, batch_size: int = 1, *, features: Any = None) -> int:
    """Forward-pass FLOPs per image for ``[batch_size, 3, image_size, image_size]`` inputs
    (or per example of ``features``, a batch of ``batch_size`` rows of the model's own input).

    Counted by ``torch.utils.flop_counter.FlopCounterMode``, which counts the matrix
    multiplications and convolutions, a multiply-add as 2 FLOPs; normalisation, activations,
    pooling and additions are not counted. The model runs once in eval mode without gradients
    (its mode is restored) on the device and dtype of its parameters, so a model built on the
    meta device is counted without doing any arithmetic.
    """
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    dtype = first.dtype if first is not None and first.is_floating_point() else torch.float32
    if features is None:
        features = torch.zeros(batch_size, 3, image_size, image_size, device=device, dtype=dtype)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(features)
    finally:
        model.train(was_training)
    return counter.get_total_flops() // batch_size


def example_flops(model: nn.Module, info: ModelInfo) -> int:
    """Forward-pass FLOPs per example of a zoo model on its default input (``info.example_batch``)."""
    if info.is_classifier:
        return model_flops(model, info.image_size)
    first = next(model.parameters(), None)
    device = first.device if first is not None else torch.device("cpu")
    features, _ = info.example_batch(2, device=device)  # the labels do not enter the forward pass
    count = getattr(model, "count_flops", None)
    if count is None:
        return model_flops(model, batch_size=2, features=features)
    # A model whose forward is too long to trace op by op counts its own FLOPs, still with
    # FlopCounterMode (DeepSpeech2: its per-frame recurrence once, times the frames).
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return int(count(features)) // 2
    finally:
        model.train(was_training)
