"""Per-model defaults of tf_cnn_benchmarks: batch size and learning rate (or schedule).

tf_cnn_benchmarks' model definitions each carry a default batch size per device, used when
``--batch_size`` is 0 (its default), and a learning rate, used when no rate flag is given
(``--init_learning_rate``, ``--piecewise_learning_rate_schedule``): a constant for most
models, a schedule for the ResNets, DenseNets, CIFAR-10 AlexNet and SSD. The numbers below
are those definitions' (``scripts/tf_cnn_benchmarks/models/*.py``); the schedules are written
here from their description.

Schedules are functions of the global step and the *global* batch. TensorFlow's replicated
mode sums the replicas' gradients and divides the ResNet/SSD rate by the number of GPUs to
compensate; DDP averages the gradients, so the rate here is not divided: the update is the
same.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ConfigError

#: Examples per epoch that the model schedules count in (the data sets' training sizes).
IMAGENET_TRAIN = 1_281_167
CIFAR10_TRAIN = 50_000
COCO_TRAIN = 118_287
#: What a model without an entry (a custom model, a model new to this zoo) gets: the base
#: ``Model`` class's defaults.
FALLBACK_BATCH_SIZE = 32
FALLBACK_LEARNING_RATE = 0.005

LearningRate = Callable[[int], float]


@dataclass(frozen=True)
class ModelDefaults:
    """A model's default batch size per device, base learning rate and schedule kind.

    ``schedule``: ``constant``, ``resnet`` (rate x batch/256, 5 warm-up epochs, x0.1 at epochs
    30/60/80/90), ``official_resnet`` (rate x batch/default batch, x0.1 at 30/60/80/90),
    ``resnet_cifar`` (0.1, 0.01, 0.001, 0.0002 from epochs 82, 123, 300), ``densenet_cifar``
    (0.1, 0.01, 0.001, 0.0001 from epochs 150, 225, 300), ``alexnet_cifar`` (x0.1 every 100
    epochs) or ``ssd`` (rate x batch/32, 5 warm-up epochs, x0.1 at steps 160k and 200k of batch 32).
    """

    batch_size: int
    learning_rate: float
    schedule: str = "constant"


def _table() -> dict[tuple[str, str | None], ModelDefaults]:
    t: dict[tuple[str, str | None], ModelDefaults] = {}
    for name in (
        "trivial",
        "googlenet",
        "inception3",
        "inception4",
        "lenet",
        "overfeat",
        "mobilenet",
        "mobilenet_v1",
        "mobilenet_v2",
        "mobilenet_v2_tf_cnn",
        "nasnet",
    ):
        t[(name, "imagenet")] = ModelDefaults(32, 0.005)
    t[("alexnet", "imagenet")] = ModelDefaults(512, 0.005)
    for name in ("vgg11", "vgg16", "vgg19"):
        t[(name, "imagenet")] = ModelDefaults(64, 0.005)
    for depth, batch in ((50, 64), (101, 32), (152, 32)):
        for suffix in ("", "_v1.5", "_v2"):
            t[(f"resnet{depth}{suffix}", "imagenet")] = ModelDefaults(batch, 0.128, "resnet")
    for depth in (18, 34, 50, 101, 152, 200):
        batch = {50: 128, 101: 32, 152: 32}.get(depth, 32)
        for suffix in ("", "_v2"):
            t[(f"official_resnet{depth}{suffix}", "imagenet")] = ModelDefaults(
                batch, 0.0125 * batch / 32, "official_resnet"
            )
    t[("nasnetlarge", "imagenet")] = ModelDefaults(16, 0.005)
    t[("ncf", None)] = ModelDefaults(2048, 0.0005)
    t[("trivial", "cifar10")] = ModelDefaults(32, 0.005)
    t[("alexnet", "cifar10")] = ModelDefaults(128, 0.1, "alexnet_cifar")
    t[("nasnet", "cifar10")] = ModelDefaults(32, 0.025)
    for depth in (20, 32, 44, 56, 110):
        for suffix in ("", "_v2"):
            t[(f"resnet{depth}{suffix}", "cifar10")] = ModelDefaults(128, 0.1, "resnet_cifar")
    for name in ("densenet40_k12", "densenet100_k12", "densenet100_k24"):
        t[(name, "cifar10")] = ModelDefaults(64, 0.1, "densenet_cifar")
    t[("ssd300", "coco")] = ModelDefaults(32, 1e-3, "ssd")
    t[("deepspeech2", "librispeech")] = ModelDefaults(128, 0.0005)
    return t


DEFAULTS: dict[tuple[str, str | None], ModelDefaults] = _table()


def model_defaults(model: str, dataset: str) -> ModelDefaults | None:
    """The defaults of ``model`` on ``dataset`` (``None``: the model has none, use the fallbacks)."""
    return DEFAULTS.get((model, dataset)) or DEFAULTS.get((model, None))


def model_learning_rate(defaults: ModelDefaults, global_batch: int, *, base_lr: float | None = None) -> LearningRate:
    """The model's learning rate at each global step, for steps of ``global_batch`` examples.

    ``base_lr`` replaces the ResNets' 0.128 at batch 256 (``--resnet_base_lr``).
    """
    lr = base_lr if base_lr is not None and defaults.schedule == "resnet" else defaults.learning_rate
    kind = defaults.schedule
    if kind == "constant":
        return lambda step: lr
    if kind in ("resnet", "official_resnet"):
        per_epoch = IMAGENET_TRAIN / global_batch
        scaled = lr * global_batch / (256 if kind == "resnet" else defaults.batch_size)
        rate = _piecewise(
            [int(per_epoch * e) for e in (30, 60, 80, 90)], [scaled * f for f in (1, 0.1, 0.01, 0.001, 0.0001)]
        )
        return _warmup(rate, scaled, int(per_epoch * 5)) if kind == "resnet" else rate
    if kind == "resnet_cifar":
        per_epoch = int(CIFAR10_TRAIN / global_batch)
        return _piecewise([per_epoch * e for e in (82, 123, 300)], [0.1, 0.01, 0.001, 0.0002])
    if kind == "densenet_cifar":
        per_epoch = CIFAR10_TRAIN // global_batch
        return _piecewise([per_epoch * e for e in (150, 225, 300)], [0.1, 0.01, 0.001, 0.0001])
    if kind == "alexnet_cifar":
        decay_steps = max(1, 100 * CIFAR10_TRAIN // global_batch)
        return lambda step: lr * 0.1 ** (step // decay_steps)
    if kind == "ssd":
        scaled = lr * global_batch / 32
        rate = _piecewise([b * 32 // global_batch for b in (160_000, 200_000)], [scaled, scaled * 0.1, scaled * 0.01])
        return _warmup(rate, scaled, int(COCO_TRAIN / global_batch * 5))
    raise ConfigError(f"unknown learning-rate schedule {kind!r}")


def describe(defaults: ModelDefaults, model: str) -> str:
    """One line saying what the model's default learning rate is."""
    kind = defaults.schedule
    what = {
        "constant": f"{defaults.learning_rate:g}",
        "resnet": "0.128 x global batch / 256 (--resnet_base_lr replaces 0.128), 5 warm-up epochs, "
        "x0.1 at epochs 30, 60, 80, 90",
        "official_resnet": f"{defaults.learning_rate:g} x global batch / {defaults.batch_size}, "
        "x0.1 at epochs 30, 60, 80, 90",
        "resnet_cifar": "0.1, then 0.01, 0.001, 0.0002 from epochs 82, 123, 300",
        "densenet_cifar": "0.1, then 0.01, 0.001, 0.0001 from epochs 150, 225, 300",
        "alexnet_cifar": f"{defaults.learning_rate:g}, x0.1 every 100 epochs",
        "ssd": f"{defaults.learning_rate:g} x global batch / 32, 5 warm-up epochs, x0.1 at 160k and 200k steps of 32",
    }[kind]
    return f"{model}'s learning rate: {what}"


def _piecewise(boundaries: Sequence[int], values: Sequence[float]) -> LearningRate:
    # TensorFlow's piecewise_constant: values[i] while step <= boundaries[i].
    return lambda step: values[bisect.bisect_left(boundaries, step)]


def _warmup(rate: LearningRate, peak: float, steps: int) -> LearningRate:
    if steps <= 0:
        return rate
    return lambda step: peak * step / steps if step < steps else rate(step)


__all__ = [
    "DEFAULTS",
    "FALLBACK_BATCH_SIZE",
    "FALLBACK_LEARNING_RATE",
    "ModelDefaults",
    "describe",
    "model_defaults",
    "model_learning_rate",
]
