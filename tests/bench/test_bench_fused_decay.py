"""The fused SGD update with the weight decay inside it (``optim.fuses_weight_decay``): chosen
where it applies, the same training as the pre-hook's decay within fp32 tolerance, and
checkpoints that resume across the two with the decay applied exactly once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stoker.bench import BenchConfig, run_benchmark
from stoker.bench.optim import fuses_weight_decay, make_optimizer


def _params() -> list[nn.Parameter]:
    torch.manual_seed(0)
    return list(nn.Linear(5, 3).parameters())


@pytest.mark.parametrize(
    ("changes", "fused"),
    [
        ({}, True),
        ({"optimizer": "momentum"}, True),
        ({"optimizer": "adam"}, False),
        ({"optimizer": "rmsprop"}, False),
        ({"gradient_clip": 1.0}, False),  # the clip must see the decayed gradient
        ({"compile": "step"}, False),
    ],
)
def test_where_the_decay_is_fused(changes: dict[str, object], fused: bool) -> None:
    cfg = BenchConfig(weight_decay=0.1, **changes)  # type: ignore[arg-type]
    params = _params()
    assert fuses_weight_decay(cfg, params) is fused
    opt = make_optimizer(cfg, params, 0.1)
    assert bool(opt.defaults.get("fused")) is fused
    assert opt.param_groups[0].get("weight_decay", 0.0) == (0.1 if fused else 0.0)
    assert bool(opt._optimizer_step_pre_hooks) is (not fused)  # the pre-hook decays otherwise
    half = [nn.Parameter(p.detach().half()) for p in params]
    assert not fuses_weight_decay(cfg, half)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum"])
def test_fused_update_equals_the_pre_hook_update(optimizer: str) -> None:
    def step(clip: float | None) -> list[torch.Tensor]:
        params = _params()
        opt = make_optimizer(BenchConfig(optimizer=optimizer, weight_decay=0.1, gradient_clip=clip), params, 0.5)
        for i in range(3):
            for p in params:
                p.grad = torch.full_like(p, 0.25 * (i + 1)) - p.detach()
            opt.step()
        return [p.detach().clone() for p in params]

    fused, hooked = step(None), step(1e9)  # a clip that never clips: the pre-hook path, same math
    for a, b in zip(fused, hooked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_resuming_across_the_two_paths_decays_once() -> None:
    params = _params()
    fused = make_optimizer(BenchConfig(optimizer="momentum", weight_decay=0.1), params, 0.1)
    hooked = make_optimizer(BenchConfig(optimizer="momentum", weight_decay=0.1, gradient_clip=1e9), params, 0.1)
    fused.load_state_dict(hooked.state_dict())
    assert fused.param_groups[0]["weight_decay"] == 0.1 and fused.param_groups[0]["fused"]
    hooked.load_state_dict(fused.state_dict())
    assert hooked.param_groups[0]["weight_decay"] == 0.0 and not hooked.param_groups[0]["fused"]


def test_bench_losses_match_the_pre_hook_path() -> None:
    def losses(clip: float | None) -> list[float]:
        cfg = BenchConfig(
            model="trivial",
            data_name="cifar10",
            batch_size=8,
            num_batches=5,
            num_warmup_batches=0,
            device="cpu",
            init_learning_rate=0.5,
            weight_decay=0.01,
            gradient_clip=clip,
            display_every=1000,
        )
        return run_benchmark(cfg, log=lambda line: None)["losses"]

    torch.testing.assert_close(torch.tensor(losses(None)), torch.tensor(losses(1e9)), rtol=1e-5, atol=1e-6)
