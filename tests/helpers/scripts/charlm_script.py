"""A tiny charlm training job for the kill -9 test (run as a subprocess).

Usage: charlm_script.py --model_dir DIR --max_steps N [--sleep S] [--mem_len M]
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from stoker.data import stdlib_corpus
from stoker.hooks import Hook
from stoker.recipes.charlm import CharLMConfig, train_charlm

torch.set_num_threads(1)  # identical arithmetic in the reference and the resumed run

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


class Sleep(Hook):
    """Slow each loop down so a kill lands mid-run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def after_loop(self, run, result) -> None:  # noqa: ANN001
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--max_steps", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--mem_len", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    hooks = [Sleep(args.sleep)] if args.sleep else []
    results = train_charlm(tiny_config(args.model_dir, args.max_steps, args.mem_len), hooks=hooks)
    print(f"done {results}")


if __name__ == "__main__":
    main()
