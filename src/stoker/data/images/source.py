"""The batch builder of encoded-image sources (image folders, TFRecords): :class:`EncodedImageSource`.

It decides which examples fill which rows of a uint8 batch, built where (in the calling thread,
by decoding threads one slot at a time, in worker processes' shared-memory slots, or on the GPU)
and with unreadable examples replaced; what each example becomes (its crop box and flip from its
uniforms, the decode of that box alone into its row) is its :class:`~.examples.ExampleDecoder`'s.
The float cast and normalisation (:mod:`.normalize`) is one vectorised step, in the loader
(``output="float32"``) or on the device (``output="uint8"``). The random numbers of example ``i``
in epoch ``e`` come from :func:`~stoker.data.base.example_uniforms` ``(seed, e, i)``, so a batch
is the same whichever worker builds it and after any resume.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from ...errors import DataError
from ...resolve import Choice, image_threads_suffice
from ..base import IndexedSource
from ..options import ReadOptions
from .decoders import Decoder, ImageDecodeError
from .examples import EncodedExample, ExampleDecoder, ExamplePlan
from .normalize import ImagePreprocessor
from .options import ImageOptions

T = TypeVar("T")


class EncodedImageSource(IndexedSource):
    """The shared batch builder of encoded-image sources (image folders, TFRecords).

    Subclasses set up their data, call ``super().__init__``, and implement
    :attr:`num_examples`, :attr:`classes` and :meth:`_encoded`. Each example's crop
    (:attr:`examples`: header, crop box, DCT-scaled decode, uint8 resize, flip) is decoded straight
    into a row of a uint8 ``[N, H, W, 3]`` batch. With worker processes the batch is built in a
    shared-memory slot (:mod:`stoker.data._workers.processes`) and only the slot number and the
    labels cross the process boundary.

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
        #: What each image becomes, as given (``None``: the defaults).
        self.image = image = ImageOptions() if image is None else image
        self.train = bool(train)
        #: What one example becomes: its uniforms, crop box, flip and decode (:mod:`.examples`).
        self.examples = ExampleDecoder(image, train=self.train, seed=read.seed, name=self.name)
        self.output = image.output
        # uint8 batches in pinned host memory (CUDA): the infeed's copy to the GPU is then
        # asynchronous with no extra staging copy (pin_memory() of a pinned tensor is a no-op).
        self.pin_memory = bool(image.pin_memory) and image.output == "uint8"
        self._preprocess = ImagePreprocessor(
            image.mean, image.std, distortions=self.examples.distortions, channels_last=False
        )
        #: The CPU decoder and why (``auto``: measured on this data, :mod:`.auto_decoder`).
        self.decoder_choice: Choice[str] = Choice(self.decoder.name, f"decoder={image.decoder}")
        self._device_decoder = None
        if image.decode_on_device:
            from .gpu_decode import DeviceDecoder

            self.decoder_choice = Choice(self.decoder.name, "image headers only: the GPU decodes")
            on = image.decode_on_device
            self._device_decoder = DeviceDecoder("cuda" if on is True else str(on))
            # The GPU decodes whole batches in this process; reading bytes is cheap.
            read = dataclasses.replace(read, num_workers=0)
        elif image.decoder == "auto":
            self.decoder_choice = self.examples.measure(self._read_one, self.num_examples, type(self).__name__)
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
    def decoder(self) -> Decoder:
        """The CPU decoder (it reads the headers when the GPU decodes)."""
        return self.examples.decoder

    @property
    def decoder_name(self) -> str:
        """What decodes: ``libjpeg-crop``, ``simplejpeg``, ``pillow`` or ``nvjpeg``."""
        return "nvjpeg" if self._device_decoder is not None else self.decoder.name

    def _read(self, index: int) -> EncodedExample:
        try:
            return self._encoded(index)
        except OSError as e:
            raise DataError(f"{self.name}: cannot read example {index}: {type(e).__name__}: {e}") from e

    def _encoded_one(self, index: int) -> EncodedExample:
        """:meth:`_encoded` for a lone read (the ``decoder="auto"`` probe's); sources of object-store
        shards read it with a ranged request instead of fetching its shard."""
        return self._encoded(index)

    def _read_one(self, index: int) -> EncodedExample:
        try:
            return self._encoded_one(index)
        except OSError as e:
            raise DataError(f"{self.name}: cannot read example {index}: {type(e).__name__}: {e}") from e

    def _plan_example(self, index: int, u: np.ndarray | None) -> tuple[EncodedExample, ExamplePlan]:
        """Example ``index`` read, its crop box and flip decided (from its header only)."""
        example = self._read(index)
        return example, self.examples.plan(example, index, u)

    def _decode_into(self, index: int, u: np.ndarray | None, position: int, out: np.ndarray | torch.Tensor) -> int:
        """Decode example ``index`` into ``out`` (uint8 ``[H, W, 3]``); its label."""
        example, plan = self._plan_example(index, u)
        self.examples.decode_into(example, index, plan, position, out)
        return example.label

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
            u = draws[j] if k == i else self.examples.uniforms_of(epoch, k)
            return k, load(k, u, j)

        return self.load_or_replace(epoch, i, load_one)

    # ------------------------------------------------------------------ one slot at a time (decoding threads)
    def slot_plan(
        self, indices: torch.Tensor, epoch: int
    ) -> tuple[np.ndarray, np.ndarray | None, dict[str, torch.Tensor]]:
        """What the decoding threads fill batch ``indices`` from, one slot each: the indices, their
        random draws and the batch's buffers (pinned for a CUDA infeed)."""
        idx = indices.numpy()
        return idx, self.examples.uniforms(epoch, idx), {"images": self._images(len(idx))}

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
        return self.assemble(
            buffers, (np.asarray(labels, dtype=np.int64), self.examples.color(epoch, used)), copy=False
        )

    # ------------------------------------------------------------------ batches
    def batch_buffers(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
        if self._device_decoder is not None:
            return None
        size = self.examples.image_size
        return {"images": ((self.batch_size, size, size, 3), torch.uint8)}

    def _images(self, rows: int) -> torch.Tensor:
        """An empty uint8 ``[rows, H, W, 3]`` batch of images (pinned for a CUDA infeed)."""
        size = self.examples.image_size
        return torch.empty((rows, size, size, 3), dtype=torch.uint8, pin_memory=self.pin_memory)

    def fill_batch(
        self, indices: torch.Tensor, epoch: int, buffers: dict[str, torch.Tensor]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Decode the examples ``indices`` into ``buffers["images"]`` rows ``0..len(indices)``;
        ``(labels, colour parameters or None)``."""
        idx = indices.numpy()
        images = buffers["images"].numpy()
        done = self._each_example(
            epoch, idx, self.examples.uniforms(epoch, idx), lambda k, u, j: self._decode_into(k, u, j, images[j])
        )
        labels = np.fromiter((label for _, label in done), dtype=np.int64, count=len(done))
        return labels, self.examples.color(epoch, [k for k, _ in done])

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
        buffers = {"images": self._images(len(indices))}
        return self.assemble(buffers, self.fill_batch(indices, epoch, buffers), copy=False)

    def _load_on_device(self, indices: torch.Tensor, epoch: int) -> tuple[Any, torch.Tensor]:
        """nvJPEG: read and size every example here, decode the batch on the GPU, crop and resize there."""
        assert self._device_decoder is not None
        idx = indices.numpy()
        planned = self._each_example(
            epoch, idx, self.examples.uniforms(epoch, idx), lambda k, u, j: self._plan_example(k, u)
        )
        examples = [example for _, (example, _) in planned]
        plans = [(plan.box, self.examples.method(j), plan.flip) for j, (_, (_, plan)) in enumerate(planned)]
        try:
            images = self._device_decoder.decode_batch([e.data for e in examples], plans, self.examples.image_size)
        except ImageDecodeError as e:
            names = ", ".join(f"{e.name} (example {k})" for (k, _), e in zip(planned, examples, strict=True))
            raise DataError(f"{self.name}: cannot decode the batch of {names}: {e}") from e
        labels = torch.tensor([e.label for e in examples], dtype=torch.int64)
        return self._finish(images, labels, self.examples.color(epoch, [k for k, _ in planned]), copy=False)


__all__ = ["EncodedImageSource"]
