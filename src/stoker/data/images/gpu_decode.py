"""Batched JPEG decoding on the GPU (nvJPEG through ``torchvision.io.decode_jpeg``).

For GPU hosts whose CPUs cannot decode as fast as the GPU trains: the source reads the bytes
and each image's size (from the header) on the host, picks the crop boxes as on the CPU path,
then one ``decode_jpeg(list_of_tensors, device="cuda")`` call decodes the whole batch and the
crops are resized (``F.interpolate``, uint8, no antialiasing, as the CPU path) and flipped on
the GPU. Files that are not JPEG (PNG, BMP) are decoded on the CPU and uploaded.

Run on an H200 (torch 2.11, torchvision 0.26) by ``make gpu-check``; the CUDA-marked tests in
``tests/data/images/test_source.py`` and ``tests/bench/test_bench_cuda_paths.py`` exercise it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import ConfigError
from .decoders import ImageDecodeError, PillowDecoder, is_jpeg


def _torchvision_decode_jpeg() -> Any:
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as e:  # ImportError, or an operator library built for another torch
        raise ImportError(
            "decode_on_device needs torchvision built for this torch with CUDA (nvJPEG): "
            f"pip install torchvision (matching torch {torch.__version__}); importing it failed: {e}"
        ) from e
    return decode_jpeg, ImageReadMode.RGB


class DeviceDecoder:
    """Decodes a batch of encoded images on ``device`` and crops/resizes it there."""

    def __init__(self, device: str = "cuda") -> None:
        self.device = torch.device(device)
        if self.device.type != "cuda" or not torch.cuda.is_available():
            raise ConfigError(f"decode_on_device needs a CUDA device; torch sees none (asked for {device!r})")
        self._decode_jpeg, self._rgb = _torchvision_decode_jpeg()
        self._stream = torch.cuda.Stream(device=self.device)
        self._pillow = PillowDecoder()

    def _decode(self, data: list[bytes]) -> list[torch.Tensor]:
        """CHW uint8 images on the device, in order."""
        out: list[torch.Tensor | None] = [None] * len(data)
        jpegs = [k for k, d in enumerate(data) if is_jpeg(d)]
        if jpegs:
            tensors = [torch.frombuffer(bytearray(data[k]), dtype=torch.uint8) for k in jpegs]
            try:
                decoded = self._decode_jpeg(tensors, mode=self._rgb, device=self.device)
            except RuntimeError:
                # One bad file fails the whole batch call: decode one by one to name it.
                decoded = []
                for k, t in zip(jpegs, tensors, strict=True):
                    try:
                        decoded.append(self._decode_jpeg(t, mode=self._rgb, device=self.device))
                    except RuntimeError as e:
                        raise ImageDecodeError(f"image {k} of the batch is not a decodable JPEG (nvJPEG: {e})") from e
            for k, image in zip(jpegs, decoded, strict=True):
                out[k] = image
        for k, d in enumerate(data):
            if out[k] is None:
                array = np.ascontiguousarray(self._pillow.decode(d))
                out[k] = torch.from_numpy(array).to(self.device, non_blocking=True).permute(2, 0, 1)
        return [t for t in out if t is not None]

    def decode_batch(
        self, data: list[bytes], plans: list[tuple[tuple[float, float, float, float], str, bool]], size: int
    ) -> torch.Tensor:
        """uint8 ``[N, size, size, 3]`` on the device: image ``k`` cropped to ``plans[k]``'s box
        ``(left, top, w, h)``, resized with its method (or ``crop``: taken as is), flipped when asked."""
        # On a stream of its own, synchronised on both sides. torchvision's nvJPEG decode (0.26 and
        # earlier) allocates its outputs on the calling stream but writes them from a private stream
        # that does not wait for it, so it can overwrite memory that kernels queued on the calling
        # stream still read: on an H200 a resnet50 run decoding in the infeed's thread on the compute
        # stream went to NaN by step 5 (pytorch/vision#9606). Nothing is queued on this stream when
        # the decoder is called, and the batch is complete before another stream reads it.
        with torch.cuda.stream(self._stream):
            self._stream.synchronize()
            batch = self._decode_and_resize(data, plans, size)
            self._stream.synchronize()
        return batch

    def _decode_and_resize(
        self, data: list[bytes], plans: list[tuple[tuple[float, float, float, float], str, bool]], size: int
    ) -> torch.Tensor:
        images = self._decode(data)
        batch = torch.empty((len(data), size, size, 3), dtype=torch.uint8, device=self.device)
        for k, (image, (box, method, flip)) in enumerate(zip(images, plans, strict=True)):
            left, top, bw, bh = box
            x0, y0 = int(left), int(top)
            crop = image[:, y0 : max(y0 + 1, int(round(top + bh))), x0 : max(x0 + 1, int(round(left + bw)))]
            x = crop.unsqueeze(0)
            if method == "crop":
                y = x
            elif method == "area":
                y = F.interpolate(x.float(), size=(size, size), mode="area").round_().to(torch.uint8)
            elif method == "nearest":
                y = F.interpolate(x, size=(size, size), mode="nearest")
            elif self.device.type == "cuda":
                # CUDA's bilinear/bicubic kernels take floating types only (the CPU ones take uint8):
                # resize in float32, then round and saturate back to uint8 as the CPU path does.
                y = F.interpolate(x.float(), size=(size, size), mode=method, align_corners=False, antialias=False)
                y = y.round_().clamp_(0, 255).to(torch.uint8)
            else:
                y = F.interpolate(x, size=(size, size), mode=method, align_corners=False, antialias=False)
            hwc = y[0].permute(1, 2, 0)
            batch[k] = hwc.flip(1) if flip else hwc
        return batch


__all__ = ["DeviceDecoder"]
