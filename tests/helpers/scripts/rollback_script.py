"""A run over a stream with poisoned batches, rolled back by NanLossHook; run as a real process by
the rollback crash test, which it can kill -9 itself at a chosen step (not a test module)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for helpers

from helpers.rollback import make, poisoned_data, train_input  # noqa: E402
from stoker.hooks import Hook, LoopResult, NanLossHook, RunContext  # noqa: E402


class KillAfterRollback(Hook):
    """SIGKILL this process at the first loop boundary at or past ``step`` after a rollback:
    before the checkpoint of that boundary is written (priority 20) or after it (99)."""

    def __init__(self, step: int, after_save: bool) -> None:
        self.step = step
        self.priority = 99 if after_save else 20

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if run.rollbacks and run.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--max_steps", type=int, default=16)
    p.add_argument("--kill_at", type=int)
    p.add_argument("--after_save", action="store_true")
    args = p.parse_args()
    x, y = poisoned_data()
    hooks: list[Hook] = [NanLossHook(on_nan="rollback")]
    if args.kill_at is not None:
        hooks.append(KillAfterRollback(args.kill_at, args.after_save))
    est = make(args.model_dir)
    est.train(train_input(x, y), max_steps=args.max_steps, hooks=hooks)
    print(f"done {est.global_step}", flush=True)


if __name__ == "__main__":
    main()
