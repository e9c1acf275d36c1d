"""stoker bench: statistics, output lines, learning-rate schedules and results files, checked
against hand computation on fixed inputs."""

from __future__ import annotations

import csv
import json
import math
import re

import numpy as np
import pytest

from stoker.bench import BenchConfig, FlagError, latency_stats, perf_timing, write_results
from stoker.bench.optim import learning_rate_fn, parse_piecewise_schedule
from stoker.bench.stats import (
    display_due,
    format_accuracy,
    format_latencies,
    format_step_line,
    format_total,
    step_header,
)

# The expressions tf_cnn_benchmarks' own tests and log parsers use.
STEP_RE = re.compile(r"(\d+)\timages/sec: ([\d.]+) \+/- ([\d.]+) \(jitter = ([\d.]+)\)\t([\d.]+)")
TOTAL_RE = re.compile(r"total images/sec: ([\d.]+)")


def test_perf_timing_by_hand() -> None:
    # Steps of 10 images taking 0.1, 0.2, 0.1, 0.4 s: speeds 100, 50, 100, 25 images/sec.
    t = perf_timing(10, [0.1, 0.2, 0.1, 0.4])
    assert t.mean == pytest.approx(10 / 0.2)  # images over time, not the mean of the speeds (68.75)
    # population std of the speeds: sqrt(mean((s - 68.75)^2)) = sqrt(1054.6875); standard error over 4
    assert t.uncertainty == pytest.approx(math.sqrt(1054.6875) / 2)
    # median speed 75, absolute deviations 25, 25, 25, 50 -> median 25, scaled to a normal's std
    assert t.jitter == pytest.approx(1.4826 * 25)


def test_perf_timing_of_constant_steps_has_no_spread() -> None:
    t = perf_timing(32, [0.5] * 7)
    assert (t.mean, t.uncertainty, t.jitter) == (pytest.approx(64.0), 0.0, 0.0)
    assert perf_timing(32, []).mean == 0.0


def test_step_line_parses_with_the_seed_regex() -> None:
    line = format_step_line(10, perf_timing(10, [0.1, 0.2, 0.1, 0.4]), 7.59312)
    m = STEP_RE.fullmatch(line)
    assert m is not None, line
    assert m.groups() == ("10", "50.0", "16.2", "37.1", "7.593")
    with_acc = format_step_line(1, perf_timing(8, [0.5]), 0.0, (0.25, 0.625))
    assert with_acc == "1\timages/sec: 16.0 +/- 0.0 (jitter = 0.0)\t0.000\t0.250\t0.625"
    assert step_header(False) == "Step\tImg/sec\ttotal_loss"
    assert step_header(True) == "Step\tImg/sec\ttotal_loss\ttop_1_accuracy\ttop_5_accuracy"


def test_total_block_and_accuracy_line() -> None:
    block = format_total(1234.5678)
    assert block == ["-" * 64, "total images/sec: 1234.57", "-" * 64]
    assert TOTAL_RE.fullmatch(block[1]).group(1) == "1234.57"  # type: ignore[union-attr]
    assert format_accuracy(0.5, 0.875, 128) == "Accuracy @ 1 = 0.5000 Accuracy @ 5 = 0.8750 [128 examples]"


@pytest.mark.parametrize(
    ("before", "after", "every", "due"),
    [
        (0, 1, 10, True),
        (1, 2, 10, False),
        (8, 9, 10, False),
        (9, 10, 10, True),
        (10, 11, 10, False),
        (0, 4, 10, True),
        (8, 12, 10, True),
        (12, 16, 10, False),
        (5, 5, 10, False),
    ],
)
def test_progress_lines_at_step_one_and_every_n(before: int, after: int, every: int, due: bool) -> None:
    assert display_due(before, after, every) is due


def test_latency_percentiles_by_hand() -> None:
    stats = latency_stats([i / 1000 for i in range(1, 101)])  # 1 ms .. 100 ms
    assert stats.count == 100
    assert stats.mean_ms == pytest.approx(50.5)
    # linear interpolation between order statistics: rank 0.99 * 99 = 98.01 -> 99 + 0.01
    assert stats.p99_ms == pytest.approx(99.01)
    assert stats.p999_ms == pytest.approx(99.901)
    assert stats.max_ms == pytest.approx(100.0)
    assert format_latencies(stats) == (
        "Latencies - avg:  50.5000, 99th percentile:  99.0100, 99.9th percentile:  99.9010, max: 100.0000"
    )


def test_piecewise_schedule() -> None:
    assert parse_piecewise_schedule("0.3;10;0.2;25;0.1") == ([10, 25], [0.3, 0.2, 0.1])
    cfg = BenchConfig(piecewise_learning_rate_schedule="0.3;10;0.2;25;0.1")
    lr = learning_rate_fn(cfg, batches_per_epoch=2.0)
    assert lr is not None
    # boundaries int(E * 2) - 1 = 19, 49: rate i while step <= boundary i
    assert [lr(s) for s in (0, 19, 20, 49, 50, 1000)] == [0.3, 0.3, 0.2, 0.2, 0.1, 0.1]
    for bad in ("0.3;10", "0.3;x;0.1", "a;10;0.1", "0.3;10;0.2;5;0.1"):
        with pytest.raises(ValueError):
            parse_piecewise_schedule(bad)


def test_exponential_decay_floor_and_warmup() -> None:
    cfg = BenchConfig(
        init_learning_rate=1.0, num_epochs_per_decay=1, learning_rate_decay_factor=0.5, minimum_learning_rate=0.3
    )
    lr = learning_rate_fn(cfg, batches_per_epoch=10.0)
    assert lr is not None
    assert [lr(s) for s in (0, 9, 10, 19, 20, 100)] == [1.0, 1.0, 0.5, 0.5, 0.3, 0.3]  # staircase, floored
    warm = learning_rate_fn(
        BenchConfig(init_learning_rate=0.8, num_learning_rate_warmup_epochs=2), batches_per_epoch=5.0
    )
    assert warm is not None
    assert [warm(s) for s in (0, 5, 9, 10, 50)] == pytest.approx([0.0, 0.4, 0.72, 0.8, 0.8])
    assert learning_rate_fn(BenchConfig(init_learning_rate=0.1), batches_per_epoch=5.0) is None  # constant


@pytest.mark.parametrize(
    ("fields", "flags"),
    [
        ({"forward_only": True, "eval": True, "train_dir": "x"}, ("forward_only", "eval")),
        ({"num_batches": 5, "num_epochs": 1.0}, ("num_batches", "num_epochs")),
        ({"stop_at_top_1_accuracy": 0.5}, ("stop_at_top_1_accuracy", "eval_during_training_every_n_steps")),
        (
            {"piecewise_learning_rate_schedule": "0.1;1;0.01", "init_learning_rate": 0.1},
            ("piecewise_learning_rate_schedule", "init_learning_rate"),
        ),
        (
            {"learning_rate_decay_factor": 0.5},
            ("num_epochs_per_decay", "learning_rate_decay_factor", "init_learning_rate"),
        ),
        ({"fp16_enable_auto_loss_scale": True}, ("fp16_enable_auto_loss_scale", "precision")),
        ({"eval": True}, ("eval", "train_dir")),
        ({"mode": "inference", "forward_only": True}, ("forward_only", "mode")),
        ({"iterations": 5}, ("iterations", "mode")),
        ({"optimizer": "adagrad"}, ("optimizer",)),
        ({"batch_size": -1}, ("batch_size",)),  # 0 is the model's default, as in tf_cnn_benchmarks
    ],
)
def test_config_refuses_bad_combinations_naming_the_flags(fields: dict[str, object], flags: tuple[str, ...]) -> None:
    with pytest.raises(FlagError) as err:
        BenchConfig(**fields)  # type: ignore[arg-type]
    assert err.value.flags == flags
    assert f"--{flags[0]}" in str(err.value)


def test_results_files(tmp_path) -> None:  # noqa: ANN001
    result = {"model": "trivial", "images_per_sec": 123.5, "mode": "training", "losses": [1.0, 0.5], "num_steps": 2}
    js = write_results(tmp_path / "r.json", result)
    assert json.loads(js.read_text())["losses"] == [1.0, 0.5]
    path = tmp_path / "sub" / "r.csv"
    write_results(path, result)
    write_results(path, {**result, "images_per_sec": 99.0})
    rows = list(csv.DictReader(path.open()))
    assert [float(r["images_per_sec"]) for r in rows] == [123.5, 99.0]  # appended under one header
    assert rows[0]["model"] == "trivial" and "losses" not in rows[0]
    assert np.isfinite(float(rows[1]["num_steps"]))


def test_an_mfu_above_100_percent_of_a_measured_peak_says_why():
    from stoker.bench.report import summary_lines

    base = {
        "mode": "training",
        "num_steps": 2,
        "images_per_sec": 10.0,
        "gflop_per_image": 3.0,
        "gflop_per_image_forward": 1.0,
        "achieved_gflops": 30.0,
        "peak_gflops": 25.0,
    }
    source = "oneDNN conv3x3 channels_last fp32, measured"
    measured = summary_lines({**base, "device": "cpu", "peak_source": source, "mfu": 1.2})
    given = summary_lines({**base, "device": "cpu", "peak_source": "--peak_tflops", "mfu": 1.2})
    normal = summary_lines({**base, "device": "cpu", "peak_source": source, "mfu": 0.5})
    on_gpu = summary_lines({**base, "device": "cuda:0", "peak_source": source, "mfu": 1.2})
    # On a CPU a figure above 100 % always says why, naming what set the peak.
    assert measured[-1].startswith("MFU: 120.0 % (above 100 %: the peak is the fastest kernel measured")
    assert given[-1] == "MFU: 120.0 % (above 100 %: the peak is --peak_tflops, below what this run reached)"
    assert normal[-1] == "MFU: 50.0 %" and on_gpu[-1] == "MFU: 120.0 %"
