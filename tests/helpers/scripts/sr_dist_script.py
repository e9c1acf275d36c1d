"""Replicated bf16-sr training as real processes, one per replica (run by memory/test_stochastic_rounding.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

import stoker  # noqa: E402
from helpers.tiny import TinyNet, classifier_fn, make_data  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True, help="each replica writes OUT.<rank>.json")
    p.add_argument("--max_steps", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(1)
    x, y = make_data(128)
    est = stoker.Estimator(
        model=lambda params: TinyNet(dropout=0.0),
        model_fn=classifier_fn,
        optimizer=lambda params, parameters: torch.optim.Adam(parameters, lr=0.01),
        config=stoker.RunConfig(
            precision="bf16-sr",
            iterations_per_loop=2,
            progress_bar=False,
            distributed_timeout=60.0,
            log_every_n_steps=10**6,
        ),
        train_batch_size=16,
    )
    est.train(
        lambda params: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(seed=0).for_replica(params)),
        max_steps=args.max_steps,
    )
    rank = est.strategy.rank
    Path(f"{args.out}.{rank}.json").write_text(
        json.dumps(
            {
                "world_size": est.strategy.world_size,
                "weights": {k: v.float().tolist() for k, v in est.model.state_dict().items()},
                "dtypes": sorted({str(v.dtype) for v in est.model.state_dict().values()}),
                "generator": est.state.optimizer.generator.get_state().tolist(),
            }
        )
    )
    est.strategy.teardown()


if __name__ == "__main__":
    main()
