"""The benchmark's ``input_fn`` kinds, one small callable per kind of data.

Each is a frozen dataclass holding what the flags and the workload decided, called by the
Estimator as ``input_fn(params)`` with the per-replica ``batch_size``, ``num_replicas`` and
``replica_index``. :func:`stoker.bench.workload.make_input_fn` picks one from the flags.

- :class:`ModelExamples`: a synthetic batch of a model that is not an image classifier
  (MovieLens ids, spectrograms, COCO images with boxes), repeated;
- :class:`SyntheticImages`: one random image batch made on the device, repeated;
- :class:`CifarBinaries`: the CIFAR-10 binaries;
- :class:`TFRecordImages`, :class:`TarShardImages` and :class:`FolderImages`: JPEG images from
  TFRecord shards, tar shards (the WebDataset layout) or an image folder, decoded by workers with
  the same :class:`ImageOptions`;
- :class:`FirstBatchRepeated`: ``--datasets_repeat_cached_sample``, the first batch of another
  ``input_fn`` repeated forever.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data import (
    ReadOptions,
    RepeatedBatch,
    cifar_binary,
    image_folder,
    imagenet_tfrecords,
    synthetic_images,
    tar_shards,
)
from ..data import images as data_images
from ..data.images import IMAGE_EXTENSIONS
from ..data.images.tar_shards import split_of
from ..data.images.tfrecord import shard_files
from ..models import ModelInfo
from ..resolve import Choice
from ..storage import Location

InputFn = Callable[[dict[str, Any]], Iterable[Any]]


#: What an ImageNet ``--data_dir`` holds (the header's ``Dataset:`` line says it).
TFRECORDS, IMAGE_FOLDER, TAR_SHARDS = "TFRecord shards", "image folder", "tar shards"


def image_folder_roots(data_dir: Path) -> tuple[Path, Path]:
    """The training and evaluation roots of an image folder: ``train`` and ``validation`` (or
    ``val``) where they exist, else ``data_dir`` itself for both."""
    train = data_dir / "train"
    for name in ("validation", "val"):
        if (data_dir / name).is_dir():
            return (train if train.is_dir() else data_dir), data_dir / name
    return (train if train.is_dir() else data_dir), (train if train.is_dir() else data_dir)


def has_class_folders(root: Path) -> bool:
    """A visible subfolder of ``root`` (or of ``root/train``) directly holds an image file."""
    for top in (root, root / "train"):
        if not top.is_dir():
            continue
        for sub in os.scandir(top):
            if sub.is_dir() and not sub.name.startswith("."):
                if any(f.name.lower().endswith(IMAGE_EXTENSIONS) for f in os.scandir(sub.path)):
                    return True
    return False


@dataclass(frozen=True, kw_only=True)
class ModelExamples:
    """The model's own synthetic batch (``ModelInfo.example_batch``), made once and repeated."""

    info: ModelInfo
    num_classes: int
    device: torch.device
    seed: int

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        features, labels = self.info.example_batch(
            params["batch_size"], num_classes=self.num_classes, device=self.device, seed=self.seed
        )
        return RepeatedBatch(features, labels, seed=self.seed)


@dataclass(frozen=True, kw_only=True)
class SyntheticImages:
    """One random batch of ``shape`` images made on ``device``, returned every step."""

    shape: tuple[int, int, int]
    num_classes: int
    device: torch.device
    seed: int
    channels_last: bool

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        return synthetic_images(
            self.shape,
            self.num_classes,
            batch_size=params["batch_size"],
            device=self.device,
            seed=self.seed,
            channels_last=self.channels_last,
        )


@dataclass(frozen=True, kw_only=True)
class CifarBinaries:
    """The CIFAR-10 binaries of ``data_dir`` (a folder or a URL), sharded over the replicas."""

    data_dir: Location
    train: bool
    seed: int
    num_epochs: int | None
    augment: bool

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        read = ReadOptions(seed=self.seed, num_epochs=self.num_epochs).for_replica(params)
        return cifar_binary(self.data_dir, read=read, train=self.train, augment=self.augment)


@dataclass(frozen=True, kw_only=True)
class ImageOptions:
    """What the folder and the records sources are given alike (one list, so neither drifts)."""

    image_size: int
    train: bool
    seed: int
    num_epochs: int | None
    num_workers: int
    worker_kind: str
    resize_method: str
    distortions: bool
    decoder: str
    decode_on_device: bool
    pin_memory: bool

    def for_replica(self, params: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of ``image_folder`` / ``imagenet_tfrecords`` for ``params``' replica."""
        read = ReadOptions(
            seed=self.seed, num_epochs=self.num_epochs, num_workers=self.num_workers, worker_kind=self.worker_kind
        )
        image = data_images.ImageOptions(
            image_size=self.image_size,
            # tf_cnn's training preprocessing always crops at random and flips; --distortions adds colour.
            augment=self.train,
            resize_method=self.resize_method,
            crop="tf_cnn",
            distortions=self.distortions,
            output="uint8",  # normalised on the device by the model_fn (bench.model.device_images)
            decoder=self.decoder,
            decode_on_device=self.decode_on_device,
            pin_memory=self.pin_memory,  # the infeed's H2D copy starts from pinned memory
        )
        return {"train": self.train, "read": read.for_replica(params), "image": image}


@dataclass(frozen=True, kw_only=True)
class TFRecordImages:
    """ImageNet TFRecord shards: ``train-*-of-*`` for training, ``validation-*-of-*`` for evaluation
    when there are any (else the training shards); ``data_dir`` a folder or a URL."""

    data_dir: Location
    num_classes: int
    options: ImageOptions

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        train = self.options.train
        return imagenet_tfrecords(
            self.data_dir,
            split="train" if train or not shard_files(self.data_dir, "validation") else "validation",
            num_classes=self.num_classes,
            **self.options.for_replica(params),
        )


@dataclass(frozen=True, kw_only=True)
class TarShardImages:
    """Tar shards (``key.jpg`` + ``key.cls``): those named ``train*`` for training and
    ``validation*`` / ``val*`` for evaluation when there are any, else all of them."""

    data_dir: Location
    num_classes: int
    options: ImageOptions

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        split = split_of(self.data_dir, self.options.train)
        return tar_shards(self.data_dir, split=split, num_classes=self.num_classes, **self.options.for_replica(params))


@dataclass(frozen=True, kw_only=True)
class FolderImages:
    """An image folder, ``root/<class>/<image>``."""

    root: Path
    options: ImageOptions

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        return image_folder(self.root, **self.options.for_replica(params))


@dataclass(frozen=True)
class FirstBatchRepeated:
    """``--datasets_repeat_cached_sample``: the first batch of ``input_fn``, repeated forever."""

    input_fn: InputFn

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        source = iter(self.input_fn(params))
        first = next(source)
        close = getattr(source, "close", None)
        if close is not None:
            close()  # stop its workers: nothing more is read
        return itertools.repeat(first)


def image_input_fn(
    data_dir: Location, data_layout: str, num_classes: int, options: ImageOptions
) -> TFRecordImages | TarShardImages | FolderImages:
    """The ``input_fn`` of ImageNet-shaped JPEG data in ``data_dir``: its TFRecord shards
    (``data_layout`` :data:`TFRECORDS`), its tar shards (:data:`TAR_SHARDS`), or the image
    folder's training or evaluation root as ``options.train`` says."""
    if data_layout == TFRECORDS:
        return TFRecordImages(data_dir=data_dir, num_classes=num_classes, options=options)
    if data_layout == TAR_SHARDS:
        return TarShardImages(data_dir=data_dir, num_classes=num_classes, options=options)
    assert isinstance(data_dir, Path), "image folders are local (the workload refuses a URL)"
    train_root, eval_root = image_folder_roots(data_dir)
    return FolderImages(root=train_root if options.train else eval_root, options=options)


def auto_decoder_choice(data_dir: Location, data_layout: str, num_classes: int, options: ImageOptions) -> Choice[str]:
    """``--image_decoder=auto``'s measured decoder (:mod:`stoker.data.images.auto_decoder`) for
    ``options``' data: a source built here with no workers times the installed decoders on its
    own examples, then is closed; the run's sources are then given the decoder by name."""
    probe = dataclasses.replace(
        options, num_workers=0, worker_kind="auto", decoder="auto", decode_on_device=False, pin_memory=False
    )
    params = {"batch_size": 1, "num_replicas": 1, "replica_index": 0}
    source = image_input_fn(data_dir, data_layout, num_classes, probe)(params)
    choice: Choice[str] = source.decoder_choice  # type: ignore[attr-defined]
    close = getattr(source, "close", None)
    if close is not None:
        close()
    return choice


__all__ = [
    "IMAGE_FOLDER",
    "TAR_SHARDS",
    "TFRECORDS",
    "CifarBinaries",
    "FirstBatchRepeated",
    "FolderImages",
    "ImageOptions",
    "InputFn",
    "ModelExamples",
    "SyntheticImages",
    "TFRecordImages",
    "TarShardImages",
    "auto_decoder_choice",
    "has_class_folders",
    "image_folder_roots",
    "image_input_fn",
]
