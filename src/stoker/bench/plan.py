"""A ``stoker bench`` run worked out once: :class:`BenchPlan`, built by :func:`build_plan` from the flags.

The flags become one :class:`~stoker.RunConfig` (the engine's settings) and the bench's own
workload (:class:`~stoker.bench.workload.Workload`: data, model shape, device, step counts); the
plan adds the choices that are the bench's to make (torch's threads, what decodes real data,
the MFU's peak), each a :class:`~stoker.resolve.Choice` made by a rule of :mod:`stoker.resolve`
from this machine's facts, gathered once here. The engine's own choices (the kernels, the CUDA
graph) are not predicted here: the Estimator records them when it is built
(``Estimator.choices``) and the header prints that record beside the plan's.

The plan is built once per run and only read: by the header (``report.header_lines``), by the
``input_fn`` s (:meth:`BenchPlan.input_fn`) and by ``stoker bench``'s thread set-up.
:func:`preflight` asks the engine's rules about the flags that can be refused before anything
starts (in the process the user started, before replicas are launched).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch

from ..config import PrecisionName, RunConfig
from ..data.images.decoders import DECODERS, get_decoder
from ..distributed import torchrun_world_size
from ..engine.cuda_graph_step import cannot_capture, capture_refusals
from ..errors import ConfigError
from ..kernels.machine import busy_cores, usable_cores
from ..kernels.sgd_in_backward import cannot_update_in_backward, optimizer_refusal, run_refusal
from ..memory.host import keep_freed_host_memory
from ..models import create_model, example_flops, get_model_info
from ..precision import LossScale
from ..resolve import (
    DECODE_MS_PER_IMAGE,
    Choice,
    MachineFacts,
    data_workers,
    decode_inline,
    image_threads_suffice,
    input_bound,
    intra_threads,
    spelled,
    worker_kind,
)
from ..storage import location
from .config import DEFAULT_FP16_LOSS_SCALE, MODE_TRAIN, MODE_TRAIN_AND_EVAL, BenchConfig
from .flags import FLAG_OF_FIELD, FlagNames, flag_error
from .inputs import (
    CifarBinaries,
    FirstBatchRepeated,
    ImageOptions,
    InputFn,
    ModelExamples,
    SyntheticImages,
    auto_decoder_choice,
    image_input_fn,
)
from .model import ModelFactory, fp16_weights, zoo_model
from .optim import optimizer_for
from .workload import Workload, device_name, prefetch_depth, replica_device, resolve_workload

NOTHING_TO_DECODE = "synthetic data: nothing to decode"
TRAINING_FLOPS_FACTOR = 3.0  # a training image: the forward pass and a backward pass of twice its FLOPs


@dataclass(frozen=True, kw_only=True)
class InputChoices:
    """How real data is read: the workers, their kind, the decoder, whether the training thread
    decodes too and whether decoding stays in the input thread."""

    data_workers: Choice[int]
    worker_kind: Choice[str]
    decoder: Choice[str]
    training_thread_decodes: Choice[bool]
    decode_inline: Choice[bool]


@dataclass(frozen=True, kw_only=True)
class BenchPlan:
    """One run of ``stoker bench``, worked out once (see the module docstring).

    Attributes:
        cfg: the flags (``data_format`` filled in when it was left out).
        workload: what runs, on which data, where and for how many steps.
        model: the factory of the model (the zoo's, or the caller's).
        run_config: the Estimator's settings.
        bucket_mb: DDP's gradient bucket (``--gradient_repacking`` over several replicas), else ``None``.
        facts: this machine's facts the choices were made from.
        threads: torch's intra-op threads.
        input: how real data is read (``None``: nothing to decode).
        peak: where the MFU's peak comes from.
    """

    cfg: BenchConfig
    workload: Workload
    model: ModelFactory
    run_config: RunConfig
    bucket_mb: float | None
    facts: MachineFacts
    threads: Choice[int]
    input: InputChoices | None
    peak: Choice[str]

    @property
    def model_name(self) -> str:
        """``--model``, marked where the caller gave the model."""
        return self.cfg.model if self.workload.model_info is not None else f"{self.cfg.model} (custom)"

    @property
    def trains(self) -> bool:
        """Whether this run trains (training, or training + evaluation)."""
        return self.cfg.benchmark_mode in (MODE_TRAIN, MODE_TRAIN_AND_EVAL)

    def resolved_lines(self, engine: dict[str, Choice[Any]] | None) -> list[str]:
        """``name: value (reason)`` for every "auto" of the run: the plan's, and the ``engine``'s
        record (``Estimator.choices``: fast linear, SGD in the backward, CUDA graph), reasons in
        the flags' words; the input's five as one line where there is nothing to decode."""
        choices: list[tuple[str, Choice[Any]]] = [("threads", self.threads)]
        if self.input is None:
            choices.append(("input", Choice("none", NOTHING_TO_DECODE)))
        else:
            choices += [(name, getattr(self.input, name)) for name in InputChoices.__dataclass_fields__]
        kernels = dict(engine or {})
        choices += [(name, kernels[name]) for name in ("fast_linear", "sgd_in_backward") if name in kernels]
        choices.append(("peak", self.peak))
        choices += [(name, kernels[name]) for name in ("cuda_graph",) if name in kernels]
        flags = FlagNames()
        return [f"{name.replace('_', ' ')}: {_value(c.value)} ({spelled(c.reason, flags)})" for name, c in choices]

    def input_fn(self, *, train: bool, repeat: bool = True) -> InputFn:
        """The ``input_fn`` of the training (``train=True``) or evaluation data (a
        :mod:`stoker.bench.inputs` kind). Training data always repeats; evaluation data repeats
        when ``repeat`` (``--eval`` reads ``--num_batches`` batches, which may exceed one pass),
        else it is one exact pass."""
        cfg, workload = self.cfg, self.workload
        info, seed = workload.model_info, cfg.tf_random_seed
        if workload.synthetic and info is not None and not info.is_classifier:
            return ModelExamples(info=info, num_classes=workload.num_classes, device=workload.device, seed=seed)
        if workload.synthetic:
            shape = (3, workload.image_size, workload.image_size)
            return SyntheticImages(
                shape=shape,
                num_classes=workload.num_classes,
                device=workload.device,
                seed=seed,
                channels_last=cfg.channels_last,
            )
        assert cfg.data_dir is not None and self.input is not None
        # A source given a number of epochs keeps a partial last batch, which the Estimator pads.
        epochs = None if train else (1_000_000 if repeat else 1)
        input_fn: InputFn
        if workload.dataset == "cifar10":
            augment = train and cfg.distortions
            input_fn = CifarBinaries(
                data_dir=location(cfg.data_dir), train=train, seed=seed, num_epochs=epochs, augment=augment
            )
        else:
            options = self.image_options(
                train=train,
                epochs=epochs,
                num_workers=self.input.data_workers.value,
                worker_kind=self.input.worker_kind.value,
                # auto was measured once (stoker.data.images.auto_decoder), then named to every source
                decoder=cfg.image_decoder if cfg.decode_on_device else self.input.decoder.value,
            )
            input_fn = image_input_fn(location(cfg.data_dir), workload.data_layout, workload.num_classes, options)
        return FirstBatchRepeated(input_fn) if cfg.datasets_repeat_cached_sample and train else input_fn

    def image_options(
        self, *, train: bool, epochs: int | None, num_workers: int = 0, worker_kind: str = "auto", decoder: str = "auto"
    ) -> ImageOptions:
        """The :class:`~stoker.bench.inputs.ImageOptions` of a JPEG source of this run (training
        or evaluation data), with the workers and the decoder given."""
        cfg = self.cfg
        return ImageOptions(
            image_size=self.workload.image_size,
            train=train,
            seed=cfg.tf_random_seed,
            num_epochs=epochs,
            num_workers=num_workers,
            worker_kind=worker_kind,
            resize_method=cfg.resize_method,
            distortions=train and cfg.distortions,
            decoder=decoder,
            decode_on_device=cfg.decode_on_device,
            pin_memory=self.workload.device.type == "cuda",
        )


def _value(value: Any) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else str(value)


# ------------------------------------------------------------------------------ before anything starts
def preflight(cfg: BenchConfig, world: int) -> Choice[torch.device]:
    """This replica's device (the engine's one device rule, :func:`stoker.distributed.device_choice`)
    and the engine's rules the flags can break before anything is built: ``--sgd_in_backward=on``
    asks :func:`~stoker.kernels.sgd_in_backward.run_refusal` and, of the optimizer the bench
    builds, :func:`~stoker.kernels.sgd_in_backward.optimizer_refusal`. A refusal is a
    :class:`~stoker.errors.FlagError` naming the flags."""
    device = replica_device(cfg)
    if cfg.sgd_in_backward == "on":
        need = run_refusal(
            device=device.value,
            world_size=max(world, cfg.num_gpus),
            precision=cfg.precision,
            accumulation=1,
            clip_norm=None,  # --gradient_clip clips elements in an optimizer hook, which the optimizer's rule sees
            compiled=cfg.compile_mode not in (False, "none"),
            cuda_graph=cfg.cuda_graph,
            fast_linear=cfg.fast_linear,
        ) or optimizer_refusal(optimizer_for(cfg, device.value.type))
        if need is not None:
            raise flag_error(cannot_update_in_backward(need))
    return device


def machine_facts(*, sample_busy: bool = False, world: int | None = None) -> MachineFacts:
    """This process's :class:`~stoker.resolve.MachineFacts`. ``sample_busy`` samples the cores
    other processes keep busy (0.2 s; not under several replicas, which would count each other)."""
    world = torchrun_world_size() if world is None else world
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or 1)
    return MachineFacts(
        usable_cores=usable_cores(),
        cpu_count=os.cpu_count() or 1,
        default_threads=torch.get_num_threads(),
        busy_cores=busy_cores() if sample_busy and local_world <= 1 else None,
        local_world_size=local_world,
    )


def flops_per_image(model_name: str, dataset: str, num_classes: int | None = None) -> float:
    """Forward GFLOP per image of a zoo model, counted on the meta device (no arithmetic)."""
    info = get_model_info(model_name, dataset)
    with torch.device("meta"):
        model = create_model(model_name, dataset=dataset, num_classes=num_classes)
    return example_flops(model, info) / 1e9


def step_in_decodes(cfg: BenchConfig, workload: Workload) -> float | None:
    """On a CPU, with ImageNet-shaped JPEG data: how many decodes one image's training step lasts
    (its counted FLOPs over this machine's measured peak, against
    :data:`~stoker.resolve.DECODE_MS_PER_IMAGE`); ``None`` elsewhere, or for a model whose FLOPs
    cannot be counted."""
    if workload.dataset != "imagenet" or workload.device.type != "cpu":
        return None
    from ..kernels.peak import measured_peak

    try:
        gflop = TRAINING_FLOPS_FACTOR * flops_per_image(cfg.model, workload.dataset, workload.num_classes)
        peak = measured_peak(workload.device, cfg.precision).gflops
    except Exception:  # noqa: BLE001 - a model the counter cannot trace: no opinion
        return None
    return gflop / peak * 1000.0 / DECODE_MS_PER_IMAGE


# ------------------------------------------------------------------------------ building the plan
def build_plan(
    cfg: BenchConfig,
    *,
    model: ModelFactory | None = None,
    num_classes: int | None = None,
    sample_busy: bool = False,
    facts: MachineFacts | None = None,
    device: Choice[torch.device] | None = None,
) -> BenchPlan:
    """The plan of a run of ``cfg`` (``model``: the caller's factory instead of the zoo model,
    with ``num_classes`` logits). ``sample_busy``: sample the busy cores where they decide the
    threads (``stoker bench`` does; a script calling :func:`~stoker.bench.run_benchmark` does
    not). ``facts``: the machine's, made up (tests); default: this machine's (:func:`machine_facts`).
    ``device``: :func:`preflight`'s answer where the caller asked it already (``stoker bench``)."""
    if cfg.keep_host_memory:
        keep_freed_host_memory()  # before the model and data exist: their memory is kept too
    world = torchrun_world_size()
    device = preflight(cfg, world) if device is None else device
    workload = resolve_workload(cfg, device.value, custom_model=model is not None, num_classes=num_classes)
    if cfg.data_format is None:  # left out: the model's default on this device (the header says which)
        cfg = cfg.replace(data_format=workload.data_format)
    trains = cfg.benchmark_mode in (MODE_TRAIN, MODE_TRAIN_AND_EVAL)
    decodes = step_in_decodes(cfg, workload) if cfg.data_dir is not None else None
    bound = input_bound(decodes if trains and cfg.mode != "inference" else None)
    if facts is None:
        sample = sample_busy and cfg.num_intra_threads is None and not bound.value  # only where they decide
        facts = machine_facts(sample_busy=sample, world=world)
    factory = model or zoo_model(cfg, workload)
    if cfg.fp16_vars and cfg.precision == "fp16":
        factory = fp16_weights(factory)
    bucket_mb = repacking_bucket_mb(cfg, factory, model_params(cfg)) if workload.num_devices > 1 else None
    # --gpu_indices named this replica's device; else the engine resolves the flag's name (the same rule)
    config = _run_config(cfg, str(device.value) if cfg.gpu_indices.strip() else device_name(cfg), bucket_mb)
    if cfg.cuda_graph and trains:
        _check_capture(cfg, workload)
    peak = (
        Choice(f"{cfg.peak_tflops:g} TFLOP/s", "--peak_tflops")
        if cfg.peak_tflops is not None
        else Choice("measured", "the fastest of three kernels in the compute dtype, measured once per machine")
    )
    plan = BenchPlan(
        cfg=cfg,
        workload=workload,
        model=factory,
        run_config=config,
        bucket_mb=bucket_mb,
        facts=facts,
        threads=intra_threads(given=cfg.num_intra_threads, input_bound=bound, facts=facts),
        input=None,
        peak=peak,
    )
    if workload.synthetic or cfg.mode == "inference":
        return plan
    return _with_input(plan, decodes)


def _run_config(cfg: BenchConfig, device: str, bucket_mb: float | None) -> RunConfig:
    """The Estimator's settings; the engine's refusal of a setting is a flag error in the flags' words."""
    try:
        return run_config(cfg, device, bucket_mb=bucket_mb)
    except ConfigError as e:
        raise flag_error(e) from None


def _check_capture(cfg: BenchConfig, workload: Workload) -> None:
    """``--cuda_graph=true`` asks for a graph: a step that cannot be captured is a flag error
    naming why, never an eager run under the flag."""
    refusals = graph_refusals(cfg, workload.device.type, replicas=workload.num_devices)
    if refusals:
        raise flag_error(cannot_capture(refusals))


def graph_refusals(cfg: BenchConfig, device_type: str, *, replicas: int = 1) -> list[str]:
    """Why the training step of ``cfg`` on a ``device_type`` device with ``replicas`` replicas
    cannot be captured as a CUDA graph: the engine's rule
    (:func:`~stoker.engine.cuda_graph_step.capture_refusals`) asked of the optimizer the bench
    builds for CUDA (:func:`~stoker.bench.optim.optimizer_for`, on a CPU stand-in), before
    anything is built; the engine asks it again of the built step."""
    return capture_refusals(
        optimizer=optimizer_for(cfg, "cuda"),
        device_type=device_type,
        compile_mode="step" if cfg.compile_mode == "step" else "none",  # only a compiled step changes the answer
        dynamic_scaling=cfg.precision == "fp16" and cfg.fp16_enable_auto_loss_scale,
        world_size=replicas,
    )


def run_config(cfg: BenchConfig, device: str, *, bucket_mb: float | None = None) -> RunConfig:
    """The ``RunConfig`` the flags describe for a run on ``device`` (checkpoints in ``--train_dir``,
    nothing logged by the engine: the harness prints its own lines). ``bucket_mb``: DDP's
    gradient bucket size. ``--mode=inference`` calls the model directly: one device, no checkpoints."""
    if cfg.mode == "inference":
        return RunConfig(
            seed=cfg.tf_random_seed,
            device=device,
            strategy="single",
            progress_bar=False,
            summaries=False,
            fast_linear=cast("Literal['auto', 'on', 'off']", cfg.fast_linear),  # BenchConfig checked it
            sgd_in_backward=cast("Literal['off', 'auto', 'on']", cfg.sgd_in_backward),
        )
    depth = prefetch_depth(cfg)
    prefetch: dict[str, Any] = {} if depth is None else {"prefetch_depth": depth}  # else RunConfig's default
    loss_scale = LossScale(  # static unless --fp16_enable_auto_loss_scale (the growth interval is then unused)
        dynamic=bool(cfg.fp16_enable_auto_loss_scale),
        init=float(cfg.fp16_loss_scale or DEFAULT_FP16_LOSS_SCALE),
        growth_interval=cfg.fp16_inc_loss_scale_every_n or 1000,
    )
    return RunConfig(
        model_dir=cfg.train_dir,
        seed=cfg.tf_random_seed,
        iterations_per_loop=cfg.iterations_per_loop,
        save_checkpoints_steps=cfg.save_model_steps,
        # tf_cnn_benchmarks saves only at the end unless asked; math.inf means "never by time".
        save_checkpoints_secs=None if cfg.save_model_steps else (cfg.save_model_secs or math.inf),
        keep_checkpoint_max=cfg.max_ckpts_to_keep,
        log_every_n_steps=None,  # the harness prints its own progress lines
        precision=cast(PrecisionName, cfg.precision),  # one of PRECISIONS: BenchConfig checked it
        loss_scale=loss_scale,
        device=device,
        compile=cast("bool | Literal['none', 'module', 'step']", cfg.compile_mode),  # RunConfig checks it
        cuda_graph=cfg.cuda_graph,
        fast_linear=cast("Literal['auto', 'on', 'off']", cfg.fast_linear),  # BenchConfig checked it
        sgd_in_backward=cast("Literal['off', 'auto', 'on']", cfg.sgd_in_backward),
        # One process: every strategy is the same single replica. Under torchrun: DDP
        # (replicated), FSDP2 (sharded) or no gradient exchange (independent).
        strategy=effective_variable_update(cfg),
        ddp_bucket_cap_mb=bucket_mb,
        progress_bar=False,
        summaries=False,
        # tf_cnn_benchmarks' rate and optimizer flags are constants of each run's graph, so a rerun
        # into --train_dir trains on with the new values (said in one line each; docs/checkpoints.md)
        on_changed_optimizer="apply",
        **prefetch,
    )


def effective_variable_update(cfg: BenchConfig) -> str:
    """``parameter_server`` runs as ``replicated``: one process has no parameter server."""
    return "replicated" if cfg.variable_update == "parameter_server" else cfg.variable_update


def model_params(cfg: BenchConfig) -> dict[str, Any]:
    """The Estimator's ``params``: what the bench's ``model_fn`` reads."""
    return {
        "weight_decay": cfg.weight_decay,
        "print_training_accuracy": cfg.print_training_accuracy,
        "channels_last": cfg.channels_last,
        "report_base_loss": cfg.loss_type_to_report == "base_loss",
    }


def setting_names(cfg: BenchConfig) -> dict[str, str]:
    """The flag behind each setting, so a ``--train_dir`` rerun's changed-settings lines name it
    (``stoker.config.changes``: the ``RunConfig`` fields as :data:`~stoker.bench.flags.FLAG_OF_FIELD` says)."""
    rmsprop = cfg.optimizer == "rmsprop"
    return {
        **{f"RunConfig.{field}": f"--{flag}" for field, flag in FLAG_OF_FIELD.items()},
        "train_batch_size": "--batch_size",
        "eval_batch_size": "--eval_batch_size",
        "max_steps": "--num_warmup_batches + --num_batches",
        "params.weight_decay": "--weight_decay",
        "params.print_training_accuracy": "--print_training_accuracy",
        "params.channels_last": "--data_format",
        "params.report_base_loss": "--loss_type_to_report",
        "optimizer.type": "--optimizer",
        "optimizer.lr": "--init_learning_rate",
        "lr_schedule.lr": "the learning rate (--init_learning_rate and the schedule flags)",
        "optimizer.momentum": "--rmsprop_momentum" if rmsprop else "--momentum",
        "optimizer.weight_decay": "--weight_decay",
        "optimizer.eps": "--rmsprop_epsilon" if rmsprop else "--adam_epsilon",
        "optimizer.decay": "--rmsprop_decay",
        "optimizer.betas": "--adam_beta1, --adam_beta2",
    }


def repacking_bucket_mb(cfg: BenchConfig, factory: ModelFactory, params: dict[str, Any]) -> float | None:
    """``--gradient_repacking=N``: the DDP bucket size (MiB) that splits the gradients into N
    buckets of equal size, as tf_cnn_benchmarks repacks them into N tensors (``None``: not given)."""
    if not cfg.gradient_repacking:
        return None
    model = factory(params)
    fp16_weights = cfg.fp16_vars and cfg.precision == "fp16"
    grad_bytes = sum(p.numel() * (2 if fp16_weights else 4) for p in model.parameters() if p.requires_grad)
    return grad_bytes / cfg.gradient_repacking / 2**20


# ------------------------------------------------------------------------------ real data
def _with_input(plan: BenchPlan, decodes: float | None) -> BenchPlan:
    """``plan`` with the choices of how its real data is read: the decoder (``auto``: measured
    once, here, on the data), the workers and their kind (:func:`stoker.resolve.worker_kind`, the
    rule the image sources apply), and whether decoding stays in the input thread."""
    cfg, workload = plan.cfg, plan.workload
    cifar, on_cuda = workload.dataset == "cifar10", workload.device.type == "cuda"
    decoder = Choice("raw", "CIFAR-10 binaries") if cifar else _decoder(plan)

    def kind(workers: int) -> Choice[str]:
        named = decoder.value if decoder.value in DECODERS else cfg.image_decoder  # raw (CIFAR-10), nvjpeg: the flag's
        suffice = image_threads_suffice(
            releases_gil=get_decoder(named).releases_gil, decode_on_device=cfg.decode_on_device, pin_memory=on_cuda
        )
        return worker_kind(cfg.data_worker_kind, suffice, workers)

    def training_thread_helps(workers: int) -> bool:
        return workers > 0 and not cifar and not on_cuda and kind(workers).value == "thread"

    inline = decode_inline(None if cfg.datasets_num_private_threads is not None else decodes)
    workers = data_workers(
        use_datasets=cfg.use_datasets,
        decode_on_device=cfg.decode_on_device,
        given=cfg.datasets_num_private_threads,
        inline=inline,
        on_cuda=on_cuda,
        facts=plan.facts,
        training_thread_helps=training_thread_helps,
    )
    helps = training_thread_helps(workers.value)
    choices = InputChoices(
        data_workers=workers,
        worker_kind=kind(workers.value),
        decoder=decoder,
        training_thread_decodes=Choice(
            helps, "threads decode for a CPU step" if helps else "workers or the input thread decode"
        ),
        decode_inline=inline,
    )
    return dataclasses.replace(plan, input=choices)


def _decoder(plan: BenchPlan) -> Choice[str]:
    cfg = plan.cfg
    if cfg.decode_on_device:
        return Choice("nvjpeg", "--decode_on_device")
    if cfg.image_decoder != "auto":
        return Choice(get_decoder(cfg.image_decoder).name, f"--image_decoder={cfg.image_decoder}")
    assert cfg.data_dir is not None
    train = plan.trains and not cfg.eval
    options = plan.image_options(train=train, epochs=None if train else 1)
    return auto_decoder_choice(location(cfg.data_dir), plan.workload.data_layout, plan.workload.num_classes, options)


__all__ = [
    "TRAINING_FLOPS_FACTOR",
    "BenchPlan",
    "InputChoices",
    "build_plan",
    "effective_variable_update",
    "flops_per_image",
    "graph_refusals",
    "machine_facts",
    "model_params",
    "preflight",
    "repacking_bucket_mb",
    "run_config",
    "step_in_decodes",
]
