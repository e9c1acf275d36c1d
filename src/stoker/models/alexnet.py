"""AlexNet (Krizhevsky et al., 2012) and the CIFAR-10 tutorial network tf_cnn_benchmarks
registers under the same name.

ImageNet: tf_cnn_benchmarks' single-tower AlexNet has 64-192-384-384-256 filters (the paper's
two towers total 96-256-384-384-256; torchvision's variant uses 64-192-384-256-256), no local
response normalisation and no biases of 1. Its first convolution is ``VALID``, so it reads
227x227 images (224 + 3 pixels of padding) to get the 6x6x256 map the dense layers expect.

CIFAR-10: the network of TensorFlow's CIFAR-10 tutorial (two 5x5 convolutions with local
response normalisation, then 384- and 192-unit dense layers), with the tutorial's
initialisers.
"""

from __future__ import annotations

from torch import nn

from .layers import Classifier, ConvBlock, dense, max_pool
from .registry import register_model


@register_model(
    "alexnet", dataset="imagenet", default_image_size=227, default_batch_size=512, default_learning_rate=0.005
)
def alexnet(num_classes: int) -> nn.Module:
    """AlexNet, single tower, 64-192-384-384-256 filters, 227x227 input."""
    features = nn.Sequential(
        ConvBlock(3, 64, 11, stride=4, padding="valid"),  # 227 -> 55
        max_pool(3, 2),  # 27
        ConvBlock(64, 192, 5),
        max_pool(3, 2),  # 13
        ConvBlock(192, 384, 3),
        ConvBlock(384, 384, 3),
        ConvBlock(384, 256, 3),
        max_pool(3, 2),  # 6
        nn.Flatten(),
        dense(256 * 6 * 6, 4096),
        nn.Dropout(0.5),
        dense(4096, 4096),
        nn.Dropout(0.5),
    )
    return Classifier(features, 4096, num_classes)


def _lrn() -> nn.LocalResponseNorm:
    # TensorFlow's lrn(depth_radius=4, alpha=0.001 / 9) sums over 2 * 4 + 1 = 9 channels and
    # scales the sum by alpha; PyTorch divides alpha by the window size, so it gets 0.001.
    return nn.LocalResponseNorm(size=9, alpha=0.001, beta=0.75, k=1.0)


@register_model(
    "alexnet",
    dataset="cifar10",
    default_image_size=32,
    default_batch_size=128,
    default_learning_rate=0.1,
    lr_schedule="alexnet_cifar",
)
def alexnet_cifar10(num_classes: int) -> nn.Module:
    """AlexNet-style network of TensorFlow's CIFAR-10 tutorial (2 convs + LRN, 384-192 dense)."""
    features = nn.Sequential(
        ConvBlock(3, 64, 5, stddev=5e-2),
        max_pool(3, 2, "same"),  # 16
        _lrn(),
        ConvBlock(64, 64, 5, stddev=5e-2, bias_init=0.1),
        _lrn(),
        max_pool(3, 2, "same"),  # 8
        nn.Flatten(),
        dense(64 * 8 * 8, 384, stddev=0.04, bias_init=0.1),
        dense(384, 192, stddev=0.04, bias_init=0.1),
    )
    return Classifier(features, 192, num_classes)
