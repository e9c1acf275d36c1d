"""The skeleton every recipe shares: flags, ``run_spec.json``, the Estimator, train-and-evaluate, the report.

A recipe is one module. It fills in what is its own: a keyword-only config dataclass whose fields
are its flags (:func:`option`), the model, the ``model_fn`` (loss and metrics), the
``input_fn`` s and, if it likes, its optimizer, schedule, extra flag checks and report line. A
:class:`Recipe` holds those pieces and does the rest, the same way for every recipe:

- ``add_arguments(parser)``: one ``--flag`` per config field, help from the field's metadata
  (``--model_dir`` is always required);
- ``run(args)`` (``stoker train NAME``) and ``main(argv)`` (``python -m package.module``):
  config from the flags, the checks (exit 2 naming the flag), training, one printed line;
- ``train(config, **overrides)``: write ``run_spec.json``, build the Estimator, train to
  ``max_steps`` evaluating every ``eval_every_n_steps`` (``0``: train only, for a watching
  ``stoker evaluate --watch``); rerunning resumes from the newest checkpoint;
- ``register()``: the ``run_spec.json`` builder (``stoker export``) and held-out input
  (``stoker evaluate``) of the kind ``NAME``.

A whole recipe, ``linreg.py`` (declare it in a ``stoker.recipes`` entry point, and in
``stoker.run_spec`` for export, to get ``stoker train linreg``)::

    from dataclasses import dataclass

    import torch
    from torch import nn

    import stoker
    from stoker.recipes.skeleton import Recipe, RecipeConfig, option


    @dataclass(kw_only=True)
    class LinRegConfig(RecipeConfig):
        features: int = option(4, "input width")

        def model_params(self) -> dict:
            return {"features": self.features}


    def input_fns(config):
        x = torch.randn(256, config.features, generator=torch.Generator().manual_seed(config.seed))
        y = x.sum(1)
        train_read = stoker.data.ReadOptions(seed=config.seed)
        eval_read = stoker.data.ReadOptions(shuffle=False, num_epochs=1)
        train = lambda p: stoker.data.arrays(x, y, read=train_read.for_replica(p))
        held_out = lambda p: stoker.data.arrays(x, y, read=eval_read.for_replica(p))
        return train, held_out


    def model_fn(model, features, labels, mode, params):
        pred = model(features).squeeze(-1)
        if mode == stoker.ModeKeys.PREDICT:
            return stoker.EstimatorSpec(predictions={"y": pred})
        err = (pred - labels) ** 2
        if mode == stoker.ModeKeys.TRAIN:
            return stoker.EstimatorSpec(loss=err.mean())
        return stoker.EstimatorSpec(loss=err, eval_metrics={"mse": stoker.metrics.Mean()(err)})


    RECIPE = Recipe(
        name="linreg",
        config_class=LinRegConfig,
        help="linear regression on generated data",
        description="Fit y = sum(x) with one linear layer.",
        model=lambda p: nn.Linear(p["features"], 1),
        model_fn=model_fn,
        input_fns=input_fns,
        optimizer=lambda p, parameters: torch.optim.SGD(parameters, lr=p["lr"]),
        train_params=("lr",),
        keep_best=("mse", "min"),
        example_features=lambda config: torch.zeros(2, config.features),
    )
    HELP, DESCRIPTION = RECIPE.help, RECIPE.description
    add_arguments, run, main, train_linreg = RECIPE.add_arguments, RECIPE.run, RECIPE.main, RECIPE.train
    estimator_from_run_spec, eval_input_from_run_spec = RECIPE.register()

A config either subclasses :class:`RecipeConfig` (the standard run fields first, its own
after) or declares the fields of :class:`RecipeFields` itself, in the order its flags and its
``run_spec.json`` should list them (``bert`` and ``charlm`` do). This module imports neither the
command line (``stoker.cli``) nor the harness (``stoker.bench``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

import torch
from torch import nn

from ..config import RunConfig
from ..config.changes import ON_CHANGED_OPTIMIZER
from ..distributed import device_choice
from ..errors import StokerError
from ..estimator import Estimator
from ..flags import DefaultsHelpFormatter, add_flags, field_flags, given_values, option
from ..hooks import Hook, RunContext
from ..resolve import Choice, attention_form
from ..run_spec import recipe_config, register_eval_input, register_run_spec, write_run_spec
from ..spec import EstimatorSpec
from .throughput import Throughput

InputFn = Callable[[dict[str, Any]], Iterable[Any]]
ModelFn = Callable[[nn.Module, Any, Any, Any, dict[str, Any]], EstimatorSpec]
OptimizerFn = Callable[[dict[str, Any], Iterable[nn.Parameter]], torch.optim.Optimizer]
ScheduleFn = Callable[[dict[str, Any], torch.optim.Optimizer], Any]

#: The attention forms of the Transformer recipes' models: torch's scaled_dot_product_attention, or written out
ATTENTION_FORMS: tuple[str, ...] = ("sdpa", "math")
#: ``--attention``: a form, or ``auto`` (:func:`attention_for`)
ATTENTION_CHOICES: tuple[str, ...] = ("auto", *ATTENTION_FORMS)

#: :func:`option` keywords of a flag that takes one or more paths (``--text a.txt b/``)
PATHS: dict[str, Any] = {"nargs": "+", "metavar": "PATH"}


def on_changed_optimizer_option() -> Any:
    """``--on_changed_optimizer``: ``RunConfig.on_changed_optimizer``, what a rerun does with an
    optimizer setting (``--lr``, ...) that differs from the checkpoint's (docs/checkpoints.md)."""
    return option(
        "refuse",
        "a rerun whose --lr (or other optimizer setting) differs from the checkpoint's: refuse, keep the "
        "checkpoint's, or apply the new one from the resumed step",
        choices=ON_CHANGED_OPTIMIZER,
    )


def device_type_of(device: str) -> str:
    """``cuda`` or ``cpu``: where a recipe's ``--device`` trains (``auto``: as the engine resolves
    it, :func:`stoker.distributed.device_choice`; a named device is not checked here)."""
    if device == "auto":
        return device_choice("auto").value.type
    return "cuda" if device.partition(":")[0] == "cuda" else "cpu"  # the values RunConfig.device takes


def attention_for(attention: str, device: str) -> Choice[str]:
    """The attention form a Transformer recipe's model is built with: ``--attention``, or for
    ``auto`` the rule of :func:`stoker.resolve.attention_form` on the run's device. The form, not
    ``auto``, is what ``model_params()`` and ``run_spec.json`` record, so an export or a
    ``stoker evaluate`` of the run rebuilds what trained."""
    return attention_form(attention, device_type_of(device))


def fused_on_cuda(parameters: Sequence[torch.Tensor]) -> bool:
    """Whether an Adam(W) over ``parameters`` is built ``fused=True``: every parameter a plain fp32
    tensor on a CUDA device. The fused kernel updates every weight in one launch where the
    default runs a few foreach launches per step; CPU runs keep the default (their results are
    unchanged), and bf16-sr's bf16 weights and FSDP's DTensors keep it too."""
    return bool(parameters) and all(
        type(p) in (torch.Tensor, nn.Parameter) and p.device.type == "cuda" and p.dtype == torch.float32
        for p in parameters
    )


class RecipeFields(Protocol):
    """What the skeleton reads of a config: the training fields (``model_dir`` .. ``eval_steps``),
    the fields of :func:`standard_run_config` (the rest), and ``model_params()``: the ``params``
    that define the model, saved in ``run_spec.json``."""

    model_dir: str | None
    batch_size: int
    eval_batch_size: int
    max_steps: int
    eval_every_n_steps: int
    eval_steps: int | None
    save_checkpoints_steps: int
    keep_checkpoint_max: int
    iterations_per_loop: int
    log_every_n_steps: int
    clip_norm: float
    seed: int
    device: str
    on_changed_optimizer: str

    def model_params(self) -> dict[str, Any]: ...


C = TypeVar("C", bound=RecipeFields)


@dataclass(kw_only=True)
class RecipeConfig:
    """The standard fields of a recipe's config, to subclass (its own fields come after these)."""

    model_dir: str | None = option(None, "checkpoints, metrics.csv and run_spec.json (required on the command line)")
    batch_size: int = option(32, "global batch (examples per step)")
    eval_batch_size: int = option(64, "examples per evaluation batch")
    max_steps: int = option(500, "train to this global step")
    lr: float = option(1e-3, "learning rate")
    clip_norm: float = option(0.0, "gradient norm clipping (0: none)")
    eval_every_n_steps: int = option(250, "evaluate (and checkpoint) every N steps; 0: no evaluation while training")
    eval_steps: int | None = option(None, "batches per evaluation (default: all of the held-out data)")
    save_checkpoints_steps: int = option(100, "checkpoint every N steps")
    keep_checkpoint_max: int = option(3, "newest checkpoints kept (the best, if kept, too)")
    iterations_per_loop: int = option(10, "steps per device loop")
    log_every_n_steps: int = option(50, "log the loss every N steps")
    seed: int = option(0, "seed of the initial weights, data order and dropout")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    on_changed_optimizer: str = on_changed_optimizer_option()

    def model_params(self) -> dict[str, Any]:
        """The ``params`` that define the model and its data shape (saved in ``run_spec.json``)."""
        return {}


def standard_run_config(config: RecipeFields, *, keep_best: tuple[str, str] | None = None, **more: Any) -> RunConfig:
    """The ``RunConfig`` of the standard fields (``clip_norm`` 0: none; no progress bar), with
    ``keep_best`` and any ``more`` ``RunConfig`` fields."""
    return RunConfig(
        model_dir=config.model_dir,
        seed=config.seed,
        iterations_per_loop=config.iterations_per_loop,
        save_checkpoints_steps=config.save_checkpoints_steps,
        keep_checkpoint_max=config.keep_checkpoint_max,
        keep_best=keep_best,
        log_every_n_steps=config.log_every_n_steps,
        gradient_clip_norm=config.clip_norm or None,
        device=config.device,
        progress_bar=False,
        on_changed_optimizer=cast(Any, config.on_changed_optimizer),  # one of its choices: the flag checked it
        **more,
    )


@dataclass(frozen=True, kw_only=True)
class Recipe(Generic[C]):
    """A recipe: its own pieces (the fields), and the skeleton that runs them (the methods).

    ``name`` is ``stoker train NAME``, the ``run_spec.json`` kind and the prefix of error
    messages. ``params`` of the Estimator are ``config.model_params()`` plus the config fields
    named in ``train_params``. ``positive`` names the fields that must be >= 1 (checked first),
    ``check`` the recipe's other checks (a message naming the flag, or ``None``). ``run_config``
    replaces :func:`standard_run_config` (which keeps the best checkpoint by ``keep_best``).
    ``report`` is the line ``run`` prints after an evaluated run (default: every metric).
    ``example_features`` are what ``stoker export`` traces the model with. With
    ``flops_per_example`` (training FLOPs of one example), ``run`` prints a second line: the
    training examples/sec and MFU (:class:`~stoker.recipes.throughput.Throughput`).
    ``older_params``: what a run trained with when its ``run_spec.json`` predates a model
    option (``{"attention": "math"}``: the written-out attention, before ``--attention``).
    """

    name: str
    config_class: type[C]
    help: str
    description: str
    model: Callable[[dict[str, Any]], nn.Module]
    model_fn: ModelFn
    input_fns: Callable[[C], tuple[InputFn, InputFn]]
    optimizer: OptimizerFn | None = None
    lr_schedule: ScheduleFn | None = None
    train_params: tuple[str, ...] = ()
    keep_best: tuple[str, str] | None = None
    run_config: Callable[[C], RunConfig] | None = None
    estimator_class: type[Estimator] = Estimator
    positive: tuple[str, ...] = ("batch_size", "eval_batch_size", "max_steps")
    check: Callable[[C], str | None] | None = None
    report: Callable[[C, Mapping[str, float]], str] | None = None
    example_features: Callable[[C], Any] | None = None
    flops_per_example: Callable[[C], float] | None = None
    older_params: Mapping[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------ the command line
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """One flag per config field, in the argparse style of :mod:`stoker.flags`
        (``--model_dir`` required)."""
        flags = [
            dataclasses.replace(f, required=f.required or f.name == "model_dir") for f in field_flags(self.config_class)
        ]
        add_flags(parser, flags, style="argparse")

    def config_from_args(self, args: argparse.Namespace) -> C:
        """The config of parsed flags (one attribute per field)."""
        return self.config_class(**given_values(self.config_class, args))

    def config_error(self, config: C) -> str | None:
        """What is wrong with ``config``, naming the flag (``None``: nothing)."""
        for name in self.positive:
            if getattr(config, name) < 1:
                return f"--{name} must be >= 1; got {getattr(config, name)}"
        if config.eval_every_n_steps < 0:
            return (
                f"--eval_every_n_steps must be >= 0 (0: no evaluation while training); got {config.eval_every_n_steps}"
            )
        return None if self.check is None else self.check(config)

    def run(self, args: argparse.Namespace) -> int:
        """``stoker train NAME``: check the flags (exit 2), train (exit 1 if it fails), print the result."""
        config = self.config_from_args(args)
        problem = self.config_error(config)
        if problem is not None:
            print(f"stoker train {self.name}: {problem}", file=sys.stderr)
            return 2
        meter = None if self.flops_per_example is None else Throughput(self.flops_per_example(config))
        try:
            results = self.train(config, hooks=[meter] if meter else [])
        except (StokerError, ValueError) as e:  # bad paths, too little data, a bad device name ...
            print(f"stoker train {self.name}: {e}", file=sys.stderr)
            return 1
        print(self.summary(config, results))
        speed = meter.line() if meter else None
        if speed:
            print(speed)
        return 0

    def main(self, argv: Sequence[str] | None = None) -> int:
        """``python -m MODULE --model_dir DIR ...``: the same flags as ``stoker train NAME``."""
        parser = argparse.ArgumentParser(
            prog=f"python -m {self.module}",
            description=self.description,
            formatter_class=DefaultsHelpFormatter,
        )
        self.add_arguments(parser)
        return self.run(parser.parse_args(argv))

    def summary(self, config: C, results: Mapping[str, float]) -> str:
        """The line ``run`` prints: ``report``'s, or that the run trained without evaluating."""
        if config.eval_every_n_steps == 0:
            return (
                f"trained to step {results['global_step']:.0f} without evaluating "
                f"(--eval_every_n_steps 0; model_dir {config.model_dir})"
            )
        if self.report is not None:
            return self.report(config, results)
        shown = ", ".join(f"{k} = {v:.4f}" for k, v in results.items() if k != "global_step")
        return f"held-out at step {results['global_step']}: {shown} (model_dir {config.model_dir})"

    @property
    def module(self) -> str:
        """The recipe's module (that of its config class), as ``python -m`` names it."""
        module = self.config_class.__module__
        if module == "__main__":  # run as python -m package.module
            spec = getattr(sys.modules["__main__"], "__spec__", None)
            module = spec.name if spec is not None else module
        return module

    # ------------------------------------------------------------ the Estimator and training
    def params(self, config: C) -> dict[str, Any]:
        """The Estimator's ``params``: ``config.model_params()`` and the ``train_params`` fields."""
        return {**config.model_params(), **{k: getattr(config, k) for k in self.train_params}}

    def build_estimator(self, config: C, *, warm_start_from: str | os.PathLike[str] | None = None) -> Estimator:
        """The Estimator of ``config`` (checkpoints in ``config.model_dir``; ``warm_start_from``:
        initial weights, as ``Estimator(warm_start_from=...)``)."""
        run = (
            standard_run_config(config, keep_best=self.keep_best)
            if self.run_config is None
            else self.run_config(config)
        )
        return self.estimator_class(
            model=self.model,
            model_fn=self.model_fn,
            optimizer=self.optimizer,
            lr_schedule=self.lr_schedule,
            config=run,
            params=self.params(config),
            train_batch_size=config.batch_size,
            eval_batch_size=config.eval_batch_size,
            predict_batch_size=config.eval_batch_size,
            warm_start_from=warm_start_from,
            setting_names=self.setting_names(config),
        )

    def setting_names(self, config: C) -> dict[str, str]:
        """The flag that sets each setting, so a rerun's changed-settings lines name it (``--lr``)."""
        flags = {f.name for f in dataclasses.fields(cast(Any, config))}
        run_fields = {f.name for f in dataclasses.fields(RunConfig)}
        names = {f"params.{k}": f"--{k}" for k in self.params(config) if k in flags}
        names.update({f"RunConfig.{k}": f"--{k}" for k in flags & run_fields})
        names.update({k: f"--{k}" for k in ("eval_batch_size", "max_steps", "eval_every_n_steps", "eval_steps")})
        names.update({"train_batch_size": "--batch_size", "RunConfig.gradient_clip_norm": "--clip_norm"})
        return names

    def train(self, config: C | None = None, *, hooks: Sequence[Hook] = (), **overrides: Any) -> dict[str, float]:
        """Train (or resume) to ``max_steps``, evaluating every ``eval_every_n_steps``; return the
        last evaluation (with ``global_step``). With ``eval_every_n_steps=0`` it only trains (a
        watching evaluator evaluates) and returns ``{"global_step": ...}``.

        ``overrides`` replace fields of ``config`` (default: the config class's defaults). Writes
        ``run_spec.json`` into ``model_dir`` for ``stoker export`` / ``evaluate`` / ``inspect``, once
        a rerun's changed flags are accepted (a refused rerun leaves the record of the run as it was).
        """
        config = dataclasses.replace(config or self.config_class(), **overrides)  # type: ignore[type-var]
        train_fn, eval_fn = self.input_fns(config)
        est = self.build_estimator(config)
        if config.model_dir:
            hooks = [_RunSpecWriter(self.name, config), *hooks]
        if config.eval_every_n_steps == 0:  # a watching evaluator (stoker evaluate --watch) evaluates
            est.train(train_fn, max_steps=config.max_steps, hooks=hooks)
            return {"global_step": float(est.global_step)}
        return est.train_and_evaluate(
            train_fn,
            eval_fn,
            max_steps=config.max_steps,
            eval_every_n_steps=config.eval_every_n_steps,
            eval_steps=config.eval_steps,
            hooks=hooks,
        )

    # ------------------------------------------------------------ run_spec.json
    def config_from_run_spec(self, spec: Mapping[str, Any], model_dir: str | os.PathLike[str]) -> C:
        """The config a ``run_spec.json`` written by :meth:`train` records, reading ``model_dir``."""
        # recipe_config wants a dataclass type; a recipe's config class is one (RecipeFields cannot say so)
        spec = {**spec, "params": {**self.older_params, **spec["params"]}}
        return cast(C, recipe_config(cast(Any, self.config_class), spec, model_dir))

    def register(
        self,
    ) -> tuple[
        Callable[[Mapping[str, Any], str | os.PathLike[str]], tuple[Estimator, Any]],
        Callable[[Mapping[str, Any], str | os.PathLike[str]], tuple[InputFn, int | None]],
    ]:
        """Register the ``run_spec.json`` kind ``name``: its Estimator and example features (for
        ``stoker export``) and its held-out input and ``eval_steps`` (for ``stoker evaluate``).
        Returns the two builders, named as functions of the recipe's module."""

        def estimator_from_run_spec(
            spec: Mapping[str, Any], model_dir: str | os.PathLike[str]
        ) -> tuple[Estimator, Any]:
            config = self.config_from_run_spec(spec, model_dir)
            example = None if self.example_features is None else self.example_features(config)
            return self.build_estimator(config), example

        def eval_input_from_run_spec(
            spec: Mapping[str, Any], model_dir: str | os.PathLike[str]
        ) -> tuple[InputFn, int | None]:
            config = self.config_from_run_spec(spec, model_dir)
            return self.input_fns(config)[1], config.eval_steps

        estimator_from_run_spec.__doc__ = (
            f"An Estimator reading ``model_dir``'s checkpoints, and example features for export, from a "
            f"``run_spec.json`` of kind ``{self.name}``."
        )
        eval_input_from_run_spec.__doc__ = (
            f"The held-out input and ``eval_steps`` of a ``run_spec.json`` of kind ``{self.name}`` "
            "(for ``stoker evaluate [--watch]``)."
        )
        for fn in (estimator_from_run_spec, eval_input_from_run_spec):  # registered under the recipe's own name
            fn.__module__, fn.__qualname__ = self.config_class.__module__, fn.__name__
        register_run_spec(self.name)(estimator_from_run_spec)
        register_eval_input(self.name)(eval_input_from_run_spec)
        return estimator_from_run_spec, eval_input_from_run_spec


class _RunSpecWriter(Hook):
    """Writes ``run_spec.json`` once training has set up: after the restore, whose check of
    changed settings may refuse the rerun."""

    phase = "state"  # before the trackers' after_setup, which logs run_spec.json as params

    def __init__(self, kind: str, config: RecipeFields) -> None:
        self.kind, self.config = kind, config

    def after_setup(self, run: RunContext) -> None:
        assert self.config.model_dir is not None
        write_run_spec(
            self.config.model_dir,
            kind=self.kind,
            params=self.config.model_params(),
            config=dataclasses.asdict(cast(Any, self.config)),
        )


__all__ = [
    "ATTENTION_CHOICES",
    "ATTENTION_FORMS",
    "attention_for",
    "device_type_of",
    "PATHS",
    "InputFn",
    "Recipe",
    "RecipeConfig",
    "RecipeFields",
    "fused_on_cuda",
    "on_changed_optimizer_option",
    "option",
    "standard_run_config",
]
