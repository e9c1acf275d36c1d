"""``synthetic_images``: one random batch made once on the device and returned every step.

Like tf_cnn_benchmarks' synthetic data: it measures the model and the training loop with the
input pipeline taken out (no host work, no copy per step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..errors import CheckpointMismatchError, ConfigError


class RepeatedBatch:
    """One ``(features, labels)`` batch, made once by the caller, returned on every ``next()``.

    The synthetic data of models whose inputs are not images (ids, spectrograms, boxes): the
    caller generates the batch on the device from ``seed``; the state is the batch count and
    the seed, as for :class:`SyntheticImages`.
    """

    prefers_inline_fetch = True

    def __init__(self, features: Any, labels: Any, *, seed: int = 0) -> None:
        self.features = features
        self.labels = labels
        self.seed = int(seed)
        self.batch = 0

    def __iter__(self) -> RepeatedBatch:
        return self

    def __next__(self) -> tuple[Any, Any]:
        self.batch += 1
        return self.features, self.labels

    def state_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise CheckpointMismatchError(
                f"synthetic data: the saved input state has seed={state['seed']} but this source has "
                f"seed={self.seed}; resume with the same seed"
            )
        self.batch = int(state["batch"])


class SyntheticImages:
    """The same ``(images, labels)`` tensors on every ``next()``. See :func:`synthetic_images`."""

    # Nothing to prepare ahead: a prefetch thread would only add a hand-off per step.
    prefers_inline_fetch = True

    def __init__(
        self,
        shape: Sequence[int],
        num_classes: int,
        *,
        batch_size: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        channels_last: bool = False,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"synthetic_images: batch_size must be a positive integer; got {batch_size!r}")
        if num_classes < 1:
            raise ConfigError(f"synthetic_images: num_classes must be >= 1; got {num_classes}")
        shape = tuple(int(s) for s in shape)
        if channels_last and len(shape) != 3:
            raise ConfigError(f"synthetic_images: channels_last needs a (C, H, W) shape; got {shape}")
        device = torch.device(device)
        self.seed = int(seed)
        self.batch = 0
        # Generated directly on the device by a private generator: no host work, no copy, and
        # the global RNG (which the training step owns) is left alone.
        gen = torch.Generator(device=device).manual_seed(self.seed % 2**63)
        images = torch.randn((batch_size, *shape), generator=gen, device=device, dtype=torch.float32)
        if dtype != torch.float32:
            images = images.to(dtype)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        self.images = images
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=gen, device=device, dtype=torch.int64)

    def __iter__(self) -> SyntheticImages:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.batch += 1
        return self.images, self.labels

    def state_dict(self) -> dict[str, Any]:
        """Batches served so far and the seed: the data itself never changes."""
        return {"batch": self.batch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise CheckpointMismatchError(
                f"synthetic_images: the saved input state has seed={state['seed']} but this source has "
                f"seed={self.seed}; resume with the same seed"
            )
        self.batch = int(state["batch"])


def synthetic_images(
    shape: Sequence[int] = (3, 224, 224),
    num_classes: int = 1001,
    *,
    batch_size: int,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    channels_last: bool = False,
) -> SyntheticImages:
    """A batch of random images and labels, generated once on ``device``, repeated forever.

    Args:
        shape: one image's shape, ``(C, H, W)``.
        num_classes: labels are uniform in ``[0, num_classes)`` (1001: ImageNet with background).
        batch_size: give ``params["batch_size"]``.
        device: where the tensors live (use the training device: nothing is copied per step).
        dtype: of the images (labels are int64).
        seed: seeds the random values.
        channels_last: store the images NHWC in memory (shape stays NCHW).
    """
    return SyntheticImages(
        shape, num_classes, batch_size=batch_size, device=device, dtype=dtype, seed=seed, channels_last=channels_last
    )
