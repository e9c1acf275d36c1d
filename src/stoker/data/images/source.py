"""The batch builder of encoded-image sources (image folders, TFRecords): :class:`EncodedImageSource`.

Each example's crop box and flip are drawn from its uniforms (:mod:`.crops`), only that box is
decoded (:mod:`stoker.data.images.decoders`: the smallest DCT scale that keeps it at least ``image_size``,
uint8 resize, flip) straight into a uint8 batch, and the float cast and normalisation
(:mod:`.normalize`) is one vectorised step, in the loader (``output="float32"``) or on the
device (``output="uint8"``). The random numbers of example ``i`` in epoch ``e`` come from
:func:`~stoker.data.base.example_uniforms` ``(seed, e, i)``, so a batch is the same whichever
worker builds it and after any resume.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import numpy as np
import torch

from ...errors import DataError
from ...resolve import Choice, image_threads_suffice
from ..base import IndexedSource, example_uniforms
from ..options import ReadOptions
from . import auto_decoder
from .color import color_params
from .crops import FLIP_INDEX, INCEPTION_DRAWS, INCEPTION_FLIP_INDEX, TRAIN_DRAWS, source_box
from .decoders import RESIZE_MODES, ImageDecodeError, decode_crop_resize, get_decoder
from .normalize import ImagePreprocessor
from .options import ImageOptions

T = TypeVar("T")


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
    example's crop (:func:`stoker.data.images.decoders.decode_crop_resize`: header, crop box, DCT-scaled
    decode, uint8 resize, flip) straight into a uint8 ``[N, H, W, 3]`` batch. With worker
    processes the batch is built in a shared-memory slot (:mod:`stoker.data._workers.processes`) and only
    the slot number and the labels cross the process boundary.

    ``output="uint8"`` yields the uint8 ``[N, H, W, 3]`` images as they are, or with
    ``distortions`` a dict ``{"images": uint8 [N, H, W, 3], "color": float32 [N, COLOR_PARAMS]}``:
    the float cast, colour distortions and normalisation then belong in the step, on the device
    (:class:`~stoker.data.images.normalize.ImagePreprocessor`; ``stoker bench`` does this).
    ``output="float32"`` (the default) applies that same ImagePreprocessor in the loader:
    float32 ``[N, 3, H, W]``, as before. ``decode_on_device=True`` decodes batches with nvJPEG
    on the GPU (``torchvision.io.decode_jpeg``) and crops and resizes them there.

    ``read``'s ``shuffle`` and ``num_epochs`` left ``None`` follow ``train``, as for every
    file-backed source: training shuffles and repeats, evaluation is one pass in order.

    Training crops (``image.augment``): ``crop="inception"`` (the default) is torchvision's
    ``RandomResizedCrop`` box (area 8%-100%, aspect 3/4-4/3) and evaluation resizes the shorter
    side to ``image_size / 0.875``; ``crop="tf_cnn"`` is tf_cnn_benchmarks' (TensorFlow's
    ``sample_distorted_bounding_box`` with its arguments, honouring the example's object
    boxes; evaluation: its ``eval_image`` box), see :mod:`stoker.data.images.crops`.
    """

    name = "encoded_images"

    def __init__(self, *, read: ReadOptions, image: ImageOptions | None = None, train: bool = True) -> None:
        self.image = image = ImageOptions() if image is None else image
        self.image_size = image.image_size
        self.train = bool(train)
        self.augment = self.train if image.augment is None else bool(image.augment)
        self.resize_method = image.resize_method
        self.crop = image.crop
        self.distortions = bool(image.distortions) and self.augment  # colour distortions go with the random crop
        self.output = image.output
        self.mean, self.std = tuple(image.mean), tuple(image.std)
        # uint8 batches in pinned host memory (CUDA): the infeed's copy to the GPU is then
        # asynchronous with no extra staging copy (pin_memory() of a pinned tensor is a no-op).
        self.pin_memory = bool(image.pin_memory) and image.output == "uint8"
        self._draws = TRAIN_DRAWS if image.crop == "tf_cnn" or self.distortions else INCEPTION_DRAWS
        self._flip_index = FLIP_INDEX if image.crop == "tf_cnn" else INCEPTION_FLIP_INDEX
        decoder, decode_on_device = image.decoder, image.decode_on_device
        self.decoder = get_decoder(decoder)  # auto: the first of the fixed order, until measured
        #: The CPU decoder and why (``auto``: measured on this data, :mod:`.auto_decoder`).
        self.decoder_choice: Choice[str] = Choice(self.decoder.name, f"decoder={decoder}")
        if decode_on_device:
            self.decoder_choice = Choice(self.decoder.name, "image headers only: the GPU decodes")
        elif decoder == "auto":
            self.decoder_choice = self._measured_decoder(int(read.seed))
            self.decoder = get_decoder(self.decoder_choice.value)
        self._preprocess = ImagePreprocessor(self.mean, self.std, distortions=self.distortions, channels_last=False)
        self._device_decoder = None
        if decode_on_device:
            from .gpu_decode import DeviceDecoder

            self._device_decoder = DeviceDecoder("cuda" if decode_on_device is True else str(decode_on_device))
            # The GPU decodes whole batches in this process; reading bytes is cheap.
            read = dataclasses.replace(read, num_workers=0)
        super().__init__(read.for_mode(self.train))
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
        """What decodes: ``libjpeg-crop``, ``simplejpeg``, ``pillow`` or ``nvjpeg``."""
        return "nvjpeg" if self._device_decoder is not None else self.decoder.name

    def _measured_decoder(self, seed: int) -> Choice[str]:
        """``decoder="auto"``: the decoder that builds this source's first-epoch crops fastest here
        (:func:`.auto_decoder.choose_decoder`); unreadable examples are left out of the timing."""
        if len(auto_decoder.candidates()) < 2:
            return auto_decoder.choose_decoder(None, [], self.image_size)
        indices = auto_decoder.sample_indices(self.num_examples)
        draws = example_uniforms(seed, 0, indices, self._draws) if self.augment else None
        samples, names = [], []
        for position, index in enumerate(indices):
            try:
                example, box, flip, wh = self._plan_sized(index, None if draws is None else draws[position])
            except DataError:
                continue
            samples.append(auto_decoder.TimingSample(example.data, box, self._method(index), flip, wh))
            names.append(example.name)
        setting = (type(self).__name__, self.num_examples, tuple(names), self.image_size, self.resize_method)
        return auto_decoder.choose_decoder((*setting, self.crop, self.augment, seed), samples, self.image_size)

    def _box(
        self, width: int, height: int, u: np.ndarray | None, example: EncodedExample
    ) -> tuple[float, float, float, float]:
        """``(left, top, w, h)`` of the region example ``example`` decodes (:func:`~.crops.source_box`)."""
        return source_box(
            width,
            height,
            u,
            image_size=self.image_size,
            resize_method=self.resize_method,
            crop=self.crop,
            bbox=example.bbox,
            name=example.name,
        )

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


__all__ = ["EncodedExample", "EncodedImageSource"]
