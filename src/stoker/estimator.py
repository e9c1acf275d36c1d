"""The ``Estimator``: train, evaluate and predict a ``model_fn`` on batches from an ``input_fn``.

The facade wires small parts together and keeps the top loop short:

- ``RunConfig`` says how to run, ``params`` what to build; the model is built once from
  ``params`` and lives as long as the Estimator.
- the ``Strategy`` says where the replica runs and how replicas combine;
- the ``Infeed`` turns ``input_fn``'s iterable into device batches and knows its position;
- the ``DeviceLoop`` runs ``iterations_per_loop`` steps per host round trip;
- hooks run between loops; the ``CheckpointManager`` writes and reads checkpoints.

``train`` resumes from the newest checkpoint in ``model_dir`` whenever the Estimator's memory
does not already hold it, so rerunning a killed script continues it exactly.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import (
    CheckpointManager,
    LoadedCheckpoint,
    WarmStartSettings,
    check_state_fits,
    load_checkpoint,
    warm_start,
)
from .config import RunConfig
from .data._tree import batch_rows
from .distributed import Strategy, make_strategy
from .distributed.sharded import DCP_DIR, load_sharded, save_sharded
from .errors import CheckpointError, ModelFnError, NanLossError
from .hooks import (
    CheckpointSaverHook,
    Hook,
    HookRunner,
    LoggingHook,
    NanLossHook,
    PreemptionHook,
    ProgressBarHook,
    RunContext,
    StepCounterHook,
    StopAtStepHook,
    SummaryHook,
)
from .hooks.base import LoopResult, every_n_steps_due, sorted_hooks
from .infeed import Batch, Infeed
from .loop import DeviceLoop, TrainStep, check_spec
from .metrics import MetricAccumulator
from .precision import autocast_context, make_loss_scaler
from .rng import rng_state, seed_everything, set_rng_state
from .spec import EstimatorSpec, ModeKeys
from .summary import ScalarWriter

log = logging.getLogger("stoker")

ModelArg = nn.Module | Callable[[dict[str, Any]], nn.Module]
OptimizerFn = Callable[[dict[str, Any], Iterable[nn.Parameter]], torch.optim.Optimizer]
ScheduleFn = Callable[[dict[str, Any], torch.optim.Optimizer], Any]
InputFn = Callable[[dict[str, Any]], Iterable[Any]]

_MODEL_FN_ARGS = ("model", "features", "labels", "mode", "params")
TRAIN_STATE_FORMAT = 1


class Estimator:
    """Trains, evaluates and predicts one model, with checkpoints in ``config.model_dir``.

    Args:
        model: an ``nn.Module``, or a function ``params -> nn.Module`` called once (after
            seeding with ``config.seed``, so initial weights are reproducible).
        model_fn: ``model_fn(model, features, labels, mode, params) -> EstimatorSpec``.
        optimizer: ``optimizer(params, parameters) -> torch.optim.Optimizer`` (training only).
        config: a ``RunConfig``; default: in memory, fp32, 10 steps per loop.
        params: hyper-parameters handed to ``model``, ``model_fn`` and ``input_fn``; stoker adds
            ``batch_size`` (per replica), ``num_replicas`` and ``replica_index``.
        train_batch_size / eval_batch_size / predict_batch_size: global batch sizes, divided
            among replicas (and accumulation steps); eval and predict default to the train one.
        lr_schedule: ``lr_schedule(params, optimizer) -> LR scheduler``, stepped every step.
        warm_start_from: a checkpoint, model_dir, safetensors file or ``WarmStartSettings``
            to initialise weights from when ``model_dir`` has no checkpoint yet.
    """

    def __init__(
        self,
        model: ModelArg,
        model_fn: Callable[..., EstimatorSpec],
        optimizer: OptimizerFn | None = None,
        config: RunConfig | None = None,
        params: Mapping[str, Any] | None = None,
        train_batch_size: int | None = None,
        eval_batch_size: int | None = None,
        predict_batch_size: int | None = None,
        lr_schedule: ScheduleFn | None = None,
        warm_start_from: str | Path | WarmStartSettings | None = None,
    ) -> None:
        if config is not None and not isinstance(config, RunConfig):
            raise TypeError(f"config must be a stoker.RunConfig; got {type(config).__name__}")
        self.config = config or RunConfig()
        self.params: dict[str, Any] = dict(params or {})
        if not (isinstance(model, nn.Module) or callable(model)):
            raise TypeError(f"model must be an nn.Module or a function params -> nn.Module; got {type(model).__name__}")
        self._model_arg = model
        self._model_fn = _bind_model_fn(model_fn)
        self._optimizer_fn = optimizer
        self._schedule_fn = lr_schedule
        self._warm_start_from = warm_start_from
        self.strategy: Strategy = make_strategy(self.config.strategy, self.config.device, self.config.distributed_timeout)
        self.train_batch_size = _check_batch("train_batch_size", train_batch_size)
        self.eval_batch_size = _check_batch("eval_batch_size", eval_batch_size) or self.train_batch_size
        self.predict_batch_size = _check_batch("predict_batch_size", predict_batch_size) or self.eval_batch_size
        for name in ("train_batch_size", "eval_batch_size", "predict_batch_size"):
            if getattr(self, name) is not None:
                self._per_replica(name, getattr(self, name))  # fail now, not at the first call
        self._ckpt = (
            CheckpointManager(
                self.config.model_dir,
                keep_checkpoint_max=self.config.keep_checkpoint_max,
                keep_best=self.config.keep_best,
                writer=self.strategy.is_chief,
            )
            if self.config.model_dir
            else None
        )
        self._model: nn.Module | None = None
        self._module: nn.Module | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._schedule: Any = None
        self._scaler = make_loss_scaler(
            self.config.precision, self.config.loss_scale, self.config.loss_scale_init, self.config.loss_scale_growth_interval
        )
        self.global_step = 0
        self._cache: Any = None
        # Which checkpoint's full training state the memory holds ("fresh": newly built,
        # "memory": trained past any checkpoint, None: unknown, e.g. eval loaded other weights).
        self._state_of: Path | str | None = "fresh"
        self._weights_of: Path | None = None  # the checkpoint whose weights are in the model
        self._pending_input_state: Any = None
        self._eval_writer: ScalarWriter | None = None
        self._pending_hook_state: dict[str, Any] = {}
        _ensure_log_handler(self.strategy.is_chief)

    # ================================================================ public API
    @property
    def model(self) -> nn.Module:
        """The ``nn.Module`` (built on first access)."""
        self._build_model()
        assert self._model is not None
        return self._model

    @property
    def model_dir(self) -> str | None:
        return self.config.model_dir  # type: ignore[return-value]

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's complete weights as CPU tensors, also when they are sharded over
        replicas (then every replica must call this)."""
        self._build_model()
        assert self._model is not None
        return self.strategy.full_state_dict(self._model)

    def initialize(self) -> Estimator:
        """Build the model (and optimizer) now and restore the newest checkpoint if there is one.

        Afterwards ``evaluate``, ``predict`` and ``export`` also work on an Estimator that was
        never trained: they use its initial (or warm-started) weights. Training from here is
        the same as training without calling this.
        """
        if self._optimizer_fn is not None:
            self._build_for_training()
            self._restore_for_training()
        else:
            self._build_model()
            latest = self.latest_checkpoint()
            if latest is not None and self._weights_of != latest:
                self._apply_checkpoint(load_checkpoint(latest), full=False)
        if self._state_of == "fresh":
            self._state_of = "memory"
        return self

    def export(
        self,
        export_dir: str | os.PathLike[str],
        example_features: Any,
        dynamic_batch: bool = True,
        formats: Sequence[str] = ("pt2",),
        *,
        checkpoint_path: str | os.PathLike[str] | None = None,
    ) -> Path:
        """Export the PREDICT computation as a ``torch.export`` program (``model.pt2``), plus
        ``model.safetensors`` and ``signature.json`` (and ``model.onnx`` if asked). Uses the
        best checkpoint when ``keep_best`` recorded one, else the newest. See docs/export.md."""
        from .export import export

        return export(self, export_dir, example_features, dynamic_batch, formats, checkpoint_path=checkpoint_path)

    def latest_checkpoint(self) -> Path | None:
        """The newest checkpoint in ``model_dir`` (``None`` if there is none)."""
        return self._ckpt.latest_path() if self._ckpt else None

    def train(
        self,
        input_fn: InputFn,
        steps: int | None = None,
        max_steps: int | None = None,
        hooks: Sequence[Hook] = (),
    ) -> Estimator:
        """Train until ``steps`` more steps, global step ``max_steps``, or the end of the data.

        Resumes from the newest checkpoint in ``model_dir``: model, optimizer, schedule, loss
        scale, RNGs, carried cache, hooks and the input position.
        """
        check_train_arguments(steps, max_steps)
        if self.train_batch_size is None:
            raise ValueError("train: the Estimator needs train_batch_size")
        if self._optimizer_fn is None:
            raise ValueError("train: the Estimator needs optimizer=lambda params, parameters: torch.optim.X(parameters, ...)")
        self._build_for_training()
        self._restore_for_training()
        if max_steps is not None and self.global_step >= max_steps:
            log.info("train: global step %d already reaches max_steps=%d; nothing to do", self.global_step, max_steps)
            return self

        run = self._run_context(max_steps)
        # A hook the caller passes replaces the default hook of the same class (e.g. a
        # LoggingHook(language_model=True) instead of the plain one).
        given = {type(h) for h in hooks}
        hook_list = [h for h in self._default_hooks() if type(h) not in given] + list(hooks)
        if steps is not None or max_steps is not None:
            hook_list.append(StopAtStepHook(num_steps=steps, last_step=max_steps))
        runner = HookRunner(sorted_hooks(hook_list))
        step = self._train_step()
        infeed: Infeed | None = None
        started = False
        try:
            runner.begin(run)
            runner.load_state_dict(self._pending_hook_state)
            runner.after_setup(run)
            infeed = self._make_infeed(input_fn, ModeKeys.TRAIN, restore=self._pending_input_state)
            run._save = partial(self._save_checkpoint, run, runner, infeed, step)
            loop = DeviceLoop(step, run, self.train_batch_size, self.strategy)
            self._model.train()  # type: ignore[union-attr]
            self._state_of, self._weights_of, started = "memory", None, True
            while not run.stop_requested:
                n = self.config.iterations_per_loop
                if run.max_steps is not None:
                    n = min(n, run.max_steps - run.global_step)
                if n <= 0:
                    break
                runner.before_loop(run, n)
                result = loop.run_loop(infeed, n)
                self.global_step = run.global_step
                if loop.exhausted:
                    run.request_stop(f"input_fn's data ended at step {run.global_step}")
                run.logs.clear()  # values hooks share are fresh at every loop boundary
                runner.after_loop(run, result)
                run.stop_requested = run.any_replica(run.stop_requested)
            runner.end(run)
        except BaseException as error:
            if started:
                self._state_of = None  # memory may be ahead of (or worse than) the newest checkpoint
            clearer = self.strategy.explain_failure(error)
            if clearer is not error:
                raise clearer from error
            raise
        finally:
            self.global_step = run.global_step
            self._cache = step.params.get("cache")
            if infeed is not None:
                self._pending_input_state = infeed.state_dict()
                infeed.close()
            self._pending_hook_state = runner.state_dict()
            runner.close()
        if run.stop_reason:
            log.info("training stopped at step %d: %s", run.global_step, run.stop_reason)
        if run.exit_code is not None:
            sys.exit(run.exit_code)
        return self

    def evaluate(
        self,
        input_fn: InputFn,
        steps: int | None = None,
        checkpoint_path: str | Path | None = None,
        name: str | None = None,
    ) -> dict[str, float]:
        """Evaluate on ``input_fn`` (all of it, or ``steps`` batches).

        Uses ``checkpoint_path`` if given, else the newest checkpoint in ``model_dir``, else the
        weights in memory from training. Returns ``loss``, every metric and ``global_step``.
        The last partial batch is padded and masked, so the result is exact.
        """
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ValueError(f"evaluate: steps must be a positive integer or None; got {steps!r}")
        if self.eval_batch_size is None:
            raise ValueError("evaluate: the Estimator needs eval_batch_size (or train_batch_size)")
        step, evaluated = self._load_for_inference(checkpoint_path, "evaluate")
        model = self._model
        assert model is not None
        was_training = model.training
        model.eval()
        params = self._mode_params(ModeKeys.EVAL, self.eval_batch_size)
        accumulator = MetricAccumulator()
        device = self.strategy.device
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        loss_count = torch.zeros((), dtype=torch.float64, device=device)
        warned = False
        with _isolated_rng(self.config.seed), torch.no_grad(), self._make_infeed(input_fn, ModeKeys.EVAL, params=params) as infeed:
            for i, batch in enumerate(self._in_lockstep(infeed)):
                with autocast_context(self.config.precision, device):
                    spec = self._model_fn(self._module, batch.features, batch.labels, ModeKeys.EVAL, params)
                spec = check_spec(spec, ModeKeys.EVAL)
                params["cache"] = _detach_cache(spec.cache)
                mask = batch.mask
                real = mask.to(torch.float64) if mask is not None else None
                if spec.loss is not None:
                    loss = spec.loss.detach().to(torch.float64)
                    if loss.dim() == 0:
                        if batch.rows < (mask.shape[0] if mask is not None else batch.rows) and not warned:
                            log.warning(
                                "evaluate: model_fn returned a batch-mean loss for a padded batch; return "
                                "per-example losses (reduction='none') in EVAL mode for an exact eval loss"
                            )
                            warned = True
                        loss_sum += loss * batch.rows
                        loss_count += batch.rows
                    else:
                        loss = loss.reshape(loss.shape[0], -1).mean(1)
                        loss_sum += (loss * real).sum() if real is not None else loss.sum()
                        loss_count += real.sum() if real is not None else loss.shape[0]
                for metric_name, update in (spec.eval_metrics or {}).items():
                    accumulator.add(metric_name, update, real)
                if steps is not None and i + 1 >= steps:
                    break
        keys, totals = accumulator.flat_totals()
        packed = torch.cat([torch.stack([loss_sum, loss_count]), totals if totals is not None else loss_sum.new_zeros(0)])
        values = self.strategy.all_reduce_sum(packed).cpu().tolist()
        results: dict[str, float] = {}
        if values[1] > 0:
            results["loss"] = values[0] / values[1]
        results.update(accumulator.results(keys, values[2:]))
        results["global_step"] = step
        if was_training:
            model.train()
        self._after_evaluation(step, evaluated, results, name)
        return results

    def predict(
        self,
        input_fn: InputFn,
        checkpoint_path: str | Path | None = None,
        yield_single_examples: bool = True,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Yield predictions for every example of ``input_fn``, in order, padding removed.

        Each item is a dict of CPU tensors: one example (``yield_single_examples=True``) or one
        batch. The last partial batch is padded to the static batch size for the step and
        the padded rows are dropped.
        """
        if self.predict_batch_size is None:
            raise ValueError("predict: the Estimator needs predict_batch_size (or train_batch_size)")
        self._load_for_inference(checkpoint_path, "predict")
        return self._predict(input_fn, yield_single_examples)

    def train_and_evaluate(
        self,
        train_input_fn: InputFn,
        eval_input_fn: InputFn,
        max_steps: int,
        eval_every_n_steps: int = 1000,
        eval_steps: int | None = None,
        hooks: Sequence[Hook] = (),
    ) -> dict[str, float]:
        """Train to ``max_steps``, evaluating (and checkpointing) every ``eval_every_n_steps``.

        Each evaluation is recorded on its checkpoint, which feeds ``RunConfig.keep_best``.
        Returns the final evaluation.
        """
        if not isinstance(eval_every_n_steps, int) or eval_every_n_steps < 1:
            raise ValueError(f"train_and_evaluate: eval_every_n_steps must be a positive integer; got {eval_every_n_steps!r}")
        evaluator = EvaluationHook(self, eval_input_fn, every_n_steps=eval_every_n_steps, steps=eval_steps)
        self.train(train_input_fn, max_steps=max_steps, hooks=[*hooks, evaluator])
        if evaluator.last_results is None or evaluator.last_results["global_step"] != self.global_step:
            return self.evaluate(eval_input_fn, steps=eval_steps)
        return evaluator.last_results

    # ================================================================ building
    def _build_model(self) -> None:
        if self._model is not None:
            return
        seed_everything(self.config.seed)
        if self.config.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        model = self._model_arg if isinstance(self._model_arg, nn.Module) else self._model_arg(self.params)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model(params) must return an nn.Module; it returned a {type(model).__name__}")
        self._model = model.to(self.strategy.device)
        self._maybe_warm_start()  # on every replica, before wrapping (DDP broadcasts rank 0's)
        module = self.strategy.wrap_model(self._model)
        self._module = torch.compile(module) if self.config.compile else module
        if self.strategy.world_size > 1:  # same initial weights, but each replica its own dropout
            seed_everything(self.config.seed + 1_000_003 * self.strategy.rank)

    def _maybe_warm_start(self) -> None:
        if self._warm_start_from is None or (self._ckpt and self._ckpt.latest_path() is not None):
            return
        assert self._model is not None
        self.warm_start_report = warm_start(self._model, self._warm_start_from)

    def _build_for_training(self) -> None:
        self._build_model()
        if self._optimizer is not None:
            return
        assert self._model is not None and self._optimizer_fn is not None
        opt = self._optimizer_fn(self.params, self._model.parameters())
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer(params, parameters) must return a torch.optim.Optimizer; got {type(opt).__name__}")
        self._optimizer = opt
        if self._schedule_fn is not None:
            self._schedule = self._schedule_fn(self.params, opt)

    def _train_step(self) -> TrainStep:
        params = self._mode_params(ModeKeys.TRAIN, self.train_batch_size)
        if self._cache is not None:
            params["cache"] = self._cache
        assert self._module is not None and self._optimizer is not None
        return TrainStep(
            module=self._module,
            model_fn=self._model_fn,
            optimizer=self._optimizer,
            schedule=self._schedule,
            scaler=self._scaler,
            precision=self.config.precision,
            device=self.strategy.device,
            params=params,
            accumulation=self.config.gradient_accumulation_steps,
            clip_norm=self.config.gradient_clip_norm,
        )

    def _run_context(self, max_steps: int | None) -> RunContext:
        assert self._model is not None and self._optimizer is not None and self.train_batch_size is not None
        return RunContext(
            config=self.config,
            params=self.params,
            model=self._model,
            optimizer=self._optimizer,
            global_step=self.global_step,
            max_steps=max_steps,
            global_batch_size=self.train_batch_size,
            is_chief=self.strategy.is_chief,
            _any_replica=self.strategy.any_replica,
            last_checkpoint=self.latest_checkpoint(),
            last_checkpoint_step=self._ckpt.latest_step() if self._ckpt else None,
        )

    def _default_hooks(self) -> list[Hook]:
        cfg = self.config
        hooks: list[Hook] = [NanLossHook()]
        if cfg.log_every_n_steps is not None:
            hooks += [StepCounterHook(cfg.log_every_n_steps), LoggingHook(cfg.log_every_n_steps)]
        if cfg.progress_bar:
            hooks.append(ProgressBarHook())
        if cfg.model_dir and cfg.mlperf_log:
            from .mlperf import MLPerfLogHook

            hooks.append(MLPerfLogHook())
        if cfg.model_dir:
            hooks.append(CheckpointSaverHook(save_steps=cfg.save_checkpoints_steps, save_secs=None if cfg.save_checkpoints_steps else cfg.save_checkpoints_secs))
            hooks.append(PreemptionHook())
            if cfg.summaries:
                hooks.append(SummaryHook(cfg.log_every_n_steps or 100))
        return hooks

    def _per_replica(self, what: str, global_batch: int, accumulation: int = 1) -> int:
        world = self.strategy.world_size
        if what == "train_batch_size":
            accumulation = self.config.gradient_accumulation_steps
        if global_batch % (world * accumulation):
            detail = f"{world} replicas" + (f" x {accumulation} accumulation steps" if accumulation > 1 else "")
            raise ValueError(
                f"{what}={global_batch} is not divisible by {world * accumulation} ({detail}); "
                f"use a multiple of {world * accumulation}"
            )
        return global_batch // (world * accumulation)

    def _mode_params(self, mode: ModeKeys, global_batch: int | None) -> dict[str, Any]:
        assert global_batch is not None
        params = dict(self.params)
        params["batch_size"] = self._per_replica(f"{mode.value}_batch_size", global_batch)
        params["num_replicas"] = self.strategy.world_size
        params["replica_index"] = self.strategy.rank
        params["cache"] = None
        return params

    def _make_infeed(
        self, input_fn: InputFn, mode: ModeKeys, restore: Any = None, params: dict[str, Any] | None = None
    ) -> Infeed:
        if not callable(input_fn):
            raise TypeError(f"input_fn must be a function params -> iterable; got {type(input_fn).__name__}")
        if params is None:
            global_batch = {ModeKeys.TRAIN: self.train_batch_size, ModeKeys.EVAL: self.eval_batch_size}.get(mode, self.predict_batch_size)
            params = self._mode_params(mode, global_batch)
        cfg = self.config
        # input_fn and iter() run with freshly seeded global RNGs, so an input pipeline that
        # draws from them when it is built does so identically in a fresh and a resumed run.
        with _isolated_rng(cfg.seed):
            source = input_fn(params)
            return Infeed(
                source,
                device=self.strategy.device,
                prefetch_depth=0 if getattr(source, "prefers_inline_fetch", False) else cfg.prefetch_depth,
                snapshot_every=cfg.iterations_per_loop * cfg.gradient_accumulation_steps,
                pad_to=None if mode is ModeKeys.TRAIN else params["batch_size"],
                restore=restore,
                what=f"{mode.value} input_fn",
            )

    # ================================================================ checkpoints
    def _train_state(self, runner: HookRunner, rng_per_replica: list[Any], cache_per_replica: list[Any]) -> dict[str, Any]:
        assert self._optimizer is not None
        return {
            "format": TRAIN_STATE_FORMAT,
            "global_step": self.global_step,
            # sharded: the optimizer's slices are in dcp/ with the model's
            "optimizer": None if self.strategy.shards_state else self._optimizer.state_dict(),
            "schedule": self._schedule.state_dict() if self._schedule is not None else None,
            "scaler": self._scaler.state_dict() if self._scaler is not None else None,
            "rng": rng_per_replica,
            "cache": cache_per_replica,  # each replica carries its own
            "hooks": runner.state_dict(),
            "world_size": self.strategy.world_size,
        }

    def _save_checkpoint(self, run: RunContext, runner: HookRunner, infeed: Infeed, step: TrainStep) -> Path | None:
        if self._ckpt is None:
            return None
        self.global_step = run.global_step
        self._cache = step.params.get("cache")
        assert self._model is not None
        if not all(bool(torch.isfinite(p).all()) for p in self._model.parameters()):
            raise NanLossError(self.global_step, float("nan"), str(run.last_checkpoint) if run.last_checkpoint else None)
        # Collective: each replica contributes its input position and RNG state; the chief
        # writes everything, and nobody goes on until the checkpoint and index are complete.
        mine = {"input": infeed.state_dict(), "rng": rng_state(), "cache": _to_cpu(self._cache)}
        everyone = self.strategy.all_gather_object(mine)
        path = self._ckpt.model_dir / f"ckpt-{self.global_step}"
        tmp: Path | None = None
        if self.strategy.shards_state:  # every replica writes its slices into the chief's tmp dir
            tmp = Path(self.strategy.broadcast_object(str(self._ckpt.begin(self.global_step)) if self.strategy.is_chief else None))
            assert self._optimizer is not None
            save_sharded(tmp / DCP_DIR, self._model, self._optimizer)
        if self.strategy.is_chief:
            inputs = {rank: r["input"] for rank, r in enumerate(everyone)}
            state = self._train_state(runner, [r["rng"] for r in everyone], [r["cache"] for r in everyone])
            weights = None if self.strategy.shards_state else self._model.state_dict()
            path = self._ckpt.save(self.global_step, weights, state, inputs, tmp_dir=tmp)
        self.strategy.barrier()
        run.last_checkpoint, run.last_checkpoint_step = path, self.global_step
        self._state_of = self._weights_of = path
        log.info("checkpoint %s written", path)
        return path

    def _restore_for_training(self) -> None:
        """Load the newest checkpoint unless memory already holds exactly its state."""
        latest = self.latest_checkpoint()
        if latest is None or self._state_of == latest:
            if latest is None and self._state_of is None:
                raise CheckpointError(
                    "there is no checkpoint to resume from and the state in memory is not a training state "
                    "(an error stopped training, or evaluate/predict loaded other weights): build a new Estimator"
                )
            return
        ckpt = load_checkpoint(latest)
        self._apply_checkpoint(ckpt, full=True)
        log.info("resumed from %s (step %d)", latest, self.global_step)

    def _apply_checkpoint(self, ckpt: LoadedCheckpoint, full: bool) -> None:
        assert self._model is not None
        state = ckpt.train_state
        if ckpt.dcp_dir is not None:  # a sharded checkpoint: weights (and optimizer) in slices
            try:
                load_sharded(ckpt.dcp_dir, self._model, self._optimizer if full else None)
            except Exception as e:  # noqa: BLE001 - DCP reports mismatches in many shapes
                raise CheckpointError(f"checkpoint {str(ckpt.path)!r} does not fit the model or optimizer: {e}") from e
        else:
            check_state_fits(self._model, ckpt.model_state or {}, f"checkpoint {str(ckpt.path)!r}")
            self._model.load_state_dict(ckpt.model_state or {})
        self.global_step = ckpt.step
        self._weights_of = ckpt.path
        if not full:
            self._state_of = None  # weights only: the next train() restores the full state
            return
        assert self._optimizer is not None
        if ckpt.dcp_dir is None:
            if state.get("optimizer") is None:
                raise CheckpointError(f"checkpoint {str(ckpt.path)!r} has no optimizer state")
            try:
                self._optimizer.load_state_dict(state["optimizer"])
            except (ValueError, KeyError) as e:
                raise CheckpointError(f"checkpoint {str(ckpt.path)!r}: the optimizer state does not fit this optimizer ({e})") from e
        if self._schedule is not None and state.get("schedule") is not None:
            self._schedule.load_state_dict(state["schedule"])
        if self._scaler is not None and state.get("scaler") is not None:
            self._scaler.load_state_dict(state["scaler"])
        self._pending_hook_state = state.get("hooks", {})
        saved_world, world = int(state.get("world_size", 1)), self.strategy.world_size
        self._cache = None
        if saved_world == world:
            set_rng_state(state["rng"][self.strategy.rank])
            caches = state.get("cache")
            if caches is not None:
                self._cache = _to_device(caches[self.strategy.rank], self.strategy.device)
            self._pending_input_state = ckpt.input_states.get(self.strategy.rank)
        else:
            # Weights, optimizer, schedule and step carry over; the input is re-sharded where
            # the source can do it; per-replica RNG streams cannot be carried over.
            saved = [ckpt.input_states.get(r) for r in range(saved_world)]
            self._pending_input_state = {"reshard": saved} if all(s is not None for s in saved) else None
            log.warning(
                "checkpoint %s was written by %d replica(s) and this run has %d: weights, optimizer, "
                "schedule, step and input position are restored, but each replica's RNG and carried cache "
                "start afresh "
                "(bitwise-exact resume needs the same number of replicas)", ckpt.path, saved_world, world,
            )
        self._state_of = ckpt.path

    def _load_for_inference(self, checkpoint_path: str | Path | None, what: str) -> tuple[int, Path | None]:
        """Put the weights to use in the model; return their step and checkpoint."""
        self._build_model()
        if checkpoint_path is None and self._state_of == "memory":
            return self.global_step, None
        if checkpoint_path is None and self._state_of == "fresh" and self._warm_start_from is not None and self.latest_checkpoint() is None:
            return self.global_step, None  # warm-started weights, not trained yet
        if self._ckpt is not None:
            path = self._ckpt.resolve(checkpoint_path)
        elif checkpoint_path is not None:
            path = CheckpointManager(checkpoint_path, writer=False).resolve(checkpoint_path)
        else:
            path = None
        if path is None:
            raise CheckpointError(
                f"{what}: no checkpoint in model_dir {self.config.model_dir!r} and this Estimator has not "
                "been trained; call train() first, or pass checkpoint_path="
            )
        if self._weights_of != path:
            self._apply_checkpoint(load_checkpoint(path), full=False)
        return self.global_step, path

    def _after_evaluation(self, step: int, evaluated: Path | None, results: dict[str, float], name: str | None) -> None:
        if not self.strategy.is_chief:
            return
        label = f"eval_{name}" if name else "eval"
        log.info("%s at step %d: %s", label, step, ", ".join(f"{k} = {v:.6g}" for k, v in results.items() if k != "global_step"))
        if self._ckpt is None:
            return
        if self.config.summaries:
            if self._eval_writer is None:  # one events file per Estimator, not one per evaluation
                self._eval_writer = ScalarWriter(self._ckpt.model_dir, tensorboard=True)
            self._eval_writer.write(step, {k: v for k, v in results.items() if k != "global_step"}, prefix=f"{label}/")
            self._eval_writer.flush()
        if name is None and evaluated is not None and evaluated.parent == self._ckpt.model_dir:
            if self._ckpt.record_eval(step, results):
                log.info("ckpt-%d is the best so far by %s", step, self.config.keep_best[0])  # type: ignore[index]

    # ================================================================ predict
    def _predict(self, input_fn: InputFn, single: bool) -> Iterator[dict[str, torch.Tensor]]:
        model = self._model
        assert model is not None
        was_training = model.training
        model.eval()
        params = self._mode_params(ModeKeys.PREDICT, self.predict_batch_size)
        device = self.strategy.device
        try:
            with self._make_infeed(input_fn, ModeKeys.PREDICT, params=params) as infeed:
                for batch in self._in_lockstep(infeed):
                    with torch.no_grad(), autocast_context(self.config.precision, device):
                        spec = self._model_fn(self._module, batch.features, batch.labels, ModeKeys.PREDICT, params)
                    spec = check_spec(spec, ModeKeys.PREDICT)
                    params["cache"] = _detach_cache(spec.cache)
                    preds = _check_predictions(spec.predictions, params["batch_size"])
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


    def _in_lockstep(self, infeed: Infeed) -> Iterator[Batch]:
        """The infeed's batches; with several replicas, padded out with fully masked copies of
        the last batch until every replica's data has ended (collectives need all replicas)."""
        if self.strategy.world_size == 1:
            yield from infeed
            return
        last: Batch | None = None
        while True:
            batch = next(infeed, None)
            if not self.strategy.any_replica(batch is not None):
                return
            if batch is None:
                if last is None:
                    raise ValueError(
                        f"replica {self.strategy.rank} got no data at all: shard the input so every "
                        "replica has at least one batch (params['num_replicas'], params['replica_index'])"
                    )
                mask = torch.zeros(batch_rows(last.features) or 0, dtype=torch.bool, device=self.strategy.device)
                batch = Batch(last.features, last.labels, mask, 0)
            last = batch
            yield batch

    def _gather_rows(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """One batch of predictions from every replica, interleaved into input order on the chief.

        stoker's sources give replica ``r`` the examples ``r, r + K, r + 2K, ...`` of the data,
        so row ``j`` of replica ``r`` is example ``j * K + r`` of this batch's block.
        """
        everyone = self.strategy.all_gather_object(rows)
        if not self.strategy.is_chief:
            return None
        counts = [next(iter(r.values())).shape[0] if r else 0 for r in everyone]
        order = [(r, j) for j in range(max(counts, default=0)) for r in range(len(everyone)) if j < counts[r]]
        return {k: torch.stack([everyone[r][k][j] for r, j in order]) if order else everyone[0][k][:0] for k in rows}


class EvaluationHook(Hook):
    """Evaluate every ``every_n_steps`` steps during training, on a fresh checkpoint of that step."""

    priority = 35  # after the checkpoint saver, so the evaluation is recorded on its checkpoint

    def __init__(self, estimator: Estimator, input_fn: InputFn, every_n_steps: int, steps: int | None = None) -> None:
        self.estimator = estimator
        self.input_fn = input_fn
        self.every_n_steps = every_n_steps
        self.steps = steps
        self._last = 0
        self.last_results: dict[str, float] | None = None

    def after_setup(self, run: RunContext) -> None:
        self._last = run.global_step

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if every_n_steps_due(self._last, run.global_step, self.every_n_steps):
            self._evaluate(run)

    def end(self, run: RunContext) -> None:
        if self.last_results is None or self.last_results["global_step"] != run.global_step:
            self._evaluate(run)

    def _evaluate(self, run: RunContext) -> None:
        run.save_checkpoint()
        self._last = run.global_step
        est = self.estimator
        est.global_step = run.global_step
        self.last_results = est.evaluate(self.input_fn, steps=self.steps)


# ==================================================================== helpers
def check_train_arguments(steps: int | None, max_steps: int | None) -> None:
    """The rules for ``train(steps=..., max_steps=...)``: at most one, each a non-negative int."""
    if steps is not None and max_steps is not None:
        raise ValueError("train: give steps or max_steps, not both")
    for name, value in (("steps", steps), ("max_steps", max_steps)):
        if value is not None and (not isinstance(value, int) or value < 0):
            raise ValueError(f"train: {name} must be a non-negative integer; got {value!r}")


def _bind_model_fn(fn: Callable[..., EstimatorSpec]) -> Callable[..., EstimatorSpec]:
    """Check ``model_fn``'s signature once; return a function called with all five arguments."""
    if not callable(fn):
        raise ModelFnError(f"model_fn must be callable; got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    kinds = [p.kind for p in sig.parameters.values()]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return fn
    names = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) >= 5:
        return fn
    if len(names) >= 3 and tuple(names) == _MODEL_FN_ARGS[: len(names)]:
        n = len(names)
        return lambda model, features, labels, mode, params: fn(*(model, features, labels, mode, params)[:n])
    got = ", ".join(names)
    hint = " (a TensorFlow-style model_fn: stoker passes the built module first)" if names[:1] == ["features"] else ""
    raise ModelFnError(f"model_fn must take (model, features, labels, mode, params); it takes ({got}){hint}")


def _check_batch(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return value


def _check_predictions(preds: Any, batch: int) -> Mapping[str, torch.Tensor]:
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


def _to_cpu(cache: Any) -> Any:
    if cache is None:
        return None
    if isinstance(cache, torch.Tensor):
        return cache.detach().cpu()
    return tuple(_to_cpu(c) for c in cache)


def _to_device(cache: Any, device: torch.device) -> Any:
    if cache is None:
        return None
    if isinstance(cache, torch.Tensor):
        return cache.to(device)
    return tuple(_to_device(c, device) for c in cache)


def _detach_cache(cache: Any) -> Any:
    if cache is None:
        return None
    if isinstance(cache, torch.Tensor):
        return cache.detach()
    return tuple(c.detach() for c in cache)


@contextlib.contextmanager
def _isolated_rng(seed: int) -> Iterator[None]:
    """Run a block with freshly seeded global RNGs, then put the previous states back."""
    saved = rng_state()
    seed_everything(seed)
    try:
        yield
    finally:
        set_rng_state(saved)


def _ensure_log_handler(is_chief: bool = True) -> None:
    """Show stoker's INFO lines when the application has not configured logging itself.

    Replicas other than the chief log warnings and errors only (set the "stoker" logger's
    level yourself to see more).
    """
    if not is_chief and log.level == logging.NOTSET:
        log.setLevel(logging.WARNING)
    root = logging.getLogger()
    if log.handlers or root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s stoker %(levelname)s: %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.propagate = False


__all__ = ["Estimator", "EvaluationHook", "check_train_arguments"]
