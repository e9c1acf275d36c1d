"""NASNet-A (Zoph et al., 2017): mobile and large for ImageNet, the CIFAR-10 network.

The networks tf_cnn_benchmarks runs as ``nasnet``, ``nasnetlarge`` (ImageNet) and ``nasnet``
(CIFAR-10), which build TF-slim's NASNet-A without its classifier: tf_cnn_benchmarks asks for
no classes, so neither the auxiliary head nor the dropout exist, and the benchmark appends its
usual logits layer to the globally pooled features.

A network is a stem, then ``num_cells`` normal cells in three stacks separated by two
reduction cells (each doubles the filters and halves the resolution). Every cell reads the
two previous cells' outputs, brings both to its width with 1x1 convolutions (a "factorized
reduction" when the older one has twice the resolution), runs five pairwise combinations of
separable convolutions, poolings and identities, and concatenates what no combination used.
The ImageNet stem is a strided 3x3 convolution and two reduction cells at a quarter and half
the width; the CIFAR stem is one 3x3 convolution.

Convolutions have no bias and are followed by batch norm with a scale (ImageNet: decay
0.9997, epsilon 1e-3; CIFAR: 0.9, 1e-5); weights use slim's fan-out variance scaling.
Drop-path (large and CIFAR) drops a branch per example with a probability that grows with
the cell's depth and linearly with the training steps the model has run (``drop_path_steps``,
counted by the model itself in training mode, a buffer that checkpoints with it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .layers import BNConfig, Classifier, ConvBlock, avg_pool, batch_norm, max_pool
from .registry import register_model

BN_NASNET_IMAGENET = BNConfig(decay=0.9997, epsilon=1e-3, scale=True)
BN_NASNET_CIFAR = BNConfig(decay=0.9, epsilon=1e-5, scale=True)

# A cell: ten operations, applied pairwise to the hidden states named by ``inputs`` (states 0
# and 1 are the cell's two inputs, state 2 + i the result of combination i); ``used`` marks the
# states some combination reads, the others are concatenated into the output.
_NORMAL_OPS = ("sep5", "sep3", "sep5", "sep3", "avg3", "none", "avg3", "avg3", "sep3", "none")
_NORMAL_INPUTS = (0, 1, 1, 1, 0, 1, 1, 1, 0, 0)
_NORMAL_USED = (1, 0, 0, 0, 0, 0, 0)
_REDUCTION_OPS = ("sep5", "sep7", "max3", "sep7", "avg3", "sep5", "none", "avg3", "sep3", "max3")
_REDUCTION_INPUTS = (0, 1, 0, 1, 0, 1, 3, 2, 2, 0)
_REDUCTION_USED = (1, 1, 1, 0, 0, 0, 0)


@dataclass(frozen=True, kw_only=True)
class NasnetConfig:
    """One NASNet-A network, in slim's hyperparameter names."""

    num_cells: int
    num_conv_filters: int
    stem: str  # "imagenet" or "cifar"
    stem_multiplier: float
    bn: BNConfig
    drop_path_keep_prob: float = 1.0  # reached by the last cell at the end of training
    total_training_steps: int = 250_000
    skip_reduction_layer_input: bool = False
    filter_scaling_rate: float = 2.0


MOBILE = NasnetConfig(num_cells=12, num_conv_filters=44, stem="imagenet", stem_multiplier=1.0, bn=BN_NASNET_IMAGENET)
LARGE = NasnetConfig(
    num_cells=18,
    num_conv_filters=168,
    stem="imagenet",
    stem_multiplier=3.0,
    bn=BN_NASNET_IMAGENET,
    drop_path_keep_prob=0.7,
    skip_reduction_layer_input=True,
)
CIFAR = NasnetConfig(
    num_cells=18,
    num_conv_filters=32,
    stem="cifar",
    stem_multiplier=3.0,
    bn=BN_NASNET_CIFAR,
    drop_path_keep_prob=0.6,
    total_training_steps=937_500,
)  # 600 epochs at batch 32


def _conv_bn(
    in_ch: int,
    out_ch: int,
    kernel: int,
    stride: int,
    bn: BNConfig,
    *,
    groups: int = 1,
    padding: str = "same",
    with_bn: bool = True,
) -> ConvBlock:
    # slim's variance_scaling_initializer(mode=FAN_OUT): truncated normal, stddev sqrt(1.3 * 2 / fan_out).
    fan_out = (out_ch // groups) * kernel * kernel
    return ConvBlock(
        in_ch,
        out_ch,
        kernel,
        stride,
        padding,
        bn=bn if with_bn else None,
        activation=None,
        groups=groups,
        bias=False,
        stddev=math.sqrt(2.6 / fan_out),
    )


class FactorizedReduction(nn.Module):
    """Halves the resolution without dropping pixels: two 1x1 convolutions, each on the pixels
    of one parity (even rows/columns, odd ones), concatenated and normalised. With
    ``stride=1``, a 1x1 convolution and batch norm."""

    def __init__(self, in_ch: int, out_ch: int, stride: int, bn: BNConfig) -> None:
        super().__init__()
        self.stride = stride
        if stride == 1:
            self.path = _conv_bn(in_ch, out_ch, 1, 1, bn)
            return
        self.path1 = _conv_bn(in_ch, out_ch // 2, 1, 1, bn, with_bn=False)
        self.path2 = _conv_bn(in_ch, out_ch // 2, 1, 1, bn, with_bn=False)
        self.bn = batch_norm(out_ch, bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            return self.path(x)
        s = self.stride
        shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))  # the odd pixels, zero-padded at the end
        return self.bn(torch.cat([self.path1(x[:, :, ::s, ::s]), self.path2(shifted[:, :, ::s, ::s])], dim=1))


def _separable_stack(in_ch: int, out_ch: int, kernel: int, stride: int, bn: BNConfig) -> nn.Sequential:
    """Two (ReLU, depthwise kxk, pointwise 1x1, batch norm) layers; the first one strides."""
    layers: list[nn.Module] = []
    for i in range(2):
        cin = in_ch if i == 0 else out_ch
        layers += [
            nn.ReLU(),
            _conv_bn(cin, cin, kernel, stride if i == 0 else 1, bn, groups=cin, with_bn=False),
            _conv_bn(cin, out_ch, 1, 1, bn),
        ]
    return nn.Sequential(*layers)


def _operation(op: str, in_ch: int, out_ch: int, stride: int, bn: BNConfig) -> nn.Module:
    if op.startswith("sep"):
        return _separable_stack(in_ch, out_ch, int(op[3:]), stride, bn)
    if op == "none":
        if stride == 1 and in_ch == out_ch:
            return nn.Identity()
        return nn.Sequential(nn.ReLU(), _conv_bn(in_ch, out_ch, 1, stride, bn))
    pool = (avg_pool if op.startswith("avg") else max_pool)(int(op[3:]), stride, "same")
    if in_ch == out_ch:
        return pool
    return nn.Sequential(pool, _conv_bn(in_ch, out_ch, 1, 1, bn))


def drop_path(x: torch.Tensor, keep_prob: torch.Tensor) -> torch.Tensor:
    """Zero whole examples with probability ``1 - keep_prob``; scale the kept ones by ``1 / keep_prob``."""
    keep = torch.floor(keep_prob + torch.rand(x.shape[0], 1, 1, 1, device=x.device, dtype=x.dtype))
    return x / keep_prob * keep


class Cell(nn.Module):
    """One NASNet-A cell (normal or reduction) of ``filters`` channels per hidden state.

    ``in_ch`` / ``prev_ch``: channels of the previous cell's output and of the one before it
    (``None``: there is none, the previous output stands in); ``prev_is_larger``: the one before
    has twice the resolution. ``layer_ratio`` is (the cell's index + 1) / (number of cells), the
    depth factor of its drop-path probability.
    """

    def __init__(
        self,
        *,
        reduction: bool,
        in_ch: int,
        prev_ch: int | None,
        prev_is_larger: bool,
        filters: int,
        layer_ratio: float,
        cfg: NasnetConfig,
    ) -> None:
        super().__init__()
        bn = cfg.bn
        ops, inputs, self.used = (
            (_REDUCTION_OPS, _REDUCTION_INPUTS, _REDUCTION_USED)
            if reduction
            else (_NORMAL_OPS, _NORMAL_INPUTS, _NORMAL_USED)
        )
        self.inputs = inputs
        self.ops_names = ops
        stride = 2 if reduction else 1
        self.prev_adjust: nn.Module = nn.Identity()
        if prev_ch is None:  # the previous output stands in, as it is
            prev_ch = in_ch
        elif prev_is_larger:
            self.prev_adjust = nn.Sequential(nn.ReLU(), FactorizedReduction(prev_ch, filters, 2, bn))
            prev_ch = filters
        elif prev_ch != filters:
            self.prev_adjust = nn.Sequential(nn.ReLU(), _conv_bn(prev_ch, filters, 1, 1, bn))
            prev_ch = filters
        self.base = nn.Sequential(nn.ReLU(), _conv_bn(in_ch, filters, 1, 1, bn))
        channels = [filters, prev_ch]
        self.ops = nn.ModuleList()
        for i, (op, src) in enumerate(zip(ops, inputs, strict=True)):
            # Only the cell's own inputs are strided; the combinations are already reduced.
            self.ops.append(_operation(op, channels[src], filters, stride if src < 2 else 1, bn))
            if i % 2 == 1:
                channels.append(filters)
        # Unused states whose width differs from the last one's are brought to it (slim keeps
        # this general; in NASNet-A it happens to the stand-in previous output of a first cell).
        self.out_adjust = nn.ModuleDict(
            {
                str(i): FactorizedReduction(ch, filters, 1, bn)
                for i, ch in enumerate(channels)
                if not self.used[i] and ch != filters
            }
        )
        self.out_channels = filters * sum(1 for u in self.used if not u)
        self.keep_prob = 1.0 - layer_ratio * (1.0 - cfg.drop_path_keep_prob)

    def forward(self, x: torch.Tensor, prev: torch.Tensor | None, progress: torch.Tensor | None) -> torch.Tensor:
        states = [self.base(x), self.prev_adjust(x if prev is None else prev)]
        for i in range(0, len(self.ops), 2):
            h = None
            for j in (i, i + 1):
                y = self.ops[j](states[self.inputs[j]])
                if progress is not None and self.ops_names[j] != "none":
                    y = drop_path(y, 1.0 - progress * (1.0 - self.keep_prob))
                h = y if h is None else h + y
            assert h is not None
            states.append(h)
        out = [
            self.out_adjust[str(i)](s) if str(i) in self.out_adjust else s
            for i, s in enumerate(states)
            if not self.used[i]
        ]
        return torch.cat(out, dim=1)


class NasnetFeatures(nn.Module):
    """Stem and cells of a NASNet-A network, ending in ReLU and a global mean: ``[B, C]``."""

    drop_path_steps: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, cfg: NasnetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.drop_path = cfg.drop_path_keep_prob < 1.0
        self.register_buffer("drop_path_steps", torch.zeros((), dtype=torch.float32))
        reductions = [int(k / 3 * cfg.num_cells) for k in (1, 2)]  # slim's calc_reduction_layers
        stem_cells = 2 if cfg.stem == "imagenet" else 0
        total = cfg.num_cells + 2 + stem_cells
        # Each entry: (channels, resolution level) of a cell output; level counts the halvings.
        if cfg.stem == "imagenet":
            stem_ch = int(32 * cfg.stem_multiplier)
            self.stem = _conv_bn(3, stem_ch, 3, 2, cfg.bn, padding="valid")
        else:
            stem_ch = int(cfg.num_conv_filters * cfg.stem_multiplier)
            self.stem = _conv_bn(3, stem_ch, 3, 1, cfg.bn)
        outputs: list[tuple[int, int] | None] = [None, (stem_ch, 0)]
        self.cells = nn.ModuleList()
        self.prev_index: list[int] = []  # which earlier output each cell reads as its second input
        scaling = cfg.filter_scaling_rate**-stem_cells
        cell_num = 0

        def add(reduction: bool, prev_pos: int) -> None:
            nonlocal cell_num
            last, prev = outputs[-1], outputs[prev_pos]
            assert last is not None
            filters = int(cfg.num_conv_filters * scaling)
            cell = Cell(
                reduction=reduction,
                in_ch=last[0],
                prev_ch=None if prev is None else prev[0],
                prev_is_larger=prev is not None and prev[1] < last[1],
                filters=filters,
                layer_ratio=(cell_num + 1) / total,
                cfg=cfg,
            )
            self.cells.append(cell)
            self.prev_index.append(len(outputs) + prev_pos if prev_pos < 0 else prev_pos)
            outputs.append((cell.out_channels, last[1] + (1 if reduction else 0)))
            cell_num += 1

        for _ in range(stem_cells):
            add(True, -2)
            scaling *= cfg.filter_scaling_rate
        for i in range(cfg.num_cells):
            prev_pos = len(outputs) - 2  # as an absolute index, fixed before a reduction is added
            if i in reductions:
                scaling *= cfg.filter_scaling_rate
                add(True, -2)
            add(False, prev_pos if cfg.skip_reduction_layer_input else -2)
        last = outputs[-1]
        assert last is not None
        self.num_features = last[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        progress = None
        if self.drop_path and self.training:
            self.drop_path_steps.add_(1)
            progress = torch.clamp(self.drop_path_steps / self.cfg.total_training_steps, max=1.0)
        outputs: list[torch.Tensor | None] = [None, self.stem(x)]
        for cell, prev in zip(self.cells, self.prev_index, strict=True):
            last = outputs[-1]
            assert last is not None
            outputs.append(cell(last, outputs[prev], progress))
        last = outputs[-1]
        assert last is not None
        return F.relu(last).mean(dim=(2, 3))


def _nasnet(cfg: NasnetConfig, num_classes: int) -> Classifier:
    features = NasnetFeatures(cfg)
    return Classifier(features, features.num_features, num_classes)


@register_model(
    "nasnet",
    dataset="imagenet",
    default_image_size=224,
    min_image_size=32,
    default_batch_size=32,
    default_learning_rate=0.005,
)
def nasnet_mobile(num_classes: int) -> nn.Module:
    """NASNet-A mobile (4 @ 1056): 12 cells of 44 filters, 224x224 input."""
    return _nasnet(MOBILE, num_classes)


@register_model(
    "nasnetlarge",
    dataset="imagenet",
    default_image_size=331,
    min_image_size=32,
    default_batch_size=16,
    default_learning_rate=0.005,
)
def nasnet_large(num_classes: int) -> nn.Module:
    """NASNet-A large (6 @ 4032): 18 cells of 168 filters, 331x331 input, drop-path."""
    return _nasnet(LARGE, num_classes)


@register_model(
    "nasnet",
    dataset="cifar10",
    default_image_size=32,
    min_image_size=8,
    default_batch_size=32,
    default_learning_rate=0.025,
)
def nasnet_cifar(num_classes: int) -> nn.Module:
    """NASNet-A for CIFAR-10 (6 @ 768): 18 cells of 32 filters, drop-path."""
    return _nasnet(CIFAR, num_classes)
