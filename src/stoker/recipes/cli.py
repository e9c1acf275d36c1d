"""``stoker train RECIPE ...``: one subcommand per recipe found in the ``stoker.recipes`` entry points.

A recipe module provides ``HELP``, ``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args)``
(the shared skeleton in :mod:`stoker.recipes.skeleton` gives all four). stoker's own
(``charlm``, ``bert``) are declared like any other package's (:mod:`stoker.plugins`), so an
installed package that declares a ``stoker.recipes`` entry point gets its own ``stoker train NAME``.
"""

from __future__ import annotations

from typing import Any

from .. import plugins
from ..flags import DefaultsHelpFormatter


def add_parser(subparsers: Any) -> None:
    """Register ``stoker train <recipe> ...`` on the ``stoker`` command's subparsers."""
    names = plugins.entry_points(plugins.RECIPES_GROUP)
    train = subparsers.add_parser(
        "train",
        help=f"train a recipe ({', '.join(names)})",
        description="Train one of the installed recipes into --model_dir; rerunning the same command resumes it.",
    )
    recipes = train.add_subparsers(dest="recipe", metavar="RECIPE", required=True)
    for name in names:
        try:
            module = plugins.load(plugins.RECIPES_GROUP, name)
        except plugins.PluginError as e:
            recipes.add_parser(name, help=f"unavailable: {e}")
            continue
        assert module is not None
        sub = recipes.add_parser(
            name,
            help=module.HELP,
            description=module.DESCRIPTION,
            formatter_class=DefaultsHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(func=module.run)


__all__ = ["add_parser"]
