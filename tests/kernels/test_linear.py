"""``nn.Linear`` on oneDNN (stoker.kernels.linear): the same function as the BLAS path within fp32
rounding, the same parameters and state_dict, bitwise resume on one path, and a cached per-machine
choice that these tests set by hand (they must not depend on which kernel wins on this CPU)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import stoker
from helpers.tiny import make_data, make_estimator, state_equal, train_input
from stoker._cache import cache_dir
from stoker.kernels import linear as fl
from stoker.kernels.machine import machine_key

pytestmark = pytest.mark.skipif(not fl.onednn_available(), reason="this torch build has no oneDNN linear")


def _mlp(bias: bool = True) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(48, 96, bias=bias), nn.GELU(), nn.Linear(96, 96, bias=bias), nn.Tanh(), nn.Linear(96, 10)
    )


def _forward_backward(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y.square().sum() + y.sum()).backward()
    assert x.grad is not None
    return y.detach(), x.grad, [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / b.abs().max()).detach())


@pytest.mark.parametrize("shape", [(64, 48), (4, 16, 48)], ids=["2d", "3d"])
@pytest.mark.parametrize("bias", [True, False])
def test_forced_on_agrees_with_the_blas_in_values_and_grads(shape, bias):
    plain = _mlp(bias)
    fast = copy.deepcopy(plain)
    assert fl.use_fast_linear(fast, "on") == ["0", "2", "4"]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    y0, gx0, g0 = _forward_backward(plain, x)
    y1, gx1, g1 = _forward_backward(fast, x)
    assert fast(x).grad_fn.name() == "OneDNNLinearFunctionBackward"  # oneDNN really ran (not F.linear)
    assert plain(x).grad_fn.name() != "OneDNNLinearFunctionBackward"
    assert _rel(y1, y0) < 1e-5 and _rel(gx1, gx0) < 1e-5
    assert len(g1) == len(g0) == (6 if bias else 4)  # the last layer always has a bias
    for a, b in zip(g1, g0, strict=True):
        assert _rel(a, b) < 1e-5


def test_the_swap_keeps_parameters_and_state_dict_and_goes_back():
    model = _mlp()
    params = [id(p) for p in model.parameters()]
    keys = list(model.state_dict())
    fl.use_fast_linear(model, "on")
    assert all(type(m) is fl.OneDNNLinear for m in model if isinstance(m, nn.Linear))
    assert [id(p) for p in model.parameters()] == params and list(model.state_dict()) == keys
    assert fl.use_plain_linear(model) == 3
    assert all(type(m) in (nn.Linear, nn.GELU, nn.Tanh) for m in model)
    assert fl.use_fast_linear(model, "off") == []
    with pytest.raises(ValueError, match="fast_linear must be one of auto, on, off; got 'fast'"):
        fl.use_fast_linear(model, "fast")


def test_inference_and_autocast_follow_f_linear():
    plain = _mlp()
    fast = copy.deepcopy(plain)
    fl.use_fast_linear(fast, "on")
    x = torch.randn(8, 48)
    with torch.inference_mode():
        assert _rel(fast(x), plain(x)) < 1e-5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y0, y1 = plain(x), fast(x)
    assert y0.dtype == y1.dtype == torch.bfloat16  # oneDNN where it has bf16, else the BLAS: autocast's dtype
    assert _rel(y1.float(), y0.float()) < 2e-2
    y1.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in fast.parameters())


def _seed(speedup: object, rows: int = 64, fin: int = 48, fout: int = 96, training: bool = True) -> None:
    key = f"{machine_key(torch.device('cpu'), 'fp32')}|{rows}x{fin}->{fout}|{'train' if training else 'infer'}"
    path = cache_dir() / fl.LINEAR_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({key: speedup}))


@pytest.mark.parametrize(("speedup", "onednn"), [(2.0, True), (1.01, False), (0.5, False)])
def test_auto_takes_the_cached_choice_of_this_machine(speedup, onednn):
    _seed(speedup)
    choice = fl.choose(64, 48, 96, torch.float32, True)
    assert choice == fl.LinearChoice(onednn, speedup, f"measured {speedup:.2f}x BLAS", cached=True)
    model = nn.Linear(48, 96)
    fl.use_fast_linear(model, "auto")
    y = model(torch.randn(64, 48, requires_grad=True))
    assert (y.grad_fn.name() == "OneDNNLinearFunctionBackward") is onednn
    assert fl.describe_choices() == [
        f"64x48->96 fp32 train: {'oneDNN' if onednn else 'BLAS'} (measured {speedup:.2f}x BLAS, cached)"
    ]


def test_auto_measures_once_and_rewrites_a_corrupt_cache(monkeypatch):
    path = cache_dir() / fl.LINEAR_FILE
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    calls = []
    monkeypatch.setattr(fl, "measure_linear", lambda *a, **k: calls.append(a) or 3.0)
    assert fl.choose(64, 48, 96, torch.float32, True).onednn
    assert fl.choose(64, 48, 96, torch.float32, True).onednn  # this process remembers
    assert calls == [(64, 48, 96, torch.float32, True)]
    assert list(json.loads(path.read_text()).values()) == [3.0]
    fl.reset_choices()
    assert fl.choose(64, 48, 96, torch.float32, True) == fl.LinearChoice(True, 3.0, "measured 3.00x BLAS", cached=True)
    assert len(calls) == 1
    assert fl.choose(4, 4, 4, torch.float32, True) == fl.LinearChoice(False, None, "too small to measure")


def test_measure_linear_returns_a_ratio():
    ratio = fl.measure_linear(64, 64, 128, torch.float32, True, budget_s=0.05)
    assert 0.01 < ratio < 100


def test_estimator_resume_is_bitwise_on_the_onednn_path(tmp_path):
    x, y = make_data(100)
    kwargs = dict(fast_linear="on", iterations_per_loop=3, save_checkpoints_steps=5)
    whole = make_estimator(tmp_path / "whole", **kwargs)
    whole.train(train_input(x, y), max_steps=22)
    assert whole.state.fast_linears == ["fc1", "fc2"]
    assert all(c.onednn and c.reason == "forced on" for c in fl.choices_made().values())

    first = make_estimator(tmp_path / "split", **kwargs)
    first.train(train_input(x, y), max_steps=11)
    second = make_estimator(tmp_path / "split", **kwargs)
    second.train(train_input(x, y), max_steps=22)
    assert state_equal(whole.model, second.model)

    plain = make_estimator(tmp_path / "plain", iterations_per_loop=3)
    plain.train(train_input(x, y), max_steps=22)
    assert plain.state.fast_linears == []
    for (name, a), b in zip(whole.model.state_dict().items(), plain.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name  # the same training up to fp32 rounding


def test_run_config_checks_fast_linear():
    assert stoker.RunConfig().fast_linear == "off"
    with pytest.raises(ValueError, match="RunConfig.fast_linear must be one of auto, on, off; got 'yes'"):
        stoker.RunConfig(fast_linear="yes")  # type: ignore[arg-type]


def test_an_exported_program_holds_a_plain_linear():
    """Export traces F.linear (portable), not the oneDNN operator the eager layer calls."""
    model = _mlp()
    fl.use_fast_linear(model, "on")
    program = torch.export.export(model, (torch.randn(4, 48),))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert sum("linear" in t for t in targets) == 3 and not any("mkldnn" in t for t in targets)
    x = torch.randn(4, 48)
    assert _rel(program.module()(x), model(x)) < 1e-5
