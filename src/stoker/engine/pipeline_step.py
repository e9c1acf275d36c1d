"""The training step of a pipelined run (``RunConfig.pipeline`` under torchrun).

One step is one batch: the schedule (``torch.distributed.pipelining``) cuts it into
``PipelineConfig.microbatches`` micro-batches and runs their forward and backward passes through the
stages; then the replicas of each stage average their gradients, the norm over all stages clips
them, and each stage's optimizer updates its own parameters.

The loss comes from the user's ``model_fn``, called on the last stage once per micro-batch
with a stand-in ``model`` whose call returns that micro-batch's output, and with the
micro-batch's rows of ``features`` and ``labels``. So a ``model_fn`` that computes everything
model-dependent through one ``model(features)`` call (the usual shape) needs no change; one
that does not gets a ``ModelFnError`` saying so. Its loss must be a mean over the micro-batch
(the schedule averages micro-batches), ``host_call`` a dict of scalars (averaged over
micro-batches), and it must not carry a cache. (At the first step of a run the schedule calls
the loss once more, to infer the backward pass's shapes; that call's values are dropped.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from ..distributed.pipeline_runtime import PipelineRuntime, StageOutput
from ..errors import ModelFnError
from ..spec import ModeKeys
from .infeed import Infeed
from .loop import TrainStep, check_spec


class PipelineTrainStep(TrainStep):
    """``TrainStep`` for one process of a pipeline: its stages' part of every micro-batch."""

    def __init__(self, *, runtime: PipelineRuntime, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runtime = runtime
        self.host_keys: tuple[str, ...] | None = None  # known on every stage after the first step
        self._losses: list[torch.Tensor] = []
        self._host: list[torch.Tensor] = []

    def __call__(self, infeed: Infeed) -> tuple[torch.Tensor, Any]:
        batch = next(infeed)
        features, labels = batch.features, batch.labels
        args = features if isinstance(features, tuple) else (features,)
        if not all(isinstance(a, torch.Tensor) for a in args):
            raise ModelFnError(
                "a pipelined run feeds the first stage tensors: features must be a tensor or a tuple of tensors"
            )
        rows = args[0].shape[0]
        index = torch.arange(rows, device=self.device)
        self._losses, self._host = [], []

        def loss_fn(output: Any, micro_rows: torch.Tensor) -> torch.Tensor:
            return self._micro_loss(output, features, labels, micro_rows)

        with self.precision.forward_context(self.device):
            self.runtime.train_step(args, index, loss_fn)
        runtime = self.runtime
        runtime.sync_gradients()
        if self.clip_norm is not None:
            runtime.clip_grad_norm(self.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            self.schedule.step()
        return self._shared_values()

    def _micro_loss(self, output: Any, features: Any, labels: Any, rows: torch.Tensor) -> torch.Tensor:
        model = StageOutput(output)
        take = lambda t: t[rows] if isinstance(t, torch.Tensor) else t  # noqa: E731
        spec = self.model_fn(model, tree_map(take, features), tree_map(take, labels), ModeKeys.TRAIN, self.params)
        spec = check_spec(spec, ModeKeys.TRAIN)
        if model.calls != 1:
            raise ModelFnError(
                f"in a pipelined run model_fn must call model(features) exactly once in TRAIN mode (it called it "
                f"{model.calls} times): the last stage hands model_fn the pipeline's output through that call"
            )
        if spec.cache is not None:
            raise ModelFnError("EstimatorSpec.cache is not supported with RunConfig.pipeline")
        host = spec.host_call
        if host is not None:
            if not isinstance(host, dict):
                raise ModelFnError("with RunConfig.pipeline, EstimatorSpec.host_call must be a dict of scalar tensors")
            if self.host_keys is None:
                self.host_keys = tuple(host)
            self._host.append(torch.stack([v.detach().float().reshape(()) for v in host.values()]))
        loss = spec.loss
        assert loss is not None  # check_spec above raised otherwise
        self._losses.append(loss.detach().float())
        return loss

    def _shared_values(self) -> tuple[torch.Tensor, Any]:
        """The step's loss (mean over micro-batches) and host_call values, from the last stage."""
        runtime = self.runtime
        if not self._checked:  # the first step: every stage learns the host_call names
            self.host_keys = runtime.share_object_from_last(self.host_keys if runtime.holds_last else None)
            self._checked = True
        width = 1 + len(self.host_keys or ())
        if runtime.holds_last:
            # The schedule's first step also calls the loss once to infer backward metadata:
            # the step's values are those of its last `microbatches` calls.
            m = runtime.microbatches
            values = [torch.stack(self._losses[-m:]).mean().reshape(1)]
            if self.host_keys:
                values.append(torch.stack(self._host[-m:]).mean(0))
            packed = torch.cat(values)
        else:
            packed = torch.zeros(width, device=self.device)
        packed = runtime.share_from_last(packed)
        host_call = (self.host_keys, packed[1:]) if self.host_keys else None
        return packed[0], host_call


__all__ = ["PipelineTrainStep"]
