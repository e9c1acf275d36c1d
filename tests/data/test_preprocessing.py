"""tf_cnn_benchmarks' preprocessing, held to the seed's: the same crop boxes for the same random
stream, the evaluation transform's geometry, the colour ops within a stated tolerance of
TensorFlow's, and the normalisation exact.

The TensorFlow comparisons run the peer (``~/.cache/stoker-peers/tfvenv``) in a subprocess and
skip cleanly without it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.tf_random import TF_PYTHON, PhiloxDraws, run_tf
from stoker.data import DataError
from stoker.data import preprocessing as P
from stoker.data.base import example_uniforms
from stoker.data.images import fused_normalize, normalize, normalize_images
from stoker.data.images.color import _distort

#: Colour ops: max |ours - TensorFlow's| on the [0, 1] scale after the final clip. Measured
#: ~1.2e-6 (float32 rounding of a different but equivalent order of operations); 1e-5 is
#: 400x tighter than one 8-bit level (1/255 ~ 3.9e-3).
COLOR_TOL = 1e-5


def row(*attempts: tuple[float, float, float, float], fill: float = 0.0) -> np.ndarray:
    """A training row of uniforms: the given crop attempts first, ``fill`` everywhere else."""
    u = np.full(P.TRAIN_DRAWS, fill)
    for t, a in enumerate(attempts):
        u[4 * t : 4 * t + 4] = a
    return u


# ------------------------------------------------------------------------------------------
# sample_distorted_box


def test_box_for_fixed_uniforms_is_the_hand_computed_one() -> None:
    # 500x375, aspect 0.5 -> 0.75 + 0.5 * 0.58 = 1.04; area 5%-100% -> height in
    # [lrint(sqrt(9375 / 1.04)), min(375, lrint(sqrt(187500 / 1.04)))] = [95, 375];
    # height 95 + floor(0.5 * 281) = 235, width lrint(235 * 1.04) = 244;
    # top floor(0.25 * (375 - 235)) = 35, left floor(0.75 * (500 - 244)) = 192.
    assert P.sample_distorted_box(500, 375, row((0.5, 0.5, 0.25, 0.75))) == (192, 35, 244, 235)


def test_an_attempt_covering_too_little_is_rejected_and_the_next_four_uniforms_used() -> None:
    # Attempt 0: aspect 0.75, height 112, width 84: 9408 px = 5% of the image, under the 10%
    # the whole-image "object" needs. Attempt 1 is the hand-computed box above.
    u = row((0.0, 0.0, 0.0, 0.0), (0.5, 0.5, 0.25, 0.75))
    assert P.sample_distorted_box(500, 375, u) == (192, 35, 244, 235)
    assert P.sample_distorted_box(500, 375, u, min_object_covered=0.05) == (0, 0, 84, 112)


def test_after_max_attempts_the_whole_image_is_the_box() -> None:
    assert P.sample_distorted_box(500, 375, np.zeros(P.TRAIN_DRAWS)) == (0, 0, 500, 375)
    assert P.sample_distorted_box(500, 375, row((0.0,) * 4, (0.5, 0.5, 0.25, 0.75)), max_attempts=1) == (0, 0, 500, 375)
    # An object box of less than one pixel can never be covered: always the whole image.
    assert P.sample_distorted_box(500, 375, row((0.5, 0.5, 0.25, 0.75)), [[0.5, 0.5, 0.5, 0.5]]) == (0, 0, 500, 375)


def test_boxes_cover_the_object_and_stay_inside_the_image() -> None:
    bbox = [[0.8, 0.7, 1.0, 1.0]]  # ymin, xmin, ymax, xmax: the bottom-right corner, x 350-500, y 300-375
    u = example_uniforms(0, 0, np.arange(500), P.TRAIN_DRAWS)
    boxes = np.array([P.sample_distorted_box(500, 375, r, bbox) for r in u])
    free = np.array([P.sample_distorted_box(500, 375, r) for r in u])
    left, top, w, h = boxes.T
    assert (left >= 0).all() and (top >= 0).all() and (left + w <= 500).all() and (top + h <= 375).all()
    inter = (np.minimum(left + w, 500) - np.maximum(left, 350)).clip(0) * (
        np.minimum(top + h, 375) - np.maximum(top, 300)
    ).clip(0)
    assert (inter / (150 * 75) >= 0.1).all()
    # Without the box, many of the same draws land away from that corner.
    free_inter = (np.minimum(free[:, 0] + free[:, 2], 500) - np.maximum(free[:, 0], 350)).clip(0)
    assert (free_inter == 0).mean() > 0.1
    assert (boxes != free).any(axis=1).mean() > 0.1


def test_box_arguments_are_checked() -> None:
    u = row((0.5, 0.5, 0.25, 0.75))
    with pytest.raises(DataError, match=r"in \[0, 1\]"):
        P.sample_distorted_box(500, 375, u, [[0.1, 0.1, 1.2, 0.5]])
    with pytest.raises(ValueError, match="needs 400 uniforms"):
        P.sample_distorted_box(500, 375, u[:10])
    with pytest.raises(ValueError, match="area_range"):
        P.sample_distorted_box(500, 375, u, area_range=(0.5, 0.1))
    with pytest.raises(ValueError, match="image size"):
        P.sample_distorted_box(0, 375, u)


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


def _box_stats(b: np.ndarray, width: int, height: int) -> dict[str, np.ndarray]:
    return {
        "area": b[:, 2] * b[:, 3] / (width * height),
        "aspect": b[:, 2] / b[:, 3],
        "centre_x": (b[:, 0] + b[:, 2] / 2) / width,
        "centre_y": (b[:, 1] + b[:, 3] / 2) / height,
    }


def test_uniform_driven_boxes_have_tensorflows_distribution() -> None:
    """Our uniforms (20,000 examples) against TensorFlow's own stream (2,000 seeds, replayed
    exactly: see the peer test below) for a 500x375 image: every KS distance under 0.05
    (the two-sample 0.1% critical value for these sizes is ~0.046; measured 0.01-0.03)."""
    tf_boxes = np.array([P.sample_distorted_box_from(500, 375, PhiloxDraws(1, i)) for i in range(2000)])
    ours = np.array(
        [P.sample_distorted_box(500, 375, r) for r in example_uniforms(3, 0, np.arange(20000), P.TRAIN_DRAWS)]
    )
    ts, os_ = _box_stats(tf_boxes, 500, 375), _box_stats(ours, 500, 375)
    for key in ts:
        assert _ks(ts[key], os_[key]) < 0.05, key
    assert abs(ts["area"].mean() - os_["area"].mean()) < 0.015


# ------------------------------------------------------------------------------------------
# the evaluation transform, the crop mode, the flip


def test_eval_geometry_hand_computed() -> None:
    # 500x375 to 224: the shorter side becomes int(375 * 224/375 * 1.145) = 256, the longer
    # int(500 * 224/375 * 1.145) = 341; the central square starts at (58, 16).
    assert P.eval_resize_shape(500, 375, 224) == (341, 256, 58, 16)
    assert P.eval_resize_shape(300, 300, 224) == (256, 256, 16, 16)
    left, top, w, h = P.eval_crop_box(500, 375, 224)
    assert (left, top) == pytest.approx((58 * 500 / 341, 16 * 375 / 256))
    assert (w, h) == pytest.approx((224 * 500 / 341, 224 * 375 / 256))


TF_CNN = TF_PYTHON.parents[2] / "benchmarks" / "scripts" / "tf_cnn_benchmarks"


def test_random_crop_box_and_flip() -> None:
    u = row((0.5, 0.25, 0.0, 0.0))
    assert P.random_crop_box(300, 250, 224, u) == (19, 13)  # floor(0.25 * 77), floor(0.5 * 27)
    with pytest.raises(DataError, match="--resize_method=crop needs images of at least 224x224"):
        P.random_crop_box(300, 200, 224, u)
    u[P.FLIP_INDEX] = 0.49
    assert P.flip_of(u)
    u[P.FLIP_INDEX] = 0.5
    assert not P.flip_of(u)


def test_resize_method_for_round_robin_cycles_tf_cnns_order() -> None:
    assert [P.resize_method_for("round_robin", i) for i in range(6)] == [
        "nearest",
        "bilinear",
        "bicubic",
        "area",
        "nearest",
        "bilinear",
    ]
    assert P.resize_method_for("bicubic", 3) == "bicubic"
    with pytest.raises(ValueError, match="--resize_method must be one of nearest, bilinear"):
        P.resize_method_for("lanczos", 0)


# ------------------------------------------------------------------------------------------
# colour


def test_color_params_map_the_uniforms_onto_tf_cnns_ranges() -> None:
    u = np.zeros((2, P.TRAIN_DRAWS))
    u[0, P.COLOR_SLICE] = [0.0, 0.5, 0.75, 0.25, 0.75]
    u[1, P.COLOR_SLICE] = [1 - 2**-20, 0.0, 0.0, 1 - 2**-20, 0.25]
    p = P.color_params(u)
    assert p.dtype == np.float32 and p.shape == (2, P.COLOR_PARAMS)
    np.testing.assert_allclose(p[0], [-32 / 255, 1.0, 0.1, 0.75, 1.0], rtol=1e-6)
    np.testing.assert_allclose(p[1], [32 / 255, 0.5, -0.2, 1.5, 0.0], rtol=1e-5)
    np.testing.assert_array_equal(P.color_params(u[0]), p[0])


def _test_image(seed: int = 0) -> np.ndarray:
    """32x40 RGB: a smooth colour field (every hue) with noise and pure black, white, grey and
    saturated pixels, the corners of the colour ops."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, 32), np.linspace(0, 1, 40), indexing="ij")
    img = np.stack([xx, yy, 1 - xx * yy], -1) * 255 + rng.normal(0, 20, (32, 40, 3))
    img = img.clip(0, 255).astype(np.uint8)
    img[0, :4] = [[0, 0, 0], [255, 255, 255], [128, 128, 128], [255, 0, 0]]
    return img


def _params() -> np.ndarray:
    rows = P.color_params(example_uniforms(1, 0, np.arange(16), P.TRAIN_DRAWS))
    extremes = np.array(
        [[-32 / 255, 1.5, 0.2, 1.5, 0], [32 / 255, 0.5, -0.2, 0.5, 1], [-0.12, 1.4, 0.19, 0.6, 1], [0, 1, 0, 1, 0]],
        dtype=np.float32,
    )
    return np.concatenate([rows, extremes])


def _batch(img: np.ndarray, params: np.ndarray, channels_last: bool = True) -> np.ndarray:
    """ImagePreprocessor with mean 0 and std 1: the distorted image on the [0, 1] scale, HWC."""
    pre = P.ImagePreprocessor((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), distortions=True, channels_last=channels_last)
    images = torch.from_numpy(img)[None].repeat(len(params), 1, 1, 1)
    return pre(images, torch.from_numpy(params)).permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("channels_last", [True, False])
def test_batch_colour_ops_match_the_reference(channels_last: bool) -> None:
    img, params = _test_image(), _params()
    assert {0.0, 1.0} <= set(params[:, 4].tolist())  # both orders are exercised
    ref = np.stack([P.distort_color_reference(img, p) for p in params])
    got = _batch(img, params, channels_last)
    assert np.abs(got - ref).max() <= COLOR_TOL
    # The identity parameters give back the image (up to float rounding).
    np.testing.assert_allclose(got[-1], img / np.float32(255), atol=1e-6)
    # And the ops do something: every other row differs from the image by several levels.
    assert (np.abs(got[:-1] - img / 255).max(axis=(1, 2, 3)) > 8 / 255).all()


def test_the_accelerator_path_merging_orders_with_where_matches_the_cpu_path() -> None:
    """On a GPU the batch goes at once, the two orders merged by ``where``; run that path on the
    CPU (the private step the accelerator uses) against the chunked CPU path."""
    img, params = _test_image(), torch.from_numpy(_params())
    x = torch.from_numpy(img)[None].repeat(len(params), 1, 1, 1).permute(0, 3, 1, 2).contiguous().float() / 255
    merged = _distort(x.clone(), params, (params[:, 4] >= 0.5).view(-1, 1, 1, 1))
    torch.testing.assert_close(merged, P.distort_color_batch(x, params), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------
# ImagePreprocessor: cast and normalisation


def test_normalisation_exact_values() -> None:
    images = torch.tensor([[[[0, 255, 51], [255, 0, 102]]]], dtype=torch.uint8)  # [1, 1, 2, 3]
    out = P.ImagePreprocessor(P.TF_CNN_MEAN, P.TF_CNN_STD)(images)
    assert out.shape == (1, 3, 1, 2) and out.dtype == torch.float32
    # tf_cnn's x / 127.5 - 1: 0 -> -1, 255 -> 1, 51 -> -0.6, 102 -> -0.2 (float32 of (x - 127.5) / 127.5)
    expected = (np.array([[0, 255], [255, 0], [51, 102]], np.float32) - np.float32(127.5)) / np.float32(127.5)
    np.testing.assert_array_equal(out[0, :, 0].numpy(), expected)
    assert out[0, 0, 0, 0].item() == -1.0 and out[0, 0, 0, 1].item() == 1.0


@pytest.mark.parametrize("channels_last", [True, False])
def test_without_colour_it_is_normalize_images_bitwise(channels_last: bool) -> None:
    images = torch.randint(0, 256, (4, 9, 7, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = P.ImagePreprocessor(channels_last=channels_last)(images)
    assert torch.equal(out, normalize_images(images, P.IMAGENET_MEAN, P.IMAGENET_STD))
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    distorted = P.ImagePreprocessor(distortions=True, channels_last=channels_last)(
        images, torch.from_numpy(P.color_params(example_uniforms(0, 0, np.arange(4), P.TRAIN_DRAWS)))
    )
    assert distorted.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert P.ImagePreprocessor().state_dict() == {}


def test_row_wise_normalisation_follows_the_width_and_takes_any_strides() -> None:
    """The channels_last path normalises image rows against constants repeated along a row; a
    batch of another width, or a non-contiguous one (a slice), gives what the broadcast gives."""
    pre = P.ImagePreprocessor()
    gen = torch.Generator().manual_seed(1)
    for shape in ((2, 5, 7, 3), (3, 4, 11, 3), (2, 5, 7, 3)):
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        assert torch.equal(pre(images), normalize_images(images, P.IMAGENET_MEAN, P.IMAGENET_STD))
    wide = torch.randint(0, 256, (2, 6, 10, 3), dtype=torch.uint8, generator=gen)
    part = wide[:, :, 2:8]  # not contiguous
    assert torch.equal(pre(part), normalize_images(part.contiguous(), P.IMAGENET_MEAN, P.IMAGENET_STD))


def test_a_batch_larger_than_a_block_is_normalised_in_blocks_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU the rows are normalised a cache-sized block at a time; a block that does not divide
    the rows (here 5 rows of 30 values, the last block short) gives the whole-batch result."""
    monkeypatch.setattr(normalize, "_NORMALIZE_BLOCK_BYTES", 5 * 4 * 30)
    monkeypatch.setattr(fused_normalize, "available", lambda: False)  # the torch path, where it builds too
    images = torch.randint(0, 256, (3, 7, 10, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    out = P.ImagePreprocessor()(images)
    assert torch.equal(out, normalize_images(images, P.IMAGENET_MEAN, P.IMAGENET_STD))
    assert out.is_contiguous(memory_format=torch.channels_last) and out.shape == (3, 3, 7, 10)


def test_distorted_output_is_normalised_distorted_image() -> None:
    img, params = _test_image(), _params()
    pre = P.ImagePreprocessor(distortions=True)
    out = pre(torch.from_numpy(img)[None].repeat(len(params), 1, 1, 1), torch.from_numpy(params))
    x01 = _batch(img, params)
    mean, std = np.array(P.IMAGENET_MEAN, np.float32), np.array(P.IMAGENET_STD, np.float32)
    np.testing.assert_allclose(out.permute(0, 2, 3, 1).numpy(), (x01 - mean) / std, atol=1e-5)


def test_wiring_mistakes_are_refused() -> None:
    images = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    color = torch.zeros(2, P.COLOR_PARAMS)
    with pytest.raises(ValueError, match="uint8"):
        P.ImagePreprocessor()(images.float())
    with pytest.raises(ValueError, match="needs the batch's color"):
        P.ImagePreprocessor(distortions=True)(images)
    with pytest.raises(ValueError, match="was given color"):
        P.ImagePreprocessor()(images, color)
    with pytest.raises(ValueError, match=r"color must be \[N, 5\]"):
        P.ImagePreprocessor(distortions=True)(images, color[:1])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_it_matches_the_cpu() -> None:
    img, params = _test_image(), _params()
    images = torch.from_numpy(img)[None].repeat(len(params), 1, 1, 1)
    color = torch.from_numpy(params)
    for pre, args in ((P.ImagePreprocessor(), (images,)), (P.ImagePreprocessor(distortions=True), (images, color))):
        cpu = pre(*args)
        gpu = pre(*(a.cuda() for a in args))  # the module is not moved: it follows its input
        assert gpu.is_cuda
        torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------
# against TensorFlow itself


_TF_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf

a = json.loads(sys.argv[1])
res = {"boxes": [], "eval": None}
for case in a["box_cases"]:
    boxes = tf.constant(np.asarray(case["bbox"], np.float32).reshape(1, -1, 4))
    size = tf.constant([case["height"], case["width"], 3], tf.int32)
    seeds = tf.constant([[case["seed"], i] for i in range(case["n"])], tf.int64)
    def one(seed):
        begin, sz, _ = tf.image.stateless_sample_distorted_bounding_box(
            size, boxes, seed=seed, min_object_covered=case["cover"], aspect_ratio_range=case["aspect"],
            area_range=case["area"], max_attempts=100, use_image_if_no_bounding_boxes=True)
        return tf.stack([begin[1], begin[0], sz[1], sz[0]])
    draw = tf.function(lambda s: tf.map_fn(one, s, fn_output_signature=tf.int32))
    res["boxes"].append(draw(seeds).numpy().tolist())

img = np.asarray(a["image"], np.uint8)
res["color"] = []
for b, s, h, c, order in a["params"]:
    x = tf.constant(img, tf.float32) / 255.0
    x = tf.image.adjust_brightness(x, b)
    if order >= 0.5:
        x = tf.image.adjust_contrast(x, c)
    x = tf.image.adjust_saturation(x, s)
    x = tf.image.adjust_hue(x, h)
    if order < 0.5:
        x = tf.image.adjust_contrast(x, c)
    res["color"].append(tf.clip_by_value(x, 0.0, 1.0).numpy().tolist())

if a["tf_cnn"]:
    sys.path.insert(0, a["tf_cnn"])
    import preprocessing  # tf_cnn_benchmarks' own
    res["eval"] = []
    for w, h in a["eval_sizes"]:
        yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        pix = np.stack([yy, xx, np.zeros_like(xx)], -1).astype(np.float32)  # each pixel holds its (y, x)
        out = preprocessing.eval_image(tf.constant(pix), 224, 224, 0, "nearest").numpy()
        res["eval"].append([out[:, 0, 0].astype(int).tolist(), out[0, :, 1].astype(int).tolist()])
print(json.dumps(res))
"""
TF_CNN = TF_PYTHON.parents[2] / "benchmarks" / "scripts" / "tf_cnn_benchmarks"
_TF_CNN_RANGES = {"aspect": [0.75, 1.33], "area": [0.05, 1.0]}
BOX_CASES = [
    {"width": 500, "height": 375, "bbox": [], "cover": 0.1, "seed": 1, "n": 2000, **_TF_CNN_RANGES},
    {"width": 375, "height": 500, "bbox": [[0.1, 0.2, 0.5, 0.6]], "cover": 0.1, "seed": 2, "n": 300, **_TF_CNN_RANGES},
    {
        "width": 640,
        "height": 427,
        "bbox": [[0.0, 0.0, 0.3, 0.2], [0.6, 0.5, 0.9, 1.0]],
        "cover": 0.5,
        "seed": 3,
        "n": 300,
        **_TF_CNN_RANGES,
    },
    {"width": 300, "height": 7, "bbox": [], "cover": 0.1, "seed": 4, "n": 200, **_TF_CNN_RANGES},
    # Small images and other ranges: rounding pushes areas past both ends of the range, so the
    # one-row-more and one-row-less corrections both run (24 and 9 times in these 600 seeds).
    {
        "width": 31,
        "height": 17,
        "bbox": [],
        "cover": 0.1,
        "seed": 5,
        "n": 300,
        "aspect": [0.3, 3.0],
        "area": [0.1, 0.5],
    },
    {
        "width": 97,
        "height": 61,
        "bbox": [],
        "cover": 0.1,
        "seed": 5,
        "n": 300,
        "aspect": [0.5, 2.0],
        "area": [0.05, 0.3],
    },
]
EVAL_SIZES = [(500, 375), (375, 500), (640, 480), (300, 300), (1000, 201)]


@pytest.fixture(scope="module")
def tf_peer() -> dict:
    """One run of the TensorFlow peer for every comparison here (TensorFlow's import is the cost)."""
    if not TF_PYTHON.exists():
        pytest.skip(f"the TensorFlow peer {TF_PYTHON} is not installed")
    args = {
        "box_cases": BOX_CASES,
        "image": _test_image().tolist(),
        "params": _params().tolist(),
        "eval_sizes": EVAL_SIZES,
        "tf_cnn": str(TF_CNN) if TF_CNN.exists() else "",
    }
    return run_tf(_TF_SCRIPT, args)


def test_tensorflows_boxes_are_reproduced_exactly_from_its_random_stream(tf_peer: dict) -> None:
    """tf.image.stateless_sample_distorted_bounding_box for 3,400 seeds: our algorithm fed
    TensorFlow's Philox stream for each seed gives every box exactly (no bbox, a bbox, two boxes
    with a higher coverage, a thin image that falls back to the whole, small images with other
    ranges)."""
    for case, tf_boxes in zip(BOX_CASES, tf_peer["boxes"], strict=True):
        ours = [
            list(
                P.sample_distorted_box_from(
                    case["width"],
                    case["height"],
                    PhiloxDraws(case["seed"], i),
                    case["bbox"] or None,
                    min_object_covered=case["cover"],
                    aspect_ratio_range=tuple(case["aspect"]),
                    area_range=tuple(case["area"]),
                )
            )
            for i in range(case["n"])
        ]
        assert ours == tf_boxes, case
    assert [0, 0, 300, 7] in tf_peer["boxes"][3]  # the fall-back happened


def test_eval_geometry_is_tf_cnns(tf_peer: dict) -> None:
    """tf_cnn's own eval_image on images whose pixels hold their coordinates, nearest resize:
    the rows and columns it picks are those of our resize shape and crop offset."""
    if tf_peer["eval"] is None:
        pytest.skip(f"tf_cnn_benchmarks' sources are not at {TF_CNN}")
    for (w, h), (ys, xs) in zip(EVAL_SIZES, tf_peer["eval"], strict=True):
        rw, rh, left, top = P.eval_resize_shape(w, h, 224)
        # TensorFlow's legacy nearest resize reads source pixel floor(i * in / out).
        assert ys == np.floor((top + np.arange(224)) * (h / rh)).astype(int).tolist()
        assert xs == np.floor((left + np.arange(224)) * (w / rw)).astype(int).tolist()


def test_colour_ops_match_tensorflows(tf_peer: dict) -> None:
    """TensorFlow 2's adjust_brightness / adjust_saturation / adjust_hue / adjust_contrast in
    tf_cnn's two orders, then the clip, on the same image with the same parameters: the
    reference and the batch module within COLOR_TOL of it."""
    img, params = _test_image(), _params()
    tf_out = np.asarray(tf_peer["color"], dtype=np.float32)
    ref = np.stack([P.distort_color_reference(img, p) for p in params])
    assert np.abs(ref - tf_out).max() <= COLOR_TOL
    assert np.abs(_batch(img, params) - tf_out).max() <= COLOR_TOL
