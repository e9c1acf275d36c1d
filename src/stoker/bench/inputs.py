"""The benchmark's ``input_fn`` kinds, one small callable per kind of data.

Each is a frozen dataclass holding what the flags and the workload decided, called by the
Estimator as ``input_fn(params)`` with the per-replica ``batch_size``, ``num_replicas`` and
``replica_index``. :func:`stoker.bench.workload.make_input_fn` picks one from the flags.

- :class:`ModelExamples`: a synthetic batch of a model that is not an image classifier
  (MovieLens ids, spectrograms, COCO images with boxes), repeated;
- :class:`SyntheticImages`: one random image batch made on the device, repeated;
- :class:`CifarBinaries`: the CIFAR-10 binaries;
- :class:`TFRecordImages` and :class:`FolderImages`: JPEG images from TFRecord shards or an
  image folder, decoded by workers with the same :class:`ImageOptions`;
- :class:`FirstBatchRepeated`: ``--datasets_repeat_cached_sample``, the first batch of another
  ``input_fn`` repeated forever.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data import RepeatedBatch, cifar_binary, image_folder, imagenet_tfrecords, synthetic_images
from ..data.tfrecord import find_shards
from ..models import ModelInfo

InputFn = Callable[[dict[str, Any]], Iterable[Any]]


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
    """The CIFAR-10 binaries of ``data_dir``, sharded over the replicas."""

    data_dir: Path
    train: bool
    seed: int
    num_epochs: int | None
    augment: bool

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        return cifar_binary(
            self.data_dir,
            batch_size=params["batch_size"],
            train=self.train,
            seed=self.seed,
            num_epochs=self.num_epochs,
            num_shards=params["num_replicas"],
            shard_index=params["replica_index"],
            augment=self.augment,
        )


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
        return {
            "batch_size": params["batch_size"],
            "image_size": self.image_size,
            "train": self.train,
            "seed": self.seed,
            "num_epochs": self.num_epochs,
            "num_workers": self.num_workers,
            "num_shards": params["num_replicas"],
            "shard_index": params["replica_index"],
            # tf_cnn's training preprocessing always crops at random and flips; --distortions adds colour.
            "augment": self.train,
            "resize_method": self.resize_method,
            "crop": "tf_cnn",
            "distortions": self.distortions,
            "output": "uint8",  # normalised on the device by the model_fn (bench.model.device_images)
            "decoder": self.decoder,
            "worker_kind": self.worker_kind,
            "decode_on_device": self.decode_on_device,
            "pin_memory": self.pin_memory,  # the infeed's H2D copy starts from pinned memory
        }


@dataclass(frozen=True, kw_only=True)
class TFRecordImages:
    """ImageNet TFRecord shards: ``train-*-of-*`` for training, ``validation-*-of-*`` for evaluation
    when there are any (else the training shards)."""

    data_dir: Path
    num_classes: int
    options: ImageOptions

    def __call__(self, params: dict[str, Any]) -> Iterable[Any]:
        train = self.options.train
        return imagenet_tfrecords(
            self.data_dir,
            split="train" if train or not find_shards(self.data_dir, "validation") else "validation",
            num_classes=self.num_classes,
            **self.options.for_replica(params),
        )


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


__all__ = [
    "CifarBinaries",
    "FirstBatchRepeated",
    "FolderImages",
    "ImageOptions",
    "InputFn",
    "ModelExamples",
    "SyntheticImages",
    "TFRecordImages",
]
