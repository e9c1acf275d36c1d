"""One encoded example into one row of a batch: :class:`ExampleDecoder`.

What :class:`~.options.ImageOptions` say happens to each example, in the order it happens: its
random numbers (:func:`~stoker.data.base.example_uniforms` of ``(seed, epoch, index)``), the
image's size from its header, the crop box and flip (:mod:`.crops`), the resize method, and the
decode of that box alone straight into the batch's row (:func:`.decoders.decode_crop_resize`).
Which examples a batch holds, in which slots and built by which thread is the batch builder's
(:class:`~.source.EncodedImageSource`); what one example becomes is this class's, so a change to
the crop or the decode touches this file and :mod:`.crops` only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch

from ...errors import DataError
from ...resolve import Choice
from ..base import example_uniforms
from . import auto_decoder
from .color import color_params
from .crops import FLIP_INDEX, INCEPTION_DRAWS, INCEPTION_FLIP_INDEX, TRAIN_DRAWS, source_box
from .decoders import RESIZE_MODES, Decoder, ImageDecodeError, decode_crop_resize, get_decoder
from .options import ImageOptions

Box = tuple[float, float, float, float]


class EncodedExample(NamedTuple):
    """One encoded image as a source stores it: the bytes, the label, the object boxes
    (``(ymin, xmin, ymax, xmax)`` in [0, 1], as TFRecords hold them: one box or ``[K, 4]``;
    ``None`` when there is none) and a name for messages (a path, or "train-00003-of-01024 record 17")."""

    data: bytes
    label: int
    bbox: np.ndarray | tuple[float, float, float, float] | None
    name: str


class ExamplePlan(NamedTuple):
    """What an example's header and uniforms decide before any pixel is decoded: the region of the
    image to decode (``(left, top, w, h)`` in its pixels), the flip and the image's ``(width, height)``."""

    box: Box
    flip: bool
    image_wh: tuple[int, int]


class ExampleDecoder:
    """Plans and decodes one example at a time as ``image`` says, for the source ``name``.

    ``train`` decides ``augment=None``; ``seed`` keys every example's uniforms. The CPU decoder is
    ``image.decoder`` (``auto``: the first of the fixed order until :meth:`measure` times them).
    """

    def __init__(self, image: ImageOptions, *, train: bool, seed: int, name: str) -> None:
        self.name = name
        self.seed = int(seed)
        self.image_size = image.image_size
        self.resize_method = image.resize_method
        self.crop = image.crop
        self.augment = train if image.augment is None else bool(image.augment)
        self.distortions = bool(image.distortions) and self.augment  # colour distortions go with the random crop
        self.draws = TRAIN_DRAWS if image.crop == "tf_cnn" or self.distortions else INCEPTION_DRAWS
        self.flip_index = FLIP_INDEX if image.crop == "tf_cnn" else INCEPTION_FLIP_INDEX
        self.decoder: Decoder = get_decoder(image.decoder)

    # ------------------------------------------------------------------ random numbers
    def uniforms(self, epoch: int, indices: np.ndarray | Sequence[int]) -> np.ndarray | None:
        """The uniforms of the examples ``indices`` in ``epoch`` (``None`` when nothing is random)."""
        return example_uniforms(self.seed, epoch, indices, self.draws) if self.augment else None

    def uniforms_of(self, epoch: int, index: int) -> np.ndarray:
        """One example's uniforms (a replacement keeps its own: they follow the example, not the slot)."""
        return example_uniforms(self.seed, epoch, [index], self.draws)[0]

    def color(self, epoch: int, used: Sequence[int]) -> np.ndarray | None:
        """The colour distortion parameters of the examples ``used`` (``None`` without distortions)."""
        if not self.distortions:
            return None
        return color_params(example_uniforms(self.seed, epoch, used, self.draws))

    def method(self, position: int) -> str:
        """The resize method of the example at ``position`` (``round_robin`` cycles by it)."""
        if self.resize_method == "round_robin":
            return RESIZE_MODES[position % len(RESIZE_MODES)]
        return self.resize_method

    # ------------------------------------------------------------------ one example
    def plan(self, example: EncodedExample, index: int, u: np.ndarray | None) -> ExamplePlan:
        """Example ``index``'s crop box and flip, from its header and uniforms ``u``."""
        try:
            width, height = self.decoder.size(example.data)
        except ImageDecodeError as e:
            raise self._unreadable(example, index, e) from e
        flip = u is not None and bool(u[self.flip_index] < 0.5)
        box = source_box(
            width,
            height,
            u,
            image_size=self.image_size,
            resize_method=self.resize_method,
            crop=self.crop,
            bbox=example.bbox,
            name=example.name,
        )
        return ExamplePlan(box, flip, (width, height))

    def decode_into(
        self, example: EncodedExample, index: int, plan: ExamplePlan, position: int, out: np.ndarray | torch.Tensor
    ) -> None:
        """Decode ``plan``'s box of ``example`` into ``out`` (uint8 ``[H, W, 3]``)."""
        try:
            decode_crop_resize(
                example.data,
                plan.box,
                self.image_size,
                self.method(position),
                plan.flip,
                decoder=self.decoder,
                out=out,
                image_wh=plan.image_wh,  # read once: the header is parsed for the box already
            )
        except ImageDecodeError as e:
            raise self._unreadable(example, index, e) from e

    def _unreadable(self, example: EncodedExample, index: int, error: ImageDecodeError) -> DataError:
        return DataError(f"{self.name}: cannot read image {example.name} (example {index}): {error}")

    # ------------------------------------------------------------------ decoder="auto"
    def measure(self, read: Callable[[int], EncodedExample], num_examples: int, kind: str) -> Choice[str]:
        """The decoder that builds the first-epoch crops of these examples fastest here
        (:func:`.auto_decoder.choose_decoder`), taken as this one's decoder; ``read(index)`` gives
        example ``index`` of the ``num_examples``, unreadable ones are left out of the timing;
        ``kind`` names the source in the key of the once-per-process cache."""
        if len(auto_decoder.candidates()) < 2:
            choice = auto_decoder.choose_decoder(None, [], self.image_size)
        else:
            indices = auto_decoder.sample_indices(num_examples)
            draws = self.uniforms(0, indices)
            samples, names = [], []
            for position, index in enumerate(indices):
                try:
                    example = read(index)
                    plan = self.plan(example, index, None if draws is None else draws[position])
                except DataError:
                    continue
                samples.append(
                    auto_decoder.TimingSample(example.data, plan.box, self.method(index), plan.flip, plan.image_wh)
                )
                names.append(example.name)
            setting = (kind, num_examples, tuple(names), self.image_size, self.resize_method)
            key = (*setting, self.crop, self.augment, self.seed)
            choice = auto_decoder.choose_decoder(key, samples, self.image_size)
        self.decoder = get_decoder(choice.value)
        return choice


__all__ = ["EncodedExample", "ExampleDecoder", "ExamplePlan"]
