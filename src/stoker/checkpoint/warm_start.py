"""Warm start: initialise some of a model's weights from another run before training starts.

TF's ``WarmStartSettings``: the source is a model_dir (its latest checkpoint), a ``ckpt-<step>``
directory (sharded ones are consolidated) or a ``.safetensors`` file; regular expressions pick
the model's parameters to take, and a mapping renames them where the source's names differ.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import storage
from . import safe_load
from .files import load_checkpoint
from .manager import CheckpointManager

log = logging.getLogger("stoker")


@dataclass(kw_only=True)
class WarmStartSettings:
    """Initialise some weights from another run before training starts (TF's ``WarmStartSettings``).

    Attributes:
        ckpt_to_initialize_from: a model_dir, a ``ckpt-<step>`` directory or a ``.safetensors`` file.
        vars_to_warm_start: a regular expression (or list of them) selecting the model's
            parameter names to take; default all.
        var_name_to_prev_var_name: the name in the source for a model name, where they differ.
    """

    ckpt_to_initialize_from: str | os.PathLike[str]
    vars_to_warm_start: str | list[str] = ".*"
    var_name_to_prev_var_name: Mapping[str, str] = field(default_factory=dict)


@dataclass
class WarmStartReport:
    """Which weights a warm start took, and which it could not find or fit."""

    loaded: list[str]
    not_found: list[str]
    shape_mismatch: list[str]


def warm_start(model: nn.Module, settings: WarmStartSettings | str | os.PathLike[str]) -> WarmStartReport:
    """Copy matching weights from a checkpoint or safetensors file into ``model``."""
    if not isinstance(settings, WarmStartSettings):
        settings = WarmStartSettings(ckpt_to_initialize_from=settings)
    src = storage.location(settings.ckpt_to_initialize_from)
    if src.suffix == ".safetensors" and storage.is_file(src):
        source = safe_load.decode(storage.read_bytes(src), src.name, str(src), None)
    else:
        resolved = CheckpointManager(src, writer=False).resolve(src, "warm_start_from")
        assert resolved is not None  # resolve raises for a path that holds no checkpoint
        loaded = load_checkpoint(resolved)
        if loaded.model_state is not None:
            source = loaded.model_state
        else:
            from ..distributed.sharded import consolidate

            assert loaded.dcp_dir is not None  # no model_state: a sharded checkpoint, in dcp_dir
            source = consolidate(loaded.dcp_dir)
    patterns = settings.vars_to_warm_start
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    selected = [re.compile(p) for p in patterns]
    own = model.state_dict()
    report = WarmStartReport([], [], [])
    updates: dict[str, torch.Tensor] = {}
    for name, tensor in own.items():
        if not any(p.fullmatch(name) for p in selected):
            continue
        prev = settings.var_name_to_prev_var_name.get(name, name)
        if prev not in source:
            report.not_found.append(name)
        elif source[prev].shape != tensor.shape:
            report.shape_mismatch.append(f"{name}: {list(source[prev].shape)} vs {list(tensor.shape)}")
        else:
            updates[name] = source[prev]
            report.loaded.append(name)
    model.load_state_dict(updates, strict=False)
    if report.not_found or report.shape_mismatch:
        log.warning(
            "warm start from %s: %d weights loaded, not found: %s, shape mismatch: %s",
            src,
            len(report.loaded),
            report.not_found or "none",
            report.shape_mismatch or "none",
        )
    else:
        log.info("warm start from %s: %d weights loaded", src, len(report.loaded))
    return report


__all__ = ["WarmStartReport", "WarmStartSettings", "warm_start"]
