"""Small image data for the data tests: image trees, fake CIFAR-10 files, a tiny conv net
trained on them (also by helpers/scripts/data_train_script.py), and the colour ops' test image."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

import stoker
from stoker.data.base import example_uniforms
from stoker.data.images.color import color_params
from stoker.data.images.crops import TRAIN_DRAWS
from stoker.data.images.normalize import ImagePreprocessor

IMAGE_SIZE = 16
BATCH = 8


def noisy_jpeg(width: int = 203, height: int = 157, seed: int = 0, **save: object) -> bytes:
    """Content with detail at every scale (smooth blobs plus noise), odd sizes (partial iMCUs)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    pixels = np.clip(smooth + rng.integers(-20, 21, smooth.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    if save.pop("gray", False):
        image = image.convert("L")
    buf = io.BytesIO()
    image.save(buf, format="JPEG", **{"quality": 90, **save})
    return buf.getvalue()


def smooth_jpeg(width: int = 120, height: int = 90, seed: int = 0, quality: int = 90) -> bytes:
    """A smooth random colour field (little detail: decoders agree closely on it)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (height // 10, width // 10, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def smooth_jpeg_tree(root: Path, classes: int = 2, per_class: int = 10, size: tuple[int, int] = (120, 90)) -> Path:
    """``root/class_<c>/img_<i>.jpg`` of :func:`smooth_jpeg` images, deterministic."""
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (root / f"class_{c}" / f"img_{i:03d}.jpg").write_bytes(smooth_jpeg(*size, seed=100 * c + i))
    return root


def make_image_tree(
    root: Path, classes: int = 3, per_class: int = 20, size: int = 16, seed: int = 0, fmt: str = "jpg"
) -> Path:
    """``root/class_<c>/img_<i>.<fmt>``: random RGB images, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            pixels[..., c % 3] //= 2  # some class signal for the model to learn
            Image.fromarray(pixels).save(folder / f"img_{i:03d}.{fmt}")
    return root


def make_index_tree(root: Path, classes: int = 3, per_class: int = 7, size: int = 12) -> Path:
    """Lossless PNGs of one flat colour each: example ``k`` (file order) has red = k, green = 7."""
    k = 0
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", (size + i, size), (k, 7, 0)).save(folder / f"img_{i:03d}.png")
            k += 1
    return root


def make_id_tree(root: Path, count: int = 20, seed: int = 0) -> Path:
    """``root/id_<k>/img.png``: one noisy lossless image per class folder, so an example's label
    is its index in the data set (its id) and any crop, flip or colour change shows in its pixels."""
    rng = np.random.default_rng(seed)
    for k in range(count):
        folder = root / f"id_{k:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (20 + k % 5, 24 + k % 3, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / "img.png")
    return root


class TinyConv(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x)).mean((2, 3))
        return self.fc(self.drop(h))


def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    if params.get("sleep"):
        time.sleep(params["sleep"])  # slows the run so a kill lands mid-way; changes no number
    logits = model(features)
    reduction = "mean" if mode == stoker.ModeKeys.TRAIN else "none"
    return stoker.EstimatorSpec(
        loss=F.cross_entropy(logits, labels, reduction=reduction),
        eval_metrics={"accuracy": stoker.metrics.Accuracy()(logits, labels)},
    )


def make_estimator(model_dir: str | Path | None, sleep: float = 0.0, **config: object) -> stoker.Estimator:
    cfg: dict[str, object] = {
        "model_dir": model_dir,
        "progress_bar": False,
        "iterations_per_loop": 2,
        "save_checkpoints_steps": 3,
        "log_every_n_steps": 5,
    }
    cfg.update(config)
    return stoker.Estimator(
        model=lambda p: TinyConv(),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        config=stoker.RunConfig(**cfg),  # type: ignore[arg-type]
        params={"sleep": sleep},
        train_batch_size=BATCH,
    )


def input_fn(data: str | Path, num_workers: int = 2):  # noqa: ANN201
    def fn(params: dict) -> stoker.data.ImageFolderSource:
        return stoker.data.image_folder(
            data,
            read=stoker.data.ReadOptions(num_workers=num_workers, seed=3).for_replica(params),
            image=stoker.data.ImageOptions(image_size=IMAGE_SIZE),
        )

    return fn


def write_cifar(folder: Path, per_file: int = 20, files: tuple[str, ...] | None = None, seed: int = 0) -> Path:
    """Fake CIFAR-10 binary files; record k of the set has pixel 0 = k % 256, pixel 1 = k // 256."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    names = files or tuple(f"data_batch_{i}.bin" for i in range(1, 6)) + ("test_batch.bin",)
    k = 0
    for name in names:
        rec = rng.integers(0, 256, (per_file, 3073), dtype=np.uint8)
        rec[:, 0] = rng.integers(0, 10, per_file)
        for r in range(per_file):
            rec[r, 1], rec[r, 2] = k % 256, k // 256
            k += 1
        rec.tofile(folder / name)
    return folder


#: Colour ops: max |ours - TensorFlow's| on the [0, 1] scale after the final clip. Measured
#: ~1.2e-6 (float32 rounding of a different but equivalent order of operations); 1e-5 is
#: 400x tighter than one 8-bit level (1/255 ~ 3.9e-3).
COLOR_TOL = 1e-5


def color_test_image(seed: int = 0) -> np.ndarray:
    """32x40 RGB: a smooth colour field (every hue) with noise and pure black, white, grey and
    saturated pixels, the corners of the colour ops."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, 32), np.linspace(0, 1, 40), indexing="ij")
    img = np.stack([xx, yy, 1 - xx * yy], -1) * 255 + rng.normal(0, 20, (32, 40, 3))
    img = img.clip(0, 255).astype(np.uint8)
    img[0, :4] = [[0, 0, 0], [255, 255, 255], [128, 128, 128], [255, 0, 0]]
    return img


def color_test_params() -> np.ndarray:
    """Colour parameters of 16 examples' uniforms, then the extremes of every range and the identity."""
    rows = color_params(example_uniforms(1, 0, np.arange(16), TRAIN_DRAWS))
    extremes = np.array(
        [[-32 / 255, 1.5, 0.2, 1.5, 0], [32 / 255, 0.5, -0.2, 0.5, 1], [-0.12, 1.4, 0.19, 0.6, 1], [0, 1, 0, 1, 0]],
        dtype=np.float32,
    )
    return np.concatenate([rows, extremes])


def distorted_01(img: np.ndarray, params: np.ndarray, channels_last: bool = True) -> np.ndarray:
    """ImagePreprocessor with mean 0 and std 1: the distorted image on the [0, 1] scale, HWC."""
    pre = ImagePreprocessor((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), distortions=True, channels_last=channels_last)
    images = torch.from_numpy(img)[None].repeat(len(params), 1, 1, 1)
    return pre(images, torch.from_numpy(params)).permute(0, 2, 3, 1).numpy()
