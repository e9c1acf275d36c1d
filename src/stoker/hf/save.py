"""Any checkpoint of a Hugging Face model written as a ``save_pretrained`` folder.

:func:`save_pretrained` takes the weights of a checkpoint (the newest, or one named; sharded
FSDP2 / ``dcp/`` ones are gathered) through the Estimator that trained them, puts them in a new
instance of the model's own class (built on the meta device, so no second copy of random
weights is made) and lets ``transformers`` write it: ``config.json`` and ``model.safetensors``
under the names ``from_pretrained`` expects (tied weights once), plus the tokenizer's files when
one is given. ``AutoModel...from_pretrained(folder)`` then computes what the checkpoint computes.

LoRA runs (:func:`~stoker.hf.with_lora`) are merged into their base first (``merge_adapters``),
or written as PEFT's own adapter folder (``adapter_config.json``, ``adapter_model.safetensors``).

The folder appears whole: it is written beside its place and renamed into it, so a reader never
sees half of one, and a folder written before by the same call is replaced.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..estimator import Estimator


def save_pretrained(
    estimator: Estimator,
    out_dir: str | os.PathLike[str],
    *,
    checkpoint_path: str | os.PathLike[str] | None = None,
    best: bool = False,
    tokenizer: Any = None,
    merge_adapters: bool = True,
) -> Path:
    """Write the Estimator's model, with a checkpoint's weights, as a ``save_pretrained`` folder.

    Args:
        estimator: an Estimator whose ``model=`` builds a ``transformers`` model (or a PEFT model
            of one); it need not have trained in this process (a new Estimator on the same
            ``model_dir`` reads its checkpoints).
        out_dir: the folder to write (replaced if it exists).
        checkpoint_path: the checkpoint whose weights to write; default: the weights in memory
            after ``train``, else the newest checkpoint in ``model_dir``.
        best: write the best checkpoint by ``RunConfig.keep_best`` instead (Trainer's
            ``load_best_model_at_end``); an error when no evaluation has chosen one.
        tokenizer: also write its files (``tokenizer.json``, ``tokenizer_config.json``, ...).
        merge_adapters: LoRA: merge the adapters into the base and write the merged model (an
            ordinary model folder); ``False`` writes PEFT's adapter folder instead.

    In a distributed run every replica calls it (sharded weights are gathered); the chief writes.
    Returns ``out_dir`` as a ``Path``.
    """
    if best:
        checkpoint_path = _best_checkpoint(estimator, checkpoint_path)
    estimator.state.weights_for_inference(checkpoint_path, "save_pretrained")
    weights = estimator.model_state_dict()  # every replica: sharded weights are gathered
    model, strategy, target = estimator.model, estimator.strategy, Path(out_dir)
    if strategy.is_chief:
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _write(model, weights, tmp, tokenizer, merge_adapters)
            _replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    strategy.barrier()
    return target


def _best_checkpoint(estimator: Estimator, checkpoint_path: str | os.PathLike[str] | None) -> str:
    checkpoints = estimator.state.checkpoints
    chosen = None if checkpoints is None else checkpoints.best()
    if checkpoint_path is not None or checkpoints is None or chosen is None:
        raise ConfigError(
            "save_pretrained: best=True needs a model_dir whose evaluations chose a best checkpoint "
            "(RunConfig.keep_best and train_and_evaluate), and no checkpoint_path"
        )
    return str(checkpoints.model_dir / chosen.name)


def _write(module: nn.Module, weights: dict[str, torch.Tensor], folder: Path, tokenizer: Any, merge: bool) -> None:
    model: Any = module  # a transformers or PEFT model: its own methods below
    if hasattr(model, "peft_config"):  # a PEFT model: its memory holds the weights (it is never sharded)
        if merge:
            merged = copy.deepcopy(model).merge_and_unload()
            merged.save_pretrained(folder)
        else:
            model.save_pretrained(folder)
    else:
        _fresh_copy(module, weights).save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def _fresh_copy(model: nn.Module, weights: dict[str, torch.Tensor]) -> Any:
    """A new instance of ``model``'s own class (not FSDP2's subclass of it) holding ``weights``."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "save_pretrained"):
        raise ConfigError(
            f"save_pretrained: the Estimator's model is a {type(model).__name__}, not a transformers model "
            "(build it with stoker.hf.from_pretrained or from_config)"
        )
    cls = next(c for c in type(model).__mro__ if not c.__module__.startswith("torch.distributed"))
    with torch.device("meta"):  # no weights made only to be replaced
        fresh = cls(copy.deepcopy(config))
    fresh.load_state_dict(weights, strict=True, assign=True)
    fresh.tie_weights()  # assign=True put separate tensors where the model ties one
    return fresh


def _replace(tmp: Path, target: Path) -> None:
    """``tmp`` renamed to ``target``; a ``target`` there before is moved aside first, then removed."""
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


__all__ = ["save_pretrained"]
