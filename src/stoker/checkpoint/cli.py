"""``stoker checkpoint``: look after a model_dir's checkpoints from the command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .. import storage
from ..errors import CheckpointError


def add_parser(subparsers: Any) -> None:
    """Register ``stoker checkpoint consolidate``."""
    parser = subparsers.add_parser("checkpoint", help="checkpoint utilities (consolidate a sharded checkpoint)")
    sub = parser.add_subparsers(dest="checkpoint_command", metavar="ACTION", required=True)
    cons = sub.add_parser(
        "consolidate",
        help="write one model.safetensors from a sharded checkpoint's dcp/ directory",
        description="Gather a sharded (FSDP2) checkpoint's weight slices into one model.safetensors, "
        "readable without stoker. PATH is a model_dir (its newest checkpoint) or a ckpt-<step> directory, "
        "a local path or an fsspec URL (s3://, gs://, memory://).",
    )
    cons.add_argument("path", help="model_dir or ckpt-<step> directory (local path or fsspec URL)")
    cons.add_argument(
        "--out", help="output file, local path or URL (default: PATH's checkpoint directory/model.safetensors)"
    )
    cons.set_defaults(func=_consolidate)


def _consolidate(args: argparse.Namespace) -> int:
    import safetensors.torch

    from ..distributed.sharded import DCP_DIR, consolidate
    from .manager import CheckpointManager

    try:
        ckpt = CheckpointManager(args.path, writer=False).resolve(args.path)
    except CheckpointError as e:
        print(f"stoker checkpoint consolidate: {e}")
        return 1
    if ckpt is None or not storage.is_dir(ckpt / DCP_DIR):
        print(
            f"stoker checkpoint consolidate: {ckpt or args.path} is not a sharded checkpoint (no {DCP_DIR}/ directory)"
        )
        return 1
    weights = consolidate(ckpt / DCP_DIR)
    out = storage.location(args.out) if args.out else ckpt / "model.safetensors"
    tensors = {k: v.contiguous() for k, v in weights.items()}
    if isinstance(out, Path):
        tmp = out.with_name(out.name + ".tmp")
        safetensors.torch.save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.replace(out)
    else:  # one whole-object PUT: readers see all of it or none (no rename on an object store)
        storage.write_all([(out, safetensors.torch.save(tensors, metadata={"format": "pt"}))])
    print(f"wrote {out} ({len(weights)} tensors, {sum(v.numel() for v in weights.values()):,} values)")
    return 0
