"""``PredictionRun``: predictions for every example of an input, in input order, padding removed.

Each batch is padded to the static predict batch (one compiled shape), and the padded rows are
dropped on the host. With several replicas every replica predicts its shard and the chief
gathers and interleaves the rows back into input order; the other replicas yield nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ..errors import ModelFnError
from ..spec import ModeKeys
from .inputs import InputFn, InputPlan
from .loop import ModelFn, check_spec, detach_cache
from .model_state import ModelState


class PredictionRun:
    """Runs ``model_fn`` in PREDICT mode over an input and yields its predictions."""

    def __init__(self, state: ModelState, inputs: InputPlan, model_fn: ModelFn) -> None:
        self.state = state
        self.inputs = inputs
        self.model_fn = model_fn
        self.strategy = state.strategy

    def run(self, input_fn: InputFn, single: bool) -> Iterator[dict[str, torch.Tensor]]:
        """Rows (``single``) or batches of predictions as dicts of CPU tensors."""
        model = self.state.build_model()
        module = self.state.module
        assert module is not None  # build_model() set it
        was_training = model.training
        model.eval()
        params = self.inputs.mode_params(ModeKeys.PREDICT)
        device = self.strategy.device
        precision = self.state.precision
        try:
            with self.state.inference_weights(), self.inputs.infeed(input_fn, ModeKeys.PREDICT, params) as infeed:
                for batch in self.inputs.in_lockstep(infeed):
                    with torch.no_grad(), precision.forward_context(device):
                        spec = self.model_fn(module, batch.features, batch.labels, ModeKeys.PREDICT, params)
                    spec = check_spec(spec, ModeKeys.PREDICT)
                    params["cache"] = detach_cache(spec.cache)
                    preds = check_predictions(spec.predictions, params["batch_size"])
                    rows = {k: v[: batch.rows].cpu() for k, v in preds.items()}
                    if self.strategy.world_size > 1:
                        rows = self._gather_rows(rows)
                        if rows is None:
                            continue
                    if single:
                        n = next(iter(rows.values())).shape[0] if rows else 0
                        for i in range(n):
                            yield {k: v[i] for k, v in rows.items()}
                    elif rows:
                        yield rows
        finally:
            if was_training:
                model.train()

    def _gather_rows(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """One batch of predictions from every replica, interleaved into input order on the chief.

        stoker's sources give replica ``r`` the examples ``r, r + K, r + 2K, ...`` of the data,
        so row ``j`` of replica ``r`` is example ``j * K + r`` of this batch's block.
        """
        everyone = self.strategy.gather_over_replicas(rows)
        if not self.strategy.is_chief:
            return None
        counts = [next(iter(r.values())).shape[0] if r else 0 for r in everyone]
        order = [(r, j) for j in range(max(counts, default=0)) for r in range(len(everyone)) if j < counts[r]]
        return {k: torch.stack([everyone[r][k][j] for r, j in order]) if order else everyone[0][k][:0] for k in rows}


def check_predictions(preds: Any, batch: int) -> Mapping[str, torch.Tensor]:
    """``EstimatorSpec.predictions`` as a dict of batch-major tensors, or a ``ModelFnError``."""
    if preds is None:
        raise ModelFnError("model_fn returned EstimatorSpec(predictions=None) in PREDICT mode; give a dict of tensors")
    if isinstance(preds, torch.Tensor):
        preds = {"predictions": preds}
    if not isinstance(preds, Mapping):
        raise ModelFnError(f"EstimatorSpec.predictions must be a dict of tensors; got {type(preds).__name__}")
    for key, value in preds.items():
        if not isinstance(value, torch.Tensor):
            raise ModelFnError(f"EstimatorSpec.predictions[{key!r}] must be a tensor; got {type(value).__name__}")
        if value.dim() == 0 or value.shape[0] != batch:
            raise ModelFnError(
                f"EstimatorSpec.predictions[{key!r}] has shape {list(value.shape)}, but the batch has {batch} "
                "rows; every prediction needs the batch as its first dimension"
            )
    return preds


__all__ = ["PredictionRun", "check_predictions"]
