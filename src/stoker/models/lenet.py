"""LeNet-5 as tf_cnn_benchmarks defines it (LeCun et al., 1998).

tf_cnn_benchmarks does not build the 1998 network: it uses TensorFlow's MNIST-tutorial
variant (two 5x5 ``SAME`` convolutions with 32 and 64 filters, ReLU and max pooling, then a
512-unit dense layer) on 28x28 images with 3 channels.
"""

from __future__ import annotations

from torch import nn

from .layers import Classifier, ConvBlock, dense, max_pool
from .registry import register_model


@register_model("lenet", dataset="imagenet", default_image_size=28, default_batch_size=32, default_learning_rate=0.005)
def lenet(num_classes: int) -> nn.Module:
    """LeNet-5 (TensorFlow MNIST-tutorial variant) on 28x28 RGB input."""
    features = nn.Sequential(
        ConvBlock(3, 32, 5),
        max_pool(2, 2),
        ConvBlock(32, 64, 5),
        max_pool(2, 2),
        nn.Flatten(),
        dense(64 * 7 * 7, 512),
    )
    return Classifier(features, 512, num_classes)
