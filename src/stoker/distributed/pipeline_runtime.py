"""Running one process's pipeline stages: ``torch.distributed.pipelining`` stages and schedules.

``PipelineRuntime`` owns the ``PipelineStage`` objects and schedules of one process. Training
uses one schedule with a loss function (built at the first step); inference uses a schedule
without one per input shape (evaluation and prediction batches are padded to one static shape,
so that is one or two schedules). Values the last stage computes (the output of an inference
pass, the loss of a step) are broadcast over the pipeline group, so every process of a replica
continues with the same values and calls the same collectives.

After the schedule's backward passes (which already divide by the number of micro-batches,
``scale_grads``), ``sync_gradients`` averages each stage's gradients over its replicas in one
flat all-reduce on the ``dp`` group, and ``clip_grad_norm`` clips by the norm over all stages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from ..errors import UserCodeError


class PipelineLayout(Protocol):
    """What the runtime reads from its strategy (``PipelineStrategy``): groups, ranks, config."""

    config: Any
    device: torch.device
    pp_group: Any
    dp_group: Any
    dp_size: int
    stage_indices: list[int]
    last_stage_rank: int

    def _guard(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...


def _schedule_class(name: str) -> Any:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    return {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved1f1b": ScheduleInterleaved1F1B}[name]


class PipelineRuntime:
    """This process's stages, their schedules, and the collectives around a pipelined step."""

    def __init__(self, strategy: PipelineLayout, stages: list[nn.Module]) -> None:
        self.strategy = strategy
        self.stages = stages
        self.parameters = [p for s in stages for p in s.parameters()]
        self.holds_first = strategy.stage_indices[0] == 0
        self.holds_last = strategy.stage_indices[-1] == strategy.config.stages - 1
        self._train: Any = None
        self._loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = None
        self._inference: dict[tuple[Any, ...], Any] = {}
        self.microbatches = strategy.config.microbatches

    def _schedule(self, microbatches: int, loss_fn: Callable[..., torch.Tensor] | None) -> Any:
        from torch.distributed.pipelining import PipelineStage

        s = self.strategy
        pipeline_stages = [
            PipelineStage(module, index, s.config.stages, s.device, group=s.pp_group)
            for module, index in zip(self.stages, s.stage_indices, strict=True)
        ]
        cls = _schedule_class(s.config.schedule)
        first = pipeline_stages if s.config.schedule == "interleaved1f1b" else pipeline_stages[0]
        return cls(first, microbatches, loss_fn=loss_fn)

    # ------------------------------------------------------------------ training
    def train_step(
        self, args: tuple[Any, ...], index: torch.Tensor, loss_fn: Callable[[Any, torch.Tensor], torch.Tensor]
    ) -> None:
        """Forward and backward of one batch in micro-batches; the last stage calls
        ``loss_fn(output, rows)`` per micro-batch (``rows``: that micro-batch's row indices)."""
        if self._train is None:
            # self._loss_fn: set below, before the schedule first calls this (None not callable: misc)
            self._train = self._schedule(self.microbatches, lambda out, rows: self._loss_fn(out, rows))  # type: ignore[misc]
        self._loss_fn = loss_fn
        inputs = args if self.holds_first else ()
        target = index if self.holds_last else None
        self.strategy._guard(self._train.step, *inputs, target=target, return_outputs=False)

    def sync_gradients(self) -> None:
        """Average every gradient over the replicas of its stage (one flat all-reduce)."""
        s = self.strategy
        if s.dp_size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        s._guard(dist.all_reduce, flat, group=s.dp_group)
        flat /= s.dp_size
        offset = 0
        for p, g in zip(self.parameters, grads, strict=True):
            n = g.numel()
            if p.grad is not None:  # a parameter without a gradient keeps none (the optimizer skips it)
                p.grad.copy_(flat[offset : offset + n].view_as(g))
            offset += n

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip by the global gradient norm over every stage (as ``clip_grad_norm_`` would on the unsplit model)."""
        s = self.strategy
        grads = [p.grad for p in self.parameters if p.grad is not None]
        local = torch.zeros((), dtype=torch.float32, device=s.device)
        for g in grads:
            local = local + g.detach().float().pow(2).sum()
        s._guard(dist.all_reduce, local, group=s.pp_group)
        total = local.sqrt()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.to(g.dtype))
        return total

    def share_from_last(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (a 1-d float tensor of a length every process knows) from the last stage."""
        out = values.detach().clone()
        self.strategy._guard(dist.broadcast, out, src=self.strategy.last_stage_rank, group=self.strategy.pp_group)
        return out

    def share_object_from_last(self, obj: Any) -> Any:
        box = [obj]
        self.strategy._guard(
            dist.broadcast_object_list, box, src=self.strategy.last_stage_rank, group=self.strategy.pp_group
        )
        return box[0]

    # ------------------------------------------------------------------ inference
    def infer(self, *args: torch.Tensor) -> Any:
        """The unsplit model's output for ``args``, on every process of the pipeline."""
        for a in args:
            if not isinstance(a, torch.Tensor):
                raise UserCodeError(f"a pipelined model takes tensors; got {type(a).__name__}")
        rows = args[0].shape[0]
        micro = self.strategy.config.microbatches
        micro = micro if rows % micro == 0 else 1
        key = (micro, *((tuple(a.shape), a.dtype) for a in args))
        schedule = self._inference.get(key)
        if schedule is None:
            schedule = self._inference[key] = self._schedule(micro, None)
        with torch.no_grad():
            out = self.strategy._guard(schedule.eval, *(args if self.holds_first else ()))
        return self._broadcast_output(out)

    def _broadcast_output(self, out: Any) -> Any:
        tensors = (out,) if isinstance(out, torch.Tensor) else out
        if self.holds_last and not (isinstance(tensors, tuple) and all(isinstance(t, torch.Tensor) for t in tensors)):
            raise UserCodeError(
                f"the last pipeline stage must return a tensor or a tuple of tensors; got {type(out).__name__}"
            )
        meta = [(tuple(t.shape), t.dtype) for t in tensors] if self.holds_last else None
        meta = self.share_object_from_last((meta, isinstance(out, torch.Tensor)))
        shapes, single = meta
        device = self.strategy.device
        result = []
        for i, (shape, dtype) in enumerate(shapes):
            t = tensors[i].contiguous() if self.holds_last else torch.empty(shape, dtype=dtype, device=device)
            self.strategy._guard(dist.broadcast, t, src=self.strategy.last_stage_rank, group=self.strategy.pp_group)
            result.append(t)
        return result[0] if single else tuple(result)


class PipelinedModule(nn.Module):
    """What ``model_fn`` receives in evaluation and prediction: calling it runs the whole
    pipeline and returns the last stage's output on every process."""

    runtime: PipelineRuntime  # in __dict__, not a submodule

    def __init__(self, runtime: PipelineRuntime) -> None:
        super().__init__()
        self.__dict__["runtime"] = runtime  # not a submodule: the stages' parameters belong to the model

    def forward(self, *args: torch.Tensor) -> Any:
        return self.runtime.infer(*args)


class StageOutput(nn.Module):
    """What ``model_fn`` receives as ``model`` on the last stage while training: calling it
    returns the stage's output for the micro-batch (the features it is given are not used)."""

    def __init__(self, output: Any) -> None:
        super().__init__()
        self.__dict__["output"] = output
        self.calls = 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.output


__all__ = ["PipelineRuntime", "PipelinedModule", "StageOutput"]
