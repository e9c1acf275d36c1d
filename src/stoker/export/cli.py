"""The ``stoker export MODEL_DIR --out DIR`` command.

It rebuilds the model_dir's Estimator through the registry in :mod:`stoker.run_spec` (which
imports the module of the run's kind through its ``stoker.run_spec`` entry point) and exports
it with :func:`stoker.export.export`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Mapping
from typing import Any

import torch

from .. import storage
from ..errors import StokerError
from ..run_spec import RUN_SPEC_FILE, estimator_from_model_dir
from .aot import AOT_DEVICES
from .program import FORMATS, SIGNATURE_FILE, export


def add_parser(subparsers: Any) -> None:
    """Register ``stoker export MODEL_DIR --out DIR``."""
    p = subparsers.add_parser(
        "export",
        help="export a model_dir's best (else newest) checkpoint as torch.export program + safetensors",
        description="Export the PREDICT computation of a model_dir made by a stoker recipe or harness "
        f"(it needs {RUN_SPEC_FILE}, see docs/export.md) to --out: model.pt2, model.safetensors, "
        "signature.json and optionally model.onnx and (--aot) model.aoti.pt2.",
    )
    p.add_argument("model_dir", help=f"a model_dir with checkpoints and {RUN_SPEC_FILE}")
    p.add_argument("--out", required=True, help="the export directory to create (an earlier export there is replaced)")
    p.add_argument("--checkpoint", default=None, help="a ckpt-<step> directory to export (default: best, else newest)")
    p.add_argument(
        "--format",
        dest="formats",
        action="append",
        choices=FORMATS,
        default=None,
        help="pt2 (always) and/or onnx; repeat the flag for both",
    )
    p.add_argument(
        "--static_batch",
        type=int,
        default=None,
        metavar="N",
        help="fix the batch dimension to N instead of exporting it as dynamic",
    )
    p.add_argument(
        "--aot",
        action="store_true",
        help="also compile the program with AOTInductor into model.aoti.pt2 (needs a C++ compiler)",
    )
    p.add_argument(
        "--aot_device",
        choices=AOT_DEVICES,
        default="cpu",
        help="the device the --aot package is compiled for (cuda: not yet verified on a GPU)",
    )
    p.set_defaults(func=_export_command)


def _export_command(args: argparse.Namespace) -> int:
    if args.aot_device != "cpu" and not args.aot:
        print("stoker export: --aot_device needs --aot", file=sys.stderr)
        return 2
    if args.static_batch is not None and args.static_batch < 1:
        print(f"stoker export: --static_batch must be >= 1; got {args.static_batch}", file=sys.stderr)
        return 2
    logging.getLogger("stoker").setLevel(logging.WARNING)  # the summary below says what the INFO lines would
    try:
        est, example, spec = estimator_from_model_dir(args.model_dir)
        if args.static_batch is not None:
            example = _with_batch(example, args.static_batch)
        out = export(
            est,
            args.out,
            example,
            dynamic_batch=args.static_batch is None,
            formats=tuple(args.formats or ("pt2",)),
            checkpoint_path=args.checkpoint,
            aot=args.aot,
            aot_device=args.aot_device,
        )
    except (StokerError, ValueError) as e:
        print(f"stoker export: {e}", file=sys.stderr)
        return 1
    signature = json.loads(storage.read_bytes(out / SIGNATURE_FILE))  # out may be a URL
    print(
        f"exported {signature['checkpoint'] or 'weights in memory'} (step {signature['global_step']}, "
        f"{signature['checkpoint_choice']}) of a {spec['kind']} run to {out}"
    )
    for kind in ("inputs", "outputs"):
        for item in signature[kind]:
            print(f"  {kind[:-1]:6s} {item['name']}: {item['dtype']}{item['shape']}")
    print(f"  files: {', '.join(signature['files'])}")
    if "aot" in signature:
        aot = signature["aot"]
        print(
            f"  aot:   {aot['file']} for {aot['device']}, torch {aot['torch_version']} "
            f"(compiled in {aot['compile_s']:.1f} s, max difference from eager "
            f"{aot['max_abs_difference_from_eager']:.3g})"
        )
    return 0


def _with_batch(example: Any, n: int) -> Any:
    def resize(t: torch.Tensor) -> torch.Tensor:
        return t[:1].expand(n, *t.shape[1:]).clone()

    if isinstance(example, torch.Tensor):
        return resize(example)
    if isinstance(example, Mapping):
        return {k: resize(v) for k, v in example.items()}
    return tuple(resize(v) for v in example)


__all__ = ["add_parser"]
