"""OverFeat, the "fast" model (Sermanet et al., 2014), as tf_cnn_benchmarks defines it.

Five convolutions (96-256-512-1024-1024 filters) and 3072/4096-unit dense layers. The first two
convolutions are ``VALID`` and the input is 231x231, so the last map is 6x6x1024.
"""

from __future__ import annotations

from torch import nn

from .layers import Classifier, ConvBlock, dense, max_pool
from .registry import register_model


@register_model(
    "overfeat", dataset="imagenet", default_image_size=231, default_batch_size=32, default_learning_rate=0.005
)
def overfeat(num_classes: int) -> nn.Module:
    """OverFeat (fast model), 231x231 input."""
    features = nn.Sequential(
        ConvBlock(3, 96, 11, stride=4, padding="valid"),  # 231 -> 56
        max_pool(2, 2),  # 28
        ConvBlock(96, 256, 5, padding="valid"),  # 24
        max_pool(2, 2),  # 12
        ConvBlock(256, 512, 3),
        ConvBlock(512, 1024, 3),
        ConvBlock(1024, 1024, 3),
        max_pool(2, 2),  # 6
        nn.Flatten(),
        dense(1024 * 6 * 6, 3072),
        nn.Dropout(0.5),
        dense(3072, 4096),
        nn.Dropout(0.5),
    )
    return Classifier(features, 4096, num_classes)
