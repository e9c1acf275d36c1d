"""Which ``TrainStep`` a training run uses: eager, compiled (``compile="step"``) or a CUDA graph.

``RunConfig.compile`` and ``RunConfig.cuda_graph`` (its ``LoopConfig`` slice) choose; what a
variant cannot run is refused with a ``ConfigError`` naming the option and the cause. A
CUDA-graph step that is built can still fall back to eager at run time, with a warning naming
the cause (a batch whose shapes change, a host sync in ``model_fn``): only running the step
shows those.
"""

from __future__ import annotations

from typing import Any

from ..config.slices import LoopConfig
from ..distributed import Strategy
from .loop import TrainStep


def make_train_step(config: LoopConfig, strategy: Strategy, kwargs: dict[str, Any]) -> TrainStep:
    """The step the loop's ``config`` asks for, built from ``TrainStep``'s keyword arguments."""
    runtime = getattr(strategy, "runtime", None)
    if runtime is not None:  # the model was cut into pipeline stages (RunConfig.pipeline)
        from .pipeline_step import PipelineTrainStep

        return PipelineTrainStep(runtime=runtime, **kwargs)
    if config.cuda_graph:
        from .cuda_graph_step import CudaGraphTrainStep, cannot_capture, cuda_graph_refusals

        reasons = cuda_graph_refusals(config, strategy, kwargs)
        if reasons:
            raise cannot_capture(reasons)
        return CudaGraphTrainStep(**kwargs)
    if config.compile == "step":
        from .compiled_step import CompiledTrainStep, check_compiled_step_supported

        check_compiled_step_supported(strategy_name=type(strategy).__name__, shards_state=strategy.shards_state)
        return CompiledTrainStep(**kwargs)
    return TrainStep(**kwargs)


__all__ = ["make_train_step"]
