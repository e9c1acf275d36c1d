"""What tf_cnn_benchmarks-style preprocessing costs on the CPU (``stoker.data.images``).

Per batch (``--batch`` x ``--size`` x ``--size`` uint8 images, a smooth colour field with
noise), interleaved round by round so machine noise hits every variant alike, the median
milliseconds of

- ``normalize_images``: the old loader-side cast + normalise (reference);
- ``ImagePreprocessor``: the cast + normalise of ``--nodistortions`` (channels_last output);
- ``ImagePreprocessor distortions``: plus tf_cnn's colour distortions (``--distortions``);

and the per-example host work of a training batch: ``example_uniforms(..., TRAIN_DRAWS)``,
``sample_distorted_box`` for a 500x375 image and ``color_params``.

``--tensorflow`` also times the same colour ops (and the cast + normalise alone) in the
TensorFlow peer (``$PEERS_DIR/tfvenv``, default ``~/.cache/stoker-peers``), per image in a
``tf.function`` over the batch, one intra-op thread, best of 3, in a subprocess.

Freed host memory is kept for reuse, as ``stoker bench`` keeps it
(:func:`stoker.keep_freed_host_memory`; TensorFlow's allocator keeps its memory too), so a
variant's time is its arithmetic, not the page faults of a fresh 38 MB buffer each call
(``--fresh_host_memory`` measures with glibc's defaults instead).

``run()`` returns a dict; ``main()`` prints it, with the machine load and thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from stoker import keep_freed_host_memory
from stoker.data.base import example_uniforms
from stoker.data.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    TRAIN_DRAWS,
    ImagePreprocessor,
    color_params,
    normalize_images,
    sample_distorted_box,
)


def _images(batch: int, size: int) -> torch.Tensor:
    rng = np.random.default_rng(0)
    yy, xx = np.meshgrid(np.linspace(0, 1, size), np.linspace(0, 1, size), indexing="ij")
    base = np.stack([xx, yy, 1 - xx * yy], -1) * 255
    return torch.from_numpy(
        np.stack([(base + rng.normal(0, 20, base.shape)).clip(0, 255) for _ in range(batch)]).astype(np.uint8)
    )


def _ms(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def run(*, batch: int = 64, size: int = 224, rounds: int = 7, threads: int = 1) -> dict[str, float]:
    """Median milliseconds per batch of each variant (see the module docstring)."""
    torch.set_num_threads(threads)
    images = _images(batch, size)
    u = example_uniforms(0, 0, np.arange(batch), TRAIN_DRAWS)
    color = torch.from_numpy(color_params(u))
    plain, distorted = ImagePreprocessor(), ImagePreprocessor(distortions=True)
    variants: dict[str, Callable[[], object]] = {
        "normalize_images ms/batch": lambda: normalize_images(images, IMAGENET_MEAN, IMAGENET_STD),
        "ImagePreprocessor ms/batch": lambda: plain(images),
        "ImagePreprocessor distortions ms/batch": lambda: distorted(images, color),
        "example_uniforms(TRAIN_DRAWS) ms/batch": lambda: example_uniforms(0, 1, np.arange(batch), TRAIN_DRAWS),
        "sample_distorted_box ms/batch": lambda: [sample_distorted_box(500, 375, r) for r in u],
        "color_params ms/batch": lambda: color_params(u),
    }
    for fn in variants.values():  # warm-up: allocator, first-call costs
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, fn in variants.items():
            times[k].append(_ms(fn))
    return {k: statistics.median(v) for k, v in times.items()}


_TF_TIMING = """
import json, sys, time
import numpy as np
import tensorflow as tf
a = json.loads(sys.argv[1])
tf.config.threading.set_intra_op_parallelism_threads(a["threads"])
tf.config.threading.set_inter_op_parallelism_threads(1)
rng = np.random.default_rng(0)
n, size = a["batch"], a["size"]
imgs = tf.constant(rng.integers(0, 256, (n, size, size, 3)).astype(np.uint8))
params = tf.constant(np.stack([rng.uniform(-0.12, 0.12, n), rng.uniform(0.5, 1.5, n), rng.uniform(-0.2, 0.2, n),
                               rng.uniform(0.5, 1.5, n), np.arange(n) % 2], 1).astype(np.float32))
def distorted(args):
    img, p = args
    x = tf.image.adjust_brightness(tf.cast(img, tf.float32) / 255.0, p[0])
    def order0(x=x):
        return tf.image.adjust_contrast(tf.image.adjust_hue(tf.image.adjust_saturation(x, p[1]), p[2]), p[3])
    def order1(x=x):
        return tf.image.adjust_hue(tf.image.adjust_saturation(tf.image.adjust_contrast(x, p[3]), p[1]), p[2])
    return tf.clip_by_value(tf.cond(p[4] < 0.5, order0, order1), 0.0, 1.0) * 2 - 1
def plain(img):
    return tf.cast(img, tf.float32) / 127.5 - 1
f32 = tf.float32
variants = {
    "TensorFlow distortions ms/batch": tf.function(
        lambda: tf.map_fn(distorted, (imgs, params), fn_output_signature=f32)),
    "TensorFlow cast+normalise ms/batch": tf.function(lambda: tf.map_fn(plain, imgs, fn_output_signature=f32)),
}
out = {}
for name, fn in variants.items():
    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    out[name] = min(times) * 1e3
print(json.dumps(out))
"""


def run_tensorflow(*, batch: int = 64, size: int = 224, threads: int = 1) -> dict[str, float]:
    """The TensorFlow peer's milliseconds per batch for the same work (see the module docstring)."""
    python = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "stoker-peers")) / "tfvenv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"--tensorflow: the TensorFlow peer {python} is not installed (see benchmarks/peers/README.md)"
        )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    args = json.dumps({"batch": batch, "size": size, "threads": threads})
    r = subprocess.run([str(python), "-c", _TF_TIMING, args], capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tensorflow", action="store_true", help="also time the same ops in the TensorFlow peer")
    parser.add_argument(
        "--fresh_host_memory", action="store_true", help="glibc's default allocator (freed memory returned)"
    )
    args = parser.parse_args()
    kept = not args.fresh_host_memory and keep_freed_host_memory()
    print(
        f"load {os.getloadavg()}, torch threads {args.threads}, batch {args.batch}x{args.size}x{args.size}, "
        f"host memory {'kept for reuse' if kept else 'glibc defaults'}"
    )
    result = run(batch=args.batch, size=args.size, rounds=args.rounds, threads=args.threads)
    for k, v in result.items():
        print(f"{k:42s} {v:9.2f}")
    if args.tensorflow:
        result.update(run_tensorflow(batch=args.batch, size=args.size, threads=args.threads))
        for k in ("TensorFlow distortions ms/batch", "TensorFlow cast+normalise ms/batch"):
            print(f"{k:42s} {result[k]:9.2f}")
    base = result["ImagePreprocessor ms/batch"]
    print(f"distortions / no distortions: {result['ImagePreprocessor distortions ms/batch'] / base:.1f}x")


if __name__ == "__main__":
    main()
