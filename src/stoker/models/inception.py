"""Inception v3 (Szegedy et al., 2015) and Inception v4 (Szegedy et al., 2016).

Both follow tf_cnn_benchmarks, which differs from the papers' reference code as follows:

* Every convolution is followed by tf_cnn_benchmarks' default batch norm, which learns a shift
  (beta) but no scale (gamma), with ``epsilon=1e-3`` and ``decay=0.999``; convolutions have no
  bias. (Keras' InceptionV3 makes the same choice, so the v3 parameter counts agree.)
* No auxiliary classifier: tf_cnn_benchmarks builds Inception v3's auxiliary head only on
  request and Inception v4 has none.
* In Inception v3's last module the pooling column uses max pooling (the previous one uses
  average pooling); Inception v4 ends with dropout (keep probability 0.8) before the logits.

Input is 299x299. The final pooling is a global mean, so smaller inputs down to 75x75 work.
"""

from __future__ import annotations

from torch import nn

from .layers import (
    BN_TF_CNN,
    Classifier,
    Concat,
    ConvBlock,
    GlobalAvgPool,
    Size2,
    avg_pool,
    max_pool,
)
from .registry import register_model


def _conv(in_channels: int, out_channels: int, kernel: Size2, stride: int = 1, padding: str = "same") -> ConvBlock:
    """Convolution + shift-only batch norm + ReLU, the unit every Inception layer uses."""
    return ConvBlock(in_channels, out_channels, kernel, stride, padding, bn=BN_TF_CNN)


def _seq(*layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(*layers)


# ----------------------------------------------------------------------------- Inception v3


def _v3_a(c: int, pool_features: int) -> Concat:
    """35x35 module; outputs 224 + pool_features channels."""
    return Concat(
        _conv(c, 64, 1),
        _seq(_conv(c, 48, 1), _conv(48, 64, 5)),
        _seq(_conv(c, 64, 1), _conv(64, 96, 3), _conv(96, 96, 3)),
        _seq(avg_pool(3, 1, "same"), _conv(c, pool_features, 1)),
    )


def _v3_b(c: int) -> Concat:
    """35x35 -> 17x17 reduction; outputs c + 480 channels."""
    return Concat(
        _conv(c, 384, 3, 2, "valid"),
        _seq(_conv(c, 64, 1), _conv(64, 96, 3), _conv(96, 96, 3, 2, "valid")),
        max_pool(3, 2),
    )


def _v3_c(c: int, n: int) -> Concat:
    """17x17 module with factorised 7x7 convolutions of width n; outputs 768 channels."""
    return Concat(
        _conv(c, 192, 1),
        _seq(_conv(c, n, 1), _conv(n, n, (1, 7)), _conv(n, 192, (7, 1))),
        _seq(
            _conv(c, n, 1),
            _conv(n, n, (7, 1)),
            _conv(n, n, (1, 7)),
            _conv(n, n, (7, 1)),
            _conv(n, 192, (1, 7)),
        ),
        _seq(avg_pool(3, 1, "same"), _conv(c, 192, 1)),
    )


def _v3_d(c: int) -> Concat:
    """17x17 -> 8x8 reduction; outputs c + 512 channels."""
    return Concat(
        _seq(_conv(c, 192, 1), _conv(192, 320, 3, 2, "valid")),
        _seq(
            _conv(c, 192, 1),
            _conv(192, 192, (1, 7)),
            _conv(192, 192, (7, 1)),
            _conv(192, 192, 3, 2, "valid"),
        ),
        max_pool(3, 2),
    )


def _v3_e(c: int, pool: str) -> Concat:
    """8x8 module whose 3x3 columns fork into 1x3 and 3x1 halves; outputs 2048 channels."""
    pooling = max_pool(3, 1, "same") if pool == "max" else avg_pool(3, 1, "same")
    return Concat(
        _conv(c, 320, 1),
        # The two halves share their input layer (tf_cnn_benchmarks' 'share' columns).
        _seq(_conv(c, 384, 1), Concat(_conv(384, 384, (1, 3)), _conv(384, 384, (3, 1)))),
        _seq(
            _conv(c, 448, 1),
            _conv(448, 384, 3),
            Concat(_conv(384, 384, (1, 3)), _conv(384, 384, (3, 1))),
        ),
        _seq(pooling, _conv(c, 192, 1)),
    )


@register_model(
    "inception3",
    dataset="imagenet",
    default_image_size=299,
    min_image_size=75,
    default_batch_size=32,
    default_learning_rate=0.005,
)
def inception3(num_classes: int) -> nn.Module:
    """Inception v3 without the auxiliary head; shift-only batch norm."""
    features = nn.Sequential(
        _conv(3, 32, 3, 2, "valid"),  # 149
        _conv(32, 32, 3, 1, "valid"),  # 147
        _conv(32, 64, 3),  # 147
        max_pool(3, 2),  # 73
        _conv(64, 80, 1, 1, "valid"),  # 73
        _conv(80, 192, 3, 1, "valid"),  # 71
        max_pool(3, 2),  # 35
        _v3_a(192, 32),  # 256
        _v3_a(256, 64),  # 288
        _v3_a(288, 64),  # 288
        _v3_b(288),  # 17x17x768
        _v3_c(768, 128),
        _v3_c(768, 160),
        _v3_c(768, 160),
        _v3_c(768, 192),
        _v3_d(768),  # 8x8x1280
        _v3_e(1280, "avg"),  # 2048
        _v3_e(2048, "max"),  # 2048
        GlobalAvgPool(),
    )
    return Classifier(features, 2048, num_classes)


# ----------------------------------------------------------------------------- Inception v4


def _v4_stem() -> nn.Sequential:
    """299x299x3 -> 35x35x384."""
    return nn.Sequential(
        _conv(3, 32, 3, 2, "valid"),  # 149
        _conv(32, 32, 3, 1, "valid"),  # 147
        _conv(32, 64, 3),  # 147
        Concat(max_pool(3, 2), _conv(64, 96, 3, 2, "valid")),  # 73x73x160
        Concat(
            _seq(_conv(160, 64, 1), _conv(64, 96, 3, 1, "valid")),
            _seq(
                _conv(160, 64, 1),
                _conv(64, 64, (7, 1)),
                _conv(64, 64, (1, 7)),
                _conv(64, 96, 3, 1, "valid"),
            ),
        ),  # 71x71x192
        Concat(_conv(192, 192, 3, 2, "valid"), max_pool(3, 2)),  # 35x35x384
    )


def _v4_a(c: int) -> Concat:
    """35x35 module; outputs 384 channels."""
    return Concat(
        _seq(avg_pool(3, 1, "same"), _conv(c, 96, 1)),
        _conv(c, 96, 1),
        _seq(_conv(c, 64, 1), _conv(64, 96, 3)),
        _seq(_conv(c, 64, 1), _conv(64, 96, 3), _conv(96, 96, 3)),
    )


def _v4_reduction_a(c: int, k: int, l: int, m: int, n: int) -> Concat:  # noqa: E741
    """35x35 -> 17x17 reduction; outputs c + n + m channels."""
    return Concat(
        max_pool(3, 2),
        _conv(c, n, 3, 2, "valid"),
        _seq(_conv(c, k, 1), _conv(k, l, 3), _conv(l, m, 3, 2, "valid")),
    )


def _v4_b(c: int) -> Concat:
    """17x17 module; outputs 1024 channels."""
    return Concat(
        _seq(avg_pool(3, 1, "same"), _conv(c, 128, 1)),
        _conv(c, 384, 1),
        _seq(_conv(c, 192, 1), _conv(192, 224, (1, 7)), _conv(224, 256, (7, 1))),
        _seq(
            _conv(c, 192, 1),
            _conv(192, 192, (1, 7)),
            _conv(192, 224, (7, 1)),
            _conv(224, 224, (1, 7)),
            _conv(224, 256, (7, 1)),
        ),
    )


def _v4_reduction_b(c: int) -> Concat:
    """17x17 -> 8x8 reduction; outputs c + 512 channels."""
    return Concat(
        max_pool(3, 2),
        _seq(_conv(c, 192, 1), _conv(192, 192, 3, 2, "valid")),
        _seq(
            _conv(c, 256, 1),
            _conv(256, 256, (1, 7)),
            _conv(256, 320, (7, 1)),
            _conv(320, 320, 3, 2, "valid"),
        ),
    )


def _v4_c(c: int) -> Concat:
    """8x8 module whose last layers fork into 1x3 and 3x1 halves; outputs 1536 channels."""
    return Concat(
        _seq(avg_pool(3, 1, "same"), _conv(c, 256, 1)),
        _conv(c, 256, 1),
        _seq(_conv(c, 384, 1), Concat(_conv(384, 256, (1, 3)), _conv(384, 256, (3, 1)))),
        _seq(
            _conv(c, 384, 1),
            _conv(384, 448, (1, 3)),
            _conv(448, 512, (3, 1)),
            Concat(_conv(512, 256, (3, 1)), _conv(512, 256, (1, 3))),
        ),
    )


@register_model(
    "inception4",
    dataset="imagenet",
    default_image_size=299,
    min_image_size=75,
    default_batch_size=32,
    default_learning_rate=0.005,
)
def inception4(num_classes: int) -> nn.Module:
    """Inception v4; shift-only batch norm, dropout 0.2 before the logits."""
    features = nn.Sequential(
        _v4_stem(),
        *[_v4_a(384) for _ in range(4)],
        _v4_reduction_a(384, 192, 224, 256, 384),  # 17x17x1024
        *[_v4_b(1024) for _ in range(7)],
        _v4_reduction_b(1024),  # 8x8x1536
        *[_v4_c(1536) for _ in range(3)],
        GlobalAvgPool(),
        nn.Dropout(0.2),
    )
    return Classifier(features, 1536, num_classes)
