"""GoogLeNet / Inception v1 (Szegedy et al., 2014) as tf_cnn_benchmarks defines it.

tf_cnn_benchmarks keeps the main tower of the paper's network and drops the rest: no local
response normalisation, no auxiliary classifiers and no dropout before the logits. The
convolutions have biases and no batch norm. The final 7x7 average pool is written as a global
mean, which is the same at the 224x224 default size and also accepts smaller inputs.
"""

from __future__ import annotations

from torch import nn

from .layers import Classifier, Concat, ConvBlock, GlobalAvgPool, max_pool
from .registry import register_model


def _inception(in_channels: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, cp: int) -> Concat:
    """One Inception module: 1x1, 1x1->3x3, 1x1->5x5 and 3x3 max pool->1x1 columns."""
    return Concat(
        ConvBlock(in_channels, c1, 1),
        nn.Sequential(ConvBlock(in_channels, c3r, 1), ConvBlock(c3r, c3, 3)),
        nn.Sequential(ConvBlock(in_channels, c5r, 1), ConvBlock(c5r, c5, 5)),
        nn.Sequential(max_pool(3, 1, "same"), ConvBlock(in_channels, cp, 1)),
    )


@register_model(
    "googlenet",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.005,
)
def googlenet(num_classes: int) -> nn.Module:
    """GoogLeNet (Inception v1) main tower, without LRN or auxiliary heads."""
    features = nn.Sequential(
        ConvBlock(3, 64, 7, stride=2),  # 112
        max_pool(3, 2, "same"),  # 56
        ConvBlock(64, 64, 1),
        ConvBlock(64, 192, 3),
        max_pool(3, 2, "same"),  # 28
        _inception(192, 64, 96, 128, 16, 32, 32),  # 3a -> 256
        _inception(256, 128, 128, 192, 32, 96, 64),  # 3b -> 480
        max_pool(3, 2, "same"),  # 14
        _inception(480, 192, 96, 208, 16, 48, 64),  # 4a -> 512
        _inception(512, 160, 112, 224, 24, 64, 64),  # 4b -> 512
        _inception(512, 128, 128, 256, 24, 64, 64),  # 4c -> 512
        _inception(512, 112, 144, 288, 32, 64, 64),  # 4d -> 528
        _inception(528, 256, 160, 320, 32, 128, 128),  # 4e -> 832
        max_pool(3, 2, "same"),  # 7
        _inception(832, 256, 160, 320, 32, 128, 128),  # 5a -> 832
        _inception(832, 384, 192, 384, 48, 128, 128),  # 5b -> 1024
        GlobalAvgPool(),
    )
    return Classifier(features, 1024, num_classes)
