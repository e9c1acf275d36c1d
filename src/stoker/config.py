"""``RunConfig``: how a run is executed (where, how often to save and log, in what precision).

What the model *is* lives in ``params``; ``RunConfig`` only says how to run it. Every field is
validated when the config is built, and a bad value raises ``ValueError`` naming the field and
the values it accepts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Literal

from .storage.stores import RetryPolicy

Precision = Literal["fp32", "bf16", "fp16", "bf16-sr"]
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "bf16-sr")
STRATEGIES: tuple[str, ...] = ("auto", "single", "replicated", "sharded", "independent", "pipeline")
PIPELINE_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved1f1b")
COMPILE_MODES: tuple[str, ...] = ("none", "module", "step")  # also True (= "module") and False (= "none")


@dataclass(kw_only=True)
class RunConfig:
    """Execution settings of an ``Estimator``.

    Attributes:
        model_dir: where checkpoints, TensorBoard events and ``metrics.csv`` go. ``None``
            keeps everything in memory (no checkpoints, no resume).
        seed: seeds model initialisation and every RNG stoker manages; resume restores them.
        iterations_per_loop: training steps per host round trip (the device loop). Loss and
            ``host_call`` values stay on the device within a loop; hooks run once per loop, so
            step-based intervals (checkpoints, logging) are honoured at the first loop boundary
            at or after the step they name. In one process, when every hook waits for a due
            step (``Hook.due_step``: the built-in ones do; a hook without it is called after
            every loop), the loops before the first due step run as one, since no hook would
            see them: the host is visited less, the hooks see the same steps.
        save_checkpoints_steps / save_checkpoints_secs: checkpoint interval (set at most one;
            with neither, a checkpoint is written every 600 s). A final checkpoint is always
            written when ``train`` returns.
        keep_checkpoint_max: how many of the newest checkpoints to retain (0 keeps all).
        keep_best: ``(metric, "min" | "max")``: also retain the checkpoint with the best
            evaluation value of ``metric``, apart from the newest ones.
        log_every_n_steps: interval of the loss / examples-per-second log lines (``None``: no
            log lines and no step counter, e.g. for a harness that prints its own).
        precision: ``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast + loss scaling) keep fp32
            master weights; ``bf16-sr`` keeps the weights and the optimizer state in bf16 and
            rounds every update stochastically (``stoker.memory.stochastic_rounding``, ``docs/memory.md``).
        loss_scale: fp16 only: a number for a static scale (e.g. 128) or ``"dynamic"``.
        loss_scale_init / loss_scale_growth_interval: dynamic scaling starts at
            ``loss_scale_init``, halves (and skips the update) on inf/NaN gradients and doubles
            after ``loss_scale_growth_interval`` good steps.
        gradient_accumulation_steps: micro-batches per optimizer step. The global batch is the
            batch of one optimizer step, so each micro-batch holds
            ``train_batch_size / (replicas * gradient_accumulation_steps)`` examples.
        gradient_clip_norm: clip the global gradient norm to this value before each update.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        compile: ``False`` / ``"none"``: eager; ``True`` / ``"module"``: wrap the model in
            ``torch.compile``; ``"step"``: compile the whole training step (forward, loss
            scaling, backward, optimizer update; see ``docs/device_loop.md``).
        cuda_graph: CUDA only: capture the training step once as a CUDA graph and replay it
            every step (static input buffers, capturable optimizer, loss scale on the device).
        strategy: how replicas are formed: ``auto`` picks from the torchrun environment.
        ddp_bucket_cap_mb: ``replicated``: the size of DDP's gradient buckets in MiB (``None``:
            DDP's default of 25); gradients are all-reduced one bucket at a time.
        prefetch_depth: batches the infeed prepares ahead (0: fetch in the training thread).
        progress_bar: show a tqdm bar when stderr is a terminal.
        summaries: write TensorBoard events and ``metrics.csv`` into ``model_dir``.
        distributed_timeout: seconds a collective may wait for a lost replica.
        deterministic: ask torch for deterministic kernels (slower on GPU).
        recompute: activation recompute (``docs/memory.md``): ``None`` (off), ``"all"`` (the
            whole model, or each pipeline stage), or glob patterns on module names such as
            ``"layers.*"`` whose modules drop their activations after the forward pass and
            recompute them in backward (``torch.utils.checkpoint``, non-reentrant; gradients
            are bitwise the same). A pattern that matches no module is an error listing them.
        pipeline_split: pipeline parallelism (``docs/model_parallel.md``): the module names to
            split the model *before*, e.g. ``("layers.2",)`` for two stages. Names are the
            model's pipeline units: its children in order, with ``nn.ModuleList`` /
            ``nn.Sequential`` children opened one level (``embeddings``, ``layers.0``, ...,
            ``head``); the model's forward must be exactly their composition. Under torchrun the
            processes form ``replicas x stages`` (``WORLD_SIZE / stages`` replicas); in one
            process the model runs unsplit (the names are still checked).
        pipeline_microbatches: micro-batches each replica's batch is cut into (must divide it).
        pipeline_schedule: ``gpipe``, ``1f1b`` or ``interleaved1f1b``
            (``torch.distributed.pipelining``'s ScheduleGPipe / Schedule1F1B /
            ScheduleInterleaved1F1B).
        pipeline_stages_per_process: stages each process holds (the interleaved schedule's
            virtual stages; 1 for ``gpipe`` and ``1f1b``, at least 2 for ``interleaved1f1b``).
        mlperf_log: write MLPerf-style ``:::MLLOG`` events to ``model_dir/mlperf.log`` (RUN_START,
            EPOCH_START/STOP, RUN_STOP; ``stoker.hooks.MLPerfLogHook`` adds evaluations).
        async_checkpoints: write checkpoints on a background thread: the loop waits only for a
            copy of the state (``stoker.checkpoint.async_writer``); a failed write stops training at
            the next loop boundary with the previous checkpoint still the latest. Sharded
            (``dcp/``) checkpoints are always written synchronously.
        storage_retry: how storage faults are retried and how long one storage operation may
            take (``stoker.storage.RetryPolicy``; default 5 attempts, backoff from 0.2 s,
            600 s timeout).
    """

    model_dir: str | os.PathLike[str] | None = None
    seed: int = 0
    iterations_per_loop: int = 10
    save_checkpoints_steps: int | None = None
    save_checkpoints_secs: float | None = None
    keep_checkpoint_max: int = 5
    keep_best: tuple[str, str] | None = None
    log_every_n_steps: int | None = 100
    precision: Precision = "fp32"
    loss_scale: float | Literal["dynamic"] = "dynamic"
    loss_scale_init: float = 2.0**15
    loss_scale_growth_interval: int = 1000
    gradient_accumulation_steps: int = 1
    gradient_clip_norm: float | None = None
    device: str = "auto"
    compile: bool | Literal["none", "module", "step"] = False
    cuda_graph: bool = False
    strategy: str = "auto"
    ddp_bucket_cap_mb: float | None = None
    prefetch_depth: int = 2
    progress_bar: bool = True
    summaries: bool = True
    distributed_timeout: float = 1800.0
    deterministic: bool = False
    mlperf_log: bool = False
    recompute: str | tuple[str, ...] | None = None
    pipeline_split: tuple[str, ...] | None = None
    pipeline_microbatches: int = 1
    pipeline_schedule: str = "1f1b"
    pipeline_stages_per_process: int = 1
    async_checkpoints: bool = False
    storage_retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.async_checkpoints, bool):
            raise ValueError(f"RunConfig.async_checkpoints must be True or False; got {self.async_checkpoints!r}")
        if self.model_dir is not None:
            self.model_dir = os.fspath(self.model_dir)
        _positive_int("iterations_per_loop", self.iterations_per_loop)
        _positive_int("gradient_accumulation_steps", self.gradient_accumulation_steps)
        if self.log_every_n_steps is not None:
            _positive_int("log_every_n_steps", self.log_every_n_steps)
        _positive_int("loss_scale_growth_interval", self.loss_scale_growth_interval)
        if self.keep_checkpoint_max < 0:
            raise ValueError(
                f"RunConfig.keep_checkpoint_max must be >= 0 (0 keeps all), got {self.keep_checkpoint_max}"
            )
        if self.save_checkpoints_steps is not None and self.save_checkpoints_secs is not None:
            raise ValueError(
                "RunConfig: set at most one of save_checkpoints_steps and save_checkpoints_secs "
                f"(got {self.save_checkpoints_steps} and {self.save_checkpoints_secs})"
            )
        if self.save_checkpoints_steps is not None:
            _positive_int("save_checkpoints_steps", self.save_checkpoints_steps)
        if self.save_checkpoints_secs is not None and not self.save_checkpoints_secs > 0:
            raise ValueError(f"RunConfig.save_checkpoints_secs must be > 0, got {self.save_checkpoints_secs}")
        if self.save_checkpoints_steps is None and self.save_checkpoints_secs is None:
            self.save_checkpoints_secs = 600.0
        if self.precision not in PRECISIONS:
            raise ValueError(f"RunConfig.precision must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        if self.precision == "bf16-sr":
            self._check_bf16_sr()
        if self.loss_scale != "dynamic" and not (isinstance(self.loss_scale, (int, float)) and self.loss_scale > 0):
            raise ValueError(f"RunConfig.loss_scale must be a positive number or 'dynamic'; got {self.loss_scale!r}")
        if not self.loss_scale_init > 0:
            raise ValueError(f"RunConfig.loss_scale_init must be > 0; got {self.loss_scale_init}")
        if self.keep_best is not None:
            if (
                not isinstance(self.keep_best, (tuple, list))
                or len(self.keep_best) != 2
                or self.keep_best[1] not in ("min", "max")
            ):
                raise ValueError(f"RunConfig.keep_best must be (metric_name, 'min' | 'max'); got {self.keep_best!r}")
            self.keep_best = (str(self.keep_best[0]), str(self.keep_best[1]))
        if self.gradient_clip_norm is not None and not self.gradient_clip_norm > 0:
            raise ValueError(f"RunConfig.gradient_clip_norm must be > 0; got {self.gradient_clip_norm}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"RunConfig.strategy must be one of {', '.join(STRATEGIES)}; got {self.strategy!r}")
        if self.ddp_bucket_cap_mb is not None and not self.ddp_bucket_cap_mb > 0:
            raise ValueError(f"RunConfig.ddp_bucket_cap_mb must be > 0; got {self.ddp_bucket_cap_mb}")
        if self.prefetch_depth < 0:
            raise ValueError(f"RunConfig.prefetch_depth must be >= 0; got {self.prefetch_depth}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"RunConfig.device must be auto, cpu, cuda or cuda:N; got {self.device!r}")
        if not (isinstance(self.compile, bool) or self.compile in COMPILE_MODES):
            raise ValueError(
                f"RunConfig.compile must be True, False, {', '.join(map(repr, COMPILE_MODES))}; got {self.compile!r}"
            )
        if not isinstance(self.cuda_graph, bool):
            raise ValueError(f"RunConfig.cuda_graph must be True or False; got {self.cuda_graph!r}")
        if self.cuda_graph and self.device == "cpu":
            raise ValueError(
                "RunConfig.cuda_graph=True needs a CUDA device; device is 'cpu' (set device='cuda' or cuda_graph=False)"
            )
        if self.cuda_graph and self.compile_mode == "step":
            raise ValueError("RunConfig: cuda_graph=True and compile='step' are two ways to run the step; pick one")
        self.recompute = _recompute_spec(self.recompute)
        self._check_pipeline()
        if not self.distributed_timeout > 0:
            raise ValueError(f"RunConfig.distributed_timeout must be > 0; got {self.distributed_timeout}")

    def _check_bf16_sr(self) -> None:
        """bf16-sr's update runs eagerly, one parameter at a time, and needs no loss scaling."""
        if self.loss_scale != "dynamic":
            raise ValueError(
                f"RunConfig.loss_scale={self.loss_scale!r} is fp16 loss scaling; precision='bf16-sr' has fp32's "
                "exponent range and scales no loss (leave loss_scale unset, or use precision='fp16')"
            )
        if self.compile == "step" or self.cuda_graph:
            raise ValueError(
                "RunConfig: precision='bf16-sr' does not run with compile='step' or cuda_graph=True (its update "
                "steps one parameter at a time with its own generator); use compile='module' or 'none'"
            )

    def _check_pipeline(self) -> None:
        split = self.pipeline_split
        if split is not None:
            names = [split] if isinstance(split, str) else split
            if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(
                    "RunConfig.pipeline_split must be None or module names to split before (a string or a "
                    f"list of strings such as ('layers.2',)); got {split!r}"
                )
            if len(set(names)) != len(names):
                raise ValueError(f"RunConfig.pipeline_split names a module twice: {list(names)!r}")
            self.pipeline_split = tuple(names)
        _positive_int("pipeline_microbatches", self.pipeline_microbatches)
        _positive_int("pipeline_stages_per_process", self.pipeline_stages_per_process)
        if self.pipeline_schedule not in PIPELINE_SCHEDULES:
            raise ValueError(
                f"RunConfig.pipeline_schedule must be one of {', '.join(PIPELINE_SCHEDULES)}; got {self.pipeline_schedule!r}"
            )
        interleaved = self.pipeline_schedule == "interleaved1f1b"
        if interleaved != (self.pipeline_stages_per_process > 1):
            raise ValueError(
                "RunConfig: pipeline_schedule='interleaved1f1b' needs pipeline_stages_per_process >= 2, and "
                f"'gpipe' / '1f1b' need 1; got {self.pipeline_schedule!r} with {self.pipeline_stages_per_process}"
            )
        if self.pipeline_split is None:
            if self.strategy == "pipeline":
                raise ValueError(
                    "RunConfig.strategy='pipeline' needs pipeline_split (the module names to split before)"
                )
            return
        stages = len(self.pipeline_split) + 1
        if stages % self.pipeline_stages_per_process:
            raise ValueError(
                f"RunConfig: {stages} pipeline stages (pipeline_split names {stages - 1} modules) cannot be "
                f"spread evenly at pipeline_stages_per_process={self.pipeline_stages_per_process}"
            )
        if self.strategy not in ("auto", "pipeline"):
            raise ValueError(f"RunConfig.pipeline_split needs strategy 'auto' or 'pipeline'; got {self.strategy!r}")
        if self.gradient_accumulation_steps != 1:
            raise ValueError(
                "RunConfig: with pipeline_split, micro-batches are pipeline_microbatches; set "
                f"gradient_accumulation_steps=1 (got {self.gradient_accumulation_steps})"
            )
        if self.precision in ("fp16", "bf16-sr") or self.compile_mode != "none" or self.cuda_graph:
            raise ValueError(
                "RunConfig: pipeline_split runs the eager step in fp32 or bf16; fp16 loss scaling, bf16-sr "
                f"weights, compile and cuda_graph are not supported with it (got precision={self.precision!r}, "
                f"compile={self.compile!r}, cuda_graph={self.cuda_graph})"
            )

    @property
    def pipeline_stages(self) -> int:
        """The number of pipeline stages (1: no pipeline)."""
        return 1 if self.pipeline_split is None else len(self.pipeline_split) + 1

    @property
    def compile_mode(self) -> str:
        """``compile`` as one of ``"none"``, ``"module"``, ``"step"``."""
        if isinstance(self.compile, bool):
            return "module" if self.compile else "none"
        return self.compile

    def replace(self, **changes: object) -> RunConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _recompute_spec(value: object) -> str | tuple[str, ...] | None:
    """``None``, ``"all"`` or a tuple of non-empty glob patterns (a single pattern or a list is accepted)."""
    if value is None or value == "all":
        return value  # type: ignore[return-value]
    patterns = [value] if isinstance(value, str) else value
    if (
        not isinstance(patterns, (list, tuple))
        or not patterns
        or not all(isinstance(p, str) and p.strip() for p in patterns)
    ):
        raise ValueError(
            "RunConfig.recompute must be None, 'all', or module-name patterns (a string or a list of "
            f"strings such as 'layers.*'); got {value!r}"
        )
    return tuple(p.strip() for p in patterns)


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"RunConfig.{name} must be a positive integer; got {value!r}")
