"""``image_folder``: image files in one folder per class (the ImageNet layout), via Pillow.

Training batches are augmented the Inception/ResNet way: a random crop of 8%-100% of the
area and aspect ratio 3/4-4/3 (torchvision's ``RandomResizedCrop`` algorithm: ten tries,
then a central crop), resized to ``image_size`` with bilinear filtering, then a random
horizontal flip. Evaluation batches resize the shorter side to ``image_size / 0.875`` and
take the central ``image_size`` square. Both are done in one Pillow ``resize`` of the needed
source box (no full-size intermediate), and the batch is normalised in one vectorised step.

The random numbers of example ``i`` in epoch ``e`` come from
:func:`~stoker.data.base.example_uniforms` ``(seed, e, i)``, so a batch is the same whichever
worker builds it and after any resume.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .base import DataError, IndexedSource, example_uniforms

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
# Uniforms an example may use: 10 tries x (area, log-ratio), top, left, flip.
_DRAWS = 23


def random_resized_crop_box(
    width: int,
    height: int,
    u: Sequence[float] | np.ndarray,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """``(left, top, w, h)`` of torchvision's ``RandomResizedCrop.get_params``, drawn from ``u``.

    ``u`` holds at least 22 uniforms in [0, 1): two per try (area, log aspect ratio) for ten
    tries, then the top and left offsets. Falls back to a central crop, as torchvision does.
    """
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for t in range(10):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u[2 * t])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[2 * t + 1])
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(u[20] * (height - h + 1))
            left = int(u[21] * (width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop_box(width: int, height: int, image_size: int, resize_to: int) -> tuple[float, float, float, float]:
    """Source box of "resize the shorter side to ``resize_to``, then centre-crop ``image_size``"."""
    if width <= height:
        new_w, new_h = resize_to, int(resize_to * height / width)
    else:
        new_w, new_h = int(resize_to * width / height), resize_to
    top = int(round((new_h - image_size) / 2.0))
    left = int(round((new_w - image_size) / 2.0))
    sx, sy = width / new_w, height / new_h
    return left * sx, top * sy, (left + image_size) * sx, (top + image_size) * sy


def normalize_images(batch: np.ndarray | torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 ``[N, H, W, C]`` (0-255) to float32 NCHW ``(x / 255 - mean) / std``, contiguous."""
    # Reorder the uint8 bytes first, then convert: cheaper than converting a strided view.
    x = torch.as_tensor(batch).permute(0, 3, 1, 2).contiguous().to(torch.float32)
    m = torch.tensor(mean, dtype=torch.float32).mul_(255).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).mul_(255).view(1, -1, 1, 1)
    return x.sub_(m).div_(s)


def decode_rgb(path: str, what: str = "image_folder") -> Image.Image:
    """The image at ``path`` decoded to RGB; a :class:`DataError` naming the file if it cannot be."""
    try:
        with Image.open(path) as im:
            im.load()
            return im if im.mode == "RGB" else im.convert("RGB")
    except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError, zlib.error ... for bad files
        raise DataError(f"{what}: cannot read image {path}: {type(e).__name__}: {e}") from e


#: ``resize_method`` names (tf_cnn_benchmarks') and Pillow's filters; ``round_robin`` cycles
#: through the four by the example's position in its batch, ``crop`` crops without resizing.
RESIZE_FILTERS: dict[str, Image.Resampling] = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "area": Image.Resampling.BOX,  # TensorFlow's AREA: each output pixel averages its source box
}
RESIZE_METHODS: tuple[str, ...] = (*RESIZE_FILTERS, "round_robin", "crop")


def augment_image(
    im: Image.Image,
    image_size: int,
    u: Sequence[float] | np.ndarray | None,
    *,
    resize_method: str = "bilinear",
    position: int = 0,
) -> np.ndarray:
    """``image_size`` square uint8 HWC array: train augmentation from ``u``, or eval centre crop if None.

    ``resize_method`` picks the filter (``round_robin``: by ``position``, the example's place
    in its batch); ``crop`` takes an ``image_size`` square without resizing (at a random place
    drawn from ``u``, else the centre), so the image must be at least that large.
    """
    width, height = im.size
    if resize_method == "crop":
        if width < image_size or height < image_size:
            raise DataError(
                f"--resize_method=crop needs images of at least {image_size}x{image_size}; "
                f"{getattr(im, 'filename', 'an image')} is {width}x{height}"
            )
        top = int(u[20] * (height - image_size + 1)) if u is not None else (height - image_size) // 2
        left = int(u[21] * (width - image_size + 1)) if u is not None else (width - image_size) // 2
        arr = np.asarray(im.crop((left, top, left + image_size, top + image_size)))
    else:
        if resize_method == "round_robin":
            resample = list(RESIZE_FILTERS.values())[position % len(RESIZE_FILTERS)]
        else:
            resample = RESIZE_FILTERS[resize_method]
        if u is None:
            box: tuple[float, float, float, float] = center_crop_box(
                width, height, image_size, int(round(image_size / 0.875))
            )
        else:
            left, top, w, h = random_resized_crop_box(width, height, u)
            box = (left, top, left + w, top + h)
        arr = np.asarray(im.resize((image_size, image_size), resample, box=box))
    if u is not None and u[22] < 0.5:
        arr = arr[:, ::-1]
    return arr


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


class ImageFolderSource(IndexedSource):
    """Decoded, augmented, normalised image batches from a folder tree. See :func:`image_folder`."""

    name = "image_folder"

    def __init__(
        self,
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
        augment: bool | None = None,
        resize_method: str = "bilinear",
    ) -> None:
        if not isinstance(image_size, int) or image_size < 1:
            raise ValueError(f"image_folder: image_size must be a positive integer; got {image_size!r}")
        if resize_method not in RESIZE_METHODS:
            raise ValueError(
                f"image_folder: resize_method must be one of {', '.join(RESIZE_METHODS)}; got {resize_method!r}"
            )
        self.augment = bool(train) if augment is None else bool(augment)
        self.resize_method = resize_method
        self.root = Path(root)
        self.classes, self.paths, self.targets = scan_image_folder(root, extensions)
        self.image_size = image_size
        self.train = bool(train)
        shuffle, num_epochs = self.mode_defaults(self.train, shuffle, num_epochs)
        super().__init__(
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            num_epochs=num_epochs,
            drop_remainder=drop_remainder,
            num_shards=num_shards,
            shard_index=shard_index,
            num_workers=num_workers,
            skip_bad_examples=skip_bad_examples,
            start_method=start_method,
        )

    @property
    def num_examples(self) -> int:
        return len(self.paths)

    def _identity(self) -> dict[str, int]:
        # A different batch size would make the saved batch number point at other examples.
        return {"num_classes": len(self.classes), "batch_size": self.batch_size}

    def _example(self, index: int, u: np.ndarray | None, position: int = 0) -> tuple[np.ndarray, int]:
        image = augment_image(
            decode_rgb(self.paths[index]), self.image_size, u, resize_method=self.resize_method, position=position
        )
        return image, int(self.targets[index])

    def load_batch(self, indices: torch.Tensor, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = indices.numpy()
        draws = example_uniforms(self.seed, epoch, idx, _DRAWS) if self.augment else None
        size = self.image_size
        images = np.empty((len(idx), size, size, 3), dtype=np.uint8)
        labels = np.empty(len(idx), dtype=np.int64)

        for j, i in enumerate(idx.tolist()):

            def load_one(k: int, i: int = i, j: int = j) -> tuple[np.ndarray, int]:
                if draws is None:
                    return self._example(k, None, j)
                # A replacement example keeps its own augmentation: it depends on k, not the slot.
                return self._example(k, draws[j] if k == i else example_uniforms(self.seed, epoch, [k], _DRAWS)[0], j)

            images[j], labels[j] = self.load_or_replace(epoch, i, load_one)
        return normalize_images(images, IMAGENET_MEAN, IMAGENET_STD), torch.from_numpy(labels)


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
    augment: bool | None = None,
    resize_method: str = "bilinear",
) -> ImageFolderSource:
    """``(images, labels)`` batches from ``root/<class>/**/<image>`` files, decoded with Pillow.

    Classes are the sorted subfolder names (``.classes``) and labels their index; files are
    sorted. Images are float32 ``[batch, 3, image_size, image_size]`` normalised by the
    ImageNet mean and std, labels int64.

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
        num_workers: decode in this many worker processes, each building whole batches.
        num_shards, shard_index: give ``params["num_replicas"]`` and ``params["replica_index"]``.
        skip_bad_examples: replace an unreadable image by the next readable one in the
            epoch's order, counted in ``.bad_examples_skipped`` and logged; otherwise an
            unreadable image raises a :class:`~stoker.data.DataError` naming the file.
        extensions: file name endings that are images (case-insensitive).
        start_method: multiprocessing start method for the workers (default fork on Linux).
        augment: random crop and flip (default ``train``); ``False`` on training data gives the
            evaluation transform (tf_cnn_benchmarks' ``--nodistortions``).
        resize_method: ``bilinear`` (default), ``nearest``, ``bicubic``, ``area``,
            ``round_robin`` (the four by position in the batch) or ``crop`` (no resizing).

    Raises:
        DataError: the root is missing or has no class folders, or a class folder has no images.
    """
    return ImageFolderSource(
        root,
        batch_size=batch_size,
        image_size=image_size,
        train=train,
        shuffle=shuffle,
        seed=seed,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        num_workers=num_workers,
        num_shards=num_shards,
        shard_index=shard_index,
        skip_bad_examples=skip_bad_examples,
        extensions=extensions,
        start_method=start_method,
        augment=augment,
        resize_method=resize_method,
    )


__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RESIZE_METHODS",
    "ImageFolderSource",
    "augment_image",
    "decode_rgb",
    "image_folder",
    "normalize_images",
    "random_resized_crop_box",
]
