"""The charlm recipe's attention forms: ``--attention=sdpa`` (default; the relative-position
scores as scaled_dot_product_attention's additive mask) against ``math`` (written out)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers.charlm import tiny_config
from stoker.recipes.charlm import RECIPE, CharTransformerXL, build_estimator, input_fns


def _pair(dropout: float = 0.0) -> tuple[CharTransformerXL, CharTransformerXL]:
    kw = dict(d_model=32, n_layer=2, n_head=2, d_head=16, d_inner=64, dropout=dropout, mem_len=8)
    torch.manual_seed(0)
    sdpa = CharTransformerXL(**kw)
    math = CharTransformerXL(**kw, attention="math")
    math.load_state_dict(sdpa.state_dict())
    return sdpa, math


def test_sdpa_and_the_written_out_attention_agree_with_memory_and_the_causal_mask() -> None:
    sdpa, math = _pair()
    tokens = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(1))
    grads = []
    for model in (sdpa, math):
        first, memory = model(tokens[:, :8])
        second, _ = model(tokens[:, 8:], memory)  # the second segment attends to the memory too
        loss = F.cross_entropy(second.reshape(-1, 256), tokens[:, 8:].reshape(-1)) + first.square().mean()
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        model.outputs = (first.detach(), second.detach())  # type: ignore[assignment]
    for a, b in zip(sdpa.outputs, math.outputs, strict=True):  # type: ignore[arg-type]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for name, g in grads[0].items():
        torch.testing.assert_close(g, grads[1][name], rtol=1e-4, atol=1e-6, msg=name)
    assert sdpa.blocks[0].attn.attention == "sdpa" and math.blocks[0].attn.attention == "math"


@pytest.mark.parametrize("attention", ["sdpa", "math"])
def test_resume_is_bitwise_within_one_form(tmp_path, attention: str) -> None:  # noqa: ANN001
    def config(name: str):  # noqa: ANN202
        return dataclasses.replace(tiny_config(str(tmp_path / name), max_steps=8), attention=attention)

    ref_cfg = config("ref")
    train_fn, _ = input_fns(ref_cfg)
    ref = build_estimator(ref_cfg).train(train_fn, max_steps=8)
    cut_cfg = config("cut")
    build_estimator(cut_cfg).train(train_fn, max_steps=4)
    resumed = build_estimator(cut_cfg).train(train_fn, max_steps=8)
    assert resumed.model.blocks[0].attn.attention == attention
    for (name, a), b in zip(ref.model_state_dict().items(), resumed.model_state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_the_option_parses_and_appears_in_help() -> None:
    parser = argparse.ArgumentParser(prog="stoker train charlm")
    RECIPE.add_arguments(parser)
    assert "--attention {auto,sdpa,math}" in parser.format_help()
    assert parser.parse_args(["--model_dir", "d"]).attention == "auto"
    assert parser.parse_args(["--model_dir", "d", "--attention", "math"]).attention == "math"
    params = {k: v for k, v in tiny_config("d", 1).model_params().items() if k != "attention"}
    assert CharTransformerXL.from_params(params).blocks[0].attn.attention == "math"  # an older run spec


def test_auto_is_sdpa_on_cuda_and_math_on_the_cpu_and_the_form_is_what_the_run_spec_records() -> None:
    from stoker.recipes.charlm import CharLMConfig

    assert CharLMConfig(device="cpu").model_params()["attention"] == "math"
    assert CharLMConfig(device="cuda:1").model_params()["attention"] == "sdpa"
    assert CharLMConfig(device="cuda", attention="math").model_params()["attention"] == "math"
    assert CharLMConfig(device="cpu", attention="sdpa").model_params()["attention"] == "sdpa"
    default = CharLMConfig().model_params()["attention"]
    assert default == ("sdpa" if torch.cuda.is_available() else "math")


def test_an_older_run_spec_rebuilds_the_written_out_form_and_a_newer_one_its_own(tmp_path) -> None:  # noqa: ANN001
    """A run spec from before ``--attention`` (no ``attention`` in its params or config) trained
    the written-out form, on any device; one written now records the form it trained."""
    cfg = tiny_config(str(tmp_path), 1)
    params = {k: v for k, v in cfg.model_params().items() if k != "attention"}
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "attention"}
    for device in ("cpu", "cuda"):
        old = RECIPE.config_from_run_spec({"params": params, "config": {**config, "device": device}}, tmp_path)
        assert old.model_params()["attention"] == "math"
    new = RECIPE.config_from_run_spec({"params": {**params, "attention": "sdpa"}, "config": config}, tmp_path)
    assert new.model_params()["attention"] == "sdpa"
