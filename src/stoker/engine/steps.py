"""Which ``TrainStep`` a training run uses: eager, compiled (``compile="step"``) or a CUDA graph.

``RunConfig.compile`` and ``RunConfig.cuda_graph`` choose; what a variant cannot run is refused
with an error naming the option (compiled step), or falls back to the eager step with a
warning naming the cause (CUDA graph: a capture needs static shapes and no host syncs).
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import RunConfig
from ..distributed import Strategy
from .loop import TrainStep

log = logging.getLogger("stoker")


def make_train_step(config: RunConfig, strategy: Strategy, kwargs: dict[str, Any]) -> TrainStep:
    """The step ``config`` asks for, built from ``TrainStep``'s keyword arguments."""
    runtime = getattr(strategy, "runtime", None)
    if runtime is not None:  # the model was cut into pipeline stages (RunConfig.pipeline)
        from .pipeline_step import PipelineTrainStep

        return PipelineTrainStep(runtime=runtime, **kwargs)
    if config.cuda_graph:
        device = strategy.device
        if device.type != "cuda":
            raise ValueError(
                f"RunConfig.cuda_graph=True needs a CUDA device; this run's device is {str(device)!r} "
                "(set device='cuda' or cuda_graph=False)"
            )
        from .cuda_graph_step import CudaGraphTrainStep, cuda_graph_refusal

        why = cuda_graph_refusal(config, strategy, kwargs)
        if why is None:
            return CudaGraphTrainStep(**kwargs)
        log.warning("cuda_graph: running the eager step instead: %s", why)
        return TrainStep(**kwargs)
    if config.compile_mode == "step":
        from .compiled_step import CompiledTrainStep, check_compiled_step_supported

        check_compiled_step_supported(strategy_name=type(strategy).__name__, shards_state=strategy.shards_state)
        return CompiledTrainStep(**kwargs)
    return TrainStep(**kwargs)


__all__ = ["make_train_step"]
