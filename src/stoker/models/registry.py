"""The model registry: every zoo model is a factory registered under ``(dataset, name)``.

The same name may exist for several datasets (``trivial`` and ``alexnet`` are defined for both
ImageNet and CIFAR-10, with different architectures), so lookups always name the dataset.

Image classifiers take ``[B, 3, S, S]`` images, return logits and train with softmax
cross-entropy. A model of another kind (recommendation, speech, detection) registers what
differs: ``synthetic_batch`` makes a batch of its own inputs and labels, ``loss`` turns its
outputs and labels into the training loss, ``example`` names one example ("utterances").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, UnknownNameError

DATASETS: tuple[str, ...] = ("imagenet", "cifar10", "movielens", "librispeech", "coco")

# tf_cnn_benchmarks trains ImageNet models with 1001 classes: class 0 is "background", a
# leftover of the Inception preprocessing that its checkpoints and logits keep. MovieLens:
# interacted or not; LibriSpeech: 28 characters and the CTC blank; COCO: 80 classes and the
# background.
DEFAULT_NUM_CLASSES: dict[str, int] = {"imagenet": 1001, "cifar10": 10, "movielens": 2, "librispeech": 29, "coco": 81}
#: Examples per epoch of each data set's training and validation splits: what ``--num_epochs``
#: and the model schedules (``schedules.py``) count in.
EXAMPLES_PER_EPOCH: dict[str, dict[str, int]] = {
    "imagenet": {"train": 1_281_167, "validation": 50_000},
    "cifar10": {"train": 50_000, "validation": 10_000},
    # MLPerf NCF: 19,861,770 training positives with 4 sampled negatives each; one held-out
    # positive per user for evaluation.
    "movielens": {"train": 99_308_850, "validation": 138_493},
    # train-clean-100 + train-clean-360, and test-clean (the reference's file patterns).
    "librispeech": {"train": 132_553, "validation": 2_620},
    "coco": {"train": 118_287, "validation": 4_952},
}
#: The learning-rate schedules a model's entry may name (``schedules.py`` says what each is).
LR_SCHEDULES: tuple[str, ...] = (
    "constant",
    "resnet",
    "official_resnet",
    "resnet_cifar",
    "densenet_cifar",
    "alexnet_cifar",
    "ssd",
)

ModelFactory = Callable[..., nn.Module]
#: ``(batch_size, num_classes, generator, device) -> (features, labels)``: one random batch.
SyntheticBatchFn = Callable[[int, int, torch.Generator, torch.device], tuple[Any, Any]]
#: ``(model outputs, labels) -> scalar loss``, the batch mean.
LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the registry knows about one model.

    Attributes:
        name: the model name, e.g. ``"resnet50"``.
        dataset: one of ``DATASETS``.
        image_size: the square input size the reference trains at (``[B, 3, S, S]``).
        num_classes: the number of logits when ``create_model`` is not given one.
        factory: called as ``factory(num_classes=..., **kwargs)``; returns the ``nn.Module``.
        description: one line saying what the model is.
        min_image_size: the smallest input the architecture accepts. Models that flatten a
            fixed-size feature map (VGG, AlexNet, ...) accept only ``image_size``; models that
            end in a global average pool accept anything from this size up.
        default_batch_size: the per-device batch size tf_cnn_benchmarks' model definition
            sets (``None``: the reference sets none of its own).
        default_learning_rate: the learning rate that definition sets (``None``: likewise).
        lr_schedule: how that rate changes with the step: one of :data:`LR_SCHEDULES`
            (:func:`stoker.models.schedules.learning_rate_schedule` says how).
        synthetic_batch: makes a random batch for a model that does not read images
            (``None``: an image classifier).
        loss: the training loss of such a model (``None``: softmax cross-entropy on logits).
        example: what one example is, for throughput lines ("images", "examples", ...).
    """

    name: str
    dataset: str
    image_size: int
    num_classes: int
    factory: ModelFactory
    description: str
    min_image_size: int
    default_batch_size: int | None = None
    default_learning_rate: float | None = None
    lr_schedule: str = "constant"
    synthetic_batch: SyntheticBatchFn | None = None
    loss: LossFn | None = None
    example: str = "images"

    @property
    def is_classifier(self) -> bool:
        """An image classifier: images in, logits out, softmax cross-entropy."""
        return self.synthetic_batch is None

    def example_batch(
        self, batch_size: int, *, num_classes: int | None = None, device: str | torch.device = "cpu", seed: int = 0
    ) -> tuple[Any, Any]:
        """A random ``(features, labels)`` batch of this model's inputs at its default size.

        On the meta device the batch is made on the CPU and moved (shapes only), so a model
        built on the meta device can run it.
        """
        device = torch.device(device)
        where = torch.device("cpu") if device.type == "meta" else device
        gen = torch.Generator(device=where).manual_seed(seed)
        classes = self.num_classes if num_classes is None else num_classes
        with torch.device(where):  # also inside a caller's `with torch.device("meta")`
            if self.synthetic_batch is None:
                size = self.image_size
                batch: tuple[Any, Any] = (
                    torch.randn(batch_size, 3, size, size, generator=gen, device=where),
                    torch.randint(0, classes, (batch_size,), generator=gen, device=where),
                )
            else:
                batch = self.synthetic_batch(batch_size, classes, gen, where)
        if where != device:
            return _to_device(batch, device)
        return batch


_REGISTRY: dict[tuple[str, str], ModelInfo] = {}


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise UnknownNameError(f"unknown dataset {dataset!r}; allowed datasets: {', '.join(DATASETS)}")


def register_model(
    name: str,
    *,
    dataset: str,
    default_image_size: int,
    num_classes_default: int | None = None,
    min_image_size: int | None = None,
    description: str | None = None,
    default_batch_size: int | None = None,
    default_learning_rate: float | None = None,
    lr_schedule: str = "constant",
    synthetic_batch: SyntheticBatchFn | None = None,
    loss: LossFn | None = None,
    example: str = "images",
) -> Callable[[ModelFactory], ModelFactory]:
    """Decorator that registers a model factory under ``(dataset, name)``.

    ``num_classes_default`` defaults to the dataset's class count (1001 for ImageNet, 10 for
    CIFAR-10); ``min_image_size`` defaults to ``default_image_size`` (a fixed-size model);
    ``description`` defaults to the first line of the factory's docstring;
    ``default_batch_size``, ``default_learning_rate`` and ``lr_schedule`` record the reference's
    own defaults (what ``stoker bench`` trains with when no flag says otherwise);
    ``synthetic_batch``, ``loss`` and ``example`` describe a model that is not an image
    classifier (see the module docstring).
    Registering the same
    ``(dataset, name)`` twice is an error. The factory is returned unchanged.
    """
    _check_dataset(dataset)
    if lr_schedule not in LR_SCHEDULES:
        raise UnknownNameError(f"unknown lr_schedule {lr_schedule!r}; allowed: {', '.join(LR_SCHEDULES)}")

    def decorate(factory: ModelFactory) -> ModelFactory:
        key = (dataset, name)
        if key in _REGISTRY:
            raise ConfigError(f"model {name!r} is already registered for dataset {dataset!r}")
        doc = (factory.__doc__ or "").strip()
        _REGISTRY[key] = ModelInfo(
            name=name,
            dataset=dataset,
            image_size=default_image_size,
            num_classes=(DEFAULT_NUM_CLASSES[dataset] if num_classes_default is None else num_classes_default),
            factory=factory,
            description=description or (doc.splitlines()[0] if doc else name),
            min_image_size=default_image_size if min_image_size is None else min_image_size,
            default_batch_size=default_batch_size,
            default_learning_rate=default_learning_rate,
            lr_schedule=lr_schedule,
            synthetic_batch=synthetic_batch,
            loss=loss,
            example=example,
        )
        return factory

    return decorate


def list_models(dataset: str | None = None) -> list[str]:
    """Sorted names of the models registered for ``dataset``, or for any dataset if ``None``."""
    if dataset is not None:
        _check_dataset(dataset)
    return sorted({n for (d, n) in _REGISTRY if dataset is None or d == dataset})


def get_model_info(name: str, dataset: str = "imagenet") -> ModelInfo:
    """The ``ModelInfo`` of ``name`` for ``dataset``; ``ValueError`` listing the allowed names."""
    _check_dataset(dataset)
    info = _REGISTRY.get((dataset, name))
    if info is None:
        elsewhere = [d for d in DATASETS if (d, name) in _REGISTRY]
        hint = f" (it exists for dataset {', '.join(map(repr, elsewhere))})" if elsewhere else ""
        raise UnknownNameError(
            f"unknown model {name!r} for dataset {dataset!r}{hint}; allowed names: {', '.join(list_models(dataset))}"
        )
    return info


def create_model(
    name: str, *, dataset: str = "imagenet", num_classes: int | None = None, **kwargs: object
) -> nn.Module:
    """Build model ``name`` for ``dataset`` with ``num_classes`` logits (default: the dataset's).

    Extra keyword arguments go to the model's factory. The module is built on the current
    default device, so ``with torch.device("meta"): create_model(...)`` builds it without
    allocating or initialising weights (handy for counting parameters or FLOPs).
    """
    info = get_model_info(name, dataset)
    return info.factory(num_classes=info.num_classes if num_classes is None else num_classes, **kwargs)


def _to_device(tree: Any, device: torch.device) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: _to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_to_device(v, device) for v in tree)
    return tree
