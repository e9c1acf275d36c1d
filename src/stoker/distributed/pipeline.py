"""Pipeline parallelism: a model cut into stages, replicas x stages processes (``RunConfig.pipeline``).

How a model is split. Its *pipeline units* are its children in order, with ``nn.ModuleList``
and ``nn.Sequential`` children opened one level (``embeddings``, ``layers.0``, ...,
``head``). ``PipelineConfig.split`` names the units to split *before*; a stage is a run of
consecutive units, and the model's forward pass must be exactly their composition (each unit
takes what the previous one returned). Each process keeps only its stages' units: the others
are deleted from the model it built, so the parameter names of what remains are those of the
unsplit model. That is why stages are built by hand rather than by
``torch.distributed.pipelining.pipeline`` tracing: a traced split (``torch.export``) gives graph
modules with their own names and structure, while deleting units keeps every checkpoint key
the unsplit model's key, so the stages' ``torch.distributed.checkpoint`` shards consolidate
into one ``model.safetensors`` that loads into the unsplit model, and a pipelined checkpoint
evaluates or warm-starts in one process with no mapping. The price is the contract on
``forward`` above (stated once, in ``docs/model_parallel.md``).

The processes form a ``DeviceMesh`` of shape ``(replicas, stages / stages_per_process)``
with dimensions ``("dp", "pp")``: a ``pp`` group runs one pipeline (``PipelineStage`` and a
``torch.distributed.pipelining`` schedule; no hand-written send/recv), a ``dp`` group holds the
replicas of one stage, whose gradients are averaged after every step. Every process of a
replica reads the same batches (the first stage feeds them in, the last stage needs the labels
for the loss), so ``num_replicas`` is the number of ``dp`` replicas, not of processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError
from .pipeline_runtime import PipelinedModule, PipelineRuntime
from .process_group import ProcessGroupStrategy

PIPELINE_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved1f1b")


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """Pipeline parallelism as ``RunConfig(pipeline=...)`` takes it (``docs/model_parallel.md``).

    Attributes:
        split: the module names to split the model *before*, e.g. ``("layers.2",)`` for two
            stages (a single string is one name). Names are the model's pipeline units: its
            children in order, with ``nn.ModuleList`` / ``nn.Sequential`` children opened one
            level (``embeddings``, ``layers.0``, ..., ``head``); the model's forward must be
            exactly their composition. Under torchrun the processes form ``replicas x stages``
            (``WORLD_SIZE / stages`` replicas); in one process the model runs unsplit (the
            names are still checked).
        microbatches: micro-batches each replica's batch is cut into (must divide it).
        schedule: ``gpipe``, ``1f1b`` or ``interleaved1f1b`` (``torch.distributed.pipelining``'s
            ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B).
        stages_per_process: stages each process holds (the interleaved schedule's virtual
            stages; 1 for ``gpipe`` and ``1f1b``, at least 2 for ``interleaved1f1b``); it must
            divide the number of stages.

    A bad value raises ``ValueError`` naming the field and what it accepts; how the pipeline
    combines with the rest of the run (strategy, precision, accumulation) ``RunConfig`` checks.
    """

    split: tuple[str, ...]
    microbatches: int = 1
    schedule: str = "1f1b"
    stages_per_process: int = 1

    def __post_init__(self) -> None:
        split = self.split
        names = [split] if isinstance(split, str) else split
        if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(
                "PipelineConfig.split must be the module names to split before (a string or a list of strings "
                f"such as ('layers.2',)); got {split!r}"
            )
        if len(set(names)) != len(names):
            raise ConfigError(f"PipelineConfig.split names a module twice: {list(names)!r}")
        object.__setattr__(self, "split", tuple(names))
        check_schedule(self.microbatches, self.schedule, self.stages_per_process)
        if self.stages % self.stages_per_process:
            raise ConfigError(
                f"PipelineConfig: {self.stages} pipeline stages (split names {self.stages - 1} modules) cannot be "
                f"spread evenly at stages_per_process={self.stages_per_process}"
            )

    @property
    def stages(self) -> int:
        return len(self.split) + 1


def check_schedule(microbatches: object, schedule: object, stages_per_process: object) -> None:
    """``PipelineConfig``'s checks of the fields other than ``split`` (a ``ValueError`` naming the field)."""
    for name, value in (("microbatches", microbatches), ("stages_per_process", stages_per_process)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"PipelineConfig.{name} must be a positive integer; got {value!r}")
    if schedule not in PIPELINE_SCHEDULES:
        raise ConfigError(f"PipelineConfig.schedule must be one of {', '.join(PIPELINE_SCHEDULES)}; got {schedule!r}")
    if (schedule == "interleaved1f1b") != (stages_per_process > 1):  # type: ignore[operator]
        raise ConfigError(
            "PipelineConfig: schedule='interleaved1f1b' needs stages_per_process >= 2, and 'gpipe' / '1f1b' "
            f"need 1; got {schedule!r} with {stages_per_process}"
        )


# ==================================================================== splitting a model
def pipeline_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's pipeline units in order: its children, containers opened one level."""
    units: list[tuple[str, nn.Module]] = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.Sequential)) and not isinstance(model, (nn.ModuleList, nn.Sequential)):
            units += [(f"{name}.{n}", c) for n, c in child.named_children()]
        else:
            units.append((name, child))
    return units


def plan_stages(model: nn.Module, split: Sequence[str]) -> list[list[str]]:
    """The unit names of every stage; a ``ValueError`` naming ``PipelineConfig.split`` when
    a name is not a unit, the names are out of order, or there are more stages than units."""
    names = [n for n, _ in pipeline_units(model)]
    what = type(model).__name__
    listing = ", ".join(names) if len(names) <= 24 else ", ".join(names[:12] + ["..."] + names[-6:])
    own = [n for n, _ in model.named_parameters(recurse=False)] + [n for n, _ in model.named_buffers(recurse=False)]
    if own:
        raise ConfigError(
            f"PipelineConfig.split: {what} holds parameters or buffers itself ({', '.join(own)}), which no "
            "stage can own; move them into a child module"
        )
    if len(split) + 1 > len(names):
        raise ConfigError(
            f"PipelineConfig.split asks for {len(split) + 1} stages, but {what} has only {len(names)} "
            f"pipeline units ({listing}); name at most {len(names) - 1} split points"
        )
    for name in split:
        if name not in names:
            raise ConfigError(
                f"PipelineConfig.split: {name!r} is not a pipeline unit of {what}; split before one of: {listing}"
            )
    cuts = [names.index(n) for n in split]
    if cuts[0] == 0:
        raise ConfigError(f"PipelineConfig.split: splitting before the first unit {names[0]!r} leaves stage 0 empty")
    if cuts != sorted(cuts):
        raise ConfigError(f"PipelineConfig.split: give the names in the model's order ({listing}); got {list(split)!r}")
    bounds = [0, *cuts, len(names)]
    return [names[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


class StageModule(nn.Module):
    """Runs one stage's units in order (the units stay owned by the model they came from)."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.unit_names = list(names)
        self.units = nn.ModuleList(model.get_submodule(n) for n in names)

    def forward(self, *args: Any) -> Any:
        out: Any = args
        for unit in self.units:
            out = unit(*out) if isinstance(out, tuple) else unit(out)
        return out


def keep_only(model: nn.Module, names: Sequence[str]) -> None:
    """Delete every pipeline unit of ``model`` not in ``names`` (the rest keep their names)."""
    keep = set(names)
    for name, _ in pipeline_units(model):
        if name in keep:
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        del parent._modules[leaf]


# ==================================================================== the strategy
class PipelineStrategy(ProcessGroupStrategy):
    """Replicas x pipeline stages under torchrun (``RunConfig.pipeline``)."""

    shards_state = True  # each stage holds its part: checkpoints go through torch.distributed.checkpoint

    def __init__(self, device: str, timeout: float, config: PipelineConfig) -> None:
        super().__init__(device, timeout)
        from torch.distributed.device_mesh import init_device_mesh

        self.config = config
        per_process = config.stages_per_process
        pp = config.stages // per_process
        if self.world_size % pp:
            raise ConfigError(
                f"PipelineConfig.split gives {config.stages} stages ({pp} processes per pipeline at "
                f"stages_per_process={per_process}), but WORLD_SIZE={self.world_size} is not a multiple "
                f"of {pp}; start replicas x {pp} processes"
            )
        rounds = max(1, config.microbatches // pp)
        if config.schedule == "interleaved1f1b" and config.microbatches % rounds:
            raise ConfigError(
                f"PipelineConfig.microbatches={config.microbatches}: interleaved1f1b runs micro-batches in rounds "
                f"of {pp} (the processes per pipeline); use a multiple of {pp}"
            )
        self.mesh = init_device_mesh(self.device.type, (self.world_size // pp, pp), mesh_dim_names=("dp", "pp"))
        self.dp_group = self.mesh.get_group("dp")
        self.pp_group = self.mesh.get_group("pp")
        self.pp_size = pp
        self.pp_rank = self.mesh.get_local_rank("pp")
        self.dp_size = self.world_size // pp
        self.dp_rank = self.mesh.get_local_rank("dp")
        self.stage_indices = [self.pp_rank + v * pp for v in range(per_process)]
        self.last_stage_rank = dist.get_global_rank(self.pp_group, pp - 1)
        self.optimizer_checkpoint_key = f"optimizer_pp{self.pp_rank}"
        self.runtime: PipelineRuntime | None = None  # once the model is wrapped

    @property
    def num_replicas(self) -> int:
        return self.dp_size

    @property
    def replica_index(self) -> int:
        return self.dp_rank

    def process_name(self, rank: int) -> str:
        # The mesh is arange(world).view(replicas, processes per pipeline).
        replica, position = divmod(rank, self.pp_size)
        stages = ", ".join(str(position + v * self.pp_size) for v in range(self.config.stages_per_process))
        return f"process {rank} (replica {replica}, stage {stages})"

    def wrap_model(self, model: nn.Module) -> nn.Module:
        plan = plan_stages(model, self.config.split)
        stages: list[nn.Module] = [StageModule(model, plan[i]) for i in self.stage_indices]
        recomputes = getattr(model, "_stoker_recompute", False)  # RunConfig.recompute="all": each stage
        keep_only(model, [n for i in self.stage_indices for n in plan[i]])
        if recomputes:
            from ..memory.recompute import apply_recompute

            for stage in stages:
                apply_recompute(stage, "all")
        self.runtime = PipelineRuntime(self, stages)
        return PipelinedModule(self.runtime)

    # Sums over replicas: every stage of a replica holds the same values (the last stage's,
    # broadcast), so the sum runs over the dp group only.
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.detach().clone()
        self._guard(dist.all_reduce, out, group=self.dp_group)
        return out

    def gather_over_replicas(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.dp_size
        self._guard(dist.all_gather_object, out, obj, group=self.dp_group)
        return out

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        # Replica 0's stages hold every weight once; other replicas hold copies of them.
        mine = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        full: dict[str, torch.Tensor] = {}
        for part in self.all_gather_object(mine):
            full.update(part)
        return full


__all__ = [
    "PIPELINE_SCHEDULES",
    "PipelineConfig",
    "PipelineStrategy",
    "StageModule",
    "keep_only",
    "pipeline_units",
    "plan_stages",
]
