"""VGG networks A, D and E (Simonyan & Zisserman, 2014) as vgg11, vgg16 and vgg19.

The textbook definition without batch norm: 3x3 ``SAME`` convolutions with biases and ReLU,
2x2 max pooling after each of the five stages, then two 4096-unit dense layers with dropout.
The flatten expects a 7x7 map, so the input is 224x224.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .layers import Classifier, ConvBlock, dense, max_pool
from .registry import register_model

_STAGE_WIDTHS = (64, 128, 256, 512, 512)


def _vgg(convs_per_stage: Sequence[int], num_classes: int) -> Classifier:
    layers: list[nn.Module] = []
    in_channels = 3
    for num_convs, width in zip(convs_per_stage, _STAGE_WIDTHS, strict=True):
        for _ in range(num_convs):
            layers.append(ConvBlock(in_channels, width, 3))
            in_channels = width
        layers.append(max_pool(2, 2))
    layers += [
        nn.Flatten(),
        dense(512 * 7 * 7, 4096),
        nn.Dropout(0.5),
        dense(4096, 4096),
        nn.Dropout(0.5),
    ]
    return Classifier(nn.Sequential(*layers), 4096, num_classes)


@register_model("vgg11", dataset="imagenet", default_image_size=224, default_batch_size=64, default_learning_rate=0.005)
def vgg11(num_classes: int) -> nn.Module:
    """VGG-11 (configuration A), no batch norm."""
    return _vgg((1, 1, 2, 2, 2), num_classes)


@register_model("vgg16", dataset="imagenet", default_image_size=224, default_batch_size=64, default_learning_rate=0.005)
def vgg16(num_classes: int) -> nn.Module:
    """VGG-16 (configuration D), no batch norm."""
    return _vgg((2, 2, 3, 3, 3), num_classes)


@register_model("vgg19", dataset="imagenet", default_image_size=224, default_batch_size=64, default_learning_rate=0.005)
def vgg19(num_classes: int) -> nn.Module:
    """VGG-19 (configuration E), no batch norm."""
    return _vgg((2, 2, 4, 4, 4), num_classes)
