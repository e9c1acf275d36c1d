"""The recipes' speed line (:class:`stoker.recipes.throughput.Throughput`): the first loop left
out where later ones ran, the examples of every replica against every replica's peak."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stoker.hooks import LoopResult, RunInfo
from stoker.recipes.throughput import Throughput


def _loop(first: int, steps: int, seconds: float, batch: int = 8) -> LoopResult:
    return LoopResult(
        first_step=first,
        steps=steps,
        global_step=first + steps,
        losses=[1.0] * steps,
        values={},
        seconds=seconds,
        input_wait_seconds=0.0,
        examples=batch * steps,
    )


def _run(world_size: int = 1) -> SimpleNamespace:
    return SimpleNamespace(model=torch.nn.Linear(2, 2), info=RunInfo(precision="fp32"), world_size=world_size)


def test_the_first_loop_is_left_out_where_later_ones_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    from stoker.kernels import peak

    monkeypatch.setattr(peak, "device_peak", lambda device, precision: (100.0, "made up"))
    meter = Throughput(flops_per_example=1e9)
    run = _run()
    meter.begin(run)
    meter.after_loop(run, _loop(0, 10, 50.0))  # compilation: slow
    assert meter.examples_per_sec == pytest.approx(80 / 50.0)  # the only loop so far counts
    assert meter.line() == (
        "training: 1.6 examples/sec (steps 1-10, the first loop only (compilation and warm-up included)), "
        "MFU 1.6 % of 0.1 TFLOP/s (made up)"
    )
    meter.after_loop(run, _loop(10, 10, 1.0))
    meter.after_loop(run, _loop(20, 5, 0.5))
    assert meter.examples_per_sec == pytest.approx(120 / 1.5)
    assert meter.line() == "training: 80.0 examples/sec (steps 11-25), MFU 80.0 % of 0.1 TFLOP/s (made up)"


def test_replicas_are_measured_against_all_their_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    from stoker.kernels import peak

    monkeypatch.setattr(peak, "device_peak", lambda device, precision: (100.0, "made up"))
    meter = Throughput(flops_per_example=1e9)
    run = _run(world_size=4)
    meter.begin(run)
    for first in (0, 10):
        meter.after_loop(run, _loop(first, 10, 1.0, batch=40))
    value, gflops, source = meter.mfu()
    assert (value, gflops, source) == (pytest.approx(1.0), 400.0, "made up, x 4 devices")
    assert Throughput().line() is None  # nothing ran
    no_flops = Throughput()
    no_flops.begin(run)
    no_flops.after_loop(run, _loop(0, 10, 1.0))
    assert no_flops.mfu() is None and no_flops.line() == (
        "training: 80.0 examples/sec (steps 1-10, the first loop only (compilation and warm-up included))"
    )
