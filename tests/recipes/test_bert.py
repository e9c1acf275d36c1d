"""The bert recipe: masks (80/10/10, fixed count, keyed by position), the model's layout, the
loss splitting exactly, exact resume, and the command line through export."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import stoker
from helpers.bert import tiny_config, windows
from stoker.recipes.bert import (
    IGNORE,
    MASK_ID,
    BertMLM,
    build_estimator,
    config_error,
    input_fns,
    mlm_loss,
)
from stoker.recipes.cli import add_parser as add_train_parser


def test_every_window_has_the_same_number_of_targets_and_only_targets_change():
    source = windows(batch_size=2000, mask_prob=0.15)
    inputs, labels = next(iter(source))
    k = round(0.15 * 20)
    targets = labels != IGNORE
    assert source.num_targets == k and (targets.sum(1) == k).all()
    order = source.batch_indices(0, 0)
    original = source.windows[order].long()
    assert torch.equal(labels[targets], original[targets])  # the label is the original byte
    assert torch.equal(inputs[~targets], original[~targets])  # nothing else is touched
    changed = inputs[targets]
    n = changed.numel()
    masked = (changed == MASK_ID).float().mean().item()
    kept = (changed == original[targets]).float().mean().item()
    assert abs(masked - 0.8) < 0.015, masked
    # 10% kept, plus a random byte that happens to equal the original (rare in text)
    assert abs(kept - 0.1) < 0.015, kept
    assert abs((1 - masked - kept) - 0.1) < 0.015
    assert n == 2000 * k
    # positions are spread over the whole window (uniform k-subsets)
    per_position = targets.float().mean(0)
    assert (per_position - k / 20).abs().max() < 0.05


def test_masks_depend_only_on_seed_epoch_and_window():
    a, b = windows(), windows()
    assert all(
        torch.equal(x, y)
        for x, y in zip(a.load_batch(torch.tensor([5, 9]), 0), b.load_batch(torch.tensor([5, 9]), 0), strict=True)
    )
    # the same window in another batch position gets the same mask
    one = a.load_batch(torch.tensor([9]), 0)
    assert torch.equal(one[1][0], b.load_batch(torch.tensor([5, 9]), 0)[1][1])
    assert not torch.equal(a.load_batch(torch.tensor([9]), 1)[1], one[1])  # a new epoch, new masks
    assert not torch.equal(windows(seed=4).load_batch(torch.tensor([9]), 0)[1], one[1])
    # the position is the state: a restored source continues bitwise
    it = iter(a)
    for _ in range(3):
        next(it)
    state = a.state_dict()
    want = [next(it) for _ in range(2)]
    c = windows()
    c.load_state_dict(state)
    got = [next(iter(c)) for _ in range(2)]
    assert all(torch.equal(x, y) for w, g in zip(want, got, strict=True) for x, y in zip(w, g, strict=True))


def test_the_model_is_embeddings_layers_head_and_the_loss_splits_exactly():
    torch.manual_seed(0)
    model = BertMLM(
        hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64, dropout=0.0, max_positions=20
    ).eval()
    assert [n for n, _ in model.named_children()] == ["embeddings", "layers", "head"]
    assert isinstance(model.layers, torch.nn.ModuleList) and len(model.layers) == 3
    inputs, labels = next(iter(windows()))
    with torch.no_grad():
        logits = model(inputs)
        h = model.embeddings(inputs)
        for layer in model.layers:
            h = layer(h)
        assert torch.equal(model.head(h), logits)  # forward is exactly the composition of the children
    assert logits.shape == (8, 20, 257)
    whole = mlm_loss(logits, labels)
    halves = (mlm_loss(logits[:4], labels[:4]) + mlm_loss(logits[4:], labels[4:])) / 2
    torch.testing.assert_close(halves, whole, rtol=1e-6, atol=0)
    targets = labels != IGNORE
    want = torch.nn.functional.cross_entropy(logits[targets], labels[targets])
    torch.testing.assert_close(whole, want)


def test_training_stopped_and_resumed_is_bitwise_the_uninterrupted_run(tmp_path):
    ref_cfg = tiny_config(str(tmp_path / "ref"), max_steps=6)
    train_fn, _ = input_fns(ref_cfg)
    ref = build_estimator(ref_cfg).train(train_fn, max_steps=6)
    cut_cfg = tiny_config(str(tmp_path / "cut"), max_steps=6)
    build_estimator(cut_cfg).train(train_fn, max_steps=3)  # stops at a checkpoint (every 2 steps) ... then 4
    resumed = build_estimator(cut_cfg).train(train_fn, max_steps=6)  # a new process would do the same
    for (name, a), b in zip(ref.model_state_dict().items(), resumed.model_state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_bad_sizes_are_named():
    assert (
        config_error(tiny_config(None, 1, hidden_size=30, num_heads=4))
        == "--hidden_size (30) must be divisible by --num_heads (4)"
    )
    assert "--mask_prob" in config_error(tiny_config(None, 1, mask_prob=1.5))
    assert "--seq_len" in config_error(tiny_config(None, 1, seq_len=1))
    assert config_error(tiny_config(None, 1, recompute=["layers.*", "encoder"])).startswith(
        "--recompute: 'encoder' matches no module of BertMLM; its modules are: embeddings, layers, head,"
    )
    assert config_error(tiny_config(None, 1, recompute=["all"])) is None
    with pytest.raises(ValueError, match="mask_prob"):
        windows(mask_prob=0.0)


def test_cli_train_evaluates_mlm_and_exports(tmp_path, capsys):
    from stoker.export import load_exported
    from stoker.export.cli import add_parser as add_export_parser

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
    out = capsys.readouterr().out
    assert "held-out at step 4: mlm_accuracy = " in out and "recompute layers.*" in out
    spec = json.loads((tmp_path / "run" / "run_spec.json").read_text())
    assert spec["kind"] == "bert" and spec["params"]["hidden_size"] == 32

    bad = parser.parse_args([*argv[:4], "--num_heads", "3", "--hidden_size", "32"])
    assert bad.func(bad) == 2
    assert "--hidden_size (32) must be divisible by --num_heads (3)" in capsys.readouterr().err

    args = parser.parse_args(["export", cfg.model_dir, "--out", str(tmp_path / "exp")])
    assert args.func(args) == 0
    program = load_exported(tmp_path / "exp")
    est = build_estimator(cfg)
    tokens = torch.randint(0, 257, (3, cfg.seq_len), generator=torch.Generator().manual_seed(3))
    rows = list(
        est.predict(
            lambda p: stoker.data.arrays(
                tokens, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(p)
            ),
            checkpoint_path=program.signature["checkpoint"],
            yield_single_examples=False,
        )
    )
    assert torch.equal(program({"features": tokens})["token_ids"], torch.cat([r["token_ids"] for r in rows]))
