"""The bert recipe's attention forms (``--attention=sdpa`` by default, ``math`` written out), its
``--compile`` option, the fused AdamW it builds on CUDA, and the examples/sec and MFU it prints."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from helpers.bert import tiny_config, windows
from stoker.recipes.bert import (
    BertMLM,
    build_estimator,
    fused_on_cuda,
    input_fns,
    make_optimizer,
    mlm_loss,
    training_flops_per_example,
)
from stoker.recipes.cli import add_parser as add_train_parser


def _pair(dropout: float = 0.0) -> tuple[BertMLM, BertMLM]:
    torch.manual_seed(0)
    sdpa = BertMLM(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, dropout=dropout, max_positions=20)
    math = BertMLM(
        hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, dropout=dropout, max_positions=20,
        attention="math",
    )  # fmt: skip
    math.load_state_dict(sdpa.state_dict())
    return sdpa, math


def test_sdpa_and_the_written_out_attention_agree_in_fp32() -> None:
    """Forward and every gradient, on the recipe's batches (full windows: the recipe has no
    padding, so no mask), within fp32 rounding; and they are two computations, not one."""
    sdpa, math = _pair()
    inputs, labels = next(iter(windows()))
    losses, grads = [], []
    for model in (sdpa, math):
        loss = mlm_loss(model(inputs), labels)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], rtol=1e-4, atol=1e-6, msg=name)
    assert [m.attention for m in (sdpa.layers[0].attention, math.layers[0].attention)] == ["sdpa", "math"]
    with torch.no_grad():
        torch.testing.assert_close(sdpa.eval()(inputs), math.eval()(inputs), rtol=1e-5, atol=1e-5)


def test_with_dropout_the_forms_differ_only_by_their_masks() -> None:
    """In training mode each form draws its own dropout mask; in eval mode they agree again."""
    sdpa, math = _pair(dropout=0.1)
    inputs, _ = next(iter(windows()))
    torch.manual_seed(5)
    a = sdpa.train()(inputs)
    torch.manual_seed(5)
    b = sdpa(inputs)
    assert torch.equal(a, b)  # the same seed, the same masks: deterministic
    with torch.no_grad():
        torch.testing.assert_close(sdpa.eval()(inputs), math.eval()(inputs), rtol=1e-5, atol=1e-5)


def _forward_before_the_option(self, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """SelfAttention.forward as it was before ``--attention`` existed (commit b7a63c5), verbatim."""
    b, t, h = x.shape
    heads = self.num_heads
    q, k, v = self.qkv(x).view(b, t, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
    weights = self.drop((q @ k.transpose(-1, -2) * (h // heads) ** -0.5).softmax(-1))
    return self.out((weights @ v).transpose(1, 2).reshape(b, t, h))


def test_the_math_form_trains_step_for_step_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--attention=math`` is the recipe as it was: every loss and every weight after 4 steps
    (dropout on) bitwise those of the attention code before the option."""
    from stoker.hooks import Hook
    from stoker.recipes.bert import SelfAttention

    def run() -> tuple[list[float], dict[str, torch.Tensor]]:
        cfg = tiny_config(None, max_steps=4, attention="math")
        losses: list[float] = []

        class Losses(Hook):
            def after_loop(self, run, result):  # noqa: ANN001, ANN202
                losses.extend(result.losses)

        est = build_estimator(cfg)
        est.train(input_fns(cfg)[0], max_steps=4, hooks=[Losses()])
        return losses, est.model_state_dict()

    now_losses, now = run()
    monkeypatch.setattr(SelfAttention, "forward", _forward_before_the_option)
    then_losses, then = run()
    assert now_losses == then_losses and len(now_losses) == 4
    for name, value in now.items():
        assert torch.equal(value, then[name]), name


@pytest.mark.parametrize("attention", ["sdpa", "math"])
def test_resume_is_bitwise_within_one_form(tmp_path, attention: str) -> None:  # noqa: ANN001
    ref_cfg = tiny_config(str(tmp_path / "ref"), max_steps=6, attention=attention)
    train_fn, _ = input_fns(ref_cfg)
    ref = build_estimator(ref_cfg).train(train_fn, max_steps=6)
    cut_cfg = tiny_config(str(tmp_path / "cut"), max_steps=6, attention=attention)
    build_estimator(cut_cfg).train(train_fn, max_steps=3)
    resumed = build_estimator(cut_cfg).train(train_fn, max_steps=6)
    assert resumed.model.layers[0].attention.attention == attention
    for (name, a), b in zip(ref.model_state_dict().items(), resumed.model_state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_options_parse_appear_in_help_and_reach_the_run() -> None:
    from stoker.recipes.bert import RECIPE

    parser = argparse.ArgumentParser(prog="stoker train bert")
    RECIPE.add_arguments(parser)
    text = parser.format_help()
    assert "--attention {auto,sdpa,math}" in text and "--compile {none,module,step}" in text
    args = parser.parse_args(["--model_dir", "d", "--attention", "math", "--compile", "module"])
    assert (args.attention, args.compile) == ("math", "module")
    defaults = parser.parse_args(["--model_dir", "d"])
    assert (defaults.attention, defaults.compile) == ("auto", "none")
    with pytest.raises(SystemExit):
        parser.parse_args(["--model_dir", "d", "--attention", "flash"])
    cfg = tiny_config(None, 1, compile="module", attention="math")
    assert cfg.run_config().compile == "module"
    assert cfg.model_params()["attention"] == "math"


def test_stoker_train_bert_prints_examples_per_sec_and_mfu(tmp_path, capsys) -> None:  # noqa: ANN001
    """The second line of ``stoker train bert``: the loops after the first (steps 3-4 of two
    loops of 2), and MFU against this machine's measured peak on a CPU."""
    import re

    parser = argparse.ArgumentParser(prog="stoker")
    add_train_parser(parser.add_subparsers(dest="command"))
    cfg = tiny_config(str(tmp_path / "run"), max_steps=4)
    argv = ["train", "bert", "--model_dir", cfg.model_dir, "--max_steps", "4", "--text", *cfg.text]
    argv += ["--eval_every_n_steps", "0", "--iterations_per_loop", "2", "--save_checkpoints_steps", "4"]
    for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "seq_len", "batch_size", "device"):
        argv += [f"--{name}", str(getattr(cfg, name))]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    out = capsys.readouterr().out
    m = re.search(
        r"^training: ([\d.]+) examples/sec \(steps 3-4\), MFU ([\d.]+) % of ([\d.]+) TFLOP/s \(measured: .+\)$",
        out,
        re.MULTILINE,
    )
    assert m, out
    assert float(m.group(1)) > 0 and 0 < float(m.group(2))


def test_run_specs_without_attention_build_the_written_out_form() -> None:
    """A run spec written before the option existed trained the written-out attention."""
    params = {**tiny_config(None, 1).model_params()}
    del params["attention"]
    assert BertMLM.from_params(params).layers[0].attention.attention == "math"
    assert BertMLM.from_params({**params, "attention": "sdpa"}).layers[0].attention.attention == "sdpa"


def test_adamw_is_fused_only_for_fp32_weights_on_cuda() -> None:
    params = {"weight_decay": 0.01, "lr": 1e-3}
    model = torch.nn.Linear(3, 2)
    assert not fused_on_cuda(list(model.parameters()))
    assert not make_optimizer(params, model.parameters()).defaults["fused"]  # CPU: as before
    assert not fused_on_cuda([])
    if torch.cuda.is_available():
        cuda = torch.nn.Linear(3, 2).cuda()
        assert make_optimizer(params, cuda.parameters()).defaults["fused"]
        assert not fused_on_cuda(list(cuda.bfloat16().parameters()))  # bf16-sr's weights: the default AdamW


def test_the_flop_count_is_torch_flop_counters() -> None:
    """training_flops_per_example is what torch.utils.flop_counter counts for one window's
    forward and backward through the written-out form."""
    from torch.utils.flop_counter import FlopCounterMode

    cfg = tiny_config(None, 1, hidden_size=64, num_heads=4, intermediate_size=128, seq_len=32, dropout=0.0)
    model = BertMLM.from_params({**cfg.model_params(), "attention": "math"})
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 256, (1, 32))).sum().backward()
    assert training_flops_per_example(cfg) == counter.get_total_flops()


def test_auto_is_sdpa_on_cuda_and_math_on_the_cpu_and_the_form_is_what_the_run_spec_records(tmp_path) -> None:  # noqa: ANN001
    from stoker.recipes.bert import RECIPE, BertConfig

    assert BertConfig(device="cpu").model_params()["attention"] == "math"
    assert BertConfig(device="cuda").model_params()["attention"] == "sdpa"
    assert BertConfig(device="cpu", attention="sdpa").model_params()["attention"] == "sdpa"
    assert BertConfig(device="cuda:0", attention="math").model_params()["attention"] == "math"
    # a run spec from before the option (no "attention" anywhere) rebuilds the written-out form
    cfg = tiny_config(str(tmp_path), 1)
    params = {k: v for k, v in cfg.model_params().items() if k != "attention"}
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "attention"}
    old = RECIPE.config_from_run_spec({"params": params, "config": {**config, "device": "cuda"}}, tmp_path)
    assert old.model_params()["attention"] == "math"


def test_the_default_on_a_cpu_trains_bitwise_as_the_written_out_form(tmp_path) -> None:  # noqa: ANN001
    """``auto`` on a CPU is ``math``: the same weights after training as naming it."""
    runs = {}
    for attention in ("auto", "math"):
        est = build_estimator(tiny_config(None, 3, attention=attention, device="cpu"))
        est.train(input_fns(tiny_config(None, 3))[0], max_steps=3)
        runs[attention] = est.model_state_dict()
    for name, weight in runs["auto"].items():
        assert torch.equal(weight, runs["math"][name]), name
