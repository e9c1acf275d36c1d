"""A tiny charlm training job for the kill -9 test (run as a subprocess).

Usage: charlm_script.py --model_dir DIR --max_steps N [--sleep S] [--mem_len M]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

from helpers.charlm import tiny_config  # noqa: E402
from stoker.hooks import Hook  # noqa: E402
from stoker.recipes.charlm import train_charlm  # noqa: E402

torch.set_num_threads(1)  # identical arithmetic in the reference and the resumed run


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
