"""A run over a stream with poisoned batches, rolled back by NanLossHook; run as a real process by
the rollback crash test, which it can kill -9 itself at a chosen step (not a test module)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

from helpers.rollback import BATCH, POISONED, make, omitting, poisoned_data, train_input  # noqa: E402
from stoker.distributed import torchrun_world_size  # noqa: E402
from stoker.hooks import Hook, LoopResult, NanLossHook, RunContext  # noqa: E402


class KillAfterRollback(Hook):
    """SIGKILL this process at the first loop boundary at or past ``step`` after a rollback:
    before the checkpoint of that boundary is written (phase "recording") or after it ("signals")."""

    def __init__(self, step: int, after_save: bool) -> None:
        self.step = step
        self.phase = "signals" if after_save else "recording"

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if run.rollbacks and run.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=16)
    p.add_argument("--kill_at", type=int)
    p.add_argument("--after_save", action="store_true")
    p.add_argument("--omit", action="store_true", help="no rollback: the stream without the poisoned batches")
    p.add_argument("--out", help="the chief writes the final weights here (JSON)")
    args = p.parse_args()
    replicas = torchrun_world_size()  # replica 0's stream batches 9 and 13 are poisoned
    x, y = poisoned_data(batch=BATCH // replicas, num_shards=replicas)
    hooks: list[Hook] = [] if args.omit else [NanLossHook(on_nan="rollback")]
    if args.kill_at is not None:
        hooks.append(KillAfterRollback(args.kill_at, args.after_save))
    est = make(args.model_dir, distributed_timeout=120)
    input_fn = omitting(x, y, set(POISONED)) if args.omit else train_input(x, y)
    est.train(input_fn, max_steps=args.max_steps, hooks=hooks)
    weights = est.model_state_dict()  # collective
    if est.strategy.is_chief and args.out:
        Path(args.out).write_text(json.dumps({k: v.tolist() for k, v in weights.items()}))
    print(f"done {est.global_step}", flush=True)
    est.strategy.teardown()


if __name__ == "__main__":
    main()
