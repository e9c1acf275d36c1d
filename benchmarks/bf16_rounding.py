"""The bert recipe trained with fp32 weights, bf16 weights rounded stochastically, and bf16 weights rounded to nearest.

The three variants differ only in how weights and optimizer state are kept:

- ``fp32``: ``precision="fp32"``.
- ``bf16-sr``: ``precision="bf16-sr"`` (bf16 weights and AdamW state, stochastic rounding).
- ``bf16-nearest``: the same bf16 weights and state, and the same fp32 update one parameter at
  a time, but rounded to the nearest bf16 (``StochasticRounding`` with its ``round`` replaced):
  what pure bf16 training without stochastic rounding does.

Each trains the recipe (its defaults unless flags say otherwise) from the same seed and reports
the held-out ``mlm_loss`` and ``mlm_accuracy``; the returned dicts are printed as a table.

    python benchmarks/bf16_rounding.py --max_steps 400 --eval_steps 20
    python benchmarks/bf16_rounding.py --variants bf16-nearest --max_steps 400   # one variant per process
    python benchmarks/bf16_rounding.py --lr 1e-4      # smaller updates: more of them below bf16's resolution
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile
from typing import Any

import torch

import stoker
from stoker.memory.stochastic_rounding import StochasticRounding, to_bf16
from stoker.recipes.bert import (
    BertConfig,
    BertMLM,
    bert_model_fn,
    build_estimator,
    input_fns,
    make_optimizer,
)

VARIANTS = ("fp32", "bf16-sr", "bf16-nearest")


class NearestRounding(StochasticRounding):
    """``StochasticRounding`` that rounds to the nearest bf16 instead (the stalling baseline)."""

    def round(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)


def train(variant: str, config: BertConfig) -> dict[str, Any]:
    """Train ``config`` as ``variant``; return the held-out result."""
    train_fn, eval_fn = input_fns(config)
    if variant == "bf16-nearest":
        reference = build_estimator(dataclasses.replace(config, precision="fp32"))
        est = stoker.Estimator(
            model=lambda params: to_bf16(BertMLM.from_params(params)),
            model_fn=bert_model_fn,
            optimizer=lambda params, parameters: NearestRounding(make_optimizer(params, parameters), seed=config.seed),
            lr_schedule=reference.state.schedule_fn,
            config=config.run_config().replace(precision="bf16"),  # bf16 autocast, as bf16-sr
            params=dict(reference.params),
            train_batch_size=config.batch_size,
            eval_batch_size=config.eval_batch_size,
        )
    else:
        est = build_estimator(dataclasses.replace(config, precision=variant))
    result = est.train_and_evaluate(
        train_fn, eval_fn, max_steps=config.max_steps, eval_every_n_steps=config.max_steps, eval_steps=config.eval_steps
    )
    return {
        "variant": variant,
        "global_step": result["global_step"],
        "mlm_loss": result["mlm_loss"],
        "mlm_accuracy": result["mlm_accuracy"],
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    print("| weights | steps | held-out mlm_loss (nats) | held-out mlm_accuracy |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['global_step']} | {r['mlm_loss']:.4f} | {r['mlm_accuracy']:.4f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--max_steps", type=int, default=400)
    parser.add_argument("--eval_steps", type=int, default=20)
    parser.add_argument(
        "--lr", type=float, default=BertConfig.lr, help="peak AdamW learning rate (the recipe's by default)"
    )
    parser.add_argument("--recompute", nargs="+", default=["layers.*"])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows = []
    for variant in args.variants:
        with tempfile.TemporaryDirectory() as model_dir:
            config = BertConfig(
                model_dir=model_dir,
                max_steps=args.max_steps,
                eval_steps=args.eval_steps,
                lr=args.lr,
                recompute=args.recompute,
                device=args.device,
                log_every_n_steps=10**6,
                save_checkpoints_steps=10**6,
            )
            rows.append(train(variant, config))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    load = os.getloadavg()
    print(f"torch {torch.__version__}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
