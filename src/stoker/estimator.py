"""The ``Estimator``: train, evaluate and predict a ``model_fn`` on batches from an ``input_fn``.

The facade keeps the public API and wires the components of ``stoker.engine``, one job each:

- ``ModelState`` builds the model once from ``params`` (and the optimizer), restores it from
  checkpoints and saves it; it knows which checkpoint its memory holds;
- ``InputPlan`` turns global batch sizes into per-replica ``params`` and ``input_fn``'s iterable
  into an ``Infeed`` of device batches;
- ``TrainingRun`` runs device loops (``loop.py``) with hooks between them;
- ``EvaluationRun`` and ``PredictionRun`` run the EVAL and PREDICT modes;
- the ``Strategy`` says where the replica runs and how replicas combine.

``train`` resumes from the newest checkpoint in ``model_dir`` whenever the Estimator's memory
does not already hold it, so rerunning a killed script continues it exactly.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .checkpoint.io_config import CheckpointConfig
from .checkpoint.manager import CheckpointManager
from .checkpoint.warm_start import WarmStartSettings
from .config import RunConfig, run_info
from .distributed import DistributionConfig, Strategy, make_strategy
from .engine import (
    ContinuousEvalConfig,
    ContinuousEvalResult,
    EvaluationRun,
    InputFn,
    InputPlan,
    ModelArg,
    ModelState,
    OptimizerFn,
    PredictionRun,
    ScheduleFn,
    TrainingRun,
    bind_model_fn,
    check_train_arguments,
    default_hooks,
    evaluation_schedule,
    train_end,
    train_hooks,
    watching,
)
from .engine.cuda_graph_step import capture_refusals, cuda_graph_choice
from .engine.model_state import built_choices
from .errors import ConfigError, UserCodeError
from .hooks import Hook, RunContext
from .hooks.base import LoopResult, check_evaluations, next_due_step
from .resolve import Choice
from .spec import EstimatorSpec
from .storage import Location, check_dir

log = logging.getLogger("stoker")


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
        setting_names: how messages about settings changed on a rerun (``train``) spell each one
            (a command line passes its flags: ``{"params.lr": "--lr", "train_batch_size":
            "--batch_size"}``); keys are those of ``stoker.config.changes.RULES`` (docs/checkpoints.md).

    Its parts are public for the tools built on it: ``state``, ``inputs``, ``evaluation`` (the
    ``EvaluationRun`` ``evaluate`` uses), ``strategy`` (the engine's components) and ``choices``
    (what it chose when built, each with its reason).
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
        warm_start_from: str | os.PathLike[str] | WarmStartSettings | None = None,
        *,
        setting_names: Mapping[str, str] | None = None,
    ) -> None:
        if config is not None and not isinstance(config, RunConfig):
            raise UserCodeError(f"config must be a stoker.RunConfig; got {type(config).__name__}")
        self.config = cfg = config or RunConfig()  # each component is handed its slice, never all of it
        self.params: dict[str, Any] = dict(params or {})
        self.model_fn = model_fn
        self.strategy: Strategy = _build_strategy(cfg.distribution_config)
        self.inputs = InputPlan(
            params=self.params,
            config=cfg.input_config,
            strategy=self.strategy,
            train_batch_size=train_batch_size,
            eval_batch_size=eval_batch_size,
            predict_batch_size=predict_batch_size,
        )
        self.state = ModelState(
            model=model,
            params=self.params,
            config=cfg.state_config,
            precision=cfg.make_precision(),
            strategy=self.strategy,
            checkpoints=_build_checkpoints(cfg.checkpoint_config, writer=self.strategy.is_chief),
            optimizer=optimizer,
            lr_schedule=lr_schedule,
            warm_start_from=warm_start_from,
        )
        self.state.settings.names = dict(setting_names or {})
        self.state.settings.given(self.params, cfg, self.inputs)
        self.evaluation = EvaluationRun(self.state, self.inputs, self._model_fn, config=cfg.eval_config)
        #: Whether the last ``train`` stopped because of a signal (``PreemptionHook`` with
        #: ``exit_process=False``; with the default the process exits): a rerun continues it.
        self.interrupted = False
        self.choices: dict[str, Choice[Any]] = _record_choices(cfg, self.strategy, self.state)
        _ensure_log_handler(self.strategy.is_chief)

    # ================================================================ properties
    @property
    def model_fn(self) -> Callable[..., EstimatorSpec]:
        """The bound ``model_fn`` (always called with five arguments); assignable."""
        return self._model_fn

    @model_fn.setter
    def model_fn(self, fn: Callable[..., EstimatorSpec]) -> None:
        self._model_fn = bind_model_fn(fn)
        if hasattr(self, "evaluation"):
            self.evaluation.model_fn = self._model_fn

    @property
    def model(self) -> nn.Module:
        """The ``nn.Module`` (built on first access)."""
        return self.state.build_model()

    @property
    def model_dir(self) -> str | None:
        return self.config.checkpoint_config.model_dir

    @property
    def global_step(self) -> int:
        """The step of the weights in memory; assignable before training (AdaNet continues the
        global step across iterations this way)."""
        return self.state.global_step

    @global_step.setter
    def global_step(self, step: int) -> None:
        self.state.global_step = step

    @property
    def train_batch_size(self) -> int | None:
        return self.inputs.train_batch_size

    @property
    def eval_batch_size(self) -> int | None:
        return self.inputs.eval_batch_size

    @property
    def predict_batch_size(self) -> int | None:
        return self.inputs.predict_batch_size

    @property
    def warm_start_report(self) -> Any:
        """What ``warm_start_from`` loaded (after the model is built), else ``None``."""
        return self.state.warm_start_report

    # ================================================================ public API
    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's complete weights as CPU tensors, also when they are sharded over
        replicas (then every replica must call this)."""
        return self.state.full_state_dict()

    def latest_checkpoint(self) -> Location | None:
        """The newest checkpoint in ``model_dir`` (``None`` if there is none)."""
        return self.state.latest_checkpoint()

    def initialize(self) -> Estimator:
        """Build the model (and optimizer) now and restore the newest checkpoint if there is one.

        Afterwards ``evaluate``, ``predict`` and ``export`` also work on an Estimator that was never trained:
        they use its initial (or warm-started) weights. Training from here is the same as without this.
        """
        if self.state.can_train:
            self.state.restore_for_training()
        else:
            self.state.restore_weights()
        if self.state.holds == "fresh":
            self.state.holds = "memory"
        return self

    def default_hooks(self) -> list[Hook]:
        """The hooks every ``train`` runs (from the config); subclasses may adjust them."""
        return default_hooks(self.config.loop_config, self.config.checkpoint_config)

    def train(
        self,
        input_fn: InputFn,
        steps: int | None = None,
        max_steps: int | None = None,
        hooks: Sequence[Hook] = (),
        *,
        max_epochs: int | None = None,
    ) -> Estimator:
        """Train until ``steps`` more steps, global step ``max_steps``, epoch ``max_epochs``'s end, or the data's end.

        Resumes from the newest checkpoint in ``model_dir``: model, optimizer, schedule, loss
        scale, RNGs, carried cache, hooks and the input position. Settings that differ from those
        the checkpoint recorded (``params``, ``RunConfig`` fields, batch sizes, ``max_steps``, the
        optimizer's) are said, one line each, or refused (``RunConfig.on_changed_optimizer``).
        """
        max_steps = train_end(self.inputs, input_fn, steps, max_steps, max_epochs)  # epochs: docs/concepts.md
        hook_list = train_hooks(self.default_hooks(), hooks)
        check_evaluations(hook_list)  # EarlyStopping on an evaluation metric would never act
        self.state.settings.given(self.params, self.config, self.inputs, max_steps=max_steps)
        training = TrainingRun(
            self.state, self.inputs, self._model_fn, hook_list, loop=self.config.loop_config, info=run_info(self.config)
        )
        self.interrupted = False
        training.run(input_fn, steps, max_steps)
        self.interrupted = training.interrupted
        return self

    def evaluate(
        self,
        input_fn: InputFn,
        steps: int | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        name: str | None = None,
    ) -> dict[str, float]:
        """Evaluate on ``input_fn`` (all of it, or ``steps`` batches).

        Uses ``checkpoint_path`` if given, else the newest checkpoint in ``model_dir``, else the
        weights in memory from training. Returns ``loss``, every metric and ``global_step``.
        The last partial batch is padded and masked, so the result is exact.
        """
        return self.evaluation.run(input_fn, steps, checkpoint_path, name)

    def evaluate_continuously(
        self,
        input_fn: InputFn,
        steps: int | None = None,
        timeout_secs: float | None = 3600.0,
        *,
        poll_secs: float = 1.0,
        last_step: int | None = None,
        device: str | None = None,
        on_result: Callable[[int, dict[str, float]], None] | None = None,
        order: str = "newest",
    ) -> ContinuousEvalResult:
        """Evaluate the new checkpoints in ``model_dir`` as training writes them (run this in its
        own process, beside the trainer); see docs/evaluation.md.

        Each result is recorded on its checkpoint in the index (so ``keep_best`` chooses from it),
        logged at its step in ``model_dir/eval`` and handed to ``on_result(step, results)``. Stops
        when training has finished (``max_steps``) and everything up to it is evaluated, once the
        checkpoint of ``last_step`` is, or after ``timeout_secs`` without a new one (``None``: no
        timeout). Checkpoints with results are not evaluated again: a restarted evaluator carries
        on. ``device``: another than ``config.device`` (``"cuda:1"`` beside a trainer on ``"cuda:0"``).
        ``order="newest"`` (default) evaluates the newest pending checkpoint and records older
        pending ones as superseded; ``"oldest"`` evaluates each in step order.
        """
        config = ContinuousEvalConfig(
            steps=steps,
            timeout_secs=timeout_secs,
            poll_secs=poll_secs,
            last_step=last_step,
            summaries=self.config.summaries,
            order=order,
        )
        return watching(self.evaluation, config, device=device, on_result=on_result).run(input_fn)

    def predict(
        self,
        input_fn: InputFn,
        checkpoint_path: str | os.PathLike[str] | None = None,
        yield_single_examples: bool = True,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Yield predictions for every example of ``input_fn``, in order, padding removed.

        Each item is a dict of CPU tensors: one example (``yield_single_examples=True``) or one
        batch. The last partial batch is padded to the static batch size for the step and
        the padded rows are dropped.
        """
        if self.predict_batch_size is None:
            raise ConfigError("predict: the Estimator needs predict_batch_size (or train_batch_size)")
        self.state.wait_for_checkpoint(everywhere=True)  # the chief's asynchronous write, on every replica
        self.state.weights_for_inference(checkpoint_path, "predict")
        return PredictionRun(self.state, self.inputs, self._model_fn).run(input_fn, yield_single_examples)

    def train_and_evaluate(
        self,
        train_input_fn: InputFn,
        eval_input_fn: InputFn,
        max_steps: int | None = None,
        eval_every_n_steps: int | None = None,
        eval_steps: int | None = None,
        hooks: Sequence[Hook] = (),
        *,
        max_epochs: int | None = None,
        eval_every_n_epochs: int | None = None,
    ) -> dict[str, float]:
        """Train to ``max_steps`` (or the end of epoch ``max_epochs``), evaluating (and checkpointing)
        every ``eval_every_n_steps`` steps (default 1000) or ``eval_every_n_epochs`` epochs.

        Evaluations fall on the multiples of ``eval_every_n_steps`` (loops end there) and at the
        end. Each is recorded on its checkpoint, which feeds ``RunConfig.keep_best``. Returns the
        final evaluation; after a signal's stop in a process that goes on
        (``PreemptionHook(exit_process=False)``), the newest one so far (``{}`` if none).
        """
        max_steps, eval_every_n_steps = evaluation_schedule(
            self.inputs, train_input_fn, (max_steps, max_epochs), (eval_every_n_steps, eval_every_n_epochs)
        )
        evaluator = EvaluationHook(self, eval_input_fn, every_n_steps=eval_every_n_steps, steps=eval_steps)
        with self.state.settings.evaluating(eval_every_n_steps, eval_steps):  # recorded with the call's
            self.train(train_input_fn, max_steps=max_steps, hooks=[*hooks, evaluator])
        return evaluator.final_results()

    def export(
        self,
        export_dir: str | os.PathLike[str],
        example_features: Any,
        dynamic_batch: bool = True,
        formats: Sequence[str] = ("pt2",),
        *,
        checkpoint_path: str | os.PathLike[str] | None = None,
        aot: bool = False,
        aot_device: str = "cpu",
    ) -> Location:
        """Export the PREDICT computation as a ``torch.export`` program (``model.pt2``), plus
        ``model.safetensors`` and ``signature.json`` (and ``model.onnx`` if asked; with ``aot=True``
        also ``model.aoti.pt2``, the program compiled by AOTInductor for ``aot_device``). Uses the
        best checkpoint when ``keep_best`` recorded one, else the newest. See docs/export.md."""
        from .export.program import export

        return export(
            self,
            export_dir,
            example_features,
            dynamic_batch,
            formats,
            checkpoint_path=checkpoint_path,
            aot=aot,
            aot_device=aot_device,
        )


class EvaluationHook(Hook):
    """Evaluate during training, on a fresh checkpoint of each step it evaluates at: every
    ``every_n_steps`` steps (one period, or several) and at ``at_steps``, both counted from
    ``first_step`` (default 0: the multiples of ``every_n_steps``), and at the end of training.

    The evaluations fall on their steps (loops end there), and at the end of training when it
    reaches ``max_steps``, its data's end or a hook's stop (early stopping): never at a stop
    from outside (a signal), whose checkpoint a rerun continues.
    Each result is handed to every hook's ``after_evaluation`` (``run.add_evaluation``:
    EarlyStopping, trackers). The step of the last evaluation is kept in checkpoints: a run
    resumed from the checkpoint of a step it evaluated takes that result back from the index (or
    evaluates it again, if a kill came before it was recorded) and hands it to the hooks again,
    since no hook's state in that checkpoint holds it; so every evaluation reaches each hook
    once and resumed runs see the same evaluations as an uninterrupted one.
    """

    phase = "evaluation"  # after the checkpoint saver, so the evaluation is recorded on its checkpoint
    makes_evaluations = True

    def __init__(
        self,
        estimator: Estimator,
        input_fn: InputFn,
        every_n_steps: int | Sequence[int] = (),
        steps: int | None = None,
        *,
        at_steps: Sequence[int] = (),
        first_step: int = 0,
    ) -> None:
        self.estimator = estimator
        self.input_fn = input_fn
        self.every_n_steps = every_n_steps
        self._periods = (every_n_steps,) if isinstance(every_n_steps, int) else tuple(every_n_steps)
        self.at_steps, self.first_step = tuple(sorted(at_steps)), first_step
        self.steps = steps
        self._last: int | None = None
        self.last_results: dict[str, float] | None = None
        #: Whether the last training ended interrupted (a signal), without its final evaluation.
        self.interrupted = False

    def after_setup(self, run: RunContext) -> None:
        self.interrupted = False
        last, self._last = self._last, run.global_step
        self.due_step = self.scheduled_after(run.global_step)
        if last is None or last >= run.global_step or not self._due(last, run.global_step):
            return
        # The run was resumed from the checkpoint of a step it evaluated (or was about to).
        recorded = self._recorded(run.global_step)
        if recorded is None:
            self._evaluate(run)
        else:
            self.last_results = recorded
            run.add_evaluation(recorded)

    def scheduled_after(self, step: int) -> int | None:
        """The first step after ``step`` an evaluation is due at (``None``: no more are scheduled)."""
        local = max(step - self.first_step, 0)
        due = [next_due_step(local, n) for n in self._periods] + [at for at in self.at_steps if at > local]
        return self.first_step + min(due) if due else None

    def _due(self, last: int, step: int) -> bool:
        """Whether an evaluation is due at ``step``, the last having been at ``last``."""
        due = self.scheduled_after(last)
        return due is not None and due <= step

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if self._due(self._last or 0, run.global_step):
            self._evaluate(run)
        self.due_step = self.scheduled_after(run.global_step)

    def end(self, run: RunContext) -> None:
        self.interrupted = run.interrupted
        if self.interrupted:
            return  # the rerun evaluates where an uninterrupted run would
        if self.last_results is None or self.last_results["global_step"] != run.global_step:
            self._evaluate(run)

    def state_dict(self) -> dict[str, Any]:
        return {"last": self._last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last = state.get("last")

    def final_results(self) -> dict[str, float]:
        """``train_and_evaluate``'s result once training ended: the evaluation of its last step
        (made now if there is none yet); after a signal's stop, the newest one so far (``{}``: none)."""
        if self.interrupted:  # a signal stopped training and the process goes on (exit_process=False)
            return self.last_results or {}
        if self.last_results is None or self.last_results["global_step"] != self.estimator.global_step:
            return self.estimator.evaluate(self.input_fn, steps=self.steps)
        return self.last_results

    def _recorded(self, step: int) -> dict[str, float] | None:
        """The evaluation the index holds for ``ckpt-<step>``, if any."""
        checkpoints = self.estimator.state.checkpoints
        if checkpoints is None:
            return None
        for record in checkpoints.records():
            if record.step == step and record.evaluated:
                return {**record.metrics, "global_step": step}
        return None

    def _evaluate(self, run: RunContext) -> None:
        run.save_checkpoint()
        self._last = run.global_step
        est = self.estimator
        est.global_step = run.global_step
        self.last_results = est.evaluate(self.input_fn, steps=self.steps)
        run.add_evaluation(self.last_results)


def _build_strategy(config: DistributionConfig) -> Strategy:
    """The ``Strategy`` distribution's slice asks for."""
    return make_strategy(
        config.strategy,
        config.device,
        config.distributed_timeout,
        config.pipeline,
        bucket_cap_mb=config.ddp_bucket_cap_mb,
    )


def _record_choices(config: RunConfig, strategy: Strategy, state: ModelState) -> dict[str, Choice[Any]]:
    """The choices :attr:`Estimator.choices` reports, made once when the Estimator is built."""
    device = strategy.device_choice or Choice(strategy.device, f"the {config.strategy} strategy's")
    loop, scaler = config.loop_config, state.precision.scaler
    refusals = capture_refusals(  # the optimizer is checked when the step is built
        device_type=strategy.device.type,
        compile_mode=loop.compile,
        dynamic_scaling=scaler is not None and scaler.dynamic,
        accumulation_steps=loop.gradient_accumulation_steps,
        world_size=strategy.world_size,
    )
    graph = cuda_graph_choice(loop.cuda_graph, strategy.device.type, refusals)
    return {"device": device, **built_choices(config.state_config, strategy, state.precision), "cuda_graph": graph}


def _build_checkpoints(config: CheckpointConfig, *, writer: bool) -> CheckpointManager | None:
    """The ``model_dir``'s manager checkpointing's slice asks for (``None``: a run kept in memory)."""
    if not config.model_dir:
        return None
    check_dir(config.model_dir, "model_dir", writable=writer)  # one line now, not a traceback at the first write
    return CheckpointManager(
        config.model_dir,
        keep_checkpoint_max=config.keep_checkpoint_max,
        keep_best=config.keep_best,
        writer=writer,
        retry=config.io.retry,
    )


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
