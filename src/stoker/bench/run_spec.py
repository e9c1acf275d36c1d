"""The harness's ``run_spec.json`` kind ``"zoo"``: ``stoker bench --train_dir`` writes it, and
this module registers the builder that rebuilds a zoo classifier from it for ``stoker export``.

Importing this module registers the kind (``stoker.run_spec.register_run_spec``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .. import storage
from ..config import RunConfig
from ..estimator import Estimator
from ..models import create_model, get_model_info
from ..run_spec import RunSpecError, register_run_spec, write_run_spec
from ..spec import EstimatorSpec, ModeKeys

ZOO_KIND = "zoo"


def write_zoo_run_spec(
    train_dir: str | os.PathLike[str],
    *,
    model: str,
    dataset: str,
    num_classes: int | None,
    image_size: int,
    written_by: str = "stoker bench",
) -> storage.Location:
    """Record in ``train_dir`` how to rebuild a zoo model, so ``stoker export TRAIN_DIR`` works."""
    return write_run_spec(
        train_dir,
        kind=ZOO_KIND,
        model=model,
        dataset=dataset,
        num_classes=num_classes,
        written_by=written_by,
        params={"image_size": image_size, "num_classes": num_classes},
    )


def zoo_predict_model_fn(
    model: nn.Module, features: torch.Tensor, labels: Any, mode: ModeKeys, params: dict[str, Any]
) -> EstimatorSpec:
    """PREDICT for a zoo classifier: ``logits`` and ``classes`` (TRAIN/EVAL are the harness's job)."""
    logits = model(features)
    return EstimatorSpec(predictions={"logits": logits, "classes": logits.argmax(-1)})


@register_run_spec(ZOO_KIND)
def estimator_from_zoo_spec(
    spec: Mapping[str, Any], model_dir: str | os.PathLike[str]
) -> tuple[Estimator, torch.Tensor]:
    """A PREDICT-only Estimator reading ``model_dir``'s checkpoints, and ``[2, 3, S, S]`` example images."""
    for key in ("model", "dataset"):
        if key not in spec:
            raise RunSpecError(f"run_spec.json of kind {ZOO_KIND!r} needs a {key!r} field")
    params = dict(spec.get("params") or {})
    info = get_model_info(spec["model"], spec["dataset"])
    size = int(params.get("image_size", info.image_size))
    num_classes = params.get("num_classes", spec.get("num_classes"))
    est = Estimator(
        model=lambda p: create_model(spec["model"], dataset=spec["dataset"], num_classes=num_classes),
        model_fn=zoo_predict_model_fn,
        config=RunConfig(model_dir=os.fspath(model_dir), device="cpu", progress_bar=False, summaries=False),
        predict_batch_size=2,
    )
    return est, torch.zeros(2, 3, size, size)


__all__ = ["ZOO_KIND", "estimator_from_zoo_spec", "write_zoo_run_spec", "zoo_predict_model_fn"]
