"""``stoker adanet digits|diabetes|breast_cancer``: run a worked AdaNet search (see ``recipes``).

Wired into the ``stoker`` command by ``add_parser(subparsers)``. Rerunning with the same
``--model_dir`` resumes the search (or, once finished, only reports); ``--fresh`` starts over.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

RECIPES = ("digits", "diabetes", "breast_cancer")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from e
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative numbers, got {text!r}")
    return values


def add_parser(subparsers: Any) -> None:
    """Register the ``adanet`` subcommand on ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "adanet",
        help="AdaNet ensemble search on a bundled scikit-learn data set (digits, diabetes, breast_cancer)",
        description="Run an AdaNet search (Cortes et al., 2017) and print each iteration's candidates, "
        "the chosen architecture and held-out metrics against the best single subnetwork. See docs/adanet.md.",
        allow_abbrev=False,
    )
    p.add_argument("recipe", choices=RECIPES, help="which data set and search")
    p.add_argument("--model_dir", help="where the search lives (default runs/adanet/<recipe>); rerun to resume")
    p.add_argument("--max_iterations", type=_positive, default=3, help="AdaNet iterations; default %(default)s")
    p.add_argument(
        "--max_iteration_steps", type=_positive, default=200, help="training steps per iteration; default %(default)s"
    )
    p.add_argument("--batch_size", type=_positive, default=64, help="global batch; default %(default)s")
    p.add_argument(
        "--learning_rate", type=float, default=3e-3, help="Adam learning rate of the subnetworks; default %(default)s"
    )
    p.add_argument("--seed", type=int, default=0, help="data split, initialisation and shuffling; default %(default)s")
    p.add_argument(
        "--generators", default="linear,dnn,cnn", help="digits: which of linear,dnn,cnn to run; default %(default)s"
    )
    p.add_argument(
        "--lambdas",
        type=_floats,
        default=[0.0, 0.01, 0.1, 1.0],
        help="diabetes: adanet_lambda values; default 0,0.01,0.1,1",
    )
    p.add_argument("--fresh", action="store_true", help="delete --model_dir first")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")
    p.add_argument("--quiet", action="store_true", help="print only the JSON (with --json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the chosen recipe; returns the exit status."""
    import torch

    from ..distributed import torchrun_rank, torchrun_world_size
    from .recipes import RecipeConfig, run_breast_cancer, run_diabetes, run_digits

    logging.getLogger("stoker").setLevel(logging.WARNING)  # the recipe prints its own report
    chief = torchrun_rank() == 0  # under torchrun, replica 0 reports
    if args.fresh and torchrun_world_size() > 1:
        print(
            "stoker adanet: --fresh deletes --model_dir, which replicas would race to do: delete it before "
            "launching, and run without --fresh under torchrun",
            file=sys.stderr,
        )
        return 2
    torch.manual_seed(args.seed)
    cfg = RecipeConfig(
        model_dir=args.model_dir or f"runs/adanet/{args.recipe}",
        max_iterations=args.max_iterations,
        max_iteration_steps=args.max_iteration_steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
        fresh=args.fresh,
        verbose=not args.quiet and chief,
    )
    if args.recipe == "digits":
        which = [g.strip() for g in args.generators.split(",") if g.strip()]
        unknown = sorted(set(which) - {"linear", "dnn", "cnn"})
        if unknown:
            print(
                f"stoker adanet: --generators has unknown names {unknown}; choose from linear, dnn, cnn",
                file=sys.stderr,
            )
            return 2
        results = run_digits(cfg, which)
    elif args.recipe == "diabetes":
        results = run_diabetes(cfg, args.lambdas)
    else:
        results = run_breast_cancer(cfg)
    if args.json and chief:
        print(json.dumps(results, indent=1, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m stoker.adanet.cli <recipe> ...`` (what ``stoker adanet`` runs)."""
    parser = argparse.ArgumentParser(prog="stoker")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_parser(sub)
    args = parser.parse_args(["adanet", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
