"""``image_folder``: image files in one folder per class (the ImageNet layout), via Pillow.

Training batches are augmented the Inception/ResNet way: a random crop of 8%-100% of the
area and aspect ratio 3/4-4/3 (torchvision's ``RandomResizedCrop`` algorithm: ten tries,
then a central crop), resized to ``image_size`` with bilinear filtering, then a random
horizontal flip. Evaluation batches resize the shorter side to ``image_size / 0.875`` and
take the central ``image_size`` square. Only the needed source box is decoded (at the
smallest DCT scale that keeps it at least ``image_size``) and resized, into a uint8 batch;
the float cast and normalisation is one vectorised step, in the loader (``output="float32"``)
or on the device (``output="uint8"``).

Decoding goes through :mod:`stoker.data.jpeg` (the crop's DCT scale, uint8 resize); the
shared batch builder :class:`EncodedImageSource` serves image folders and TFRecords alike.

The random numbers of example ``i`` in epoch ``e`` come from
:func:`~stoker.data.base.example_uniforms` ``(seed, e, i)``, so a batch is the same whichever
worker builds it and after any resume.
"""

from __future__ import annotations

import math
import os
from abc import abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch
from PIL import Image

from ..resolve import image_threads_suffice
from .base import DataError, IndexedSource, example_uniforms
from .jpeg import RESIZE_METHODS, RESIZE_MODES, ImageDecodeError, decode_crop_resize, get_decoder
from .preprocessing import (
    FLIP_INDEX,
    IMAGENET_MEAN,
    IMAGENET_STD,
    TRAIN_DRAWS,
    ImagePreprocessor,
    color_params,
    eval_crop_box,
    random_crop_box,
    sample_distorted_box,
)

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


#: ``resize_method`` names and Pillow's filters, for :func:`augment_image` (the Pillow reference
#: transform; the sources resize with torch, see :mod:`stoker.data.jpeg`).
RESIZE_FILTERS: dict[str, Image.Resampling] = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "area": Image.Resampling.BOX,  # TensorFlow's AREA: each output pixel averages its source box
}
#: What an encoded-image source yields: ``float32`` normalised NCHW (the default) or the ``uint8`` NHWC batch.
OUTPUTS: tuple[str, ...] = ("float32", "uint8")
#: Training crop samplers: torchvision's ``RandomResizedCrop`` box, or tf_cnn_benchmarks'.
CROPS: tuple[str, ...] = ("inception", "tf_cnn")
T = TypeVar("T")


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


class EncodedExample(NamedTuple):
    """One encoded image as a source stores it: the bytes, the label, the object boxes
    (``(ymin, xmin, ymax, xmax)`` in [0, 1], as TFRecords hold them: one box or ``[K, 4]``;
    ``None`` when there is none) and a name for messages (a path, or "train-00003-of-01024 record 17")."""

    data: bytes
    label: int
    bbox: np.ndarray | tuple[float, float, float, float] | None
    name: str


class EncodedImageSource(IndexedSource):
    """The shared batch builder of encoded-image sources (image folders, TFRecords).

    Subclasses set up their data, call ``super().__init__``, and implement
    :attr:`num_examples`, :attr:`classes` and :meth:`_encoded`. This class decodes each
    example's crop (:func:`stoker.data.jpeg.decode_crop_resize`: header, crop box, DCT-scaled
    decode, uint8 resize, flip) straight into a uint8 ``[N, H, W, 3]`` batch. With worker
    processes the batch is built in a shared-memory slot (:mod:`stoker.data._workers.processes`) and only
    the slot number and the labels cross the process boundary.

    ``output="uint8"`` yields the uint8 ``[N, H, W, 3]`` images as they are, or with
    ``distortions`` a dict ``{"images": uint8 [N, H, W, 3], "color": float32 [N, COLOR_PARAMS]}``:
    the float cast, colour distortions and normalisation then belong in the step, on the device
    (:class:`~stoker.data.preprocessing.ImagePreprocessor`; ``stoker bench`` does this).
    ``output="float32"`` (the default) applies that same ImagePreprocessor in the loader:
    float32 ``[N, 3, H, W]``, as before. ``decode_on_device=True`` decodes batches with nvJPEG
    on the GPU (``torchvision.io.decode_jpeg``) and crops and resizes them there.

    ``shuffle`` and ``num_epochs`` left out (``None``) follow the mode, as for every file-backed
    source (:meth:`~stoker.data.IndexedSource.mode_defaults`): training shuffles and repeats,
    evaluation is one pass in order.

    Training crops (``augment``): ``crop="inception"`` (the default) is torchvision's
    ``RandomResizedCrop`` box (area 8%-100%, aspect 3/4-4/3) and evaluation resizes the shorter
    side to ``image_size / 0.875``; ``crop="tf_cnn"`` is tf_cnn_benchmarks' (TensorFlow's
    ``sample_distorted_bounding_box`` with its arguments, honouring the example's object
    boxes; evaluation: its ``eval_image`` box), see :mod:`stoker.data.preprocessing`.
    """

    name = "encoded_images"

    def __init__(
        self,
        *,
        batch_size: int,
        image_size: int = 224,
        train: bool = True,
        augment: bool | None = None,
        resize_method: str = "bilinear",
        crop: str = "inception",
        distortions: bool = False,
        output: str = "float32",
        decoder: str = "auto",
        decode_on_device: bool | str = False,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        pin_memory: bool = False,
        **indexed: Any,
    ) -> None:
        if not isinstance(image_size, int) or image_size < 1:
            raise ValueError(f"{self.name}: image_size must be a positive integer; got {image_size!r}")
        if resize_method not in RESIZE_METHODS:
            raise ValueError(
                f"{self.name}: resize_method must be one of {', '.join(RESIZE_METHODS)}; got {resize_method!r}"
            )
        if output not in OUTPUTS:
            raise ValueError(f"{self.name}: output must be one of {', '.join(OUTPUTS)}; got {output!r}")
        if crop not in CROPS:
            raise ValueError(f"{self.name}: crop must be one of {', '.join(CROPS)}; got {crop!r}")
        self.image_size = image_size
        self.train = bool(train)
        self.augment = self.train if augment is None else bool(augment)
        self.resize_method = resize_method
        self.crop = crop
        self.distortions = bool(distortions) and self.augment  # colour distortions go with the random crop
        self.output = output
        self.mean, self.std = tuple(mean), tuple(std)
        # uint8 batches in pinned host memory (CUDA): the infeed's copy to the GPU is then
        # asynchronous with no extra staging copy (pin_memory() of a pinned tensor is a no-op).
        self.pin_memory = bool(pin_memory) and output == "uint8"
        self.decoder = get_decoder(decoder)
        self._draws = TRAIN_DRAWS if crop == "tf_cnn" or self.distortions else _DRAWS
        self._flip_index = FLIP_INDEX if crop == "tf_cnn" else 22
        self._preprocess = ImagePreprocessor(self.mean, self.std, distortions=self.distortions, channels_last=False)
        self._device_decoder = None
        if decode_on_device:
            from .gpu_decode import DeviceDecoder

            self._device_decoder = DeviceDecoder("cuda" if decode_on_device is True else str(decode_on_device))
            indexed["num_workers"] = 0  # the GPU decodes whole batches in this process; reading bytes is cheap
        indexed["shuffle"], indexed["num_epochs"] = self.mode_defaults(
            self.train, indexed.get("shuffle"), indexed.get("num_epochs")
        )
        super().__init__(batch_size=batch_size, **indexed)
        if self.worker_kind == "thread" and self.num_workers > 0 and self._builds_by_slot() and not self.pin_memory:
            # The training thread fetches (no infeed thread), so it is the one that decodes the
            # rest of its batch when the decoding threads have not finished it (_ExampleThreads).
            self.prefers_inline_fetch = True

    # ------------------------------------------------------------------ to implement
    @property
    @abstractmethod
    def classes(self) -> list[str]:
        """Class names; a label is an index into this list."""

    @abstractmethod
    def _encoded(self, index: int) -> EncodedExample:
        """Example ``index``'s bytes, label, object box and name (raise :class:`DataError` if unreadable)."""

    # ------------------------------------------------------------------ one example
    def _identity(self) -> dict[str, int]:
        # A different batch size would make the saved batch number point at other examples.
        return {"num_classes": len(self.classes), "batch_size": self.batch_size}

    def _builds_by_slot(self) -> bool:
        # uint8 batches only: a float32 batch is normalised as a whole by the thread that builds
        # it, which must then stay a decoding thread, off the training thread.
        return self.output == "uint8"

    def _threads_suffice(self) -> bool:
        return image_threads_suffice(
            releases_gil=self.decoder.releases_gil,
            decode_on_device=self._device_decoder is not None,
            pin_memory=self.pin_memory,
        ).value

    @property
    def decoder_name(self) -> str:
        """What decodes: ``simplejpeg``, ``pillow`` or ``nvjpeg``."""
        return "nvjpeg" if self._device_decoder is not None else self.decoder.name

    def _box(
        self, width: int, height: int, u: np.ndarray | None, example: EncodedExample
    ) -> tuple[float, float, float, float]:
        """``(left, top, w, h)`` of the source region: the random crop from ``u``, else the
        evaluation crop (``crop`` resize: an ``image_size`` square, at random or centred)."""
        size = self.image_size
        if self.resize_method == "crop":
            if width < size or height < size:
                raise DataError(
                    f"--resize_method=crop needs images of at least {size}x{size}; {example.name} is {width}x{height}"
                )
            if u is None:
                return (width - size) // 2, (height - size) // 2, size, size
            if self.crop == "tf_cnn":
                left, top = random_crop_box(width, height, size, u)
                return left, top, size, size
            return int(u[21] * (width - size + 1)), int(u[20] * (height - size + 1)), size, size
        if self.crop == "tf_cnn":
            if u is None:
                return eval_crop_box(width, height, size)
            bbox = None if example.bbox is None else np.asarray(example.bbox, dtype=np.float32).reshape(-1, 4)
            return sample_distorted_box(width, height, u, bbox)
        if u is None:
            x0, y0, x1, y1 = center_crop_box(width, height, size, int(round(size / 0.875)))
            return x0, y0, x1 - x0, y1 - y0
        return random_resized_crop_box(width, height, u)

    def _method(self, position: int) -> str:
        if self.resize_method == "round_robin":
            return RESIZE_MODES[position % len(RESIZE_MODES)]
        return self.resize_method

    def _read(self, index: int) -> EncodedExample:
        try:
            return self._encoded(index)
        except OSError as e:
            raise DataError(f"{self.name}: cannot read example {index}: {type(e).__name__}: {e}") from e

    def _plan_example(
        self, index: int, u: np.ndarray | None
    ) -> tuple[EncodedExample, tuple[float, float, float, float], bool]:
        """Example ``index`` read, its crop box and flip decided (from its header only)."""
        example, box, flip, _ = self._plan_sized(index, u)
        return example, box, flip

    def _plan_sized(
        self, index: int, u: np.ndarray | None
    ) -> tuple[EncodedExample, tuple[float, float, float, float], bool, tuple[int, int]]:
        """:meth:`_plan_example` and the image's ``(width, height)``."""
        example = self._read(index)
        try:
            width, height = self.decoder.size(example.data)
        except ImageDecodeError as e:
            raise DataError(f"{self.name}: cannot read image {example.name} (example {index}): {e}") from e
        flip = u is not None and bool(u[self._flip_index] < 0.5)
        return example, self._box(width, height, u, example), flip, (width, height)

    def _decode_into(self, index: int, u: np.ndarray | None, position: int, out: np.ndarray | torch.Tensor) -> int:
        """Decode example ``index`` into ``out`` (uint8 ``[H, W, 3]``); its label."""
        example, box, flip, wh = self._plan_sized(index, u)
        try:
            decode_crop_resize(
                example.data,
                box,
                self.image_size,
                self._method(position),
                flip,
                decoder=self.decoder,
                out=out,
                image_wh=wh,  # read once: the header is parsed for the box already
            )
        except ImageDecodeError as e:
            raise DataError(f"{self.name}: cannot read image {example.name} (example {index}): {e}") from e
        return example.label

    def _uniforms_of(self, epoch: int, indices: np.ndarray) -> np.ndarray | None:
        return example_uniforms(self.seed, epoch, indices, self._draws) if self.augment else None

    def _each_example(
        self, epoch: int, idx: np.ndarray, draws: np.ndarray | None, load: Callable[[int, np.ndarray | None, int], T]
    ) -> list[tuple[int, T]]:
        """``(index used, load(index, uniforms, position))`` per example, bad ones replaced
        (:meth:`load_or_replace`): a replacement keeps its own augmentation (it depends on the
        example, not the slot)."""
        return [self._load_slot(epoch, idx, draws, j, load) for j in range(len(idx))]

    def _load_slot(
        self,
        epoch: int,
        idx: np.ndarray,
        draws: np.ndarray | None,
        j: int,
        load: Callable[[int, np.ndarray | None, int], T],
    ) -> tuple[int, T]:
        """``(index used, load(index, uniforms, j))`` for slot ``j`` of the batch ``idx``."""
        i = int(idx[j])

        def load_one(k: int) -> tuple[int, T]:
            if draws is None:
                return k, load(k, None, j)
            u = draws[j] if k == i else example_uniforms(self.seed, epoch, [k], self._draws)[0]
            return k, load(k, u, j)

        return self.load_or_replace(epoch, i, load_one)

    # ------------------------------------------------------------------ one slot at a time (decoding threads)
    def slot_plan(
        self, indices: torch.Tensor, epoch: int
    ) -> tuple[np.ndarray, np.ndarray | None, dict[str, torch.Tensor]]:
        """What the decoding threads fill batch ``indices`` from, one slot each: the indices, their
        random draws and the batch's buffers (pinned for a CUDA infeed)."""
        idx = indices.numpy()
        size = self.image_size
        images = torch.empty((len(idx), size, size, 3), dtype=torch.uint8, pin_memory=self.pin_memory)
        return idx, self._uniforms_of(epoch, idx), {"images": images}

    def fill_slot(
        self, epoch: int, idx: np.ndarray, draws: np.ndarray | None, j: int, buffers: dict[str, torch.Tensor]
    ) -> tuple[int, int, str | None]:
        """Decode slot ``j`` into its row of ``buffers["images"]`` (an unreadable example replaced as
        :meth:`fill_batch` replaces it): ``(index used, label, None)``, or the error's text."""
        row = buffers["images"][j]
        try:
            used, label = self._load_slot(epoch, idx, draws, j, lambda k, u, _: self._decode_into(k, u, j, row))
        except DataError as e:
            return 0, 0, str(e)
        return used, label, None

    def finish_slots(self, epoch: int, buffers: dict[str, torch.Tensor], used: list[int], labels: list[int]) -> Any:
        """The batch from its filled buffers, the examples used and their labels."""
        return self.assemble(buffers, (np.asarray(labels, dtype=np.int64), self._color(epoch, used)), copy=False)

    def _color(self, epoch: int, used: list[int]) -> np.ndarray | None:
        if not self.distortions:
            return None
        return color_params(example_uniforms(self.seed, epoch, used, self._draws))

    # ------------------------------------------------------------------ batches
    def batch_buffers(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        if self._device_decoder is not None:
            return None
        size = self.image_size
        return {"images": ((self.batch_size, size, size, 3), torch.uint8)}

    def fill_batch(
        self, indices: torch.Tensor, epoch: int, buffers: dict[str, torch.Tensor]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Decode the examples ``indices`` into ``buffers["images"]`` rows ``0..len(indices)``;
        ``(labels, colour parameters or None)``."""
        idx = indices.numpy()
        images = buffers["images"].numpy()
        done = self._each_example(
            epoch, idx, self._uniforms_of(epoch, idx), lambda k, u, j: self._decode_into(k, u, j, images[j])
        )
        labels = np.fromiter((label for _, label in done), dtype=np.int64, count=len(done))
        return labels, self._color(epoch, [k for k, _ in done])

    def _finish(self, images: torch.Tensor, labels: torch.Tensor, color: np.ndarray | None, copy: bool) -> Any:
        color_t = None if color is None else torch.from_numpy(color).to(images.device)
        if self.output == "float32":
            return self._preprocess(images, color_t), labels
        if copy:  # out of the shared slot (into pinned memory for a CUDA infeed)
            images = torch.empty_like(images, pin_memory=self.pin_memory).copy_(images)
        return (images if color_t is None else {"images": images, "color": color_t}), labels

    def assemble(
        self, buffers: dict[str, torch.Tensor], rest: tuple[np.ndarray, np.ndarray | None], *, copy: bool
    ) -> tuple[Any, torch.Tensor]:
        """The batch from filled ``buffers`` (``copy``: they are a shared slot that will be reused)."""
        labels, color = rest
        return self._finish(buffers["images"], torch.from_numpy(labels), color, copy)

    def load_batch(self, indices: torch.Tensor, epoch: int) -> tuple[Any, torch.Tensor]:
        if self._device_decoder is not None:
            return self._load_on_device(indices, epoch)
        size = self.image_size
        buffers = {"images": torch.empty((len(indices), size, size, 3), dtype=torch.uint8, pin_memory=self.pin_memory)}
        return self.assemble(buffers, self.fill_batch(indices, epoch, buffers), copy=False)

    def _load_on_device(self, indices: torch.Tensor, epoch: int) -> tuple[Any, torch.Tensor]:
        """nvJPEG: read and size every example here, decode the batch on the GPU, crop and resize there."""
        assert self._device_decoder is not None
        idx = indices.numpy()
        planned = self._each_example(
            epoch, idx, self._uniforms_of(epoch, idx), lambda k, u, j: self._plan_example(k, u)
        )
        examples = [example for _, (example, _, _) in planned]
        plans = [(box, self._method(j), flip) for j, (_, (_, box, flip)) in enumerate(planned)]
        try:
            images = self._device_decoder.decode_batch([e.data for e in examples], plans, self.image_size)
        except ImageDecodeError as e:
            names = ", ".join(f"{e.name} (example {k})" for (k, _), e in zip(planned, examples, strict=True))
            raise DataError(f"{self.name}: cannot decode the batch of {names}: {e}") from e
        labels = torch.tensor([e.label for e in examples], dtype=torch.int64)
        return self._finish(images, labels, self._color(epoch, [k for k, _ in planned]), copy=False)


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
    (:mod:`stoker.data.jpeg`); other formats with Pillow.

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
        decoder: ``auto`` (simplejpeg if installed, else Pillow), ``simplejpeg`` or ``pillow``.
        decode_on_device: ``True`` (or a CUDA device name): decode batches with nvJPEG on the
            GPU and crop and resize them there (needs torchvision with CUDA); no worker processes.
        pin_memory: ``uint8`` batches in pinned host memory (for a CUDA infeed; needs CUDA).

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
        worker_kind=worker_kind,
        augment=augment,
        resize_method=resize_method,
        crop=crop,
        distortions=distortions,
        output=output,
        decoder=decoder,
        decode_on_device=decode_on_device,
        pin_memory=pin_memory,
    )


__all__ = [
    "CROPS",
    "OUTPUTS",
    "EncodedExample",
    "EncodedImageSource",
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
