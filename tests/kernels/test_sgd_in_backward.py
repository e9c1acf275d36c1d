"""Plain SGD inside the weight-gradient product (stoker.kernels.sgd_in_backward): the same update
as ``optimizer.step()`` to fp32 rounding, on both kernels a layer may take; no gradient left on
the layers it updates; refusals that name the obstacle; bitwise resume on the path; and the
``RunConfig`` and ``stoker bench`` switches."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import stoker
from helpers.cli import run_main
from helpers.tiny import make_data, state_equal, train_input
from stoker.kernels import linear as fl
from stoker.kernels.sgd_in_backward import (
    cannot_update_in_backward,
    optimizer_refusal,
    remove_update_in_backward,
    run_refusal,
    sgd_in_backward_choice,
    update_in_backward,
    updating_in_backward,
)
from stoker.resolve import Choice, Names, spelled

pytestmark = pytest.mark.skipif(not fl.onednn_available(), reason="this torch build has no oneDNN linear")

LR, WD = 0.1, 0.01


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.Tanh(), nn.Linear(96, 96, bias=False), nn.Tanh(), nn.Linear(96, 10))


def _steps(model: nn.Module, opt: torch.optim.Optimizer, rates: list[float]) -> list[torch.Tensor]:
    """One SGD step per rate (the rate changed between steps, as a schedule does); the input gradients."""
    g = torch.Generator().manual_seed(1)
    input_grads = []
    for lr in rates:
        for group in opt.param_groups:
            group["lr"] = lr
        x = torch.randn(32, 48, generator=g).requires_grad_(True)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        assert x.grad is not None
        input_grads.append(x.grad)
        opt.step()
    return input_grads


@pytest.mark.parametrize("mode", ["on", "auto"], ids=["onednn", "blas"])  # auto: too small to measure -> BLAS
def test_the_update_in_backward_is_the_optimizers_update(mode):
    plain, fused = _mlp(), _mlp()
    for model in (plain, fused):
        fl.use_fast_linear(model, mode)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=LR, weight_decay=WD)
    fused_opt = torch.optim.SGD(fused.parameters(), lr=LR, weight_decay=WD)
    assert update_in_backward(fused, fused_opt) == ["0", "2", "4"]
    rates = [0.1, 0.05, 0.2]
    plain_grads, fused_grads = _steps(plain, plain_opt, rates), _steps(fused, fused_opt, rates)
    for a, b in zip(plain_grads, fused_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)  # grad_x is taken from the weight before its update
    for (name, a), b in zip(plain.state_dict().items(), fused.state_dict().values(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7), name
        assert not torch.equal(a, _mlp().state_dict()[name]), name  # every parameter moved
    assert updating_in_backward(fused, ran=True) == ["0", "2", "4"]

    # The layers it updates leave no gradient; the biases still get theirs (and the optimizer's step).
    x = torch.randn(4, 48)
    fused(x).sum().backward()
    assert all(fused[i].weight.grad is None for i in (0, 2, 4))
    assert fused[0].bias.grad is not None and fused[4].bias.grad is not None


def test_without_gradients_or_in_a_copy_the_layer_is_an_ordinary_one():
    model = _mlp()
    fl.use_fast_linear(model, "on")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    update_in_backward(model, opt)
    before = model[0].weight.detach().clone()
    with torch.no_grad():
        model(torch.randn(4, 48))  # inference: no update, no error
    assert torch.equal(model[0].weight, before)

    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert updating_in_backward(copied) == []
        copied(torch.randn(4, 48)).sum().backward()
        assert copied[0].weight.grad is not None  # an ordinary gradient
        assert torch.equal(model[0].weight, before)  # and the original untouched
    assert remove_update_in_backward(model) == 3 and updating_in_backward(model) == []


def test_tied_frozen_and_foreign_weights_keep_ordinary_gradients():
    model = _mlp()
    model.append(nn.Linear(10, 10))
    model[5].weight = nn.Parameter(torch.randn(10, 10))
    tied = nn.Linear(10, 10)
    tied.weight = model[5].weight  # used twice: an update after the first use would corrupt the second
    model.append(tied)
    model[2].weight.requires_grad_(False)
    fl.use_fast_linear(model, "on")
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if not n.startswith("4.")], lr=LR)
    assert update_in_backward(model, opt) == ["0"]  # 2 frozen, 4 not in the optimizer, 5/6 tied


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda ps: torch.optim.Adam(ps), "needs torch.optim.SGD (the optimizer is Adam)"),
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "needs plain SGD (param group 0 has momentum=0.9)"),
        (lambda ps: torch.optim.SGD(ps, lr=0.1, maximize=True), "needs plain SGD (param group 0 has maximize=True)"),
    ],
)
def test_an_optimizer_it_cannot_run_is_named(make, why):
    model = _mlp()
    opt = make(model.parameters())
    assert why in (optimizer_refusal(opt) or "")
    with pytest.raises(ValueError, match="sgd_in_backward: "):
        update_in_backward(model, opt)


def test_step_pre_hooks_read_gradients_so_they_refuse_it():
    opt = torch.optim.SGD(_mlp().parameters(), lr=0.1)
    opt.register_step_pre_hook(lambda o, args, kwargs: None)
    assert "step pre-hooks" in (optimizer_refusal(opt) or "")


def test_a_group_changed_to_momentum_later_stops_the_backward():
    model = _mlp()
    fl.use_fast_linear(model, "on")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    update_in_backward(model, opt)
    opt.param_groups[0]["momentum"] = 0.9
    with pytest.raises(RuntimeError, match="plain SGD only"):
        model(torch.randn(4, 48)).sum().backward()


def test_run_refusals_name_the_setting_in_each_front_end_s_words():
    ok = dict(
        device=torch.device("cpu"),
        world_size=1,
        precision="fp32",
        accumulation=1,
        clip_norm=None,
        compiled=False,
        cuda_graph=False,
        fast_linear="auto",
    )
    assert run_refusal(**ok) is None  # type: ignore[arg-type]
    cases = {
        "device": (torch.device("cuda"), "needs the CPU (this run's device is cuda)"),
        "fast_linear": ("off", "needs RunConfig.fast_linear='auto' or 'on' (the update runs in those layers)"),
        "compiled": (True, "needs no RunConfig.compile (the update runs eagerly)"),
        "cuda_graph": (True, "needs no RunConfig.cuda_graph"),
        "precision": ("bf16", "needs RunConfig.precision='fp32' (got bf16)"),
        "world_size": (2, "needs one replica (replicas average gradients before the update)"),
        "accumulation": (4, "needs one micro-batch per step (got RunConfig.gradient_accumulation_steps=4)"),
        "clip_norm": (1.0, "needs no RunConfig.gradient_clip_norm (clipping needs every gradient first)"),
    }
    for key, (value, why) in cases.items():
        assert run_refusal(**{**ok, key: value}) == why, key  # type: ignore[arg-type]

    class Flags(Names):  # a command line's names for the settings
        def field(self, name: str) -> str:
            return f"--{name}"

        def value(self, value: object) -> str:
            return str(value)

    need = run_refusal(**{**ok, "precision": "bf16"})  # type: ignore[arg-type]
    assert need is not None and need.spelled(Flags()) == "needs --precision=fp32 (got bf16)"
    choice = sgd_in_backward_choice("auto", "cpu", need)
    assert choice == Choice("off", "it needs RunConfig.precision='fp32' (got bf16)")
    assert spelled(choice.reason, Flags()) == "it needs --precision=fp32 (got bf16)"
    assert spelled(cannot_update_in_backward(need), Flags()) == (
        "--sgd_in_backward=on needs --precision=fp32 (got bf16); use --sgd_in_backward=auto or off"
    )
    assert sgd_in_backward_choice("auto", "cuda", None) == Choice("off", "CPU only")
    assert sgd_in_backward_choice("off", "cpu", None) == Choice("off", "RunConfig.sgd_in_backward='off'")
    assert sgd_in_backward_choice("on", "cpu", None).value == "on"


# ------------------------------------------------------------------ the Estimator
class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
    return stoker.EstimatorSpec(loss=F.cross_entropy(model(features), labels))


def _estimator(model_dir, optimizer=None, **config) -> stoker.Estimator:  # noqa: ANN001
    cfg = dict(model_dir=model_dir, progress_bar=False, iterations_per_loop=3, save_checkpoints_steps=5)
    cfg.update(config)
    return stoker.Estimator(
        model=lambda p: _Net(),
        model_fn=_model_fn,
        optimizer=optimizer or (lambda p, ps: torch.optim.SGD(ps, lr=0.05, weight_decay=1e-3)),
        lr_schedule=lambda p, o: torch.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5),
        config=stoker.RunConfig(**cfg),  # type: ignore[arg-type]
        train_batch_size=16,
    )


def test_estimator_resume_is_bitwise_and_agrees_with_the_ordinary_update(tmp_path):
    x, y = make_data(100)
    on = dict(fast_linear="on", sgd_in_backward="on")
    whole = _estimator(tmp_path / "whole", **on)
    whole.train(train_input(x, y), max_steps=22)
    assert whole.state.sgd_in_backward == ["fc1", "fc2"]

    first = _estimator(tmp_path / "split", **on)
    first.train(train_input(x, y), max_steps=11)
    second = _estimator(tmp_path / "split", **on)
    second.train(train_input(x, y), max_steps=22)
    assert state_equal(whole.model, second.model)

    plain = _estimator(tmp_path / "plain", fast_linear="on")
    plain.train(train_input(x, y), max_steps=11)
    assert plain.state.sgd_in_backward == []
    # A checkpoint of the ordinary update resumes on this path (the optimizer state is the same).
    mixed = _estimator(tmp_path / "plain", **on)
    mixed.train(train_input(x, y), max_steps=22)
    for (name, a), b in zip(whole.model.state_dict().items(), mixed.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name  # the same training up to fp32 rounding


def test_on_names_what_stands_in_the_way_and_auto_steps_aside(tmp_path, caplog):
    x, y = make_data(50)
    momentum = lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)  # noqa: E731
    est = _estimator(tmp_path / "on", momentum, fast_linear="on", sgd_in_backward="on")
    with pytest.raises(ValueError, match=r"RunConfig.sgd_in_backward='on' needs plain SGD \(.*momentum=0.9\); use"):
        est.train(train_input(x, y), max_steps=2)
    est = _estimator(tmp_path / "blas", sgd_in_backward="on")
    with pytest.raises(ValueError, match=r"needs RunConfig.fast_linear='auto' or 'on' \(the update runs"):
        est.train(train_input(x, y), max_steps=2)

    auto = _estimator(tmp_path / "auto", momentum, fast_linear="on", sgd_in_backward="auto")
    with caplog.at_level("INFO", logger="stoker"):
        auto.train(train_input(x, y), max_steps=2)
    assert auto.state.sgd_in_backward == [] and "momentum=0.9" in (auto.state.sgd_in_backward_refusal or "")
    assert auto.model.fc1.weight.grad is None and any("sgd_in_backward" in r.message for r in caplog.records)


def test_run_config_checks_sgd_in_backward():
    assert stoker.RunConfig().sgd_in_backward == "off"
    with pytest.raises(ValueError, match="RunConfig.sgd_in_backward must be one of off, auto, on; got 'yes'"):
        stoker.RunConfig(sgd_in_backward="yes")  # type: ignore[arg-type]


# ------------------------------------------------------------------ stoker bench
QUICK = ["bench", "--model=trivial", "--data_name=cifar10", "--batch_size=8", "--device=cpu", "--num_batches=2"]


def test_bench_says_which_layers_update_in_backward(capsys):
    code, out, _ = run_main(capsys, *QUICK, "--fast_linear=on", "--data_format=NCHW", "--peak_tflops=1")
    assert code == 0
    assert "Update:      SGD inside the weight-gradient product of features.0.fc, features.1.fc, fc " in out
    code, out, _ = run_main(capsys, *QUICK, "--optimizer=momentum", "--peak_tflops=1")
    assert code == 0
    assert "Update:      the optimizer's step for every layer (--sgd_in_backward=auto: " in out
    code, out, _ = run_main(capsys, *QUICK, "--sgd_in_backward=off", "--peak_tflops=1")
    assert code == 0 and "Update:" not in out
    # Without a warm-up step nothing has run when the header is written: a note, not "every layer".
    code, out, _ = run_main(capsys, *QUICK, "--num_warmup_batches=0", "--peak_tflops=1")
    assert code == 0 and "Update:" not in out and not re.search(r"Linear: +\d+x\d+->", out)
    assert "Note: no warm-up steps: the linear kernels and the in-backward update are chosen in the first" in out


def test_bench_refuses_an_unknown_mode(capsys):
    code, _, err = run_main(capsys, *QUICK, "--sgd_in_backward=yes")
    assert code == 2 and "--sgd_in_backward" in err and "allowed values: off, auto, on" in err


def test_it_follows_the_optimizer_through_load_state_dict_and_steps_aside_once_it_is_gone():
    """``load_state_dict`` replaces the group dicts: the rate must come from the new ones."""
    model = _mlp()
    fl.use_fast_linear(model, "on")
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    update_in_backward(model, opt)
    saved = opt.state_dict()
    saved["param_groups"][0]["lr"] = 0.0
    opt.load_state_dict(saved)
    before = model[0].weight.detach().clone()
    model(torch.randn(4, 48)).sum().backward()
    assert torch.equal(model[0].weight, before)  # lr 0 from the loaded group: the weight stays
    del opt, saved
    model(torch.randn(4, 48)).sum().backward()
    assert model[0].weight.grad is not None  # no optimizer any more: an ordinary gradient


@pytest.mark.parametrize(
    ("flags", "need"),
    [
        (["--optimizer=momentum"], "plain SGD (param group 0 has momentum=0.9)"),  # the optimizer the bench builds
        (["--gradient_clip=1.0"], "an optimizer without step pre-hooks"),  # the bench clips in one
        (["--fast_linear=off"], "--fast_linear=auto or on"),
        (["--compile=module"], "no --compile"),
        (["--precision=bf16"], "--precision=fp32 (got bf16)"),
    ],
)
def test_bench_on_names_the_flag_in_the_way(capsys, flags, need):
    code, _, err = run_main(capsys, *QUICK, "--sgd_in_backward=on", *flags)
    assert code == 2
    assert f"--sgd_in_backward=on needs {need}" in err and "use --sgd_in_backward=auto or off" in err
