"""``image_folder``: image files in one folder per class (the ImageNet layout).

Training batches are augmented the Inception/ResNet way: a random crop of 8%-100% of the
area and aspect ratio 3/4-4/3 (torchvision's ``RandomResizedCrop`` algorithm: ten tries,
then a central crop), resized to ``image_size`` with bilinear filtering, then a random
horizontal flip. Evaluation batches resize the shorter side to ``image_size / 0.875`` and
take the central ``image_size`` square. The batches are built by :class:`~.source.EncodedImageSource`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DataError
from .source import EncodedExample, EncodedImageSource

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")


def scan_image_folder(
    root: str | os.PathLike[str], extensions: Sequence[str]
) -> tuple[list[str], list[str], np.ndarray]:
    """``(classes, paths, labels)`` of a class-per-folder tree; raises :class:`DataError` naming
    the folder when the root is missing, has no class folders, or a class holds no images."""
    root = Path(root)
    if not root.exists():
        raise DataError(f"image_folder: the root folder {root} does not exist")
    if not root.is_dir():
        raise DataError(f"image_folder: the root {root} is not a folder")
    exts = tuple(e.lower() for e in extensions)
    # Hidden folders (.ipynb_checkpoints, .git) are never classes.
    classes = sorted(d.name for d in os.scandir(root) if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(
            f"image_folder: {root} has no class folders; it needs one subfolder per class holding that class's images"
        )
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root / name, followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            found.extend(
                os.path.join(dirpath, f) for f in filenames if f.lower().endswith(exts) and not f.startswith(".")
            )
        if not found:
            raise DataError(
                f"image_folder: the class folder {root / name} holds no images (extensions {', '.join(exts)})"
            )
        found.sort()
        paths.extend(found)
        labels.extend([label] * len(found))
    return classes, paths, np.asarray(labels, dtype=np.int64)


class ImageFolderSource(EncodedImageSource):
    """Decoded, augmented image batches from a folder tree. See :func:`image_folder` (its typed
    signature and defaults; the other options go to :class:`EncodedImageSource` as given)."""

    name = "image_folder"

    def __init__(
        self, root: str | os.PathLike[str], *, extensions: Sequence[str] = IMAGE_EXTENSIONS, **options: Any
    ) -> None:
        self.root = Path(root)
        self._classes, self.paths, self.targets = scan_image_folder(root, extensions)
        super().__init__(**options)

    @property
    def num_examples(self) -> int:
        return len(self.paths)

    @property
    def classes(self) -> list[str]:
        return self._classes

    def _encoded(self, index: int) -> EncodedExample:
        path = self.paths[index]
        try:
            data = _read_file(path)
        except OSError as e:
            raise DataError(f"{self.name}: cannot read image {path} (example {index}): {type(e).__name__}: {e}") from e
        return EncodedExample(data, int(self.targets[index]), None, path)


def _read_file(path: str) -> bytes:
    """The file's bytes: one ``read`` of its size (29 against 41 us for ``open().read()`` on an
    85 KB JPEG from the page cache, which reads in buffered chunks), more if it grew meanwhile."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        data = os.read(fd, size + 1)  # + 1: sees a file that grew since fstat
        if len(data) == size:
            return data
        chunks = [data]  # a short read (some network file systems) or a grown file: read to the end
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def image_folder(
    root: str | os.PathLike[str],
    *,
    batch_size: int,
    image_size: int = 224,
    train: bool = True,
    shuffle: bool | None = None,
    seed: int = 0,
    num_epochs: int | None = None,
    drop_remainder: bool | None = None,
    num_workers: int = 0,
    num_shards: int = 1,
    shard_index: int = 0,
    skip_bad_examples: bool = False,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
    start_method: str | None = None,
    worker_kind: str = "auto",
    augment: bool | None = None,
    resize_method: str = "bilinear",
    crop: str = "inception",
    distortions: bool = False,
    output: str = "float32",
    decoder: str = "auto",
    decode_on_device: bool | str = False,
    pin_memory: bool = False,
) -> ImageFolderSource:
    """``(images, labels)`` batches from ``root/<class>/**/<image>`` files.

    Classes are the sorted subfolder names (``.classes``) and labels their index; files are
    sorted. Images are float32 ``[batch, 3, image_size, image_size]`` normalised by the
    ImageNet mean and std (``output="uint8"``: the uint8 ``[batch, image_size, image_size, 3]``
    batch, to normalise on the device), labels int64. JPEGs are decoded with simplejpeg when it
    is installed (else Pillow), at the smallest DCT scale the crop allows
    (:mod:`stoker.data.images.decoders`); other formats with Pillow.

    Args:
        root: the folder holding one subfolder per class.
        batch_size: examples per batch (give ``params["batch_size"]``).
        image_size: side of the square output images.
        train: random-resized-crop and flip augmentation, shuffled (else resize and centre
            crop, in file order).
        shuffle: default ``train``.
        seed: seeds the order and the augmentation.
        num_epochs: ``None``: forever when ``train``, one pass otherwise.
        drop_remainder: default True when repeating forever (a single pass keeps the last
            partial batch; the Estimator pads it).
        num_workers: decode in this many workers, each building whole batches.
        num_shards, shard_index: give ``params["num_replicas"]`` and ``params["replica_index"]``.
        skip_bad_examples: replace an unreadable image by the next readable one in the
            epoch's order, counted in ``.bad_examples_skipped`` and logged; otherwise an
            unreadable image raises a :class:`~stoker.data.DataError` naming the file.
        extensions: file name endings that are images (case-insensitive).
        start_method: multiprocessing start method for the workers (default fork on Linux).
        worker_kind: ``auto`` (threads when the decoder releases the GIL for the whole decode,
            ``libjpeg-crop``, ``num_workers <= 4`` and the batches are not pinned for a CUDA
            infeed; else processes), ``thread`` or ``process``.
        augment: random crop and flip (default ``train``); ``False`` on training data gives the
            evaluation transform (tf_cnn_benchmarks' ``--nodistortions``).
        resize_method: ``bilinear`` (default), ``nearest``, ``bicubic``, ``area``,
            ``round_robin`` (the four by position in the batch) or ``crop`` (no resizing).
        crop: ``inception`` (torchvision's random-resized-crop box, the default) or ``tf_cnn``
            (tf_cnn_benchmarks' training and evaluation boxes, :mod:`stoker.data.preprocessing`).
        distortions: also tf_cnn's colour distortions (brightness, saturation, hue, contrast)
            on augmented batches: applied in the loader for ``float32``; with ``uint8`` the
            features are ``{"images", "color"}`` for an ``ImagePreprocessor(distortions=True)``.
        output: ``float32`` (normalised NCHW, the default) or ``uint8`` (NHWC, as decoded).
        decoder: ``auto`` (``libjpeg-crop`` or ``simplejpeg``, whichever builds this source's crops
            faster, timed on 16 of its examples: their pixels are the same; Pillow where neither
            works; :mod:`stoker.data.images.auto_decoder`), ``libjpeg-crop``, ``simplejpeg`` or
            ``pillow``. ``.decoder_choice`` says which and why.
        decode_on_device: ``True`` (or a CUDA device name): decode batches with nvJPEG on the
            GPU and crop and resize them there (needs torchvision with CUDA); no worker processes.
        pin_memory: ``uint8`` batches in pinned host memory (for a CUDA infeed; needs CUDA).

    Raises:
        DataError: the root is missing or has no class folders, or a class folder has no images.
    """
    # Every argument by name: this signature is the typed, documented face of ImageFolderSource.
    return ImageFolderSource(**locals())


__all__ = ["IMAGE_EXTENSIONS", "ImageFolderSource", "image_folder", "scan_image_folder"]
