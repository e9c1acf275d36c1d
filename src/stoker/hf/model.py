"""A ``transformers`` model as the Estimator's model, and a ``model_fn`` on its own loss.

The model is built the way stoker builds every model: once, from ``params``, after seeding with
``RunConfig.seed`` (so a model made from a config, and any head ``from_pretrained`` adds, starts
from the same weights on every run and every replica). :func:`from_pretrained` reads a local
folder only: nothing is downloaded while a run starts, on every replica, or again on a rerun.

:func:`model_fn` calls the model on the batch's features (a dict: ``input_ids``,
``attention_mask``, ...) with the labels, and trains on the loss the model computes itself, so a
model's own loss (its ``problem_type``, label smoothing, ``ignore_index``) is what stoker
minimises. In EVAL, a sequence-level head's loss is given per example (the same formula as the
model's; the mean of a full batch is the model's loss), so the padded last batch of an evaluation
is exact, with ``accuracy`` for classifiers. Other heads (token classification, language models)
evaluate on the model's batch-mean loss.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..errors import ConfigError, ModelFnError, UserCodeError
from ..metrics import Accuracy, MeanSquaredError
from ..spec import EstimatorSpec, ModeKeys


@dataclass(frozen=True)
class HFModel:
    """The Estimator's ``model=``: builds a ``transformers`` model once, from a local folder or a
    config (made by :func:`from_pretrained` and :func:`from_config`)."""

    auto_class: Any
    source: str | Any  # a folder, or a PretrainedConfig
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, params: Mapping[str, Any]) -> nn.Module:
        if isinstance(self.source, str):
            model = self.auto_class.from_pretrained(self.source, local_files_only=True, **self.kwargs)
        elif hasattr(self.auto_class, "from_config"):  # an Auto class
            model = self.auto_class.from_config(self.source, **self.kwargs)
        else:  # a model class (DistilBertForSequenceClassification, ...)
            model = self.auto_class(self.source, **self.kwargs)
        if not isinstance(model, nn.Module):
            raise UserCodeError(f"{self.auto_class.__name__} built a {type(model).__name__}, not an nn.Module")
        return model


def from_pretrained(auto_class: Any, folder: str | os.PathLike[str], **kwargs: Any) -> HFModel:
    """The Estimator's ``model=``: ``auto_class.from_pretrained(folder, **kwargs)``, built once.

    Args:
        auto_class: an Auto class (``AutoModelForSequenceClassification``) or a model class.
        folder: a local folder written by ``save_pretrained`` (``config.json`` and the weights).
            A Hub id is refused: download it once (``huggingface_hub.snapshot_download``) and
            give the folder, so that no replica downloads while a run starts.
        kwargs: for ``from_pretrained`` (``num_labels=3``, ...). The weights load in float32
            unless ``dtype=`` says otherwise: stoker's precision keeps fp32 master weights and
            computes in ``RunConfig.precision``.
    """
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"from_pretrained: {str(folder)!r} is not a local folder with a config.json; stoker.hf reads "
            "local folders only (download a Hub model once with huggingface_hub.snapshot_download)"
        )
    return HFModel(auto_class, str(path), {"dtype": torch.float32, **kwargs})


def from_config(auto_class: Any, config: Any, **kwargs: Any) -> HFModel:
    """The Estimator's ``model=``: a new model of ``config`` (a ``PretrainedConfig``), its weights
    initialised after stoker seeds (so every run and replica starts from the same ones).

    Args:
        auto_class: an Auto class (``AutoModelForSequenceClassification``) or a model class.
        config: the model's ``PretrainedConfig``.
        kwargs: for ``auto_class.from_config``.
    """
    if not hasattr(config, "to_dict") or not hasattr(config, "model_type"):
        raise ConfigError(f"from_config: config must be a transformers PretrainedConfig; got {type(config).__name__}")
    return HFModel(auto_class, config, dict(kwargs))


def model_fn(
    model: nn.Module, features: Any, labels: torch.Tensor | None, mode: ModeKeys, params: Mapping[str, Any]
) -> EstimatorSpec:
    """A ``model_fn`` for ``transformers`` models: the model's own loss, logits-based metrics.

    ``features`` is a dict of the model's inputs (``input_ids``, ``attention_mask``, ...: what
    :class:`~stoker.hf.Tokenize` makes); ``labels`` what the model takes as ``labels``.

    - TRAIN: ``loss`` is ``model(**features, labels=labels).loss``.
    - EVAL: a sequence-level head (logits ``[batch, num_labels]``) gets its loss per example, by
      the model's ``problem_type`` (single-label: cross-entropy, with ``accuracy``; regression:
      squared error, with ``mse``; multi-label: binary cross-entropy), so a padded last batch is
      exact; any other head the model's own (batch-mean) loss.
    - PREDICT: ``logits`` and ``classes`` (the argmax of the last dimension).
    """
    if not isinstance(features, Mapping):
        raise ModelFnError(
            "stoker.hf.model_fn: features must be a dict of the model's inputs (input_ids, attention_mask, ...); "
            f"got {type(features).__name__} (collate with stoker.hf.Tokenize or Pad)"
        )
    if mode == ModeKeys.TRAIN and labels is None:
        raise ModelFnError("stoker.hf.model_fn: training needs labels; the input_fn gave features only")
    out = _forward(model, features, labels)
    logits = out["logits"]
    spec = EstimatorSpec(predictions=lambda: {"logits": logits.float(), "classes": logits.argmax(-1)})
    if labels is None:
        return spec
    spec.loss = out["loss"]
    if mode == ModeKeys.EVAL and logits.dim() == 2:
        spec.loss, spec.eval_metrics = _sequence_eval(_problem_type(model, logits, labels), logits, labels)
    return spec


def _forward(model: nn.Module, features: Mapping[str, Any], labels: torch.Tensor | None) -> Mapping[str, Any]:
    """``model(**features, labels=labels)``, or a ``ModelFnError`` for a model without a head."""
    try:
        out = model(**features, labels=labels) if labels is not None else model(**features)
    except TypeError as e:
        if "labels" not in str(e):
            raise
        out = None
    if out is None or "logits" not in out or (labels is not None and out.get("loss") is None):
        raise ModelFnError(
            f"stoker.hf.model_fn: {type(_unwrapped(model)).__name__} computes no logits and loss: use a model "
            "class with a head (AutoModelForSequenceClassification, AutoModelForCausalLM, ...)"
        )
    return out


def _sequence_eval(problem: str, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-example losses and metrics of a sequence-level head, by the formula its model uses
    (``transformers``' ``ForSequenceClassificationLoss``)."""
    logits = logits.float()
    if problem == "regression":
        predicted = logits.squeeze(-1) if logits.shape[-1] == 1 else logits
        target = labels.to(predicted.dtype).reshape(predicted.shape)
        per_example = (predicted - target).pow(2).reshape(predicted.shape[0], -1).mean(1)
        return per_example, {"mse": MeanSquaredError()(predicted, target)}
    if problem == "multi_label_classification":
        target = labels.to(logits.dtype)
        per_example = F.binary_cross_entropy_with_logits(logits, target, reduction="none").mean(1)
        return per_example, {}
    per_example = F.cross_entropy(logits, labels.reshape(-1), reduction="none")
    return per_example, {"accuracy": Accuracy()(logits, labels.reshape(-1))}


def _problem_type(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> str:
    """The model's ``config.problem_type``, else the rule ``transformers`` applies when it is unset."""
    config = getattr(_unwrapped(model), "config", None)
    given = getattr(config, "problem_type", None)
    if given:
        return str(given)
    if logits.shape[-1] == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


def _unwrapped(model: nn.Module) -> nn.Module:
    """The user's module inside ``torch.compile`` (``_orig_mod``) and DDP (``.module``) wrappers."""
    for _ in range(4):
        inner = model.module if isinstance(model, DistributedDataParallel) else getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


ModelBuilder = Callable[[Mapping[str, Any]], nn.Module]

__all__ = ["HFModel", "ModelBuilder", "from_config", "from_pretrained", "model_fn"]
