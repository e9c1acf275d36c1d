"""The charlm recipe: memory semantics, the cache hand-over, eval reset, exact resume after kill -9."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

import stoker
from helpers.charlm import tiny_config
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, finished, in_background, popen, python_env, run_process
from stoker.recipes.charlm import (
    CharTransformerXL,
    build_estimator,
    charlm_model_fn,
    input_fns,
    train_charlm,
)
from stoker.recipes.cli import add_parser as add_train_parser

SCRIPT = SCRIPTS / "charlm_script.py"


def tiny_model(mem_len: int = 8, dropout: float = 0.0) -> CharTransformerXL:
    torch.manual_seed(0)
    return CharTransformerXL(d_model=32, n_layer=2, n_head=2, d_head=16, d_inner=64, dropout=dropout, mem_len=mem_len)


def test_a_segment_with_memory_sees_what_one_long_segment_sees():
    """With mem_len >= the previous segment, segment 2 attends to exactly the bytes a single
    window over both segments would: the logits agree (relative positions line up)."""
    model = tiny_model(mem_len=8).eval()
    tokens = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole, _ = model(tokens)
        first, memory = model(tokens[:, :8])
        second, _ = model(tokens[:, 8:], memory)
        alone, _ = model(tokens[:, 8:])
    torch.testing.assert_close(first, whole[:, :8], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(second, whole[:, 8:], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(alone, whole[:, 8:], atol=1e-3)  # without the memory it differs
    assert len(memory) == 2 and memory[0].shape == (3, 8, 32)


def test_no_gradient_flows_into_the_previous_segment():
    model = tiny_model(mem_len=8, dropout=0.1).train()
    seen: list[torch.Tensor] = []

    def keep(module, inputs, output) -> None:  # noqa: ANN001
        output.retain_grad()
        seen.append(output)

    handle = model.embed.register_forward_hook(keep)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    logits1, memory = model(tokens[:, :8])
    assert all(not m.requires_grad and m.grad_fn is None for m in memory)
    logits2, _ = model(tokens[:, 8:], memory)
    logits2.sum().backward()
    assert seen[0].grad is None, "segment 2's loss reached segment 1's activations"
    assert seen[1].grad is not None
    logits1.sum().backward()  # the check can see gradients where they do flow
    assert seen[0].grad is not None
    handle.remove()


def recording(log: list[tuple[str, object]]):  # noqa: ANN201
    def model_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        log.append((str(mode), params.get("cache")))
        spec = charlm_model_fn(model, features, labels, mode, params)
        log.append((f"{mode}-returned", spec.cache))
        return spec

    return model_fn


def test_the_estimator_hands_the_detached_cache_to_the_next_step_and_resets_it_at_eval(tmp_path):
    config = dataclasses.replace(tiny_config(str(tmp_path / "run"), max_steps=3), iterations_per_loop=1)
    train_fn, eval_fn = input_fns(config)
    est = build_estimator(config)
    calls: list[tuple[str, object]] = []
    est.model_fn = recording(calls)  # observe what the engine hands model_fn
    est.train(train_fn, max_steps=3)
    train_calls = [c for c in calls if c[0] == "train"]
    returned = [c[1] for c in calls if c[0] == "train-returned"]
    assert train_calls[0][1] is None
    for (_, given), previous in zip(train_calls[1:], returned, strict=False):
        assert isinstance(given, tuple) and len(given) == config.n_layer
        assert all(not g.requires_grad and g.grad_fn is None for g in given)
        assert all(torch.equal(g, p) for g, p in zip(given, previous, strict=True))
    saved = torch.load(est.latest_checkpoint() / "train_state.pt", weights_only=True)["cache"][0]  # replica 0's
    assert all(torch.equal(s, r) for s, r in zip(saved, returned[-1], strict=True))  # the cache is checkpointed

    calls.clear()
    first = est.evaluate(eval_fn, steps=3)
    eval_calls = [c[1] for c in calls if c[0] == "eval"]
    assert eval_calls[0] is None and isinstance(eval_calls[1], tuple)  # starts afresh, then carried
    calls.clear()
    assert est.evaluate(eval_fn, steps=3) == first  # a second evaluation starts afresh too
    assert [c[1] for c in calls if c[0] == "eval"][0] is None
    assert {"loss", "bpc", "ppl", "global_step"} <= set(first)
    assert first["bpc"] == pytest.approx(first["loss"] / 0.6931471805599453)


def test_mem_len_0_carries_nothing():
    model = tiny_model(mem_len=0)
    _, memory = model(torch.zeros(2, 8, dtype=torch.int64))
    assert memory is None


def test_cli_train_then_export_equals_predict(tmp_path, capsys):
    from stoker.export import load_exported
    from stoker.export.cli import add_parser as add_export_parser

    parser = argparse.ArgumentParser(prog="stoker")
    sub = parser.add_subparsers(dest="command")
    add_train_parser(sub)
    add_export_parser(sub)
    cfg = tiny_config(str(tmp_path / "run"), max_steps=4)
    argv = [
        "train",
        "charlm",
        "--model_dir",
        cfg.model_dir,
        "--max_steps",
        "4",
        "--text",
        *cfg.text,
        "--eval_steps",
        "2",
        "--eval_every_n_steps",
        "4",
    ]
    for name in (
        "d_model",
        "n_layer",
        "n_head",
        "d_head",
        "d_inner",
        "seq_len",
        "mem_len",
        "batch_size",
        "eval_batch_size",
    ):
        argv += [f"--{name}", str(getattr(cfg, name))]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    assert "held-out at step 4: bpc = " in capsys.readouterr().out
    spec = json.loads((tmp_path / "run" / "run_spec.json").read_text())
    assert spec["kind"] == "charlm" and spec["params"]["mem_len"] == cfg.mem_len

    args = parser.parse_args(["export", cfg.model_dir, "--out", str(tmp_path / "exp")])
    assert args.func(args) == 0
    program = load_exported(tmp_path / "exp")
    assert program.signature["inputs"] == [{"name": "features", "dtype": "int64", "shape": ["batch", cfg.seq_len]}]
    est = build_estimator(cfg)
    tokens = torch.randint(0, 256, (5, cfg.seq_len), generator=torch.Generator().manual_seed(3))
    batches = list(
        est.predict(
            lambda p: stoker.data.arrays(
                tokens, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p)
            ),
            checkpoint_path=program.signature["checkpoint"],
            yield_single_examples=False,
        )
    )
    want = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    for rows in (1, 5):
        got = program({"features": tokens[:rows]})
        torch.testing.assert_close(got["next_byte_logits"], want["next_byte_logits"][:rows], rtol=1e-4, atol=1e-5)
        assert torch.equal(got["next_byte"], want["next_byte"][:rows])


MAX_STEPS = 24


def run_script(model_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_process(
        [PYTHON, str(SCRIPT), "--model_dir", str(model_dir), "--max_steps", str(MAX_STEPS), *extra],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_kill_9_then_rerun_resumes_weights_and_memory_exactly(tmp_path):
    # the reference trains in the background while the run below is slowed and killed
    ref = in_background([PYTHON, str(SCRIPT), "--model_dir", str(tmp_path / "ref"), "--max_steps", str(MAX_STEPS)])
    crashed = tmp_path / "crashed"
    proc = popen(
        [PYTHON, str(SCRIPT), "--model_dir", str(crashed), "--max_steps", str(MAX_STEPS), "--sleep", "0.15"],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (crashed / "ckpt-8").exists():  # past the first evaluation's neighbourhood, before the end
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    index = json.loads((crashed / "checkpoint.json").read_text())
    assert index["latest"] != f"ckpt-{MAX_STEPS}", "the run finished before the kill"
    done = run_script(crashed)
    assert done.returncode == 0, done.stderr
    assert f"resumed from {crashed}" in done.stderr
    finished(ref)
    final = f"ckpt-{MAX_STEPS}"
    assert (crashed / final / "model.safetensors").read_bytes() == (
        tmp_path / "ref" / final / "model.safetensors"
    ).read_bytes()
    got = torch.load(crashed / final / "train_state.pt", weights_only=True)["cache"][0]  # replica 0's
    want = torch.load(tmp_path / "ref" / final / "train_state.pt", weights_only=True)["cache"][0]
    assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.slow
def test_memory_improves_held_out_bpc_at_equal_steps(tmp_path):
    """The recipe's claim, on the default small model (a few minutes on a 2-core CPU)."""
    with_memory = train_charlm(model_dir=str(tmp_path / "mem"), mem_len=64)
    without = train_charlm(model_dir=str(tmp_path / "nomem"), mem_len=0)
    assert with_memory["global_step"] == without["global_step"]
    assert with_memory["bpc"] < without["bpc"], (with_memory, without)
