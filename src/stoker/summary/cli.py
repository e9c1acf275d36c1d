"""``stoker inspect MODEL_DIR`` and ``stoker plot MODEL_DIR``: a model_dir read back from its files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import StokerError
from .inspect import format_inspection, inspect_run, plot_run


def add_parser(subparsers: Any) -> None:
    """Register ``stoker inspect MODEL_DIR`` and ``stoker plot MODEL_DIR --out curves.png``."""
    p = subparsers.add_parser(
        "inspect",
        help="show a model_dir: checkpoints (step, time, size, eval, best), latest metrics, run spec",
        description="Show what a model_dir holds, from its files only (checkpoint.json, metrics.csv, run_spec.json).",
    )
    p.add_argument("model_dir")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    p.set_defaults(func=_inspect_command)
    q = subparsers.add_parser(
        "plot",
        help="plot a model_dir's loss, eval metrics, throughput and learning rate vs step into a PNG",
        description="Plot the curves in a model_dir's metrics.csv (matplotlib, Agg backend).",
    )
    q.add_argument("model_dir")
    q.add_argument("--out", default=None, help="the PNG to write (default: MODEL_DIR/curves.png)")
    q.add_argument("--dpi", type=int, default=100, help="resolution of the PNG")
    q.set_defaults(func=_plot_command)


def _inspect_command(args: argparse.Namespace) -> int:
    try:
        info = inspect_run(args.model_dir)
    except StokerError as e:
        print(f"stoker inspect: {e}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=1) if args.json else format_inspection(info))
    return 0


def _plot_command(args: argparse.Namespace) -> int:
    if args.dpi < 10:
        print(f"stoker plot: --dpi must be >= 10; got {args.dpi}", file=sys.stderr)
        return 2
    out = args.out or str(Path(args.model_dir) / "curves.png")
    try:
        result = plot_run(args.model_dir, out, dpi=args.dpi)
    except StokerError as e:
        print(f"stoker plot: {e}", file=sys.stderr)
        return 1
    w, h = result["size"]
    print(f"wrote {result['path']} ({w}x{h} px): {', '.join(result['panels'])}")
    return 0


__all__ = ["add_parser"]
