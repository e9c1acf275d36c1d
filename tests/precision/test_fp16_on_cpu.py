"""fp16 on a CPU says what it costs here (stoker.kernels.fp16_cost) when training starts, in one
line: a warning naming bf16 where fp16's forward+backward is many times fp32's (an Intel Xeon
with avx512_fp16: x100), and the run stays in fp16 as asked."""

from __future__ import annotations

import logging

import pytest
import torch

from helpers.tiny import make_data, make_estimator, state_equal, train_input
from stoker._cache import cache_dir
from stoker.engine import model_state
from stoker.kernels import fp16_cost as cost_module
from stoker.kernels.fp16_cost import COST_FILE, Fp16Cost

XEON = Fp16Cost({"conv": 100.0, "linear": 97.0}, {"conv": 1.2, "linear": 1.1}, "2026-12-04", cached=True)
FAST = Fp16Cost({"conv": 1.3, "linear": 1.1}, {"conv": 1.2, "linear": 1.0}, "2026-12-04", cached=True)


@pytest.fixture
def measured(monkeypatch):
    """``measured(cost)``: this machine's fp16 cost as if measured so; the line not yet said."""
    monkeypatch.setattr(cost_module, "_said", set())

    def use(cost: Fp16Cost) -> None:
        monkeypatch.setattr(model_state, "fp16_cost", lambda: cost)

    return use


def train_fp16(tmp_path, caplog) -> torch.nn.Module:  # noqa: ANN001
    x, y = make_data(32)
    est = make_estimator(tmp_path / "m", precision="fp16", device="cpu")
    with caplog.at_level(logging.INFO, logger="stoker"):
        est.train(train_input(x, y), max_steps=2)
    assert est.state.precision.name == "fp16" and est.state.precision.scaler is not None  # honoured
    assert est.global_step == 2
    return est


def test_a_slow_fp16_is_one_warning_naming_bf16_and_the_run_stays_fp16(tmp_path, caplog, measured):
    measured(XEON)
    train_fp16(tmp_path, caplog)
    said = [r for r in caplog.records if "fp16 on this CPU" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in said] == [
        (
            logging.WARNING,
            "fp16 on this CPU: a linear layer's forward+backward takes 97x fp32's time (bf16: 1.1x; measured on "
            f"one thread once per machine, cached in {cache_dir() / COST_FILE}); RunConfig(precision='bf16') "
            "(fp32's exponent range, no loss scaling) trains faster here (this run stays in fp16, as asked)",
        )
    ]


def test_a_fast_fp16_is_one_info_line_said_once_per_process(tmp_path, caplog, measured):
    measured(FAST)
    train_fp16(tmp_path / "a", caplog)
    train_fp16(tmp_path / "b", caplog)
    said = [r for r in caplog.records if "fp16 on this CPU" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]
    assert said[0].getMessage().startswith("fp16 on this CPU: a linear layer's forward+backward takes 1.1x fp32's time")


def test_other_precisions_measure_nothing(tmp_path, caplog, measured, monkeypatch):
    monkeypatch.setattr(model_state, "fp16_cost", lambda: pytest.fail("measured"))
    x, y = make_data(32)
    make_estimator(tmp_path / "m", precision="bf16").train(train_input(x, y), max_steps=2)
    make_estimator(tmp_path / "n").train(train_input(x, y), max_steps=2)


def test_measuring_at_the_start_changes_no_bit_of_the_run(tmp_path, monkeypatch, measured):
    x, y = make_data(32)
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cost_module, "_memo", {})
    measuring = make_estimator(tmp_path / "a", precision="fp16")
    measuring.train(train_input(x, y), max_steps=4)  # measures for real (an empty cache)
    assert (tmp_path / "cache" / COST_FILE).is_file()
    measured(FAST)
    monkeypatch.setattr(cost_module, "_said", set())
    reading = make_estimator(tmp_path / "b", precision="fp16")
    reading.train(train_input(x, y), max_steps=4)
    assert state_equal(measuring.model, reading.model)
