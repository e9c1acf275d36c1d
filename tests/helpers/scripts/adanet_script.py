"""An AdaNet search job that the crash tests run as a real subprocess (not a test module); the
search and its data are helpers/adanet.py.

    python tests/helpers/scripts/adanet_script.py --model_dir DIR [--sleep 0.01] [--die_before_commit 1]
                                                  [--max_steps N] [--out results.json] [--evaluator]
                                                  [--async_checkpoints]

Under torchrun-style variables (RANK, WORLD_SIZE, ...) each process is one replica; ``--out``
(suffixed with the rank) records what the replica ends with: the architecture, a hash of the
final ensemble's weights and its evaluation on the training data.

``--die_before_commit t`` sends SIGKILL to itself right after the chosen ensemble of
iteration ``t`` is saved and before ``architecture-<t>.json`` is committed: the one moment a
random kill rarely hits. ``--evaluator`` chooses each iteration's candidate by evaluating it
(``adanet.Evaluator`` on the training data) instead of by the moving average of its training
loss; ``--async_checkpoints`` writes checkpoints on a background thread. A stop armed in the
environment (helpers/stops.py) is installed first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]
for path in (ROOT / "src", ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import stoker  # noqa: E402
from helpers.adanet import eval_input, make_data, make_search, train_input  # noqa: E402
from helpers.stops import install_from_env  # noqa: E402
from stoker import adanet  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model_dir", required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--die_before_commit", type=int, default=None)
    p.add_argument("--max_steps", type=int, default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--evaluator", action="store_true", help="choose by an evaluation")
    p.add_argument("--async_checkpoints", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    install_from_env()  # a stop the test armed (helpers/stops.py)
    if args.die_before_commit is not None:
        from stoker.adanet import estimator as adanet_estimator

        original = adanet_estimator.write_architecture

        def write_then_maybe_die(model_dir: Any, architecture: adanet.Architecture) -> Path:
            if architecture.iteration_number == args.die_before_commit:
                print(f"dying before committing iteration {architecture.iteration_number}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return original(model_dir, architecture)

        adanet_estimator.write_architecture = write_then_maybe_die  # type: ignore[assignment]
    x, y = make_data()
    est = make_search(
        args.model_dir,
        sleep=args.sleep,
        evaluator=adanet.Evaluator(eval_input(x, y)) if args.evaluator else None,
        run={"checkpoint_io": stoker.CheckpointIO(async_save=args.async_checkpoints)},
    )
    est.train(train_input(x, y), max_steps=args.max_steps)
    print(f"done {est.architecture().global_step}", flush=True)
    if args.out:
        weights = est.final_ensemble().state_dict()
        digest = hashlib.sha256(b"".join(weights[k].numpy().tobytes() for k in sorted(weights))).hexdigest()
        result = {
            "rank": int(os.environ.get("RANK", "0")),
            "architecture": est.architecture().serialize(),
            "final_weights_sha256": digest,
            "eval": est.evaluate(eval_input(x, y)),
            "selections": [est.selection(t) for t in range(est.iteration_number)],
        }
        Path(f"{args.out}.{result['rank']}").write_text(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
