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

import numpy as np

from ...errors import DataError
from ..options import ReadOptions
from .examples import EncodedExample
from .options import ImageOptions
from .source import EncodedImageSource

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
    """Decoded, augmented image batches from a folder tree. See :func:`image_folder`."""

    name = "image_folder"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        read: ReadOptions,
        image: ImageOptions | None = None,
        train: bool = True,
        extensions: Sequence[str] = IMAGE_EXTENSIONS,
    ) -> None:
        self.root = Path(root)
        self._classes, self.paths, self.targets = scan_image_folder(root, extensions)
        super().__init__(read=read, image=image, train=train)

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
    read: ReadOptions,
    image: ImageOptions | None = None,
    train: bool = True,
    extensions: Sequence[str] = IMAGE_EXTENSIONS,
) -> ImageFolderSource:
    """``(images, labels)`` batches from ``root/<class>/**/<image>`` files.

    Classes are the sorted subfolder names (``.classes``) and labels their index; files are
    sorted. Images are float32 ``[batch, 3, image_size, image_size]`` normalised by the
    ImageNet mean and std (``output="uint8"``: the uint8 ``[batch, image_size, image_size, 3]``
    batch, to normalise on the device), labels int64. JPEGs are decoded at the smallest DCT
    scale the crop allows (:mod:`stoker.data.images.decoders`); other formats with Pillow.

    Args:
        root: the folder holding one subfolder per class.
        read: how to read (:class:`~stoker.data.ReadOptions`; in an ``input_fn``,
            ``ReadOptions(...).for_replica(params)``). ``shuffle`` and ``num_epochs`` left
            ``None`` follow ``train``; ``drop_remainder=None`` keeps a single pass's last
            partial batch (the Estimator pads it); ``skip_bad_examples`` replaces an unreadable
            image by the next readable one of the epoch's order, counted in
            ``.bad_examples_skipped`` and logged (otherwise a :class:`~stoker.data.DataError`
            names the file); ``worker_kind="auto"`` takes threads when the decoder releases the
            GIL for the whole decode (``libjpeg-crop``), ``num_workers <= 4`` and the batches
            are not pinned for a CUDA infeed, else processes.
        image: what each image becomes (:class:`~stoker.data.images.ImageOptions`: size, crop,
            resize, colour distortions, decoder, output; ``None``: its defaults);
            ``.decoder_choice`` says which decoder ``decoder="auto"`` took and why.
        train: augment (random crop and flip) and shuffle; else resize and centre crop, in
            file order.
        extensions: file name endings that are images (case-insensitive).

    Raises:
        DataError: the root is missing or has no class folders, or a class folder has no images.
    """
    return ImageFolderSource(root, read=read, image=image, train=train, extensions=extensions)


__all__ = ["IMAGE_EXTENSIONS", "ImageFolderSource", "image_folder", "scan_image_folder"]
