"""Residual networks: tf_cnn_benchmarks' own ImageNet and CIFAR-10 ResNets, and the
"official" ResNets of the TensorFlow model garden that tf_cnn_benchmarks also runs.

References: He et al., "Deep Residual Learning for Image Recognition" (2015, v1) and
"Identity Mappings in Deep Residual Networks" (2016, v2 / pre-activation).

The three families differ in details that change the numerics or the parameter count, and
each is reproduced as its reference builds it:

``resnet50``, ``resnet101``, ``resnet152`` (+ ``_v2``, and ``resnet50_v1.5``), tf_cnn_benchmarks:
    Bottleneck blocks; v1 and v2 put the stride on the first 1x1 convolution (as the paper
    does), v1.5 on the 3x3 one (as fb.resnet.torch and torchvision do). Batch norm has a
    scale, with ``decay=0.9, epsilon=1e-5``. In v2 the stem keeps its batch norm and ReLU,
    every block starts with a *shift-only* batch norm + ReLU (the builder's default,
    ``epsilon=1e-3``), as does the final normalisation, and neither the projection shortcut
    nor the block's last convolution has a batch norm.

``official_resnetN`` (v1) and ``official_resnetN_v2``, TensorFlow's official r1 ResNet:
    Basic blocks for 18 and 34 layers, bottlenecks from 50 up; the stride sits on the 3x3
    convolution (so ``official_resnet50`` is what is usually called v1.5). Batch norm has a
    scale, ``decay=0.997, epsilon=1e-5``. The first block of *every* stage has a 1x1
    projection shortcut, even in the first stage of ResNet-18/34 where the shape does not
    change (the textbook ResNet-18/34 has an identity there), which adds 4,224 parameters.
    In v2 the stem convolution has no batch norm or ReLU; each block pre-activates.

``resnet20`` ... ``resnet110`` (+ ``_v2``), CIFAR-10, tf_cnn_benchmarks:
    Three stages of basic blocks with 16, 32 and 64 filters. Shortcuts that change shape use
    the paper's option A: subsample by 2 and zero-pad the new channels (no parameters). In v1
    the stem's batch norm is *not* followed by a ReLU (tf_cnn_benchmarks builds it with a
    linear activation). v2 pre-activates like the ImageNet v2 above, with shift-only norms.

All end in a global average pool and the logits layer; 1x1 spatial maps are fine, so the
ImageNet variants accept inputs from 32x32 up (224x224 is the default).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .layers import (
    BN_RESNET,
    BN_TF_CNN,
    BNConfig,
    Classifier,
    ConvBlock,
    GlobalAvgPool,
    batch_norm,
    max_pool,
)
from .registry import register_model

# TensorFlow's official r1 ResNet batch norm.
BN_OFFICIAL = BNConfig(decay=0.997, epsilon=1e-5, scale=True)


def _bn_relu(channels: int, cfg: BNConfig) -> nn.Sequential:
    return nn.Sequential(batch_norm(channels, cfg), nn.ReLU(inplace=True))


class ResidualBlock(nn.Module):
    """``relu(shortcut(x) + body(x))`` (v1), or with a pre-activation ``p = preact(x)``:
    ``shortcut(p if projecting else x) + body(p)`` (v2).

    Every v2 reference feeds a projection shortcut the pre-activated input and an identity
    (or subsampling) shortcut the raw input, so ``project_preact`` says which one this is.
    """

    def __init__(
        self,
        body: nn.Module,
        shortcut: nn.Module,
        preact: nn.Module | None = None,
        project_preact: bool = False,
    ) -> None:
        super().__init__()
        self.preact = preact
        self.body = body
        self.shortcut = shortcut
        self.project_preact = project_preact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.preact is None:
            return F.relu(self.shortcut(x) + self.body(x))
        p = self.preact(x)
        return self.shortcut(p if self.project_preact else x) + self.body(p)


def _projection(in_ch: int, out_ch: int, stride: int, bn: BNConfig | None) -> ConvBlock:
    """1x1 strided projection shortcut (with batch norm in v1, bare in v2)."""
    return ConvBlock(in_ch, out_ch, 1, stride, bn=bn, activation=None, bias=False)


def _last_conv(in_ch: int, out_ch: int, kernel: int, bn: BNConfig | None) -> ConvBlock:
    """A block's last convolution: no activation (the add comes first), no bias."""
    return ConvBlock(in_ch, out_ch, kernel, bn=bn, activation=None, bias=False)


# ------------------------------------------------------------- tf_cnn_benchmarks ImageNet


def _tf_cnn_bottleneck(in_ch: int, depth: int, stride: int, version: str) -> ResidualBlock:
    width = depth // 4
    v2 = version == "v2"
    out_bn = None if v2 else BN_RESNET
    # v1 (and v2) stride on the first 1x1 convolution; v1.5 moves it to the 3x3 one.
    stride_1x1, stride_3x3 = (1, stride) if version == "v1.5" else (stride, 1)
    body = nn.Sequential(
        ConvBlock(in_ch, width, 1, stride_1x1, bn=BN_RESNET),
        ConvBlock(width, width, 3, stride_3x3, bn=BN_RESNET),
        _last_conv(width, depth, 1, out_bn),
    )
    projecting = in_ch != depth
    shortcut: nn.Module
    if projecting:
        shortcut = _projection(in_ch, depth, stride, out_bn)
    elif stride > 1:
        # Unused by the standard depths, but this is the reference's rule for a block that
        # subsamples without changing width: a strided 1x1 average pool.
        shortcut = nn.AvgPool2d(1, stride)
    else:
        shortcut = nn.Identity()
    preact = _bn_relu(in_ch, BN_TF_CNN) if v2 else None
    return ResidualBlock(body, shortcut, preact, project_preact=projecting)


def _tf_cnn_resnet(layer_counts: Sequence[int], version: str, num_classes: int) -> Classifier:
    layers: list[nn.Module] = [
        ConvBlock(3, 64, 7, 2, bn=BN_RESNET),  # 112
        max_pool(3, 2, "same"),  # 56
    ]
    in_ch = 64
    for stage, count in enumerate(layer_counts):
        depth = 256 * 2**stage
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            layers.append(_tf_cnn_bottleneck(in_ch, depth, stride, version))
            in_ch = depth
    if version == "v2":
        layers.append(_bn_relu(in_ch, BN_TF_CNN))
    layers.append(GlobalAvgPool())
    return Classifier(nn.Sequential(*layers), in_ch, num_classes)


@register_model(
    "resnet50",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=64,
    default_learning_rate=0.128,
    lr_schedule="resnet",
)
def resnet50(num_classes: int) -> nn.Module:
    """ResNet-50 v1 (tf_cnn_benchmarks): stride on the first 1x1 convolution of a block."""
    return _tf_cnn_resnet((3, 4, 6, 3), "v1", num_classes)


@register_model(
    "resnet50_v1.5",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=64,
    default_learning_rate=0.128,
    lr_schedule="resnet",
)
def resnet50_v1_5(num_classes: int) -> nn.Module:
    """ResNet-50 v1.5 (tf_cnn_benchmarks): stride on the 3x3 convolution of a block."""
    return _tf_cnn_resnet((3, 4, 6, 3), "v1.5", num_classes)


@register_model(
    "resnet50_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=64,
    default_learning_rate=0.128,
    lr_schedule="resnet",
)
def resnet50_v2(num_classes: int) -> nn.Module:
    """ResNet-50 v2, pre-activation (tf_cnn_benchmarks)."""
    return _tf_cnn_resnet((3, 4, 6, 3), "v2", num_classes)


@register_model(
    "resnet101",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.128,
    lr_schedule="resnet",
)
def resnet101(num_classes: int) -> nn.Module:
    """ResNet-101 v1 (tf_cnn_benchmarks)."""
    return _tf_cnn_resnet((3, 4, 23, 3), "v1", num_classes)


@register_model(
    "resnet101_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.128,
    lr_schedule="resnet",
)
def resnet101_v2(num_classes: int) -> nn.Module:
    """ResNet-101 v2, pre-activation (tf_cnn_benchmarks)."""
    return _tf_cnn_resnet((3, 4, 23, 3), "v2", num_classes)


@register_model(
    "resnet152",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.128,
    lr_schedule="resnet",
)
def resnet152(num_classes: int) -> nn.Module:
    """ResNet-152 v1 (tf_cnn_benchmarks)."""
    return _tf_cnn_resnet((3, 8, 36, 3), "v1", num_classes)


@register_model(
    "resnet152_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.128,
    lr_schedule="resnet",
)
def resnet152_v2(num_classes: int) -> nn.Module:
    """ResNet-152 v2, pre-activation (tf_cnn_benchmarks)."""
    return _tf_cnn_resnet((3, 8, 36, 3), "v2", num_classes)


# ------------------------------------------------------------------- official r1 ResNet

_OFFICIAL_BLOCKS: dict[int, tuple[int, ...]] = {
    18: (2, 2, 2, 2),
    34: (3, 4, 6, 3),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3),
}


def _official_block(in_ch: int, filters: int, stride: int, bottleneck: bool, v2: bool, first: bool) -> ResidualBlock:
    out_ch = 4 * filters if bottleneck else filters
    out_bn = None if v2 else BN_OFFICIAL
    if bottleneck:
        body = nn.Sequential(
            ConvBlock(in_ch, filters, 1, bn=BN_OFFICIAL),
            ConvBlock(filters, filters, 3, stride, bn=BN_OFFICIAL),
            _last_conv(filters, out_ch, 1, out_bn),
        )
    else:
        body = nn.Sequential(
            ConvBlock(in_ch, filters, 3, stride, bn=BN_OFFICIAL),
            _last_conv(filters, filters, 3, out_bn),
        )
    # The reference gives the first block of every stage a projection, needed or not.
    shortcut = _projection(in_ch, out_ch, stride, out_bn) if first else nn.Identity()
    preact = _bn_relu(in_ch, BN_OFFICIAL) if v2 else None
    return ResidualBlock(body, shortcut, preact, project_preact=first)


def _official_resnet(size: int, version: int, num_classes: int) -> Classifier:
    bottleneck = size >= 50
    v2 = version == 2
    # v2 leaves the stem un-normalised: the first block's pre-activation does it.
    stem = ConvBlock(3, 64, 7, 2, bn=None if v2 else BN_OFFICIAL, activation=None if v2 else "relu", bias=False)
    layers: list[nn.Module] = [stem, max_pool(3, 2, "same")]
    in_ch = 64
    for stage, count in enumerate(_OFFICIAL_BLOCKS[size]):
        filters = 64 * 2**stage
        for i in range(count):
            stride = 2 if stage > 0 and i == 0 else 1
            layers.append(_official_block(in_ch, filters, stride, bottleneck, v2, first=i == 0))
            in_ch = 4 * filters if bottleneck else filters
    if v2:
        layers.append(_bn_relu(in_ch, BN_OFFICIAL))
    layers.append(GlobalAvgPool())
    return Classifier(nn.Sequential(*layers), in_ch, num_classes)


@register_model(
    "official_resnet18",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet18(num_classes: int) -> nn.Module:
    """ResNet-18 v1, TensorFlow official r1 model."""
    return _official_resnet(18, 1, num_classes)


@register_model(
    "official_resnet18_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet18_v2(num_classes: int) -> nn.Module:
    """ResNet-18 v2, pre-activation, TensorFlow official r1 model."""
    return _official_resnet(18, 2, num_classes)


@register_model(
    "official_resnet34",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet34(num_classes: int) -> nn.Module:
    """ResNet-34 v1, TensorFlow official r1 model."""
    return _official_resnet(34, 1, num_classes)


@register_model(
    "official_resnet34_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet34_v2(num_classes: int) -> nn.Module:
    """ResNet-34 v2, pre-activation, TensorFlow official r1 model."""
    return _official_resnet(34, 2, num_classes)


@register_model(
    "official_resnet50",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.05,
    lr_schedule="official_resnet",
)
def official_resnet50(num_classes: int) -> nn.Module:
    """ResNet-50 v1 (stride on the 3x3 convolution), TensorFlow official r1 model."""
    return _official_resnet(50, 1, num_classes)


@register_model(
    "official_resnet50_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.05,
    lr_schedule="official_resnet",
)
def official_resnet50_v2(num_classes: int) -> nn.Module:
    """ResNet-50 v2, pre-activation, TensorFlow official r1 model."""
    return _official_resnet(50, 2, num_classes)


@register_model(
    "official_resnet101",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet101(num_classes: int) -> nn.Module:
    """ResNet-101 v1 (stride on the 3x3 convolution), TensorFlow official r1 model."""
    return _official_resnet(101, 1, num_classes)


@register_model(
    "official_resnet101_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet101_v2(num_classes: int) -> nn.Module:
    """ResNet-101 v2, pre-activation, TensorFlow official r1 model."""
    return _official_resnet(101, 2, num_classes)


@register_model(
    "official_resnet152",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet152(num_classes: int) -> nn.Module:
    """ResNet-152 v1 (stride on the 3x3 convolution), TensorFlow official r1 model."""
    return _official_resnet(152, 1, num_classes)


@register_model(
    "official_resnet152_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet152_v2(num_classes: int) -> nn.Module:
    """ResNet-152 v2, pre-activation, TensorFlow official r1 model."""
    return _official_resnet(152, 2, num_classes)


@register_model(
    "official_resnet200",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet200(num_classes: int) -> nn.Module:
    """ResNet-200 v1 (stride on the 3x3 convolution), TensorFlow official r1 model."""
    return _official_resnet(200, 1, num_classes)


@register_model(
    "official_resnet200_v2",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.0125,
    lr_schedule="official_resnet",
)
def official_resnet200_v2(num_classes: int) -> nn.Module:
    """ResNet-200 v2, pre-activation, TensorFlow official r1 model."""
    return _official_resnet(200, 2, num_classes)


# ----------------------------------------------------------------------------- CIFAR-10


class _PadShortcut(nn.Module):
    """Option-A shortcut: subsample spatially, zero-pad the new channels on both sides."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.pad = (out_ch - in_ch) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad, self.pad))


def _cifar_block(in_ch: int, depth: int, stride: int, v2: bool) -> ResidualBlock:
    body = nn.Sequential(
        ConvBlock(in_ch, depth, 3, stride, bn=BN_RESNET),
        _last_conv(depth, depth, 3, None if v2 else BN_RESNET),
    )
    shortcut = _PadShortcut(in_ch, depth, stride) if in_ch != depth else nn.Identity()
    preact = _bn_relu(in_ch, BN_TF_CNN) if v2 else None
    return ResidualBlock(body, shortcut, preact)


def _cifar_resnet(blocks_per_stage: int, v2: bool, num_classes: int) -> Classifier:
    # tf_cnn_benchmarks' v1 stem has no ReLU after its batch norm; v2's does.
    layers: list[nn.Module] = [ConvBlock(3, 16, 3, bn=BN_RESNET, activation="relu" if v2 else None)]
    in_ch = 16
    for stage, depth in enumerate((16, 32, 64)):
        for i in range(blocks_per_stage):
            stride = 2 if stage > 0 and i == 0 else 1
            layers.append(_cifar_block(in_ch, depth, stride, v2))
            in_ch = depth
    if v2:
        layers.append(_bn_relu(in_ch, BN_TF_CNN))
    layers.append(GlobalAvgPool())
    return Classifier(nn.Sequential(*layers), in_ch, num_classes)


@register_model(
    "resnet20",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet20_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-20 v1 (3 blocks per stage)."""
    return _cifar_resnet(3, False, num_classes)


@register_model(
    "resnet20_v2",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet20_v2_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-20 v2, pre-activation (3 blocks per stage)."""
    return _cifar_resnet(3, True, num_classes)


@register_model(
    "resnet32",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet32_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-32 v1 (5 blocks per stage)."""
    return _cifar_resnet(5, False, num_classes)


@register_model(
    "resnet32_v2",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet32_v2_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-32 v2, pre-activation (5 blocks per stage)."""
    return _cifar_resnet(5, True, num_classes)


@register_model(
    "resnet44",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet44_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-44 v1 (7 blocks per stage)."""
    return _cifar_resnet(7, False, num_classes)


@register_model(
    "resnet44_v2",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet44_v2_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-44 v2, pre-activation (7 blocks per stage)."""
    return _cifar_resnet(7, True, num_classes)


@register_model(
    "resnet56",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet56_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-56 v1 (9 blocks per stage)."""
    return _cifar_resnet(9, False, num_classes)


@register_model(
    "resnet56_v2",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet56_v2_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-56 v2, pre-activation (9 blocks per stage)."""
    return _cifar_resnet(9, True, num_classes)


@register_model(
    "resnet110",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet110_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-110 v1 (18 blocks per stage)."""
    return _cifar_resnet(18, False, num_classes)


@register_model(
    "resnet110_v2",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="resnet_cifar",
)
def resnet110_v2_cifar10(num_classes: int) -> nn.Module:
    """CIFAR-10 ResNet-110 v2, pre-activation (18 blocks per stage)."""
    return _cifar_resnet(18, True, num_classes)
