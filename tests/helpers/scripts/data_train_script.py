"""A training job on ``image_folder`` with worker processes, run as a real subprocess by
tests/data/test_data_crash.py (not a test module); the model, data and input are in helpers/images.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

from helpers.images import input_fn, make_estimator  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--max_steps", type=int, default=40)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    est = make_estimator(args.model_dir, sleep=args.sleep)
    est.train(input_fn(args.data, args.workers), max_steps=args.max_steps)
    print(f"done {est.global_step}", flush=True)


if __name__ == "__main__":
    main()
