"""The trivial model: a stand-in network for measuring input-pipeline and framework overhead.

As in tf_cnn_benchmarks it flattens the image, squeezes it through a single unit and widens
it again, so it has almost no compute but still a real forward and backward pass. The ImageNet
variant reads 227x227 images (224 plus the 3 pixels of padding tf_cnn_benchmarks adds for
AlexNet-style ``VALID`` convolutions).
"""

from __future__ import annotations

from torch import nn

from .layers import Classifier, FlattenDense, dense
from .registry import register_model


def _trivial(image_size: int, num_classes: int) -> Classifier:
    features = nn.Sequential(
        FlattenDense(3, image_size, image_size, 1),  # flattens channels_last batches without a copy
        dense(1, 4096),
    )
    return Classifier(features, 4096, num_classes)


@register_model(
    "trivial", dataset="imagenet", default_image_size=227, default_batch_size=32, default_learning_rate=0.005
)
def trivial_imagenet(num_classes: int) -> nn.Module:
    """Trivial model: flatten, a 1-unit and a 4096-unit dense layer (227x227 input)."""
    return _trivial(227, num_classes)


@register_model("trivial", dataset="cifar10", default_image_size=32, default_batch_size=32, default_learning_rate=0.005)
def trivial_cifar10(num_classes: int) -> nn.Module:
    """Trivial model: flatten, a 1-unit and a 4096-unit dense layer (32x32 input)."""
    return _trivial(32, num_classes)
