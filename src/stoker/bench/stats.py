"""Throughput and latency statistics, and the text lines tf_cnn_benchmarks prints for them.

Definitions (the same as tf_cnn_benchmarks' ``get_perf_timing``), for per-step wall times
``t_i`` of steps of ``B`` images:

- speed ``s_i = B / t_i``, the images/sec of step ``i``;
- **mean** ``B / mean(t)``: the harmonic mean of the speeds, i.e. images over time, so a
  slow step weighs as much as the time it took;
- **uncertainty** ``std(s) / sqrt(n)``: the standard error of the mean speed (population
  standard deviation, numpy's default);
- **jitter** ``1.4826 * median(|s - median(s)|)``: the median absolute deviation scaled to
  match the standard deviation of a normal distribution, a spread that ignores outliers.

With ``iterations_per_loop = N > 1`` one sample is one device loop: ``t_i`` is the loop's
wall time divided by its steps, so the statistics describe loops, not single steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The scale that makes the median absolute deviation of normal data equal its standard deviation.
MAD_TO_STD = 1.4826
DASHES = "-" * 64
LOSS_DIGITS = 3


@dataclass(frozen=True, slots=True)
class PerfTiming:
    """Summary of per-step speeds: ``mean``, ``uncertainty`` and ``jitter`` in images/sec."""

    mean: float
    uncertainty: float
    jitter: float


def perf_timing(batch_size: int, step_times: Sequence[float]) -> PerfTiming:
    """Mean, uncertainty and jitter of the speeds of steps of ``batch_size`` images (see module doc).

    Plain Python rather than numpy: it runs between device loops at every progress line, and
    for the few hundred samples of a benchmark it is several times faster than building arrays.
    """
    n = len(step_times)
    if n == 0:
        return PerfTiming(0.0, 0.0, 0.0)
    speeds = [batch_size / t for t in step_times]
    mean = batch_size * n / math.fsum(step_times)
    mean_speed = math.fsum(speeds) / n
    std = math.sqrt(math.fsum((s - mean_speed) ** 2 for s in speeds) / n)  # population std, as numpy's
    mid = _median(speeds)
    jitter = MAD_TO_STD * _median([abs(s - mid) for s in speeds])
    return PerfTiming(mean, std / math.sqrt(n), jitter)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def format_perf(timing: PerfTiming) -> str:
    """``images/sec: M +/- U (jitter = J)``."""
    return f"images/sec: {timing.mean:.1f} +/- {timing.uncertainty:.1f} (jitter = {timing.jitter:.1f})"


def format_step_line(step: int, timing: PerfTiming, loss: float, accuracy: tuple[float, float] | None = None) -> str:
    """One progress line of a training or forward-only run: step, speed, loss (and accuracies)."""
    line = f"{step}\t{format_perf(timing)}\t{loss:.{LOSS_DIGITS}f}"
    if accuracy is not None:
        line += f"\t{accuracy[0]:.{LOSS_DIGITS}f}\t{accuracy[1]:.{LOSS_DIGITS}f}"
    return line


def step_header(with_accuracy: bool, loss_type: str = "total_loss") -> str:
    """The column header printed before the first progress line (``loss_type``: ``--loss_type_to_report``)."""
    return f"Step\tImg/sec\t{loss_type}" + ("\ttop_1_accuracy\ttop_5_accuracy" if with_accuracy else "")


def format_total(images_per_sec: float) -> list[str]:
    """The closing block: dashes, ``total images/sec: X``, dashes."""
    return [DASHES, f"total images/sec: {images_per_sec:.2f}", DASHES]


def display_due(steps_before: int, steps_after: int, display_every: int) -> bool:
    """Whether a progress line is due after steps ``steps_before + 1 .. steps_after``.

    As in tf_cnn_benchmarks: after the first step and after every multiple of
    ``display_every``; with device loops, at the first loop boundary at or past them.
    """
    if steps_after <= steps_before:
        return False
    return steps_before == 0 or steps_after // display_every > steps_before // display_every


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Per-call latencies in milliseconds: mean, 99th and 99.9th percentiles, maximum."""

    count: int
    mean_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float


def latency_stats(latencies_s: Sequence[float]) -> LatencyStats:
    """Statistics of latencies given in seconds (percentiles interpolate linearly, as numpy's)."""
    ms = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    if ms.size == 0:
        return LatencyStats(0, 0.0, 0.0, 0.0, 0.0)
    return LatencyStats(
        count=int(ms.size),
        mean_ms=float(ms.mean()),
        p99_ms=float(np.percentile(ms, 99)),
        p999_ms=float(np.percentile(ms, 99.9)),
        max_ms=float(ms.max()),
    )


def format_latencies(stats: LatencyStats) -> str:
    """The latency line of the inference benchmark (values in milliseconds)."""
    return (
        f"Latencies - avg: {stats.mean_ms:8.4f}, 99th percentile: {stats.p99_ms:8.4f}, "
        f"99.9th percentile: {stats.p999_ms:8.4f}, max: {stats.max_ms:8.4f}"
    )


def format_accuracy(top1: float, top5: float, examples: int) -> str:
    """The evaluation result line."""
    return f"Accuracy @ 1 = {top1:.4f} Accuracy @ 5 = {top5:.4f} [{examples} examples]"
