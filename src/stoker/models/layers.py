"""Building blocks shared by the zoo, mirroring the layer conventions of tf_cnn_benchmarks.

tf_cnn_benchmarks builds every model with one builder whose conventions decide both the
parameter count and the numerics, so they are reproduced here:

* A convolution has a bias unless it is followed by batch norm.
* Batch norm is configured per model. The builder's default learns only the shift (beta) and
  no scale (gamma); ResNet and DenseNet ask for both. ``BNConfig`` carries those settings in
  TensorFlow's terms (``decay`` is ``1 - momentum`` in PyTorch's).
* Weights use truncated-normal initialisers (PyTorch's default initialisation is skipped,
  since every weight and bias is overwritten): variance scaling (fan-in, scale 1) for
  convolutions, ``sqrt(2 / fan_in)`` for ReLU dense layers and ``sqrt(1 / fan_in)`` for the
  linear logits layer; biases start at a constant (0 unless a model says otherwise).
* ``SAME`` padding is symmetric ``(k - 1) // 2``. For stride 1 and odd kernels this is exactly
  TensorFlow's ``SAME``; for stride 2 on an even input TensorFlow pads one pixel more at the
  bottom/right, which gives the same output size but shifts the sampling grid by a pixel.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.nn.utils import skip_init

from ..errors import ConfigError

Size2 = int | tuple[int, int]

# The standard deviation of a unit normal truncated to [-2, 2]; TensorFlow's variance scaling
# initialiser divides by it so the truncated distribution keeps the requested variance.
_TRUNCATED_NORMAL_STD = 0.87962566103423978


@dataclass(frozen=True, slots=True)
class BNConfig:
    """Batch-norm settings in TensorFlow's terms: moving-average ``decay``, ``epsilon`` and
    whether a learned ``scale`` (gamma) exists; the shift (beta) always does."""

    decay: float = 0.999
    epsilon: float = 1e-3
    scale: bool = False


# ConvNetBuilder.batch_norm's defaults: shift only (used by Inception and by the
# pre-activations of tf_cnn_benchmarks' ResNet v2).
BN_TF_CNN = BNConfig()
# What tf_cnn_benchmarks' ResNet and DenseNet ask for.
BN_RESNET = BNConfig(decay=0.9, epsilon=1e-5, scale=True)


class CenteredBatchNorm2d(nn.BatchNorm2d):
    """Batch norm with a learned shift (beta) and no learned scale (gamma is fixed at 1)."""

    def __init__(self, num_features: int, eps: float = 1e-3, momentum: float = 0.001) -> None:
        super().__init__(num_features, eps=eps, momentum=momentum, affine=False)
        # nn.BatchNorm2d passes self.weight/self.bias to F.batch_norm, which accepts a bias
        # without a weight: registering only the bias gives TensorFlow's center-only norm.
        self.bias = nn.Parameter(torch.zeros(num_features))


def batch_norm(num_features: int, cfg: BNConfig) -> nn.BatchNorm2d:
    """A 2-D batch norm configured like TensorFlow's ``cfg``."""
    momentum = round(1.0 - cfg.decay, 12)  # 1 - 0.999 is 0.0010000000000000009 in floats
    if cfg.scale:
        return nn.BatchNorm2d(num_features, eps=cfg.epsilon, momentum=momentum)
    return CenteredBatchNorm2d(num_features, eps=cfg.epsilon, momentum=momentum)


def _pair(v: Size2) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else v


def _padding(kernel: tuple[int, int], padding: str | Size2) -> tuple[int, int]:
    if padding == "same":
        return ((kernel[0] - 1) // 2, (kernel[1] - 1) // 2)
    if padding == "valid":
        return (0, 0)
    if isinstance(padding, str):
        raise ConfigError(f"padding must be 'same', 'valid' or a size, got {padding!r}")
    return _pair(padding)


@torch.no_grad()
def trunc_normal_init_(tensor: torch.Tensor, std: float) -> None:
    """Fill ``tensor`` from a normal(0, std) truncated at two standard deviations.

    Out-of-range draws are redrawn (TensorFlow's method). That is the distribution of
    ``nn.init.trunc_normal_`` at a tenth of its cost, whose inverse-CDF sampling takes seconds
    for the 100M weights of VGG's dense layers. Meta tensors are left alone.
    """
    if tensor.is_meta:
        return
    out = tensor if tensor.is_contiguous() else torch.empty_like(tensor, memory_format=torch.contiguous_format)
    flat = out.view(-1)
    flat.normal_()
    redraw = (flat.abs() > 2.0).nonzero().squeeze(1)  # about 4.6% of the draws
    while redraw.numel() > 0:
        draws = torch.randn(redraw.numel(), dtype=flat.dtype, device=flat.device)
        flat[redraw] = draws
        redraw = redraw[draws.abs() > 2.0]
    flat.mul_(std)
    if out is not tensor:
        tensor.copy_(out)


def _activation(name: str | None) -> nn.Module | None:
    if name is None:
        return None
    if name == "relu":
        return nn.ReLU(inplace=True)
    if name == "relu6":
        return nn.ReLU6(inplace=True)
    raise ConfigError(f"activation must be 'relu', 'relu6' or None, got {name!r}")


class ConvBlock(nn.Sequential):
    """Convolution, then batch norm (or a bias), then an activation.

    This is ConvNetBuilder.conv: ``bn=None`` gives a biased convolution (``bias=False`` drops
    the bias, as tf_cnn_benchmarks does for ResNet's un-normalised convolutions), ``stddev``
    replaces the variance-scaling initialiser by a truncated normal of that deviation and
    ``bias_init`` sets the initial bias.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Size2,
        stride: Size2 = 1,
        padding: str | Size2 = "same",
        *,
        bn: BNConfig | None = None,
        activation: str | None = "relu",
        groups: int = 1,
        bias: bool = True,
        stddev: float | None = None,
        bias_init: float = 0.0,
    ) -> None:
        kernel = _pair(kernel_size)
        conv = skip_init(
            nn.Conv2d,
            in_channels,
            out_channels,
            kernel,
            stride=stride,
            padding=_padding(kernel, padding),
            groups=groups,
            bias=bn is None and bias,
            device=torch.get_default_device(),
        )
        if stddev is None:
            fan_in = (in_channels // groups) * kernel[0] * kernel[1]
            stddev = math.sqrt(1.0 / fan_in) / _TRUNCATED_NORMAL_STD
        trunc_normal_init_(conv.weight, stddev)
        if conv.bias is not None:
            nn.init.constant_(conv.bias, bias_init)
        layers: OrderedDict[str, nn.Module] = OrderedDict(conv=conv)
        if bn is not None:
            layers["bn"] = batch_norm(out_channels, bn)
        act = _activation(activation)
        if act is not None:
            layers["act"] = act
        super().__init__(layers)


def dense(
    in_features: int,
    out_features: int,
    *,
    activation: str | None = "relu",
    stddev: float | None = None,
    bias_init: float = 0.0,
) -> nn.Module:
    """ConvNetBuilder.affine: a linear layer (ReLU by default) with tf_cnn_benchmarks' init."""
    linear = skip_init(nn.Linear, in_features, out_features, device=torch.get_default_device())
    if stddev is None:
        stddev = math.sqrt((2.0 if activation == "relu" else 1.0) / in_features)
    trunc_normal_init_(linear.weight, stddev)
    nn.init.constant_(linear.bias, bias_init)
    act = _activation(activation)
    if act is None:
        return linear
    return nn.Sequential(OrderedDict(fc=linear, act=act))


class FlattenDense(nn.Module):
    """``nn.Flatten()`` then ``dense(...)``, without copying a channels_last image.

    Flattening an NHWC-stored (channels_last) batch in NCHW order is a full copy of the batch;
    for the ``trivial`` model that copy (20 MB per batch of 32 227x227 images) was 17 % of the
    step. A channels_last input is instead flattened in its storage order, a free view, against
    the weight's columns permuted to the same order (a copy of the weight, which is what the
    layer would read anyway). The result is the same function of the image in both layouts,
    up to the order of the floating-point sums.
    """

    def __init__(
        self, channels: int, height: int, width: int, out_features: int, *, activation: str | None = "relu"
    ) -> None:
        super().__init__()
        layer = dense(channels * height * width, out_features, activation=activation)
        fc, act = (layer.fc, layer.act) if isinstance(layer, nn.Sequential) else (layer, nn.Identity())
        self.fc = cast(nn.Linear, fc)  # dense() builds an nn.Linear (then its activation)
        self.act = cast(nn.Module, act)
        self.image_shape = (channels, height, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            n, c, h, w = x.shape
            weight = self.fc.weight.view(-1, c, h, w).permute(0, 2, 3, 1).reshape(self.fc.out_features, -1)
            return self.act(nn.functional.linear(x.permute(0, 2, 3, 1).reshape(n, -1), weight, self.fc.bias))
        return self.act(self.fc(x.flatten(1)))


def max_pool(kernel_size: int, stride: int, padding: str = "valid") -> nn.MaxPool2d:
    """Max pooling with TensorFlow's ``VALID`` or ``SAME`` padding (odd kernels for SAME)."""
    return nn.MaxPool2d(kernel_size, stride, padding=_padding(_pair(kernel_size), padding))


def avg_pool(kernel_size: int, stride: int, padding: str = "valid") -> nn.AvgPool2d:
    """Average pooling; with ``SAME`` padding the padded cells are left out of the average,
    as TensorFlow does."""
    return nn.AvgPool2d(
        kernel_size,
        stride,
        padding=_padding(_pair(kernel_size), padding),
        count_include_pad=False,
    )


class GlobalAvgPool(nn.Module):
    """Mean over the spatial dimensions: ``[B, C, H, W] -> [B, C]``.

    tf_cnn_benchmarks writes this either as a mean or as an average pool whose window is the
    whole final feature map at the default image size; the mean also accepts other sizes.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


class Concat(nn.Module):
    """Runs every branch on the same input and concatenates the results along channels
    (an Inception module's columns)."""

    def __init__(self, *branches: nn.Module) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


class Classifier(nn.Module):
    """A feature extractor producing ``[B, num_features]`` followed by the logits layer.

    tf_cnn_benchmarks splits every model the same way: the model builds the layers up to the
    features and the benchmark appends one linear layer with ``num_classes`` outputs.
    """

    def __init__(self, features: nn.Module, num_features: int, num_classes: int) -> None:
        super().__init__()
        self.num_features = num_features
        self.num_classes = num_classes
        self.features = features
        self.fc = dense(num_features, num_classes, activation=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))
