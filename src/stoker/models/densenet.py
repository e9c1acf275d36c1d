"""DenseNet for CIFAR-10 (Huang et al., 2016), as tf_cnn_benchmarks defines it.

Three dense blocks of ``(L - 4) / 3`` layers with growth rate ``k`` (the paper's basic DenseNet,
no bottleneck layers and no compression). Each layer is batch norm, ReLU and a biased 3x3
convolution whose ``k`` outputs are appended to its input. Between blocks a transition does
batch norm, ReLU, a biased 1x1 convolution that keeps the width, a ReLU and a 2x2 average
pool; the second ReLU is tf_cnn_benchmarks' (the paper has none there). The stem is a biased
3x3 convolution to 16 channels; the network ends with batch norm, ReLU and a global mean.
Batch norm has a scale, ``decay=0.9, epsilon=1e-5``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .layers import BN_RESNET, Classifier, ConvBlock, GlobalAvgPool, avg_pool, batch_norm
from .registry import register_model


class DenseLayer(nn.Module):
    """``concat(x, conv3x3(relu(bn(x))))``: adds ``growth_rate`` channels."""

    def __init__(self, in_ch: int, growth_rate: int) -> None:
        super().__init__()
        self.bn = batch_norm(in_ch, BN_RESNET)
        self.relu = nn.ReLU(inplace=True)
        # tf_cnn_benchmarks' initialiser: stddev sqrt(2 / (9 * k)), the fan-out He init.
        self.conv = ConvBlock(in_ch, growth_rate, 3, activation=None, stddev=math.sqrt(2.0 / 9 / growth_rate))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.conv(self.relu(self.bn(x)))], dim=1)


def _transition(channels: int) -> nn.Sequential:
    return nn.Sequential(
        batch_norm(channels, BN_RESNET),
        nn.ReLU(inplace=True),
        ConvBlock(channels, channels, 1, stddev=math.sqrt(2.0 / 9 / channels)),
        avg_pool(2, 2),
    )


def _densenet(depth: int, growth_rate: int, num_classes: int) -> Classifier:
    layers_per_block = (depth - 4) // 3
    layers: list[nn.Module] = [ConvBlock(3, 16, 3, activation=None)]
    channels = 16
    for block in range(3):
        for _ in range(layers_per_block):
            layers.append(DenseLayer(channels, growth_rate))
            channels += growth_rate
        if block < 2:
            layers.append(_transition(channels))
    layers += [batch_norm(channels, BN_RESNET), nn.ReLU(inplace=True), GlobalAvgPool()]
    return Classifier(nn.Sequential(*layers), channels, num_classes)


@register_model(
    "densenet40_k12",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=64,
    default_learning_rate=0.1,
    lr_schedule="densenet_cifar",
)
def densenet40_k12(num_classes: int) -> nn.Module:
    """DenseNet-40, growth rate 12 (12 layers per block)."""
    return _densenet(40, 12, num_classes)


@register_model(
    "densenet100_k12",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=64,
    default_learning_rate=0.1,
    lr_schedule="densenet_cifar",
)
def densenet100_k12(num_classes: int) -> nn.Module:
    """DenseNet-100, growth rate 12 (32 layers per block)."""
    return _densenet(100, 12, num_classes)


@register_model(
    "densenet100_k24",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=64,
    default_learning_rate=0.1,
    lr_schedule="densenet_cifar",
)
def densenet100_k24(num_classes: int) -> nn.Module:
    """DenseNet-100, growth rate 24 (32 layers per block)."""
    return _densenet(100, 24, num_classes)
