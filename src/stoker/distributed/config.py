"""``DistributionConfig``: distribution's slice of a ``RunConfig``.

Where the replica runs and how replicas form: the strategy, the device, the collective timeout,
DDP's bucket size and the pipeline. The user spells these flat on ``RunConfig`` (``strategy=``,
``device=``, ``pipeline=``, ...); the Estimator hands the slice to ``make_strategy``. How the
pipeline combines with the loop and the precision ``RunConfig`` checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .pipeline import PipelineConfig

STRATEGIES: tuple[str, ...] = ("auto", "single", "replicated", "sharded", "independent", "pipeline")


@dataclass(frozen=True, kw_only=True)
class DistributionConfig:
    """Distribution's slice of a ``RunConfig`` (its fields keep ``RunConfig``'s names).

    Attributes:
        strategy: one of ``STRATEGIES`` (``auto`` reads the torchrun environment).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        distributed_timeout: seconds a collective may wait for a lost replica.
        ddp_bucket_cap_mb: ``replicated``: DDP's gradient bucket size in MiB (``None``: DDP's 25).
        pipeline: ``None`` or a ``PipelineConfig`` (then ``strategy`` is ``auto`` or ``pipeline``).
    """

    strategy: str = "auto"
    device: str = "auto"
    distributed_timeout: float = 1800.0
    ddp_bucket_cap_mb: float | None = None
    pipeline: PipelineConfig | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"RunConfig.strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}")
        if self.ddp_bucket_cap_mb is not None and not self.ddp_bucket_cap_mb > 0:
            raise ConfigError(f"RunConfig.ddp_bucket_cap_mb must be > 0; got {self.ddp_bucket_cap_mb}")
        device = self.device
        if not isinstance(device, str) or not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
            raise ConfigError(f"RunConfig.device must be auto, cpu, cuda or cuda:N; got {device!r}")
        if not self.distributed_timeout > 0:
            raise ConfigError(f"RunConfig.distributed_timeout must be > 0; got {self.distributed_timeout}")
        self._check_pipeline()

    def _check_pipeline(self) -> None:
        pipeline = self.pipeline
        if pipeline is None:
            if self.strategy == "pipeline":
                raise ConfigError(
                    "RunConfig.strategy='pipeline' needs pipeline=PipelineConfig(split=...) (the module names to "
                    "split before)"
                )
            return
        if not isinstance(pipeline, PipelineConfig):
            raise ConfigError(
                "RunConfig.pipeline must be None or a stoker.distributed.PipelineConfig(split=..., ...); "
                f"got {pipeline!r}"
            )
        if self.strategy not in ("auto", "pipeline"):
            raise ConfigError(f"RunConfig.pipeline needs strategy 'auto' or 'pipeline'; got {self.strategy!r}")

    @property
    def pipeline_stages(self) -> int:
        """The number of pipeline stages (1: no pipeline)."""
        return 1 if self.pipeline is None else self.pipeline.stages


__all__ = ["STRATEGIES", "DistributionConfig"]
