"""Where the CPU of ``stoker bench --model=trivial --data_dir`` goes, and how far that work could go.

Issue 25 asks for real-image training at >= 1.5x tf_cnn_benchmarks on the same images and cores.
This script splits one training batch's CPU work into its parts, each measured on its own on one
thread, so that the figure of the run can be read against them:

- **decode**: libjpeg's crop-window decode, the call ``stoker`` and ``tf.image.decode_and_crop_jpeg``
  both make (the same library, IDCT and window); per image, timed around the C call;
- **resize**: torch's uint8 bilinear resize of the window to 227x227, timed around its call;
- **rest of the image**: file read, header, crop box, flip and Python (the whole per-image call
  less the two above);
- **step**: the training step alone on one thread (``--datasets_repeat_cached_sample``: one real
  uint8 batch repeated), with its largest operators (``--ops``).

Then, in the same run, interleaved round by round: ``stoker bench --model=trivial --data_dir`` on
its default two busy threads, and with ``--tensorflow`` tf_cnn_benchmarks on the TFRecords of the
same images (``benchmarks/cnn.py``'s runners). It prints the work of a batch, the CPU the run
spent on one (cores x wall time), the rate both cores would reach doing nothing but that work
(the **ceiling**), each against TensorFlow, and how much of the work 1.5x would have to remove.

    python benchmarks/real_image_budget.py --data_dir ~/.cache/stoker-bench/imagenet-like-1280 \\
        --rounds 3 --tensorflow --ops

``--generate N`` first fills ``--data_dir`` with N ImageNet-shaped JPEGs (as ``cnn.py`` does).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import cnn  # noqa: E402  (a sibling script: its stoker and TensorFlow runners)

from stoker.bench import run_benchmark  # noqa: E402
from stoker.data import ReadOptions  # noqa: E402
from stoker.data.images import ImageOptions, image_folder  # noqa: E402
from stoker.data.images import decoders as jpeg_module  # noqa: E402
from stoker.kernels.machine import usable_cores  # noqa: E402

BATCH, TARGET = cnn.BATCH, cnn.REAL_TARGET_OVER_TF
SIZE = 227  # trivial's input size


class Timed:
    """Wraps ``fn``, adding the seconds of each call to ``seconds``."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def per_image_ms(data_dir: str, images: int) -> dict[str, float]:
    """ms per training image on one thread: the whole per-image call, its window decode and its resize."""
    torch.set_num_threads(1)
    source = image_folder(
        data_dir,
        read=ReadOptions(batch_size=BATCH),
        image=ImageOptions(image_size=SIZE, crop="tf_cnn", output="uint8"),
        train=True,
    )
    if not hasattr(source.decoder, "decode_window"):
        raise SystemExit(f"the window decoder is not available here ({source.decoder_name}): nothing to split")
    decode = Timed(source.decoder.decode_window)
    resize = Timed(jpeg_module.resize_uint8)
    source.decoder.decode_window = decode  # type: ignore[attr-defined]  # an instance attribute shadows the method
    jpeg_module.resize_uint8 = resize
    try:
        index = np.arange(images) % source.num_examples
        draws = source.examples.uniforms(0, index)
        out = torch.empty((SIZE, SIZE, 3), dtype=torch.uint8)
        for j in range(min(BATCH, len(index))):  # warm the caches and the library
            source._decode_into(int(index[j]), None if draws is None else draws[j], j, out)
        decode.seconds = resize.seconds = 0.0
        start = time.perf_counter()
        for j, i in enumerate(index):
            source._decode_into(int(i), None if draws is None else draws[j], j, out)
        whole = time.perf_counter() - start
    finally:  # both put back as they were
        del source.decoder.decode_window
        jpeg_module.resize_uint8 = resize.fn
    n = len(index)
    return {
        "decode": decode.seconds / n * 1e3,
        "resize": resize.seconds / n * 1e3,
        "rest": (whole - decode.seconds - resize.seconds) / n * 1e3,
    }


def step_ms(case: cnn.Case, data_dir: str, ops: bool) -> tuple[float, list[tuple[str, float]]]:
    """ms per training step of ``case`` on one thread, one real uint8 batch repeated; with ``ops``
    the largest operators (ms per step, self time) from a second, profiled run."""
    torch.set_num_threads(1)
    # The benchmark's own flags (cnn.py), one batch read and then repeated: the step without decoding.
    cfg = cnn.stoker_config(case, data_dir=data_dir).replace(datasets_repeat_cached_sample=True)
    ms = BATCH / run_benchmark(cfg, log=lambda line: None)["images_per_sec"] * 1e3
    top: list[tuple[str, float]] = []
    if ops:
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415  (only with --ops)

        steps = 60
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run_benchmark(cfg.replace(num_batches=steps - cfg.num_warmup_batches), log=lambda line: None)
        # Operators called at least once a step: the model's initialisation is not the step.
        events = [e for e in prof.key_averages() if e.count >= steps]
        events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
        top = [(e.key, e.self_cpu_time_total / 1e3 / steps) for e in events[:8]]
    return ms, top


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=str(Path.home() / ".cache" / "stoker-bench" / "imagenet-like-1280"))
    parser.add_argument("--generate", type=int, help="first fill --data_dir with N ImageNet-shaped JPEGs")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--num_batches", type=int, default=300, help="timed batches of each run (default 300)")
    parser.add_argument("--images", type=int, default=960, help="images of the per-image split (default 960)")
    parser.add_argument("--tensorflow", action="store_true", help="also tf_cnn_benchmarks on the TFRecords")
    parser.add_argument("--ops", action="store_true", help="print the step's largest operators")
    args = parser.parse_args()
    if args.rounds < 1 or args.num_batches < 1 or args.images < 1:
        parser.error("--rounds, --num_batches and --images must be >= 1")
    data_dir = str(Path(args.data_dir).expanduser())
    if args.generate:
        from input_pipeline import make_imagenet_like  # noqa: PLC0415  (a sibling script)

        make_imagenet_like(Path(data_dir), args.generate)
    if not Path(data_dir).is_dir():
        parser.error(f"--data_dir {data_dir} is not a folder (--generate N fills it)")
    cnn.DATA_DIR = data_dir
    cores = usable_cores()
    case = cnn.CASES["trivial"].with_batches(args.num_batches)
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}")
    print(f"before: {cnn.uptime()}")
    parts: dict[str, list[float]] = {"decode": [], "resize": [], "rest": []}
    steps: list[float] = []
    runs: list[float] = []
    tf: list[float] = []
    top: list[tuple[str, float]] = []
    for r in range(args.rounds):
        for key, value in per_image_ms(data_dir, args.images).items():
            parts[key].append(value)
        ms, ops = step_ms(case, data_dir, args.ops and r == 0)
        steps.append(ms)
        top = top or ops
        runs.append(cnn.measure_in_child("stoker", case, cores))
        if args.tensorflow:
            tf.append(cnn.measure_in_child("tensorflow", case, cores))
        line = ", ".join(f"{k} {v[-1]:.3f}" for k, v in parts.items())
        extra = f", tensorflow {tf[-1]:.1f}" if tf else ""
        print(f"  round {r + 1}: per image {line} ms; step {ms:.2f} ms; stoker {runs[-1]:.1f}{extra} images/sec")
    print(f"after:  {cnn.uptime()}")

    med = {k: statistics.median(v) for k, v in parts.items()}
    step = statistics.median(steps)
    rate = statistics.median(runs)
    work = {f"{k} (x{BATCH})": v * BATCH for k, v in med.items()} | {"step": step}
    total = sum(work.values())
    wall = BATCH / rate * 1e3  # ms a batch in the run
    spent = cores * wall
    ceiling = cores * BATCH / total * 1e3
    print(f"\nOne batch of {BATCH}, ms of one core (medians of {args.rounds} rounds):")
    print("| part | ms | share |\n|---|---|---|")
    for name, ms in work.items():
        print(f"| {name} | {ms:.1f} | {ms / total:.0%} |")
    print(f"| **work** | **{total:.1f}** | |")
    print(f"| the run: {cores} cores x {wall:.1f} ms wall | {spent:.1f} | {total / spent:.0%} of it is the work |")
    if top:
        print("\nThe step's largest operators (self time, ms a step):")
        for name, ms in top:
            print(f"  {ms:6.2f}  {name}")
    print(f"\nstoker {rate:.1f} images/sec; ceiling (both cores on nothing but the work) {ceiling:.1f}")
    if tf:
        tf_rate = statistics.median(tf)
        paired = statistics.median(s / t for s, t in zip(runs, tf, strict=True))
        need = cores * BATCH / (TARGET * tf_rate) * 1e3  # ms of core time a batch may cost at the target
        print(f"tensorflow {tf_rate:.1f} images/sec: stoker {paired:.2f}x (per-round median), ", end="")
        print(f"ceiling {ceiling / tf_rate:.2f}x")
        over_run, over_work = 1 - need / spent, max(0.0, 1 - need / total)
        print(
            f"{TARGET:.2f}x needs <= {need:.1f} ms of core time a batch: the run spends {spent:.1f} "
            f"({over_run:.0%} to remove), the work alone is {total:.1f} ({over_work:.0%} of it to remove)"
        )


if __name__ == "__main__":
    main()
