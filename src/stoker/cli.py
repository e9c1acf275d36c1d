"""The ``stoker`` command: a table of subcommands, each registered by its package's ``cli.py``.

Every package that has a command keeps its parser in ``<package>/cli.py`` as
``add_parser(subparsers)``. This module lists them in :data:`COMMANDS` and imports only the
module of the command that runs (the subcommands pull in torch, the model zoo, matplotlib), so
``stoker --help`` and a mistyped command answer at once. Usage errors exit with status 2, and
so does a directory a command names that cannot be used (:data:`DIRECTORY_ARGUMENTS`, checked
with :func:`stoker.storage.check_dir` before the command prints or builds anything).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from ._version import __version__

#: command -> (module whose ``add_parser`` registers it, one-line help for ``stoker --help``)
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("stoker.bench.cli", "benchmark a zoo model with tf_cnn_benchmarks' flags and output"),
    "train": ("stoker.recipes.cli", "train a recipe (charlm, bert, or one an installed package adds)"),
    "evaluate": (
        "stoker.engine.cli",
        "evaluate a model_dir's checkpoints; --watch: each new one as training writes it",
    ),
    "adanet": ("stoker.adanet.cli", "run an AdaNet ensemble search on a bundled data set"),
    "export": ("stoker.export.cli", "export a model_dir's best (else newest) checkpoint as a torch.export program"),
    "serve": ("stoker.serving.cli", "serve an export over the Open Inference Protocol (KServe v2)"),
    "inspect": ("stoker.summary.cli", "show a model_dir: checkpoints, latest metrics, run spec"),
    "plot": ("stoker.summary.cli", "plot a model_dir's curves into a PNG"),
    "checkpoint": (
        "stoker.checkpoint.cli",
        "checkpoint utilities (list, verify, repair the index, consolidate a sharded checkpoint)",
    ),
    "info": ("stoker.cli", "print versions and the devices torch sees"),
}


#: command -> the options (or positional, upper case) that name a directory it uses, and whether
#: it writes there: checked before the command runs (:func:`check_directories`). ``stoker bench``
#: checks its own (``--train_dir``, ``--benchmark_log_dir``) with its flags.
DIRECTORY_ARGUMENTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "train": (("--model_dir", True),),
    "adanet": (("--model_dir", True),),
    "evaluate": (("MODEL_DIR", False),),
    "export": (("MODEL_DIR", False), ("--out", True)),
    "inspect": (("MODEL_DIR", False),),
    "plot": (("MODEL_DIR", False),),
}


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage error is the one line that matters and where to read
    more (``see stoker bench --help``), not the whole usage; exit status 2. Subcommands'
    parsers are of this class too (argparse gives them their parent's)."""

    #: the command whose ``--help`` the hint names (``stoker`` sets it to the command given)
    help_hint: str | None = None

    def error(self, message: str) -> NoReturn:
        hint = self.help_hint or self.prog
        self.exit(2, f"{self.prog}: error: {message}\nsee {hint} --help\n")


def build_parser(command: str | None = None) -> CommandParser:
    """The ``stoker`` parser; ``command``'s subparser in full, the others as one-line stubs."""
    parser = CommandParser(
        prog="stoker",
        description="stoker: a PyTorch-native Estimator. Train, evaluate, predict and benchmark models; "
        "resume killed runs exactly.",
    )
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    module = COMMANDS[command][0] if command in COMMANDS else None
    if module is not None:
        importlib.import_module(module).add_parser(sub)
    for name, (_, help_text) in COMMANDS.items():
        if name not in sub.choices:  # a stub: listed in --help, its options loaded when it runs
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``stoker info``."""
    info = subparsers.add_parser("info", help=COMMANDS["info"][1])
    info.set_defaults(func=_info)


def _info(args: argparse.Namespace) -> int:
    import torch

    print(f"stoker {__version__}")
    print(f"torch {torch.__version__}")
    print(f"cuda available: {torch.cuda.is_available()} ({torch.cuda.device_count()} devices)")
    print(f"cpu threads: {torch.get_num_threads()}")
    return 0


def check_directories(command: str, args: argparse.Namespace) -> str | None:
    """The one-line problem with a directory ``command``'s arguments name (a file, a path under
    a file, a folder it cannot write, a missing bucket), or ``None``."""
    from .errors import ConfigError
    from .storage import check_dir

    for flag, writes in DIRECTORY_ARGUMENTS.get(command, ()):
        value = getattr(args, flag.lstrip("-").lower(), None)
        if value is None:
            continue
        try:
            check_dir(value, flag, writable=writes)
        except ConfigError as e:
            return str(e)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in given if not a.startswith("-")), None)
    parser = build_parser(command)
    if command in COMMANDS:
        parser.help_hint = f"stoker {command}"  # an unknown flag is the top parser's error: name the command
    args = parser.parse_args(given)
    args.argv = given  # the command line as given: `stoker bench --num_gpus` relaunches it per replica
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    problem = check_directories(args.command, args)
    if problem:  # before the command prints anything or builds a model
        print(f"stoker {args.command}: error: {problem}", file=sys.stderr)
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
