"""bf16 weights with stochastic rounding (``precision="bf16-sr"``): the rounding, the optimizer
wrapper, exact resume, evaluation without rounding, and the errors."""

from __future__ import annotations

import json

import pytest
import torch

import stoker
from helpers.paths import SCRIPTS
from helpers.tiny import make_data, make_estimator, state_equal, train_input
from stoker.memory import state_bytes
from stoker.memory.stochastic_rounding import (
    STATE_KEY,
    StochasticRounding,
    stochastic_round_bf16,
    to_bf16,
)


def neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 values next to ``x`` towards and away from zero (equal when ``x`` is a bf16)."""
    bits = x.view(torch.int32)
    toward = (bits & -65536).view(torch.float32)
    away = torch.where(bits & 0xFFFF != 0, ((bits & -65536) + 0x10000).view(torch.float32), toward)
    return toward, away


def test_rounding_is_unbiased_and_only_ever_picks_a_neighbour():
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(64, generator=g) * 10.0 ** torch.randint(-30, 30, (64,), generator=g),
            torch.tensor([1.0 + 2.0**-10, -(1.0 + 3 * 2.0**-10), 2.0**-130 * 1.3, 3.0 - 2.0**-20]),
        ]
    )
    draws = 4096
    rounded = torch.stack([stochastic_round_bf16(x, g) for _ in range(draws)]).float()
    toward, away = neighbours(x)
    assert ((rounded == toward) | (rounded == away)).all()
    # Each draw is one of two values `spacing` apart, so its standard deviation is at most
    # spacing / 2 and the mean's at most spacing / (2 sqrt(draws)): allow 5 of those.
    spacing = (away - toward).abs()
    assert ((rounded.mean(0) - x).abs() <= 5 * spacing / (2 * draws**0.5)).all()
    # It rounds away from zero with probability (the low 16 bits) / 2**16 (a binomial
    # frequency: standard deviation at most 0.5 / sqrt(draws) = 0.0078; allow 5 of those).
    away_freq = ((rounded == away) & (away != toward)).float().mean(0)
    want = (x.view(torch.int32) & 0xFFFF).float() / 2**16
    assert (away_freq - want).abs().max() < 5 * 0.5 / draws**0.5
    assert torch.equal(want[-4:-1], torch.tensor([2.0**-3, 3 * 2.0**-3, 26214 / 2**16]))


def test_exact_values_nan_and_infinity_do_not_move_and_the_generator_decides():
    exact = torch.tensor([0.0, -0.0, 1.0, -2.5, 2.0**-126, float("inf"), -float("inf")])
    g = torch.Generator().manual_seed(1)
    for _ in range(50):
        assert torch.equal(stochastic_round_bf16(exact, g).float(), exact)
    nan = torch.tensor([float("nan"), torch.tensor(0x7F800001, dtype=torch.int32).view(torch.float32).item()])
    assert stochastic_round_bf16(nan, g).isnan().all()  # a NaN with only low payload bits stays NaN
    x = torch.randn(1000, generator=g)
    a = stochastic_round_bf16(x, torch.Generator().manual_seed(7))
    b = stochastic_round_bf16(x, torch.Generator().manual_seed(7))
    c = stochastic_round_bf16(x, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def regression(mode: str, seed: int, steps: int = 400, lr: float = 2e-3) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-batch least squares from weights in [1, 2), where bf16's spacing is 2**-7: every
    update (``lr * grad`` ~ 1e-4..1e-3) is far below half of it (3.9e-3). Returns the loss
    curve (fp32 arithmetic on the weights) and the final weights."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 64, generator=g)
    w0 = 1 + torch.rand(64, generator=g)
    y = x @ (w0 + 0.1 * torch.randn(64, generator=g))
    w = torch.nn.Parameter(w0.clone() if mode == "fp32" else w0.to(torch.bfloat16))
    opt: torch.optim.Optimizer = torch.optim.SGD([w], lr=lr)
    if mode == "sr":
        opt = StochasticRounding(opt, seed=seed)
    losses = []
    for _ in range(steps):
        loss = ((x @ w.float() - y) ** 2).mean()
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return torch.tensor(losses), w.detach()


@pytest.mark.parametrize("seed", range(4))
def test_round_to_nearest_bf16_stalls_while_stochastic_rounding_tracks_fp32(seed):
    fp32, _ = regression("fp32", seed)
    nearest, w_nearest = regression("nearest", seed)
    sr, w_sr = regression("sr", seed)
    start = fp32[0]
    assert fp32[-1] < 0.07 * start  # fp32 learns: the loss falls to ~5% of where it started
    assert nearest[-1] > 0.95 * start  # round-to-nearest bf16 stays where it started
    # Stochastic rounding follows the fp32 curve: at every step within 15% of the initial loss
    # (seen: at most 10%), and ends within 12% of it (seen: 5.6-9.1%; the rest is the noise of
    # weights that can only sit on a grid of 2**-7).
    assert ((sr - fp32).abs() <= 0.15 * start).all()
    assert sr[-1] < 0.12 * start
    assert w_sr.dtype == w_nearest.dtype == torch.bfloat16


def test_the_update_is_the_inner_optimizers_update_in_fp32_and_the_state_stays_bf16():
    torch.manual_seed(0)
    model = to_bf16(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 2)))
    reference = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    opt = StochasticRounding(torch.optim.AdamW(model.parameters(), lr=0.05), seed=3)
    ref_opt = torch.optim.AdamW(reference, lr=0.05)
    model(torch.randn(4, 6)).float().sum().backward()  # fp32 inputs are cast to bf16 by to_bf16
    for p, r in zip(model.parameters(), reference, strict=True):
        r.grad = p.grad.float()
    opt.step()
    ref_opt.step()
    saved = opt.state_dict()["state"]  # by the parameter's position
    for i, (p, r) in enumerate(zip(model.parameters(), reference, strict=True)):
        toward, away = neighbours(r.detach())
        assert p.dtype == p.grad.dtype == torch.bfloat16
        assert ((p.float() == toward) | (p.float() == away)).all()  # one of the fp32 result's neighbours
        state = saved[i]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
        assert state["step"].dtype == torch.float32


def test_schedules_reach_the_inner_optimizer_and_other_dtypes_update_unrounded():
    w16 = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    w32 = torch.nn.Parameter(torch.ones(4))
    opt = StochasticRounding(torch.optim.SGD([{"params": [w16]}, {"params": [w32], "lr": 0.5}], lr=0.25), seed=0)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 if step == 0 else 0.0)
    for _ in range(3):
        w16.grad, w32.grad = torch.ones(4, dtype=torch.bfloat16), torch.full((4,), 0.1)
        opt.step()
        schedule.step()  # lr 0 from the second step on: nothing moves any more
    assert torch.equal(w16, torch.full((4,), 0.75, dtype=torch.bfloat16))
    assert torch.equal(w32, torch.ones(4) - 0.5 * torch.full((4,), 0.1))  # fp32, no rounding to bf16
    assert [g["lr"] for g in opt.state_dict()["param_groups"]] == [0.0, 0.0]


def test_estimator_resume_is_bitwise_and_memory_halves(tmp_path):
    x, y = make_data(100)
    kwargs = dict(precision="bf16-sr", iterations_per_loop=3, save_checkpoints_steps=5)
    whole = make_estimator(tmp_path / "whole", **kwargs)
    whole.train(train_input(x, y), max_steps=16)
    make_estimator(tmp_path / "split", **kwargs).train(train_input(x, y), max_steps=8)
    second = make_estimator(tmp_path / "split", **kwargs)  # a new process would build a new one
    second.train(train_input(x, y), max_steps=16)
    assert state_equal(whole.model, second.model)
    a, b = whole.state.optimizer.state_dict(), second.state.optimizer.state_dict()
    assert torch.equal(a[STATE_KEY]["generator"], b[STATE_KEY]["generator"])
    for k, v in a["state"].items():
        for name, t in v.items():
            assert torch.equal(t, b["state"][k][name]), name
    assert all(p.dtype == torch.bfloat16 for p in whole.model.parameters())

    fp32 = make_estimator(tmp_path / "fp32", iterations_per_loop=3)
    fp32.train(train_input(x, y), max_steps=2)
    low, high = state_bytes(whole.model, whole.state.optimizer), state_bytes(fp32.model, fp32.state.optimizer)
    assert low["parameters"] * 2 == high["parameters"]
    steps = 4 * len(list(whole.model.parameters()))  # Adam's fp32 step counters are the rest
    assert (low["optimizer"] - steps) * 2 == high["optimizer"] - steps


def test_evaluation_and_prediction_do_not_round_or_draw(tmp_path):
    x, y = make_data(100)
    est = make_estimator(tmp_path / "sr", precision="bf16-sr", iterations_per_loop=3)
    est.train(train_input(x, y), max_steps=6)
    generator = est.state.optimizer.generator.get_state()
    weights = {k: v.clone() for k, v in est.model.state_dict().items()}

    def eval_fn(params):  # noqa: ANN001, ANN202
        return stoker.data.arrays(x, y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(params))

    first, again = est.evaluate(eval_fn), est.evaluate(eval_fn)
    rows = list(
        est.predict(
            lambda p: stoker.data.arrays(x, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p)),
            yield_single_examples=False,
        )
    )
    assert first == again
    assert torch.equal(est.state.optimizer.generator.get_state(), generator)
    assert all(torch.equal(v, weights[k]) for k, v in est.model.state_dict().items())
    # The same bf16 weights evaluated in plain bf16 autocast (fp32 master weights holding
    # them exactly) give the same metrics and logits: bf16-sr's evaluation adds nothing.
    plain = make_estimator(tmp_path / "sr", precision="bf16")
    assert plain.evaluate(eval_fn) == first
    plain_rows = list(
        plain.predict(
            lambda p: stoker.data.arrays(x, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p)),
            yield_single_examples=False,
        )
    )
    for r, q in zip(rows, plain_rows, strict=True):
        assert torch.equal(r["logits"].float(), q["logits"].float())


def test_unsupported_combinations_are_named(tmp_path):
    with pytest.raises(ValueError, match="loss_scale=128 is fp16 loss scaling"):
        stoker.RunConfig(precision="bf16-sr", loss_scale=128)
    with pytest.raises(ValueError, match="compile='step' or cuda_graph"):
        stoker.RunConfig(precision="bf16-sr", compile="step")
    with pytest.raises(ValueError, match="bf16-sr"):
        stoker.RunConfig(precision="bf16sr")  # type: ignore[arg-type]
    w = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="LBFGS"):
        StochasticRounding(torch.optim.LBFGS([w]), seed=0)
    with pytest.raises(ValueError, match="closure"):
        StochasticRounding(torch.optim.SGD([w], lr=0.1), seed=0).step(lambda: 0.0)
    # A checkpoint written in fp32 does not resume as bf16-sr (nothing to restore the rounding from).
    x, y = make_data(64)
    make_estimator(tmp_path / "run", iterations_per_loop=2).train(train_input(x, y), max_steps=2)
    with pytest.raises(stoker.errors.CheckpointError, match="no stochastic-rounding generator"):
        make_estimator(tmp_path / "run", precision="bf16-sr", iterations_per_loop=2).train(
            train_input(x, y), max_steps=4
        )


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; the rounding itself is tested in-process
def test_stoker_train_bert_with_bf16_sr_and_recompute_trains_saves_bf16_and_exports(tmp_path, capsys):
    import argparse

    from safetensors.torch import load_file

    from helpers.bert import tiny_config
    from stoker.export import load_exported
    from stoker.export.cli import add_parser as add_export_parser
    from stoker.recipes.cli import add_parser as add_train_parser

    parser = argparse.ArgumentParser(prog="stoker")
    sub = parser.add_subparsers(dest="command")
    add_train_parser(sub)
    add_export_parser(sub)
    cfg = tiny_config(str(tmp_path / "run"), max_steps=4)
    argv = [
        "train",
        "bert",
        "--model_dir",
        cfg.model_dir,
        "--max_steps",
        "4",
        "--text",
        *cfg.text,
        "--eval_steps",
        "2",
        "--precision",
        "bf16-sr",
        "--recompute",
        "layers.*",
    ]
    for name in (
        "hidden_size",
        "num_layers",
        "num_heads",
        "intermediate_size",
        "seq_len",
        "batch_size",
        "eval_batch_size",
        "eval_every_n_steps",
        "device",
    ):
        argv += [f"--{name}", str(getattr(cfg, name))]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    assert "precision bf16-sr, recompute layers.*" in capsys.readouterr().out
    weights = load_file(tmp_path / "run" / "ckpt-4" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    args = parser.parse_args(["export", cfg.model_dir, "--out", str(tmp_path / "exp")])
    assert args.func(args) == 0
    tokens = torch.randint(0, 257, (3, cfg.seq_len), generator=torch.Generator().manual_seed(3))
    assert load_exported(tmp_path / "exp")({"features": tokens})["token_ids"].shape == (3, cfg.seq_len)


def test_replicas_round_alike_and_stay_identical(tmp_path):

    from helpers.processes import launch_replicas

    procs = launch_replicas(SCRIPTS / "sr_dist_script.py", 2, "--out", str(tmp_path / "two"))
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    ranks = [json.loads((tmp_path / f"two.{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["world_size"] == 2 and ranks[0]["dtypes"] == ["torch.bfloat16"]
    assert ranks[0]["weights"] == ranks[1]["weights"]  # the same averaged gradient, the same rounding
    assert ranks[0]["generator"] == ranks[1]["generator"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_memory_of_a_state_heavy_step_falls_by_about_half():
    def peak(precision: str) -> int:
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()  # 33.6 M weights
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        if precision == "bf16-sr":
            to_bf16(model)
            opt = StochasticRounding(opt, seed=0)
        x = torch.randn(8, 2048, device="cuda")
        for _ in range(2):  # the second step has the optimizer state from the start
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()

    # fp32 master weights, gradients and AdamW moments (16 bytes a weight) against bf16 (8):
    # the fp32 scratch of bf16-sr's update is one parameter, so the peak falls by about half.
    assert peak("bf16-sr") < 0.65 * peak("bf16")
