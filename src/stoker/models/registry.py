"""The model registry: every zoo model is a factory registered under ``(dataset, name)``.

The same name may exist for several datasets (``trivial`` and ``alexnet`` are defined for both
ImageNet and CIFAR-10, with different architectures), so lookups always name the dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

DATASETS: tuple[str, ...] = ("imagenet", "cifar10")

# tf_cnn_benchmarks trains ImageNet models with 1001 classes: class 0 is "background", a
# leftover of the Inception preprocessing that its checkpoints and logits keep.
DEFAULT_NUM_CLASSES: dict[str, int] = {"imagenet": 1001, "cifar10": 10}

ModelFactory = Callable[..., nn.Module]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the registry knows about one model.

    Attributes:
        name: the model name, e.g. ``"resnet50"``.
        dataset: ``"imagenet"`` or ``"cifar10"``.
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


_REGISTRY: dict[tuple[str, str], ModelInfo] = {}


def _check_dataset(dataset: str) -> None:
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; allowed datasets: {', '.join(DATASETS)}")


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
) -> Callable[[ModelFactory], ModelFactory]:
    """Decorator that registers a model factory under ``(dataset, name)``.

    ``num_classes_default`` defaults to the dataset's class count (1001 for ImageNet, 10 for
    CIFAR-10); ``min_image_size`` defaults to ``default_image_size`` (a fixed-size model);
    ``description`` defaults to the first line of the factory's docstring;
    ``default_batch_size`` and ``default_learning_rate`` record the reference's own defaults.
    Registering the same
    ``(dataset, name)`` twice is an error. The factory is returned unchanged.
    """
    _check_dataset(dataset)

    def decorate(factory: ModelFactory) -> ModelFactory:
        key = (dataset, name)
        if key in _REGISTRY:
            raise ValueError(f"model {name!r} is already registered for dataset {dataset!r}")
        doc = (factory.__doc__ or "").strip()
        _REGISTRY[key] = ModelInfo(
            name=name,
            dataset=dataset,
            image_size=default_image_size,
            num_classes=(
                DEFAULT_NUM_CLASSES[dataset] if num_classes_default is None else num_classes_default
            ),
            factory=factory,
            description=description or (doc.splitlines()[0] if doc else name),
            min_image_size=default_image_size if min_image_size is None else min_image_size,
            default_batch_size=default_batch_size,
            default_learning_rate=default_learning_rate,
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
        raise ValueError(
            f"unknown model {name!r} for dataset {dataset!r}{hint}; "
            f"allowed names: {', '.join(list_models(dataset))}"
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
    return info.factory(
        num_classes=info.num_classes if num_classes is None else num_classes, **kwargs
    )
