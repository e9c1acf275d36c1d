"""The ``stoker`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stoker",
        description="stoker: a PyTorch-native Estimator. Train, evaluate, predict and benchmark models; "
        "resume killed runs exactly.",
    )
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="print versions and the devices torch sees")
    info.set_defaults(func=_info)
    # Imported here, not at the top: the subcommands pull in the model zoo and matplotlib.
    from .adanet.cli import add_parser as add_adanet_parser
    from .bench.cli import add_bench_parser
    from .checkpoint_cli import add_parser as add_checkpoint_parser
    from .evaluate_cli import add_parser as add_evaluate_parser
    from .export_cli import add_parser as add_export_parser
    from .inspect_run import add_parser as add_inspect_parser  # inspect and plot
    from .recipes import add_parser as add_train_parser  # train <recipe>
    from .serve import add_parser as add_serve_parser

    add_bench_parser(sub)
    for add in (add_train_parser, add_evaluate_parser, add_adanet_parser, add_export_parser, add_serve_parser,
                add_inspect_parser, add_checkpoint_parser):
        add(sub)
    return parser


def _info(args: argparse.Namespace) -> int:
    import torch

    print(f"stoker {__version__}")
    print(f"torch {torch.__version__}")
    print(f"cuda available: {torch.cuda.is_available()} ({torch.cuda.device_count()} devices)")
    print(f"cpu threads: {torch.get_num_threads()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    args.argv = given  # the command line as given: `stoker bench --num_gpus` relaunches it per replica
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
