"""The bert tests' tiny configuration and masked windows (also used by the recompute and
stochastic-rounding tests)."""

from __future__ import annotations

from typing import Any

from stoker.data import ReadOptions, stdlib_corpus
from stoker.recipes.bert import BertConfig, MaskedTextWindows

TINY = dict(
    hidden_size=32,
    num_layers=2,
    num_heads=2,
    intermediate_size=64,
    dropout=0.1,
    seq_len=16,
    batch_size=8,
    eval_batch_size=8,
    lr=3e-3,
    warmup_steps=2,
    eval_steps=2,
    eval_every_n_steps=4,
    save_checkpoints_steps=2,
    iterations_per_loop=2,
    log_every_n_steps=10,
    keep_checkpoint_max=0,
    device="cpu",
)


def tiny_config(model_dir: str | None, max_steps: int, **changes: object) -> BertConfig:
    """The tests' bert: 2 small layers on ~150 KB of standard-library text."""
    text = [str(p) for p in stdlib_corpus(150_000)]
    return BertConfig(model_dir=model_dir, text=text, max_steps=max_steps, **{**TINY, **changes})


def windows(mask_prob: float = 0.15, **read: Any) -> MaskedTextWindows:
    """Masked windows of 20 bytes, batches of 8, seed 3; ``read`` changes those read options."""
    files = stdlib_corpus(150_000)
    options = ReadOptions(**{"batch_size": 8, "seed": 3, **read})
    return MaskedTextWindows(files, seq_len=20, read=options, mask_prob=mask_prob)
