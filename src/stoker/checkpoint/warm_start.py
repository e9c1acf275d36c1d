"""Warm start: initialise some of a model's weights from another run before training starts.

TF's ``WarmStartSettings``: the source is a model_dir (its latest checkpoint), a ``ckpt-<step>``
directory (sharded ones are consolidated), a ``.safetensors`` file or a Hugging Face
``save_pretrained`` folder (``config.json`` beside ``model.safetensors`` or its sharded index);
regular expressions pick the model's parameters to take, and a mapping renames them where the
source's names differ. A weight the source leaves out because the model ties it to another
(``save_pretrained`` writes tied weights once) counts as loaded when that other one is.
"""

from __future__ import annotations

import json
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
        ckpt_to_initialize_from: a model_dir, a ``ckpt-<step>`` directory, a ``.safetensors`` file
            or a Hugging Face ``save_pretrained`` folder.
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
    elif (hf_files := _hf_weight_files(src)) is not None:
        source = {}
        for file in hf_files:
            source.update(safe_load.decode(storage.read_bytes(file), file.name, str(file), None))
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
    _count_tied(own, report)
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


def _hf_weight_files(folder: storage.Location) -> list[storage.Location] | None:
    """The safetensors files of a ``save_pretrained`` folder, or ``None`` if ``folder`` is not one."""
    if not storage.is_file(folder / "config.json"):
        return None
    if storage.is_file(folder / "model.safetensors"):
        return [folder / "model.safetensors"]
    if storage.is_file(folder / "model.safetensors.index.json"):  # large models: shards named by the index
        index = json.loads(storage.read_bytes(folder / "model.safetensors.index.json"))
        return [folder / name for name in sorted(set(index.get("weight_map", {}).values()))]
    return None


def _count_tied(own: Mapping[str, torch.Tensor], report: WarmStartReport) -> None:
    """Move from ``not_found`` to ``loaded`` the weights that share memory with a loaded one (tied)."""
    loaded = {own[name].data_ptr() for name in report.loaded if own[name].numel()}
    tied = [name for name in report.not_found if own[name].numel() and own[name].data_ptr() in loaded]
    report.not_found = [name for name in report.not_found if name not in tied]
    report.loaded.extend(tied)


__all__ = ["WarmStartReport", "WarmStartSettings", "warm_start"]
