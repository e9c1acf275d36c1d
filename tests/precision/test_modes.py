"""``stoker.precision``: one ``Precision`` class per mode, exact on tiny tensors, and ``RunConfig``
taking a mode by name or as an object (the same bits either way)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import stoker
from helpers.tiny import make_data, make_estimator, state_equal, train_input
from stoker import ConfigError, RunConfig
from stoker.memory import StochasticRounding
from stoker.precision import (
    BF16Precision,
    BF16SRPrecision,
    FP16Precision,
    FP32Precision,
    LossScale,
    Precision,
    make_precision,
)

CPU = torch.device("cpu")


def _ones_linear() -> nn.Linear:
    net = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        net.weight.fill_(1.0)
    return net


class _Step:
    """An optimizer step that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_fp32_does_nothing():
    precision = FP32Precision()
    net = _ones_linear()
    assert precision.convert_module(net) is net and net.weight.dtype == torch.float32
    assert isinstance(precision.forward_context(CPU), contextlib.nullcontext) and not precision.autocasts
    loss = torch.tensor(3.0)
    assert precision.scale_loss(loss) is loss
    step = _Step()
    assert precision.optimizer_step([net.weight], step) is True and step.calls == 1
    assert precision.state_dict() is None and precision.scaler is None
    precision.load_state_dict({"scale": 2.0})  # a mode without state ignores one


def test_bf16_runs_the_forward_under_bf16_autocast():
    precision = BF16Precision()
    net = _ones_linear()
    with precision.forward_context(CPU):
        assert torch.is_autocast_enabled("cpu")
        out = net(torch.tensor([[1.0, 2.0]]))
    assert out.dtype == torch.bfloat16 and out.item() == 3.0
    assert net.weight.dtype == torch.float32  # master weights stay fp32
    assert precision.state_dict() is None and precision.scaler is None


def test_fp16_dynamic_skips_a_step_on_inf_and_halves_the_scale():
    precision = FP16Precision(loss_scale=LossScale(init=1024.0, growth_interval=2))
    assert precision.scale_loss(torch.tensor(0.5)).item() == 512.0
    weight = nn.Parameter(torch.ones(2))
    step = _Step()
    weight.grad = torch.tensor([float("inf"), 1.0])
    assert precision.optimizer_step([weight], step) is False and step.calls == 0
    assert precision.scaler is not None
    assert (precision.scaler.scale, precision.scaler.skipped_steps, precision.scaler.good_steps) == (512.0, 1, 0)
    weight.grad = torch.tensor([512.0, 1024.0])  # unscaled by 512 before the step
    assert precision.optimizer_step([weight], step) is True and step.calls == 1
    assert weight.grad.tolist() == [1.0, 2.0]
    weight.grad = torch.tensor([512.0, 512.0])
    assert precision.optimizer_step([weight], step) is True and precision.scaler.scale == 1024.0  # 2 good: grows
    assert precision.state_dict() == {  # the checkpoint's "scaler" entry, keys as before
        "dynamic": True,
        "scale": 1024.0,
        "good_steps": 0,
        "skipped_steps": 1,
        "growth_interval": 2,
    }


def test_fp16_static_scales_and_never_skips():
    precision = FP16Precision(loss_scale=128)
    assert precision.loss_scale == LossScale(dynamic=False, init=128.0)
    assert precision.scale_loss(torch.tensor(2.0)).item() == 256.0
    weight = nn.Parameter(torch.ones(1))
    weight.grad = torch.tensor([float("inf")])
    step = _Step()
    assert precision.optimizer_step([weight], step) is True and step.calls == 1  # static: no check, no sync
    with precision.forward_context(CPU):
        assert torch.get_autocast_dtype("cpu") == torch.float16


def test_fp16_state_round_trips_and_fresh_starts_over():
    precision = FP16Precision(loss_scale=LossScale(init=8.0))
    assert precision.scaler is not None
    precision.scaler.step_ok(torch.tensor(1.0))  # one overflow: 4.0
    other = precision.fresh()
    assert other == precision and other is not precision and other.scaler is not precision.scaler
    assert other.scaler is not None and other.scaler.scale == 8.0
    other.load_state_dict(precision.state_dict())
    assert other.state_dict() == precision.state_dict() and other.scaler.scale == 4.0
    other.load_state_dict(None)  # a checkpoint without a scaler entry leaves it as it is
    assert other.scaler.scale == 4.0


def test_bf16_sr_converts_the_module_and_the_optimizer():
    precision = BF16SRPrecision()
    net = precision.convert_module(_ones_linear())
    assert net.weight.dtype == torch.bfloat16
    opt = precision.convert_optimizer(torch.optim.SGD(net.parameters(), lr=0.1), seed=3)
    assert isinstance(opt, StochasticRounding)
    with pytest.raises(ConfigError, match=r"precision='bf16-sr' does not support a sharded strategy"):
        precision.convert_module(_ones_linear(), sharded=True)
    with pytest.raises(ConfigError, match=r"RunConfig.loss_scale=128 is fp16 loss scaling"):
        precision.check_run(loss_scale=LossScale.of(128), compile_mode="none", cuda_graph=False)
    with pytest.raises(ConfigError, match=r"does not run with compile='step' or cuda_graph=True"):
        precision.check_run(loss_scale=LossScale(), compile_mode="step", cuda_graph=False)


def test_make_precision_by_name_and_by_object():
    assert [type(make_precision(n)) for n in stoker.precision.PRECISIONS] == [
        FP32Precision,
        BF16Precision,
        FP16Precision,
        BF16SRPrecision,
    ]
    assert make_precision("fp16", 64).loss_scale == LossScale(dynamic=False, init=64.0)
    given = FP16Precision(loss_scale=32)
    made = make_precision(given, "dynamic")  # an object keeps its own loss scale
    assert made == given and made is not given and made.scaler is not given.scaler
    with pytest.raises(ConfigError, match=r"precision must be one of fp32, bf16, fp16, bf16-sr; got 'fp8'"):
        make_precision("fp8")
    assert str(BF16Precision()) == "bf16" and repr(FP16Precision()) == f"FP16Precision(loss_scale={LossScale()!r})"
    assert issubclass(BF16SRPrecision, Precision) and BF16Precision() != FP32Precision()


def test_every_list_of_precision_names_comes_from_the_modes():
    """RunConfig's Literal, the bench's choices and each mode's dtypes are read off the classes."""
    import typing

    from stoker.bench.settings import PRECISIONS as BENCH
    from stoker.config import PrecisionName
    from stoker.precision import autocast_context, compute_dtype, precision_names

    assert typing.get_args(PrecisionName) == stoker.precision.PRECISIONS == precision_names()
    assert BENCH == precision_names(master_weights="fp32") == ("fp32", "bf16", "fp16")  # bf16-sr's are bf16
    assert [compute_dtype(n) for n in precision_names()] == [
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.bfloat16,
    ]
    with autocast_context("fp16", torch.device("cpu")):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.float16
    with pytest.raises(ConfigError, match=r"precision must be one of fp32, bf16, fp16, bf16-sr; got 'fp8'"):
        compute_dtype("fp8")


def test_run_config_takes_a_precision_object():
    config = RunConfig(precision=FP16Precision(loss_scale=128))
    assert config.precision_name == "fp16" and config.to_dict()["precision"] == "fp16"
    assert config.to_dict()["loss_scale"] == {"dynamic": False, "init": 128.0, "growth_interval": 1000}
    assert config == RunConfig(precision=FP16Precision(loss_scale=128)) != RunConfig(precision="fp16")
    with pytest.raises(ConfigError, match=r"both set fp16's loss scale; give it once"):
        RunConfig(precision=FP16Precision(loss_scale=128), loss_scale=64)
    with pytest.raises(ConfigError, match=r"a pipeline runs the eager step in fp32 or bf16.*precision='fp16'"):
        RunConfig(precision=FP16Precision(), pipeline=stoker.PipelineConfig(split="a"))
    with pytest.raises(ConfigError, match=r"precision='bf16-sr' does not run with compile='step'"):
        RunConfig(precision=BF16SRPrecision(), compile="step")


def test_a_precision_object_trains_to_the_same_bits_as_its_name():
    x, y = make_data(64)
    scale = LossScale(init=2.0**20, growth_interval=3)  # overflows, backs off, grows
    by_name = make_estimator(precision="fp16", loss_scale=scale)
    by_object = make_estimator(precision=FP16Precision(loss_scale=scale))
    for est in (by_name, by_object):
        est.train(train_input(x, y), max_steps=8)
    assert state_equal(by_name.model, by_object.model)
    assert by_name.state.scaler.state_dict() == by_object.state.scaler.state_dict()
    assert by_object.state.scaler.skipped_steps > 0
    assert by_object.state.precision is not by_object.config.precision  # the run steps its own copy
    assert by_object.config.precision.scaler.skipped_steps == 0
    bf16 = make_estimator(precision=BF16Precision())
    bf16.train(train_input(x, y), max_steps=3)
    named = make_estimator(precision="bf16")
    named.train(train_input(x, y), max_steps=3)
    assert state_equal(bf16.model, named.model)
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())


def test_an_fp16_checkpoint_keeps_the_scaler_entry(tmp_path):
    x, y = make_data(64)
    est = make_estimator(tmp_path, precision="fp16", save_checkpoints_steps=2)
    est.train(train_input(x, y), max_steps=2)
    state = torch.load(tmp_path / "ckpt-2" / "train_state.pt", weights_only=True)
    assert set(state["scaler"]) == {"dynamic", "scale", "good_steps", "skipped_steps", "growth_interval"}
    plain = make_estimator(tmp_path / "fp32", save_checkpoints_steps=2)
    plain.train(train_input(x, y), max_steps=2)
    assert torch.load(tmp_path / "fp32" / "ckpt-2" / "train_state.pt", weights_only=True)["scaler"] is None
