"""tf_cnn_benchmarks' colour distortions (``stoker.data.images.color``): the parameters drawn
from each example's uniforms, the batch op held to the op-by-op reference
(``stoker.data.images.tf_reference``) and both to TensorFlow's ops within a stated tolerance.

The TensorFlow comparison runs the peer (``~/.cache/stoker-peers/tfvenv``) in a subprocess and
skips cleanly without it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.images import COLOR_TOL, color_test_image, color_test_params, distorted_01
from helpers.tf_random import TF_PYTHON, run_tf
from stoker.data.images.color import _distort, color_params, distort_color_batch
from stoker.data.images.crops import COLOR_PARAMS, COLOR_SLICE, TRAIN_DRAWS
from stoker.data.images.tf_reference import distort_color_reference


def test_color_params_map_the_uniforms_onto_tf_cnns_ranges() -> None:
    u = np.zeros((2, TRAIN_DRAWS))
    u[0, COLOR_SLICE] = [0.0, 0.5, 0.75, 0.25, 0.75]
    u[1, COLOR_SLICE] = [1 - 2**-20, 0.0, 0.0, 1 - 2**-20, 0.25]
    p = color_params(u)
    assert p.dtype == np.float32 and p.shape == (2, COLOR_PARAMS)
    np.testing.assert_allclose(p[0], [-32 / 255, 1.0, 0.1, 0.75, 1.0], rtol=1e-6)
    np.testing.assert_allclose(p[1], [32 / 255, 0.5, -0.2, 1.5, 0.0], rtol=1e-5)
    np.testing.assert_array_equal(color_params(u[0]), p[0])


@pytest.mark.parametrize("channels_last", [True, False])
def test_batch_colour_ops_match_the_reference(channels_last: bool) -> None:
    img, params = color_test_image(), color_test_params()
    assert {0.0, 1.0} <= set(params[:, 4].tolist())  # both orders are exercised
    ref = np.stack([distort_color_reference(img, p) for p in params])
    got = distorted_01(img, params, channels_last)
    assert np.abs(got - ref).max() <= COLOR_TOL
    # The identity parameters give back the image (up to float rounding).
    np.testing.assert_allclose(got[-1], img / np.float32(255), atol=1e-6)
    # And the ops do something: every other row differs from the image by several levels.
    assert (np.abs(got[:-1] - img / 255).max(axis=(1, 2, 3)) > 8 / 255).all()


def test_the_accelerator_path_merging_orders_with_where_matches_the_cpu_path() -> None:
    """On a GPU the batch goes at once, the two orders merged by ``where``; run that path on the
    CPU (the private step the accelerator uses) against the chunked CPU path."""
    img, params = color_test_image(), torch.from_numpy(color_test_params())
    x = torch.from_numpy(img)[None].repeat(len(params), 1, 1, 1).permute(0, 3, 1, 2).contiguous().float() / 255
    merged = _distort(x.clone(), params, (params[:, 4] >= 0.5).view(-1, 1, 1, 1))
    torch.testing.assert_close(merged, distort_color_batch(x, params), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------
# against TensorFlow itself


_TF_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf

a = json.loads(sys.argv[1])
img = np.asarray(a["image"], np.uint8)
res = {"color": []}
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
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def tf_peer() -> dict:
    """One run of the TensorFlow peer (TensorFlow's import is the cost)."""
    if not TF_PYTHON.exists():
        pytest.skip(f"the TensorFlow peer {TF_PYTHON} is not installed")
    return run_tf(_TF_SCRIPT, {"image": color_test_image().tolist(), "params": color_test_params().tolist()})


def test_colour_ops_match_tensorflows(tf_peer: dict) -> None:
    """TensorFlow 2's adjust_brightness / adjust_saturation / adjust_hue / adjust_contrast in
    tf_cnn's two orders, then the clip, on the same image with the same parameters: the
    reference and the batch module within COLOR_TOL of it."""
    img, params = color_test_image(), color_test_params()
    tf_out = np.asarray(tf_peer["color"], dtype=np.float32)
    ref = np.stack([distort_color_reference(img, p) for p in params])
    assert np.abs(ref - tf_out).max() <= COLOR_TOL
    assert np.abs(distorted_01(img, params) - tf_out).max() <= COLOR_TOL
