"""``ModelState``: the model, its optimizer and everything a training run carries, built and restored.

One object owns what a checkpoint holds: the module (and its wrapped, possibly compiled, form),
the optimizer, the LR schedule, the loss scaler, the global step, the carried cache and the
states a resumed run hands back to its hooks and its input. It knows which checkpoint its
memory holds, so the facade restores only when memory is behind ``model_dir``:

- ``"fresh"``: newly built (initial or warm-started weights), never trained;
- ``"memory"``: trained past any checkpoint, or declared usable as it is (``initialize``);
- a ``Path``: exactly the full training state of that checkpoint;
- ``None``: unknown (training failed mid-way, or only weights were loaded).

Saving is collective (``saving.StateWriter``): every replica contributes its input position, RNG
state and cache; the chief writes one checkpoint through the ``CheckpointManager`` (sharded runs:
every replica its slices through ``torch.distributed.checkpoint``). ``RunConfig.ema``'s average
(``ema.EmaWeights``) is restored and saved with the weights.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import torch
from torch import nn

from ..checkpoint.manager import (
    CheckpointManager,
    LoadedCheckpoint,
    check_state_fits,
    load_checkpoint,
    previous_retained,
)
from ..checkpoint.safe_load import refused
from ..checkpoint.warm_start import WarmStartSettings, warm_start
from ..config.changes import SettingChange
from ..config.slices import StateConfig
from ..distributed import Strategy
from ..distributed.pipeline import plan_stages
from ..distributed.sharded import DCP_DIR, caused_by, load_sharded, refusal
from ..errors import CheckpointError, ConfigError, UserCodeError
from ..kernels.fp16_cost import fp16_cost, fp16_note, layer_kinds, say_once
from ..kernels.linear import fast_linear_choice, use_fast_linear
from ..kernels.sgd_in_backward import (
    cannot_update_in_backward,
    optimizer_refusal,
    run_refusal,
    sgd_in_backward_choice,
    update_in_backward,
)
from ..memory.recompute import apply_recompute
from ..precision import LossScaler, Precision
from ..resolve import Choice
from ..rng import seed_everything, set_rng_state
from ..storage.stores import Location
from .compile_cache import CompileCache
from .ema import EmaWeights
from .run_settings import RunSettings
from .saving import StateWriter

log = logging.getLogger("stoker")

ModelArg = nn.Module | Callable[[dict[str, Any]], nn.Module]
OptimizerFn = Callable[[dict[str, Any], Iterable[nn.Parameter]], torch.optim.Optimizer]
ScheduleFn = Callable[[dict[str, Any], torch.optim.Optimizer], Any]

TRAIN_STATE_FORMAT = 1


class ModelState:
    """Builds the model (once) and the optimizer, restores them from checkpoints and saves them.

    Args:
        model: an ``nn.Module``, or ``params -> nn.Module`` called once after seeding.
        params: the user's hyper-parameters (handed to ``model``, ``optimizer``, ``lr_schedule``).
        config: its slice of the ``RunConfig`` (seed, compile, recompute, ...).
        precision: the run's ``Precision`` (converts the module and optimizer; its state is checkpointed).
        strategy: where the replica runs and how replicas combine.
        checkpoints: the ``model_dir``'s manager (``None``: a run kept in memory).
        optimizer / lr_schedule: factories as ``Estimator`` takes them (``None``: no training).
        warm_start_from: initial weights when ``model_dir`` has no checkpoint yet.
    """

    def __init__(
        self,
        *,
        model: ModelArg,
        params: dict[str, Any],
        config: StateConfig,
        precision: Precision,
        strategy: Strategy,
        checkpoints: CheckpointManager | None,
        optimizer: OptimizerFn | None = None,
        lr_schedule: ScheduleFn | None = None,
        warm_start_from: str | os.PathLike[str] | WarmStartSettings | None = None,
    ) -> None:
        if not (isinstance(model, nn.Module) or callable(model)):
            raise UserCodeError(
                f"model must be an nn.Module or a function params -> nn.Module; got {type(model).__name__}"
            )
        self.model_arg = model
        self.params = params
        self.config = config
        self.strategy = strategy
        self.checkpoints = checkpoints
        self.optimizer_fn = optimizer
        self.schedule_fn = lr_schedule
        self.warm_start_from = warm_start_from
        self.warm_start_report: Any = None
        self.compile_cache: CompileCache | None = None  # a compiled run's artifacts (compile_cache())
        self.fast_linears: list[str] = []  # names of the nn.Linear layers RunConfig.fast_linear made OneDNNLinear
        self.sgd_in_backward: list[str] = []  # names of the layers RunConfig.sgd_in_backward updates in backward
        self.sgd_in_backward_refusal: str | None = None  # why "auto" kept the ordinary update
        self._model: nn.Module | None = None
        self.module: nn.Module | None = None  # what model_fn receives: wrapped (DDP/FSDP), maybe compiled
        self.optimizer: torch.optim.Optimizer | None = None
        self.schedule: Any = None
        self.precision = precision
        self.global_step = 0
        self.cache: Any = None
        self.holds: Location | str | None = "fresh"  # see the module docstring
        self.weights_of: Location | None = None  # the checkpoint whose weights are in the model
        # Handed from a restored checkpoint (or a finished train()) to the next training run.
        self.pending_input_state: Any = None
        self.pending_hook_state: dict[str, Any] = {}
        # What each checkpoint records of the run's settings; a full restore compares them
        # (the facade gives them: RunSettings.given, params, RunConfig, batch sizes, the train call's).
        self.settings = RunSettings(config.on_changed_optimizer)
        #: ``RunConfig.ema``'s moving average of the weights (``None``: none)
        self.ema: EmaWeights | None = None if config.ema is None else EmaWeights(config.ema)
        #: how its checkpoints are written (``None``: a run kept in memory)
        self.saving = None if checkpoints is None else StateWriter(checkpoints, strategy, async_save=config.async_save)
        self.writer = None if self.saving is None else self.saving.writer  # asynchronous saves' thread
        self.async_save = self.saving is not None and config.async_save

    # ---------------------------------------------------------------- building
    @property
    def scaler(self) -> LossScaler | None:
        """fp16's loss scaler (``None`` in the other precisions)."""
        return self.precision.scaler

    @property
    def model(self) -> nn.Module:
        """The plain ``nn.Module`` (built on first access)."""
        return self.build_model()

    @property
    def can_train(self) -> bool:
        return self.optimizer_fn is not None

    def build_model(self) -> nn.Module:
        """Build, warm-start and wrap the model once; later calls return it."""
        if self._model is not None:
            return self._model
        seed_everything(self.config.seed)
        if self.config.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        model = self.model_arg if isinstance(self.model_arg, nn.Module) else self.model_arg(self.params)
        if not isinstance(model, nn.Module):
            raise UserCodeError(f"model(params) must return an nn.Module; it returned a {type(model).__name__}")
        self._model = model.to(self.strategy.device)
        # before warm start (bf16-sr: fp32 weights are then rounded to nearest once)
        self._model = self.precision.convert_module(self._model, sharded=self.strategy.shards_state)
        # On every replica, before wrapping (DDP broadcasts rank 0's weights).
        if self.warm_start_from is not None and self.latest_checkpoint() is None:
            self.warm_start_report = warm_start(self._model, self.warm_start_from)
        if self.config.fast_linear != "off" and self.strategy.device.type == "cpu":
            # before recompute and wrapping: they see the swapped layers; a class swap keeps the state_dict
            self.fast_linears = use_fast_linear(self._model, self.config.fast_linear)
        if self.config.recompute is not None:  # before wrapping: DDP/FSDP/compile see the recomputing forward
            names = apply_recompute(self._model, self.config.recompute)
            log.info("recompute: %s", ", ".join(n or "the whole model" for n in names))
        if self.config.pipeline is not None and self.strategy.world_size == 1:
            plan_stages(self._model, self.config.pipeline.split)  # one process runs it unsplit; the names must fit
        module = self.strategy.wrap_model(self._model)
        if self.ema is not None:
            self.ema.attach(self._model)  # wrapped: FSDP2's parameters are sharded now, DDP's inner module
        # compile="step" compiles the training step instead (stoker.engine.compiled_step), not the module.
        self.module = cast(nn.Module, torch.compile(module)) if self.config.compile == "module" else module
        if self.strategy.world_size > 1:  # same initial weights, but each replica its own dropout
            seed_everything(self.config.seed + 1_000_003 * self.strategy.rank)
        return self._model

    def build_for_training(self) -> None:
        """The model, then the optimizer and schedule over its parameters (once)."""
        model = self.build_model()
        if self.optimizer is not None:
            return
        if self.optimizer_fn is None:
            raise ConfigError(
                "train: the Estimator needs optimizer=lambda params, parameters: torch.optim.X(parameters, ...)"
            )
        opt = self.optimizer_fn(self.params, model.parameters())
        if not isinstance(opt, torch.optim.Optimizer):
            raise UserCodeError(
                f"optimizer(params, parameters) must return a torch.optim.Optimizer; got {type(opt).__name__}"
            )
        self.settings.built_optimizer(opt)  # as the user built it, before any schedule step
        opt = self.precision.convert_optimizer(opt, seed=self.config.seed)
        self.optimizer = opt
        if self.precision.autocast_dtype is torch.float16 and self.strategy.device.type == "cpu":
            _say_fp16_cost(model, self.strategy.is_chief)
        if self.schedule_fn is not None:
            self.schedule = self.schedule_fn(self.params, opt)
            self.settings.built_schedule(self.schedule)
        if self.config.sgd_in_backward != "off":
            self.sgd_in_backward, self.sgd_in_backward_refusal = _update_in_backward(
                model, opt, self.config, self.strategy, self.precision
            )

    @property
    def pipeline_stages(self) -> int:
        """Stages this run's model is cut into (1 in one process, where a pipeline runs unsplit)."""
        pipeline = self.config.pipeline
        return pipeline.stages if pipeline is not None and self.strategy.world_size > 1 else 1

    def inference_weights(self) -> contextlib.AbstractContextManager[bool]:
        """Within it the model holds the weights inference uses: ``RunConfig.ema``'s average where
        it asks so (it yields whether it does), else its own."""
        return self.ema.applied() if self.ema is not None else contextlib.nullcontext(False)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's complete weights as CPU tensors (collective when they are sharded)."""
        return self.strategy.full_state_dict(self.build_model())

    # ---------------------------------------------------------------- restoring
    def latest_checkpoint(self) -> Location | None:
        self.wait_for_checkpoint()  # the newest checkpoint may still be on its way
        return self.checkpoints.latest_path() if self.checkpoints else None

    def restore_for_training(self) -> None:
        """Build for training and load the newest checkpoint unless memory holds exactly its state."""
        self.build_for_training()
        self.wait_for_checkpoint(everywhere=True)
        latest = self.latest_checkpoint()
        if latest is None or self.holds == latest:
            if latest is None and self.holds is None:
                raise CheckpointError(
                    "there is no checkpoint to resume from and the state in memory is not a training state "
                    "(an error stopped training, or evaluate/predict loaded other weights): build a new Estimator"
                )
            return
        # the newest checkpoint that verifies: a damaged one is skipped, with a warning
        ckpt = self.checkpoints.load_for_resume() if self.checkpoints is not None else None
        loaded = ckpt or load_checkpoint(latest)
        self.apply(loaded, full=True)
        log.info("resumed from %s (step %d)", self.holds, self.global_step)
        if self.config.compile != "none":  # before the first compiled step: the compiler finds its work done
            compile_cache(self).restore(loaded.path)
        if self.strategy.is_chief:
            self.settings.say(loaded.path, self.global_step)

    def restore_weights(self) -> None:
        """Build the model and load the newest checkpoint's weights, if memory does not hold them."""
        self.build_model()
        latest = self.latest_checkpoint()
        if latest is not None and self.weights_of != latest:
            self.apply(load_checkpoint(latest), full=False)

    def weights_for_inference(
        self, checkpoint_path: str | os.PathLike[str] | None, what: str
    ) -> tuple[int, Location | None]:
        """Put the weights to use in the model; return their step and checkpoint (``None``: memory)."""
        self.build_model()
        self.wait_for_checkpoint()  # the checkpoint asked for, or the newest, may still be on its way
        if checkpoint_path is None and self.holds == "memory":
            return self.global_step, None
        if (
            checkpoint_path is None
            and self.holds == "fresh"
            and self.warm_start_from is not None
            and self.latest_checkpoint() is None
        ):
            return self.global_step, None  # warm-started weights, not trained yet
        path = _resolve(self.checkpoints, checkpoint_path)
        if path is None:
            model_dir = str(self.checkpoints.model_dir) if self.checkpoints else None
            raise CheckpointError(
                f"{what}: no checkpoint in model_dir {model_dir!r} and this Estimator has not "
                "been trained; call train() first, or pass checkpoint_path="
            )
        if self.weights_of != path:
            self.apply(load_checkpoint(path), full=False)
        return self.global_step, path

    def apply(self, ckpt: LoadedCheckpoint, full: bool) -> None:
        """Load a checkpoint's weights, and with ``full`` everything training resumes from."""
        model = self.build_model()
        changes: list[SettingChange] = []
        if full:
            _check_layout(ckpt, self.pipeline_stages)
            changes = self.settings.compare(ckpt)
        try:
            if ckpt.dcp_dir is None:  # weights that do not fit are the first thing to say
                check_state_fits(model, ckpt.model_state or {}, f"checkpoint {str(ckpt.path)!r}")
            self.settings.refuse(ckpt, changes)  # before anything is loaded
            ema = ckpt.train_state.get("ema")
            if ckpt.dcp_dir is not None:  # a sharded checkpoint: weights (and optimizer and average) in slices
                slots = self.ema.slots(ema) if self.ema is not None else None
                extra = {"ema": slots} if slots is not None else None
                _load_sharded(
                    ckpt, model, self.optimizer if full else None, self.strategy.optimizer_checkpoint_key, extra
                )
            else:
                model.load_state_dict(ckpt.model_state or {})
                if self.ema is not None:
                    self.ema.load(ema, ckpt.ema_state)
        except CheckpointError as e:
            explained = self.settings.explain(e, changes)
            if explained is e:
                raise
            raise explained from e
        self.global_step = ckpt.step
        self.weights_of = ckpt.path
        if not full:
            self.holds = None  # weights only: the next train() restores the full state
            return
        _restore_training_state(self, ckpt)
        assert self.optimizer is not None
        self.settings.settle(changes, self.optimizer, self.schedule)
        self.holds = ckpt.path

    # ---------------------------------------------------------------- saving
    def check_checkpoint(self) -> None:
        """Raise, at a loop boundary, the failure of an asynchronous write that has finished."""
        if self.saving is not None:
            self.saving.poll()

    def wait_for_checkpoint(self, everywhere: bool = False) -> None:
        """Wait for the asynchronous write in flight (if any); raise its failure. ``everywhere``
        (collective: every replica calls it): the other replicas wait for the chief's write too,
        so that none looks for the newest checkpoint before the index names it."""
        if self.saving is not None:
            self.saving.wait()
        if everywhere and self.async_save and self.strategy.world_size > 1:
            self.strategy.barrier()

    def save(
        self,
        hook_state: Mapping[str, Any],
        input_state: Any,
        last_checkpoint: Location | None,
        finished: bool = False,
        stop: bool = False,
    ) -> Location | None:
        """Write a checkpoint of ``global_step`` (collective, :class:`~stoker.engine.saving.StateWriter`);
        ``None`` without a model_dir. ``finished``: training ends here (``max_steps``); ``stop``:
        written because the run was stopped (a signal), off the save schedule."""
        if self.saving is None:
            return None
        assert self.optimizer is not None
        path = self.saving.write(
            self.global_step,
            model=self.build_model(),
            optimizer=self.optimizer,
            ema=self.ema,
            input_state=input_state,
            cache=self.cache,
            train_state=lambda rngs, caches: _train_state(self, hook_state, rngs, caches),
            last_checkpoint=last_checkpoint,
            finished=finished,
            compiled=compile_cache(self).bundle if self.config.compile != "none" else None,
            stop=stop,
        )
        self.holds = self.weights_of = path
        log.info("checkpoint %s written", path)
        return path


def compile_cache(state: ModelState) -> CompileCache:
    """``state``'s :class:`~stoker.engine.compile_cache.CompileCache` (made at the first call,
    once the model is built: its structure is part of the fingerprint)."""
    if state.compile_cache is None:
        state.compile_cache = CompileCache(
            state.build_model(),
            compile_mode=state.config.compile,
            precision=state.precision.name,
            device=state.strategy.device,
        )
    return state.compile_cache


def compile_source(state: ModelState) -> tuple[str, float]:
    """How ``state``'s run starts compiling: "from artifacts", "fresh (<why>)", or "" (eager); and
    the seconds reading and installing the artifacts took."""
    if state.config.compile == "none":
        return "", 0.0
    restored = compile_cache(state).restored
    return ("from artifacts" if restored.source == "artifacts" else f"fresh ({restored.reason})"), restored.seconds


def _restore_training_state(state: ModelState, ckpt: LoadedCheckpoint) -> None:
    """A full restore's part beyond the weights: optimizer, schedule, loss scale, this replica's
    RNGs and cache, and what is handed to the hooks and the input of the next run."""
    train = ckpt.train_state
    assert state.optimizer is not None
    if ckpt.dcp_dir is None:
        _load_optimizer(state.optimizer, train.get("optimizer"), ckpt.path)
    if state.schedule is not None and train.get("schedule") is not None:
        state.schedule.load_state_dict(train["schedule"])
    state.precision.load_state_dict(train.get("scaler"))
    state.pending_hook_state = train.get("hooks", {})
    strategy = state.strategy
    saved_world, world = int(train.get("world_size", 1)), strategy.world_size
    state.cache = None
    if saved_world == world:
        set_rng_state(train["rng"][strategy.rank])
        caches = train.get("cache")
        if caches is not None:
            state.cache = _to_device(caches[strategy.rank], strategy.device)
        state.pending_input_state = ckpt.input_states.get(strategy.rank)
        return
    state.pending_input_state = _resharded_input(ckpt, saved_world, world)


def _train_state(
    state: ModelState, hook_state: Mapping[str, Any], rng_per_replica: list[Any], cache_per_replica: list[Any]
) -> dict[str, Any]:
    """What ``train_state.pt`` holds (sharded runs keep the optimizer in ``dcp/`` instead)."""
    assert state.optimizer is not None
    return {
        "format": TRAIN_STATE_FORMAT,
        "global_step": state.global_step,
        "optimizer": None if state.strategy.shards_state else state.optimizer.state_dict(),
        "schedule": state.schedule.state_dict() if state.schedule is not None else None,
        "scaler": state.precision.state_dict(),
        "rng": rng_per_replica,
        "cache": cache_per_replica,  # each replica carries its own
        "hooks": dict(hook_state),
        "world_size": state.strategy.world_size,
        "pipeline_stages": state.pipeline_stages,
        "settings": state.settings.record(),
        "ema": None if state.ema is None else state.ema.state_dict(),
    }


def _resolve(checkpoints: CheckpointManager | None, checkpoint_path: str | os.PathLike[str] | None) -> Location | None:
    """The checkpoint ``checkpoint_path`` names (``None``: the newest in ``model_dir``), if there is one."""
    if checkpoints is not None:
        return checkpoints.resolve(checkpoint_path)
    if checkpoint_path is not None:
        return CheckpointManager(checkpoint_path, writer=False).resolve(checkpoint_path)
    return None


def _update_in_backward(
    model: nn.Module, opt: torch.optim.Optimizer, config: StateConfig, strategy: Strategy, precision: Precision
) -> tuple[list[str], str | None]:
    """``RunConfig.sgd_in_backward``: the fast linear layers apply ``opt``'s SGD in their backward.
    Returns the layers that do, and what the run needs where none does (``"auto"`` keeping the
    ordinary update; :func:`~stoker.kernels.sgd_in_backward.sgd_in_backward_choice` says it)."""
    need = sgd_in_backward_need(config, strategy, precision) or optimizer_refusal(opt)
    if need is None:
        return update_in_backward(model, opt), None
    if config.sgd_in_backward == "on":
        raise cannot_update_in_backward(need)
    log.info("sgd_in_backward: the ordinary update: it %s", need)
    return [], need


def built_choices(config: StateConfig, strategy: Strategy, precision: Precision) -> dict[str, Choice[Any]]:
    """What a run's settings choose about its model's step before anything is built, each by its
    owner's rule: the fast linear layers and the SGD update inside the backward (until the
    optimizer is built, which may still keep the ordinary update: ``sgd_in_backward_refusal``)."""
    device = strategy.device.type
    need = sgd_in_backward_need(config, strategy, precision)
    return {
        "fast_linear": fast_linear_choice(config.fast_linear, device),
        "sgd_in_backward": sgd_in_backward_choice(config.sgd_in_backward, device, need),
    }


def sgd_in_backward_need(config: StateConfig, strategy: Strategy, precision: Precision) -> str | None:
    """What the run's settings lack for the SGD update to run inside the backward (the optimizer
    aside): :func:`~stoker.kernels.sgd_in_backward.run_refusal` of this run."""
    return run_refusal(
        device=strategy.device,
        world_size=strategy.world_size,
        precision=precision.name,
        accumulation=config.gradient_accumulation_steps,
        clip_norm=config.gradient_clip_norm,
        compiled=config.compile != "none",
        cuda_graph=config.cuda_graph,
        fast_linear=config.fast_linear,
    )


def _check_layout(ckpt: LoadedCheckpoint, stages: int) -> None:
    saved_stages = int(ckpt.train_state.get("pipeline_stages", 1))
    if saved_stages != stages:
        raise CheckpointError(
            f"checkpoint {str(ckpt.path)!r} was trained as {saved_stages} pipeline stage(s) and this run has "
            f"{stages}: resume training with the same layout (RunConfig.pipeline and "
            "WORLD_SIZE), or start a new run from its weights with warm_start_from (evaluate and predict "
            "read it in any layout)"
        )


def _load_sharded(
    ckpt: LoadedCheckpoint,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    optimizer_key: str,
    extra: dict[str, dict[str, torch.Tensor]] | None = None,
) -> None:
    """A sharded checkpoint's weights (and optimizer, and ``extra``: the average) from its ``dcp/`` slices."""
    from torch.distributed.checkpoint.api import CheckpointException  # DCP is slow to import

    assert ckpt.dcp_dir is not None
    try:
        load_sharded(ckpt.dcp_dir, model, optimizer, optimizer_key, extra)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP reports mismatches in many shapes
        unsafe = caused_by(e, pickle.UnpicklingError)  # metadata or a slice entry a safe decoder refuses
        if unsafe is not None:
            raise refused(
                str(ckpt.path),
                DCP_DIR,
                f"holds data stoker's decoders refuse ({refusal(unsafe)})",
                previous_retained(ckpt.path),
            ) from None
        if isinstance(e, CheckpointException):  # a BaseException whose text is a page of tracebacks
            raise CheckpointError(
                f"checkpoint {str(ckpt.path)!r} does not fit the model or optimizer: {refusal(e)}"
            ) from None
        raise CheckpointError(f"checkpoint {str(ckpt.path)!r} does not fit the model or optimizer: {e}") from e


def _load_optimizer(optimizer: torch.optim.Optimizer, state: Any, path: Location) -> None:
    if state is None:
        raise CheckpointError(f"checkpoint {str(path)!r} has no optimizer state")
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint {str(path)!r}: the optimizer state does not fit this optimizer ({e})") from e


def _resharded_input(ckpt: LoadedCheckpoint, saved_world: int, world: int) -> Any:
    """The input state for a run with another number of replicas than the checkpoint's."""
    # Weights, optimizer, schedule and step carry over; the input is re-sharded where the
    # source can do it (stoker.data's: the same global batches, bitwise); per-replica RNG
    # streams cannot be carried over, and the all-reduce sums the gradients in another order.
    saved = [ckpt.input_states.get(r) for r in range(saved_world)]
    resharded = {"reshard": saved} if all(s is not None for s in saved) else None
    log.warning(
        "checkpoint %s was written by %d replica(s) and this run has %d: weights, optimizer, "
        "schedule, step and input position are restored (stoker.data sources: the same global batches, "
        "bitwise), but each replica's RNG and carried cache start afresh and the gradients are summed in "
        "another order (bitwise-exact weights need the same number of replicas)",
        ckpt.path,
        saved_world,
        world,
    )
    return resharded


def _to_device(cache: Any, device: torch.device) -> Any:
    if cache is None:
        return None
    if isinstance(cache, torch.Tensor):
        return cache.to(device)
    return tuple(_to_device(c, device) for c in cache)


def _say_fp16_cost(model: nn.Module, chief: bool) -> None:
    """Say, once per process, what fp16 costs on this CPU for ``model``'s layer kinds (the chief
    measures, under a second on the first run of a machine): a warning when it is many times
    fp32's, since on some CPUs fp16's backward is ~100x slower. The run stays in fp16, as asked."""
    if chief and say_once("fp16"):
        level, line = fp16_note(fp16_cost(), layer_kinds(model), lambda name: f"RunConfig(precision={name!r})")
        log.log(level, line)


__all__ = ["TRAIN_STATE_FORMAT", "ModelArg", "ModelState", "OptimizerFn", "ScheduleFn"]
