"""MobileNets: v1 (Howard et al., 2017) and v2 (Sandler et al., 2018), width 1.0.

Both follow TF-slim's definitions, the ones tf_cnn_benchmarks branched from: convolutions
without bias, batch norm with scale and ``epsilon=1e-3``, ReLU6, truncated-normal weights
(stddev 0.09), a global average pool, dropout and a 1x1 logits convolution (a dense layer here).

The names need care, because tf_cnn_benchmarks' ``mobilenet`` is *MobileNet v2*:

``mobilenet`` and ``mobilenet_v1``
    MobileNet v1 as slim defines it (13 depthwise-separable blocks, 1024 features, dropout
    keep probability 0.999). This project's zoo names v1 ``mobilenet``, as the paper does;
    ``stoker bench --model=mobilenet`` prints a note pointing tf_cnn_benchmarks users to the
    next name.
``mobilenet_v2_tf_cnn``
    Exactly what tf_cnn_benchmarks runs as ``mobilenet``. Its model builds slim's complete
    MobileNet v2 classifier, 1001-way logits included, and the benchmark then appends its usual
    logits layer on top, so the network has two dense layers in a row (1280 -> 1001 ->
    ``num_classes``). That costs about 1.0M parameters but little compute.
``mobilenet_v2``
    The textbook MobileNet v2: the same network with a single 1280 -> ``num_classes`` layer.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import BNConfig, Classifier, ConvBlock, GlobalAvgPool, dense
from .registry import register_model

# slim's MobileNet v2 training scope uses decay 0.997; its v1 arg scope 0.9997.
BN_MOBILENET_V2 = BNConfig(decay=0.997, epsilon=1e-3, scale=True)
BN_MOBILENET_V1 = BNConfig(decay=0.9997, epsilon=1e-3, scale=True)
_STDDEV = 0.09

# (expansion factor, output channels, stride) of each inverted-residual block.
_V2_BLOCKS: tuple[tuple[int, int, int], ...] = (
    (1, 16, 1),
    (6, 24, 2), (6, 24, 1),
    (6, 32, 2), (6, 32, 1), (6, 32, 1),
    (6, 64, 2), (6, 64, 1), (6, 64, 1), (6, 64, 1),
    (6, 96, 1), (6, 96, 1), (6, 96, 1),
    (6, 160, 2), (6, 160, 1), (6, 160, 1),
    (6, 320, 1),
)  # fmt: skip

# (output channels, stride) of each depthwise-separable block of v1.
_V1_BLOCKS: tuple[tuple[int, int], ...] = (
    (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1),
    (1024, 2), (1024, 1),
)  # fmt: skip


def _conv(
    in_ch: int, out_ch: int, kernel: int, stride: int = 1, *, bn: BNConfig,
    groups: int = 1, activation: str | None = "relu6",
) -> ConvBlock:  # fmt: skip
    return ConvBlock(in_ch, out_ch, kernel, stride, bn=bn, groups=groups, activation=activation, stddev=_STDDEV)


def _make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of ``divisor``, never more than 10% down (slim)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


class InvertedResidual(nn.Module):
    """MobileNet v2 block: 1x1 expansion, 3x3 depthwise, linear 1x1 projection; the input is
    added back when the shape is unchanged."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, expansion: int) -> None:
        super().__init__()
        # slim rounds the expanded width to a multiple of 8, except for the first block whose
        # expansion factor 1 is kept exact (and then needs no expansion layer at all).
        inner = in_ch * expansion if expansion == 1 else _make_divisible(in_ch * expansion)
        bn = BN_MOBILENET_V2
        layers: list[nn.Module] = []
        if inner > in_ch:
            layers.append(_conv(in_ch, inner, 1, bn=bn))
        layers += [
            _conv(inner, inner, 3, stride, bn=bn, groups=inner),
            _conv(inner, out_ch, 1, bn=bn, activation=None),
        ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


def _mobilenet_v2_features() -> nn.Sequential:
    layers: list[nn.Module] = [_conv(3, 32, 3, 2, bn=BN_MOBILENET_V2)]
    in_ch = 32
    for expansion, out_ch, stride in _V2_BLOCKS:
        layers.append(InvertedResidual(in_ch, out_ch, stride, expansion))
        in_ch = out_ch
    layers += [
        _conv(in_ch, 1280, 1, bn=BN_MOBILENET_V2),
        GlobalAvgPool(),
        nn.Dropout(0.2),  # slim's keep probability 0.8
    ]
    return nn.Sequential(*layers)


@register_model(
    "mobilenet_v2_tf_cnn",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.005,
)
def mobilenet_v2_tf_cnn(num_classes: int) -> nn.Module:
    """tf_cnn_benchmarks' 'mobilenet': MobileNet v2, slim's 1001-way logits, then the logits layer.

    This is tf_cnn_benchmarks' model as it runs, two stacked dense layers included.
    """
    features = nn.Sequential(
        _mobilenet_v2_features(),
        # slim's own logits layer; tf_cnn_benchmarks treats its output as the features.
        dense(1280, 1001, activation=None, stddev=_STDDEV),
    )
    return Classifier(features, 1001, num_classes)


@register_model("mobilenet_v2", dataset="imagenet", default_image_size=224, min_image_size=32)
def mobilenet_v2(num_classes: int) -> nn.Module:
    """MobileNet v2, width 1.0 (slim definition, single logits layer)."""
    return Classifier(_mobilenet_v2_features(), 1280, num_classes)


@register_model(
    "mobilenet",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.005,
)
def mobilenet(num_classes: int) -> nn.Module:
    """MobileNet v1, width 1.0 (slim definition); tf_cnn_benchmarks' 'mobilenet' is mobilenet_v2_tf_cnn."""
    return mobilenet_v1(num_classes)


@register_model("mobilenet_v1", dataset="imagenet", default_image_size=224, min_image_size=32)
def mobilenet_v1(num_classes: int) -> nn.Module:
    """MobileNet v1, width 1.0 (slim definition)."""
    bn = BN_MOBILENET_V1
    layers: list[nn.Module] = [_conv(3, 32, 3, 2, bn=bn)]
    in_ch = 32
    for out_ch, stride in _V1_BLOCKS:
        layers += [
            _conv(in_ch, in_ch, 3, stride, bn=bn, groups=in_ch),  # depthwise
            _conv(in_ch, out_ch, 1, bn=bn),  # pointwise
        ]
        in_ch = out_ch
    layers += [GlobalAvgPool(), nn.Dropout(0.001)]  # slim's keep probability 0.999
    return Classifier(nn.Sequential(*layers), in_ch, num_classes)
