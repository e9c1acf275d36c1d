"""SSD300 (Liu et al., 2015) with a ResNet-34 backbone: the MLPerf detector tf_cnn_benchmarks runs.

Backbone: ResNet-34's stem and first three stages (3, 4, 6 basic blocks of 64, 128, 256
filters), the third at stride 1 (the reference reuses the second stage's last stride), so a
300x300 image gives a 38x38x256 map; batch norm with a scale, decay 0.997, epsilon 1e-4.
Five more stages (biased 1x1 then 3x3 convolutions with ReLU, Xavier-initialised) give maps of
19, 10, 5, 3 and 1 cells with 512, 512, 256, 256, 256 channels. On each of the six maps a 3x3
convolution predicts 4 box offsets and another 81 class logits for each of 4, 6, 6, 6, 4, 4
default boxes per cell: 8,732 boxes in all, in the reference's order (default box shape, then
row, then column).

Training targets are the reference's: each default box is matched to the ground-truth box it
overlaps most if their IoU is at least 0.5, and every ground-truth box to its best default box
regardless; matched boxes get their class and their offsets encoded against the default box
(centre offsets x 10, log size ratios x 5), the rest the background class 0. The loss
(``ssd_loss``) is smooth-L1 over the matched boxes' offsets plus softmax cross-entropy over the
matched boxes and the hardest unmatched ones (three per match), each divided by the number of
matches and averaged over the batch.

Synthetic data (``synthetic_detections``): random images, and for each 1 to 8 random boxes of
random classes, encoded exactly as above.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .layers import BNConfig, ConvBlock, max_pool
from .registry import register_model
from .resnet import ResidualBlock

BN_SSD = BNConfig(decay=0.997, epsilon=1e-4, scale=True)
IMAGE_SIZE = 300
FEATURE_SIZES = (38, 19, 10, 5, 3, 1)
STEPS = (8, 16, 32, 64, 100, 300)
SCALES = (21, 45, 99, 153, 207, 261, 315)
ASPECT_RATIOS: tuple[tuple[int, ...], ...] = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))
NUM_DEFAULTS = (4, 6, 6, 6, 4, 4)
NUM_BOXES = 8732
OUT_CHANNELS = (256, 512, 512, 256, 256, 256)
MATCH_THRESHOLD = 0.5
NEGATIVES_PER_POSITIVE = 3
BOX_CODER_SCALES = (10.0, 10.0, 5.0, 5.0)
MAX_SYNTHETIC_BOXES = 8


def default_boxes() -> torch.Tensor:
    """The 8,732 default boxes as ``[cy, cx, h, w]`` in image fractions, each value clipped to [0, 1]."""
    boxes: list[tuple[float, ...]] = []  # [cy, cx, h, w]
    for idx, size in enumerate(FEATURE_SIZES):
        fk = IMAGE_SIZE / STEPS[idx]
        sk1, sk2 = SCALES[idx] / IMAGE_SIZE, SCALES[idx + 1] / IMAGE_SIZE
        sk3 = math.sqrt(sk1 * sk2)
        shapes = [(sk1, sk1), (sk3, sk3)]
        for alpha in ASPECT_RATIOS[idx]:
            w, h = sk1 * math.sqrt(alpha), sk1 / math.sqrt(alpha)
            shapes += [(w, h), (h, w)]
        for w, h in shapes:
            for i, j in itertools.product(range(size), repeat=2):
                cx, cy = (j + 0.5) / fk, (i + 0.5) / fk
                boxes.append(tuple(min(max(v, 0.0), 1.0) for v in (cy, cx, h, w)))
    return torch.tensor(boxes, dtype=torch.float64)


def _corners(boxes: torch.Tensor) -> torch.Tensor:
    """``[cy, cx, h, w]`` -> ``[ymin, xmin, ymax, xmax]``."""
    cy, cx, h, w = boxes.unbind(-1)
    return torch.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], dim=-1)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every corner box of ``a`` ``[N, 4]`` with every one of ``b`` ``[M, 4]``: ``[N, M]``."""
    top_left = torch.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def encode_targets(
    gt_boxes: torch.Tensor, gt_classes: torch.Tensor, anchors: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One image's training targets: ``(offsets [8732, 4], classes [8732], number of matches)``.

    ``gt_boxes``: ``[K, 4]`` corner boxes; ``gt_classes``: ``[K]`` in 1..80; ``anchors``: the
    ``[cy, cx, h, w]`` default boxes.
    """
    iou = box_iou(gt_boxes.to(anchors.dtype), _corners(anchors))  # [K, 8732]
    best_iou, match = iou.max(0)
    match = torch.where(best_iou >= MATCH_THRESHOLD, match, -1)
    # Every ground-truth box keeps its best default box, whatever the overlap (the later box
    # wins a default box two of them pick, as a scatter of the reference's matcher does).
    match[iou.argmax(1)] = torch.arange(gt_boxes.shape[0], device=match.device)
    matched = match >= 0
    gt = gt_boxes.to(anchors.dtype)[match.clamp(min=0)]
    gh, gw = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    gcy, gcx = gt[:, 0] + gh / 2, gt[:, 1] + gw / 2
    acy, acx, ah, aw = anchors.unbind(-1)
    eps = 1e-8  # the reference coder's guard against zero sizes
    ah, aw, gh, gw = ah + eps, aw + eps, gh + eps, gw + eps
    sy, sx, sh, sw = BOX_CODER_SCALES
    offsets = torch.stack(
        [(gcy - acy) / ah * sy, (gcx - acx) / aw * sx, torch.log(gh / ah) * sh, torch.log(gw / aw) * sw], dim=-1
    )
    offsets = torch.where(matched[:, None], offsets, torch.zeros_like(offsets))
    classes = torch.where(matched, gt_classes[match.clamp(min=0)], torch.zeros_like(gt_classes[:1]))
    return offsets.float(), classes, matched.sum().float()


class SSD300(nn.Module):
    """Images ``[B, 3, 300, 300]`` -> ``(box offsets [B, 8732, 4], class logits [B, 8732, num_classes])``."""

    def __init__(self, num_classes: int = 81) -> None:
        super().__init__()
        self.num_classes = num_classes
        layers: list[nn.Module] = [ConvBlock(3, 64, 7, 2, bn=BN_SSD), max_pool(3, 2, "same")]
        in_ch = 64
        for depth, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 1)):
            for i in range(blocks):
                layers.append(_basic_block(in_ch, depth, stride if i == 0 else 1))
                in_ch = depth
        self.backbone = nn.Sequential(*layers)
        self.extras = nn.ModuleList(
            [
                nn.Sequential(_ssd_conv(256, 256, 1, 1, 0), _ssd_conv(256, 512, 3, 2, 1)),
                nn.Sequential(_ssd_conv(512, 256, 1, 1, 0), _ssd_conv(256, 512, 3, 2, 1)),
                nn.Sequential(_ssd_conv(512, 128, 1, 1, 0), _ssd_conv(128, 256, 3, 2, 1)),
                nn.Sequential(_ssd_conv(256, 128, 1, 1, 0), _ssd_conv(128, 256, 3, 1, 0)),
                nn.Sequential(_ssd_conv(256, 128, 1, 1, 0), _ssd_conv(128, 256, 3, 1, 0)),
            ]
        )
        self.loc = nn.ModuleList([_head(c, n * 4) for c, n in zip(OUT_CHANNELS, NUM_DEFAULTS, strict=True)])
        self.conf = nn.ModuleList([_head(c, n * num_classes) for c, n in zip(OUT_CHANNELS, NUM_DEFAULTS, strict=True)])

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.backbone(images)
        maps = [x]
        for extra in self.extras:
            x = extra(x)
            maps.append(x)
        locs = [_per_box(head(m), 4) for head, m in zip(self.loc, maps, strict=True)]
        confs = [_per_box(head(m), self.num_classes) for head, m in zip(self.conf, maps, strict=True)]
        return torch.cat(locs, dim=1), torch.cat(confs, dim=1)


def _basic_block(in_ch: int, depth: int, stride: int) -> ResidualBlock:
    """ResNet v1 basic block; a changed width or stride takes a 1x1 projection with batch norm."""
    body = nn.Sequential(
        ConvBlock(in_ch, depth, 3, stride, bn=BN_SSD),
        ConvBlock(depth, depth, 3, bn=BN_SSD, activation=None),
    )
    shortcut: nn.Module = nn.Identity()
    if in_ch != depth or stride != 1:
        shortcut = ConvBlock(in_ch, depth, 1, stride, bn=BN_SSD, activation=None)
    return ResidualBlock(body, shortcut)


def _xavier(conv: nn.Conv2d) -> nn.Conv2d:
    """Xavier (Glorot) uniform weights and zero biases, the reference's SSD initialiser."""
    if not conv.weight.is_meta:
        nn.init.xavier_uniform_(conv.weight)
        if conv.bias is not None:
            nn.init.zeros_(conv.bias)
    return conv


def _ssd_conv(in_ch: int, out_ch: int, kernel: int, stride: int, padding: int) -> nn.Sequential:
    return nn.Sequential(_xavier(nn.Conv2d(in_ch, out_ch, kernel, stride, padding)), nn.ReLU(inplace=True))


def _head(in_ch: int, out_ch: int) -> nn.Conv2d:
    return _xavier(nn.Conv2d(in_ch, out_ch, 3, padding=1))


def _per_box(x: torch.Tensor, values: int) -> torch.Tensor:
    """``[B, n * values, H, W]`` -> ``[B, n * H * W, values]``, default box shape before position."""
    b, _, h, w = x.shape
    return x.reshape(b, -1, values, h, w).permute(0, 1, 3, 4, 2).reshape(b, -1, values)


def ssd_loss(outputs: tuple[torch.Tensor, torch.Tensor], labels: dict[str, torch.Tensor]) -> torch.Tensor:
    """Smooth-L1 box loss plus hard-negative-mined cross-entropy, per match, averaged over the batch."""
    locs, confs = outputs
    gt_offsets, gt_classes, matches = labels["boxes"], labels["classes"], labels["num_matched"]
    positive = (gt_classes > 0).float()
    box = (F.smooth_l1_loss(locs.float(), gt_offsets, reduction="none", beta=1.0).sum(-1) * positive).sum(1)
    ce = F.cross_entropy(confs.float().transpose(1, 2), gt_classes, reduction="none")  # [B, 8732]
    # Rank the unmatched boxes by their loss; keep the 3 x matches hardest.
    rank = (ce * (1 - positive)).argsort(dim=1, descending=True).argsort(dim=1)
    negatives = (rank < (matches.long() * NEGATIVES_PER_POSITIVE).clamp(max=NUM_BOXES)[:, None]).float()
    cls = (ce * (positive + negatives)).sum(1)
    return (box / matches).mean() + (cls / matches).mean()


def synthetic_detections(
    batch_size: int, num_classes: int, gen: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Random images and 1 to 8 random boxes of random classes per image, encoded as training targets."""
    images = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen, device=device)
    anchors = default_boxes().to(device)
    offsets, classes, matches = [], [], []
    for _ in range(batch_size):
        k = int(torch.randint(1, MAX_SYNTHETIC_BOXES + 1, (1,), generator=gen, device=device))
        corner = torch.rand(k, 2, generator=gen, device=device) * 0.8
        size = 0.05 + torch.rand(k, 2, generator=gen, device=device) * (1 - corner - 0.05)
        boxes = torch.cat([corner, corner + size], dim=1)
        labels = torch.randint(1, num_classes, (k,), generator=gen, device=device)
        o, c, m = encode_targets(boxes, labels, anchors)
        offsets.append(o)
        classes.append(c)
        matches.append(m)
    return images, {"boxes": torch.stack(offsets), "classes": torch.stack(classes), "num_matched": torch.stack(matches)}


@register_model(
    "ssd300",
    dataset="coco",
    default_image_size=300,
    default_batch_size=32,
    default_learning_rate=1e-3,
    synthetic_batch=synthetic_detections,
    loss=ssd_loss,
    lr_schedule="ssd",
)
def ssd300(num_classes: int) -> nn.Module:
    """SSD300, ResNet-34 backbone: 8,732 default boxes over 6 maps, 81 classes (COCO and background)."""
    return SSD300(num_classes)
