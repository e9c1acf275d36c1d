"""Training recipes: complete, runnable model + ``model_fn`` + ``input_fn`` s built on stoker.

Each recipe module has a keyword-only config dataclass, a ``train_<name>(config)`` entry, and
``add_arguments(parser)`` / ``run(args)`` for the command line. ``add_parser`` registers the
``stoker train <recipe>`` subcommand with every recipe listed in :data:`RECIPES`.

- ``charlm``: a Transformer-XL-style character language model whose segment memory is carried
  from step to step through ``EstimatorSpec.cache`` (see docs/charlm.md).
- ``bert``: a small byte-level BERT masked-LM pretraining, the showcase of activation
  recompute and bf16 weights with stochastic rounding (see docs/bert.md).
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

#: recipe name -> module (imported only when that recipe runs, so ``stoker --help`` stays fast)
RECIPES: dict[str, str] = {"charlm": "stoker.recipes.charlm", "bert": "stoker.recipes.bert"}


def add_parser(subparsers: Any) -> None:
    """Register ``stoker train <recipe> ...`` on the ``stoker`` command's subparsers."""
    train = subparsers.add_parser(
        "train",
        help="train a built-in recipe (charlm: Transformer-XL-style character LM; bert: masked-LM pretraining)",
        description="Train one of stoker's recipes into --model_dir; rerunning the same command resumes it.",
    )
    recipes = train.add_subparsers(dest="recipe", metavar="RECIPE", required=True)
    for name, module_name in RECIPES.items():
        module = importlib.import_module(module_name)
        sub = recipes.add_parser(name, help=module.HELP, description=module.DESCRIPTION,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(func=module.run)


__all__ = ["RECIPES", "add_parser"]
