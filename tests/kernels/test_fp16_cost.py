"""What fp16 training costs on this CPU (stoker.kernels.fp16_cost): factors from an injected
measurement, cached per machine, the line a run says (a warning above 5x, naming the faster
precision), and the real measurement's shape."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from torch import nn

from stoker._cache import cache_dir
from stoker.kernels import fp16_cost as cost_module
from stoker.kernels.fp16_cost import COST_FILE, Fp16Cost, fp16_cost, fp16_note, layer_kinds

# seconds of one forward+backward: a CPU like the Intel Xeon of issue 47 (fp16 conv x100)
XEON = {("conv", "fp32"): 0.001, ("conv", "fp16"): 0.1, ("conv", "bf16"): 0.0012, ("linear", "fp32"): 0.002}
XEON |= {("linear", "fp16"): 0.0024, ("linear", "bf16"): 0.002}


@pytest.fixture(autouse=True)
def _no_memo(monkeypatch):  # the cache directory is the test's own (conftest.py)
    monkeypatch.setattr(cost_module, "_memo", {})


def spell(name: str) -> str:
    return f"precision={name!r}"


def test_factors_come_from_the_measurement_and_are_cached_per_machine(monkeypatch):
    calls = []

    def measure(kind: str, precision: str) -> float:
        calls.append((kind, precision))
        return XEON[(kind, precision)]

    threads = torch.get_num_threads()
    cost = fp16_cost(measure=measure)
    assert cost.fp16 == {"conv": pytest.approx(100.0), "linear": pytest.approx(1.2)}
    assert cost.bf16 == {"conv": pytest.approx(1.2), "linear": pytest.approx(1.0)}
    assert not cost.cached and torch.get_num_threads() == threads  # measured on one thread, then restored
    stored = json.loads((cache_dir() / COST_FILE).read_text())
    (key,) = stored
    assert "|1 threads|" in key and key.endswith("|fp16-cost")
    assert fp16_cost(measure=measure).cached  # from memory
    monkeypatch.setattr(cost_module, "_memo", {})
    again = fp16_cost(measure=lambda k, p: pytest.fail("measured again"))
    assert again.cached and again.fp16 == cost.fp16  # from the file
    (cache_dir() / COST_FILE).write_text("{not json")
    monkeypatch.setattr(cost_module, "_memo", {})
    assert not fp16_cost(measure=measure).cached  # a corrupt cache is ignored and rewritten


def test_a_fast_fp16_is_one_info_line_with_the_bf16_figure():
    cost = Fp16Cost({"conv": 1.3, "linear": 1.1}, {"conv": 1.2, "linear": 1.0}, "2026-12-04", cached=True)
    level, line = fp16_note(cost, ("conv", "linear"), spell)
    assert level == logging.INFO
    assert line == (
        "fp16 on this CPU: a convolution's forward+backward takes 1.3x fp32's time, a linear layer's 1.1x "
        f"(bf16: 1.2x, 1.0x; measured on one thread once per machine, cached in {cache_dir() / COST_FILE})"
    )


def test_a_slow_fp16_is_a_warning_naming_bf16_or_fp32():
    xeon = Fp16Cost({"conv": 100.0, "linear": 1.2}, {"conv": 1.2, "linear": 1.0}, "2026-12-04")
    level, line = fp16_note(xeon, ("conv", "linear"), spell)
    assert level == logging.WARNING
    assert line == (
        "fp16 on this CPU: a convolution's forward+backward takes 100x fp32's time, a linear layer's 1.2x "
        f"(bf16: 1.2x, 1.0x; measured on one thread once per machine, now cached in {cache_dir() / COST_FILE}); "
        "precision='bf16' (fp32's exponent range, no loss scaling) trains faster here (this run stays in fp16, "
        "as asked)"
    )
    assert fp16_note(xeon, ("linear",), spell)[0] == logging.INFO  # a model without convolutions: not slow
    no_fast_bf16 = Fp16Cost({"conv": 40.0, "linear": 30.0}, {"conv": 7.0, "linear": 1.0}, "2026-12-04")
    level, line = fp16_note(no_fast_bf16, ("conv",), lambda name: f"--precision={name}")
    assert level == logging.WARNING and line.endswith(
        "; --precision=fp32 trains faster here (this run stays in fp16, as asked)"
    )


def test_layer_kinds_are_those_the_model_has():
    assert layer_kinds(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))) == ("conv", "linear")
    assert layer_kinds(nn.Linear(2, 2)) == ("linear",)
    assert layer_kinds(nn.Conv1d(2, 2, 1)) == ("conv",)
    assert layer_kinds(nn.ReLU()) == ("conv", "linear")  # neither: both said


def test_the_real_measurement_times_every_kind_and_precision():
    seconds = cost_module.measure_all(budget_s=0.05)
    assert sorted(seconds) == ["conv", "linear"]
    for figures in seconds.values():
        assert sorted(figures) == ["bf16", "fp16", "fp32"]
        assert all(0 < s < 5 and math.isfinite(s) for s in figures.values())


def test_unmeasured_machines_measure_for_real():
    cost = fp16_cost()
    assert not cost.cached and set(cost.fp16) == set(cost.bf16) == {"conv", "linear"}
    assert all(v > 0 and math.isfinite(v) for v in (*cost.fp16.values(), *cost.bf16.values()))


def test_measuring_leaves_the_random_stream_alone():
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    cost_module.measure_all(budget_s=0.01)
    assert torch.equal(torch.rand(4), expected)  # a run that measures at its start draws what it would have
