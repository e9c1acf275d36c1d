"""The learning-rate schedules of tf_cnn_benchmarks' model definitions, by the kind a model's
registry entry names (``ModelInfo.lr_schedule``).

Each definition carries a default batch size per device and a learning rate: a constant for
most models, a schedule for the ResNets, DenseNets, CIFAR-10 AlexNet and SSD. The numbers are
in the registry entries (``default_batch_size``, ``default_learning_rate``, from
``scripts/tf_cnn_benchmarks/models/*.py``); the schedules are written here from their
description:

- ``constant``: the rate;
- ``resnet``: rate x global batch / 256, 5 linear warm-up epochs, x0.1 at epochs 30, 60, 80, 90;
- ``official_resnet``: rate x global batch / default batch, x0.1 at epochs 30, 60, 80, 90;
- ``resnet_cifar``: 0.1, 0.01, 0.001, 0.0002 from epochs 82, 123, 300;
- ``densenet_cifar``: 0.1, 0.01, 0.001, 0.0001 from epochs 150, 225, 300;
- ``alexnet_cifar``: the rate, x0.1 every 100 epochs;
- ``ssd``: rate x global batch / 32, 5 warm-up epochs, x0.1 at steps 160k and 200k of batch 32.

Schedules are functions of the global step and the *global* batch; epochs are the data set's
(:data:`~stoker.models.registry.EXAMPLES_PER_EPOCH`). TensorFlow's replicated mode sums the
replicas' gradients and divides the ResNet/SSD rate by the number of GPUs to compensate; DDP
averages the gradients, so the rate here is not divided: the update is the same.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from ..errors import ConfigError
from .registry import EXAMPLES_PER_EPOCH, ModelInfo

LearningRate = Callable[[int], float]

_IMAGENET = EXAMPLES_PER_EPOCH["imagenet"]["train"]
_CIFAR10 = EXAMPLES_PER_EPOCH["cifar10"]["train"]
_COCO = EXAMPLES_PER_EPOCH["coco"]["train"]


def learning_rate_schedule(info: ModelInfo, global_batch: int, *, base_lr: float | None = None) -> LearningRate:
    """The learning rate of ``info``'s model at each global step, for steps of ``global_batch``
    examples. ``base_lr`` replaces the ``resnet`` schedule's 0.128 at batch 256 (``--resnet_base_lr``).
    A model without a rate of its own (``default_learning_rate`` ``None``) has none: ``ConfigError``."""
    if info.default_learning_rate is None:
        raise ConfigError(f"model {info.name!r} ({info.dataset}) has no learning rate of its own")
    kind = info.lr_schedule
    lr = base_lr if base_lr is not None and kind == "resnet" else info.default_learning_rate
    if kind == "constant":
        return lambda step: lr
    if kind in ("resnet", "official_resnet"):
        per_epoch = _IMAGENET / global_batch
        scaled = lr * global_batch / (256 if kind == "resnet" else (info.default_batch_size or 1))
        rate = _piecewise(
            [int(per_epoch * e) for e in (30, 60, 80, 90)], [scaled * f for f in (1, 0.1, 0.01, 0.001, 0.0001)]
        )
        return _warmup(rate, scaled, int(per_epoch * 5)) if kind == "resnet" else rate
    if kind == "resnet_cifar":
        steps = int(_CIFAR10 / global_batch)
        return _piecewise([steps * e for e in (82, 123, 300)], [0.1, 0.01, 0.001, 0.0002])
    if kind == "densenet_cifar":
        steps = _CIFAR10 // global_batch
        return _piecewise([steps * e for e in (150, 225, 300)], [0.1, 0.01, 0.001, 0.0001])
    if kind == "alexnet_cifar":
        decay_steps = max(1, 100 * _CIFAR10 // global_batch)
        return lambda step: lr * 0.1 ** (step // decay_steps)
    # ssd (the registry admits only these kinds)
    scaled = lr * global_batch / 32
    rate = _piecewise([b * 32 // global_batch for b in (160_000, 200_000)], [scaled, scaled * 0.1, scaled * 0.01])
    return _warmup(rate, scaled, int(_COCO / global_batch * 5))


def describe_learning_rate(info: ModelInfo) -> str:
    """One line saying what the model's own learning rate is (``resnet50's learning rate: ...``)."""
    lr, batch = info.default_learning_rate, info.default_batch_size
    what = {
        "constant": f"{lr:g}",
        "resnet": "0.128 x global batch / 256 (--resnet_base_lr replaces 0.128), 5 warm-up epochs, "
        "x0.1 at epochs 30, 60, 80, 90",
        "official_resnet": f"{lr:g} x global batch / {batch}, x0.1 at epochs 30, 60, 80, 90",
        "resnet_cifar": "0.1, then 0.01, 0.001, 0.0002 from epochs 82, 123, 300",
        "densenet_cifar": "0.1, then 0.01, 0.001, 0.0001 from epochs 150, 225, 300",
        "alexnet_cifar": f"{lr:g}, x0.1 every 100 epochs",
        "ssd": f"{lr:g} x global batch / 32, 5 warm-up epochs, x0.1 at 160k and 200k steps of 32",
    }[info.lr_schedule]
    return f"{info.name}'s learning rate: {what}"


def _piecewise(boundaries: Sequence[int], values: Sequence[float]) -> LearningRate:
    # TensorFlow's piecewise_constant: values[i] while step <= boundaries[i].
    return lambda step: values[bisect.bisect_left(boundaries, step)]


def _warmup(rate: LearningRate, peak: float, steps: int) -> LearningRate:
    if steps <= 0:
        return rate
    return lambda step: peak * step / steps if step < steps else rate(step)


__all__ = ["LearningRate", "describe_learning_rate", "learning_rate_schedule"]
