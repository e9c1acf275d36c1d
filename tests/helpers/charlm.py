"""The charlm tests' tiny configuration (also used by helpers/scripts/charlm_script.py)."""

from __future__ import annotations

from stoker.data import stdlib_corpus
from stoker.recipes.charlm import CharLMConfig

TINY = dict(
    d_model=32,
    n_layer=2,
    n_head=2,
    d_head=16,
    d_inner=64,
    dropout=0.1,
    seq_len=16,
    mem_len=16,
    batch_size=4,
    eval_batch_size=4,
    lr=3e-3,
    warmup_steps=5,
    eval_steps=3,
    eval_every_n_steps=10,
    save_checkpoints_steps=4,
    iterations_per_loop=2,
    log_every_n_steps=10,
    keep_checkpoint_max=0,
    device="cpu",
)


def tiny_config(model_dir: str, max_steps: int, mem_len: int = 16) -> CharLMConfig:
    """The tests' charlm: 2 small layers on ~150 KB of standard-library text."""
    text = [str(p) for p in stdlib_corpus(150_000)]
    return CharLMConfig(model_dir=model_dir, text=text, max_steps=max_steps, **{**TINY, "mem_len": mem_len})
