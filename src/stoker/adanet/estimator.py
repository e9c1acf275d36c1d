"""``stoker.adanet.Estimator``: the AdaNet search as an outer loop over plain Estimators.

Each iteration ``t`` is one ``stoker.Estimator`` in ``model_dir/iteration-<t>/`` whose model
is an ``IterationModel`` (every candidate of the iteration in one module) and which trains
for ``max_iteration_steps`` steps, continuing the global step of the previous iteration.
When it ends, the outer loop chooses the best candidate, writes its weights as an ordinary
stoker checkpoint ``model_dir/final/ckpt-<step>``, its reports, and finally
``architecture-<t>.json``, the commit point: an iteration whose architecture file exists is
done, any other is resumed (mid-iteration resume is the engine's own, from
``iteration-<t>/``), and the bookkeeping after training is deterministic, so it is simply
redone after a crash. Which candidate wins and what is recorded of it is decided in
:mod:`stoker.adanet.selection`; this module writes it, in commit order.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import nn

from .. import storage
from ..checkpoint.manager import CheckpointManager
from ..config import RunConfig
from ..data._tree import tree_map
from ..errors import CheckpointError, ConfigError, DataError, UserCodeError
from ..estimator import Estimator as PlainEstimator
from ..estimator import check_train_arguments
from ..hooks import Hook
from ..rng import rng_state, seed_everything, set_rng_state
from ..spec import EstimatorSpec, ModeKeys
from .architecture import (
    Architecture,
    architecture_path,
    atomic_write_bytes,
    atomic_write_text,
    read_architecture,
    read_text,
    write_architecture,
)
from .ensemble import ComplexityRegularizedEnsembler, Ensembler
from .evaluator import Evaluator, ReportMaterializer
from .heads import Head, MetricFn
from .iteration import DivergedCandidateHook, EnsembleModel, IterationModel
from .replay import Config as ReplayConfig
from .search import FINAL_DIR, REPORT_FILE, SearchSpace, final_checkpoint
from .selection import choose, chosen_architecture, selection_record
from .strategy import GrowStrategy, Strategy
from .subnetwork import Generator, as_subnetwork

log = logging.getLogger("stoker")

InputFn = Callable[[dict[str, Any]], Iterable[Any]]
EXAMPLE_FEATURES = "example_features.pt"
EXAMPLE_ROWS = 2
# params[ITERATION_PARAM] tells an input_fn which iteration it feeds (e.g. to reshuffle per
# iteration, as an unseeded TF input pipeline did); it is 0 for the example batch.
ITERATION_PARAM = "adanet_iteration"

__all__ = ["Estimator"]


def _iteration_model_fn(
    model: nn.Module, features: Any, labels: Any, mode: ModeKeys, params: dict[str, Any]
) -> EstimatorSpec:
    return model(features, labels, mode)


def _first_features(input_fn: InputFn, params: dict[str, Any], seed: int) -> Any:
    """The features of ``input_fn``'s first batch, with the global RNGs isolated."""
    saved = rng_state()
    seed_everything(seed)
    try:
        source = input_fn(params)
        item = next(iter(source))
        close = getattr(source, "close", None)
        if callable(close):
            close()
    except StopIteration:
        raise DataError("input_fn gave no batch: AdaNet needs one to build the subnetworks") from None
    finally:
        set_rng_state(saved)
    is_pair = isinstance(item, (tuple, list)) and len(item) == 2 and not hasattr(item, "_fields")
    return item[0] if is_pair else item


def _check_arguments(
    head: Head,
    subnetwork_generator: Generator,
    max_iteration_steps: int,
    max_iterations: int | None,
    adanet_loss_decay: float,
    config: RunConfig | None,
    ensemblers: Sequence[Ensembler],
) -> None:
    if not isinstance(head, Head):
        raise UserCodeError(f"head must be a stoker.adanet Head; got {type(head).__name__}")
    if subnetwork_generator is None or not isinstance(subnetwork_generator, Generator):
        raise ConfigError("subnetwork_generator must be a stoker.adanet.Generator")
    if not isinstance(max_iteration_steps, int) or max_iteration_steps < 1:
        raise ConfigError(f"max_iteration_steps must be a positive integer; got {max_iteration_steps!r}")
    if max_iterations is not None and (not isinstance(max_iterations, int) or max_iterations < 1):
        raise ConfigError(f"max_iterations must be a positive integer or None; got {max_iterations!r}")
    if not 0.0 <= adanet_loss_decay < 1.0:
        raise ConfigError(f"adanet_loss_decay must be in [0, 1); got {adanet_loss_decay!r}")
    if config is None or config.model_dir is None:
        raise ConfigError(
            "AdaNet needs RunConfig(model_dir=...): iterations, architectures and the final ensemble live there"
        )
    if config.gradient_clip_norm is not None:
        raise ConfigError(
            "RunConfig.gradient_clip_norm would clip all candidates' gradients by one global norm, coupling "
            "them; clip inside a subnetwork's optimizer instead"
        )
    names = [e.name for e in ensemblers]
    if len(set(names)) != len(names):
        raise ConfigError(f"ensembler names must be unique; got {names}")


class Estimator:
    """AdaNet: grow an ensemble of subnetworks, one iteration at a time (Cortes et al., 2017).

    Args:
        head: the task's ``Head`` (loss, predictions, metrics).
        subnetwork_generator: proposes each iteration's ``Builder``s; must be deterministic.
        max_iteration_steps: training steps per iteration.
        ensemblers: how candidates combine subnetworks (default: one
            ``ComplexityRegularizedEnsembler()``, whose mixture weights stay at 1/N).
        ensemble_strategies: which candidate ensembles to form (default ``[GrowStrategy()]``).
        evaluator: choose by evaluating on data; default: by the bias-corrected moving
            average of each candidate's training ``adanet_loss``.
        metric_fn: extra evaluation metrics, ``fn(predictions, features, labels) -> {name:
            metric update}`` taking any of those arguments by name (see ``MetricFn``); they
            join the head's metrics for every candidate, every subnetwork (so an
            ``Evaluator`` may select on them) and the final ensemble, winning name conflicts.
        report_materializer: materialise the builders' reports after each iteration.
        force_grow: never choose the previous ensemble (candidate 0) at t > 0.
        replicate_ensemble_in_training: run the previous ensemble's frozen subnetworks in
            training mode (dropout on) while candidates train.
        adanet_loss_decay: decay of the moving average of ``adanet_loss``.
        max_iterations: stop after this many iterations (None: until ``max_steps``).
        replay_config: a ``replay.Config`` to repeat a recorded search without evaluating.
        config: a ``RunConfig`` with a ``model_dir`` (required: the search lives there).
        params: handed to ``input_fn``; stoker adds ``batch_size``, the replica fields and
            ``adanet_iteration`` (the iteration the data is for: vary the shuffle with it to
            give each iteration's subnetworks their own order of examples).
        train_batch_size / eval_batch_size / predict_batch_size: global batch sizes.
        report_dir: where reports go (default ``model_dir/report``).
    """

    def __init__(
        self,
        head: Head,
        subnetwork_generator: Generator,
        max_iteration_steps: int,
        *,
        ensemblers: Sequence[Ensembler] | None = None,
        ensemble_strategies: Sequence[Strategy] | None = None,
        evaluator: Evaluator | None = None,
        metric_fn: Callable[..., Mapping[str, Any]] | None = None,
        report_materializer: ReportMaterializer | None = None,
        force_grow: bool = False,
        replicate_ensemble_in_training: bool = False,
        adanet_loss_decay: float = 0.9,
        max_iterations: int | None = None,
        replay_config: ReplayConfig | None = None,
        config: RunConfig | None = None,
        params: Mapping[str, Any] | None = None,
        train_batch_size: int | None = None,
        eval_batch_size: int | None = None,
        predict_batch_size: int | None = None,
        report_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        ensemblers = list(ensemblers) if ensemblers else [ComplexityRegularizedEnsembler()]
        _check_arguments(
            head, subnetwork_generator, max_iteration_steps, max_iterations, adanet_loss_decay, config, ensemblers
        )
        assert config is not None and config.model_dir is not None  # _check_arguments raised otherwise
        self.head = head
        self.subnetwork_generator = subnetwork_generator
        self.max_iteration_steps = max_iteration_steps
        self.ensemblers = ensemblers
        self.ensemble_strategies = list(ensemble_strategies) if ensemble_strategies else [GrowStrategy()]
        self.evaluator = evaluator
        self.metric_fn = MetricFn(metric_fn) if metric_fn is not None else None
        self.report_materializer = report_materializer
        self.force_grow = bool(force_grow)
        self.replicate_ensemble_in_training = bool(replicate_ensemble_in_training)
        self.adanet_loss_decay = float(adanet_loss_decay)
        self.max_iterations = max_iterations
        self.replay_config = replay_config
        self.config = config
        self.params = dict(params or {})
        self.train_batch_size = train_batch_size
        self.eval_batch_size = eval_batch_size or train_batch_size
        self.predict_batch_size = predict_batch_size or self.eval_batch_size
        self.model_dir = storage.location(config.model_dir)  # a local Path or an fsspec URL (UrlPath)
        self.report_dir = storage.location(report_dir) if report_dir else self.model_dir / "report"
        self.history: list[dict[str, Any]] = []  # one entry per iteration finished by this object
        self._space = SearchSpace(
            head=head,
            generator=subnetwork_generator,
            strategies=self.ensemble_strategies,
            ensemblers=self.ensemblers,
            seed=config.seed,
            model_dir=self.model_dir,
            report_dir=self.report_dir if report_materializer is not None else None,
        )

    # ================================================================ state on disk
    @property
    def iteration_number(self) -> int:
        """How many iterations have finished (= the number of the next one)."""
        t = 0
        while storage.exists(architecture_path(self.model_dir, t)):
            t += 1
        return t

    def architecture(self, iteration_number: int | None = None) -> Architecture:
        """The ensemble chosen at ``iteration_number`` (default: the latest finished)."""
        t = self.iteration_number - 1 if iteration_number is None else iteration_number
        if t < 0:
            raise CheckpointError(f"no AdaNet iteration has finished in {self.model_dir} yet: train first")
        return read_architecture(self.model_dir, t)

    def selection(self, iteration_number: int) -> dict[str, Any]:
        """What was compared and chosen at ``iteration_number`` (``iteration-<t>/selection.json``)."""
        return _read_selection(self.model_dir, iteration_number)

    @property
    def global_step(self) -> int:
        """The newest global step on disk (finished iterations and the running one)."""
        t = self.iteration_number
        step = read_architecture(self.model_dir, t - 1).global_step if t > 0 else 0
        latest = CheckpointManager(self.model_dir / f"iteration-{t}", writer=False).latest_step()
        return max(step, latest or 0)

    def _example_features(self, input_fn: InputFn | None) -> Any:
        """The example batch every build uses (saved once, so every rebuild sees the same)."""
        batch_size = self.train_batch_size or EXAMPLE_ROWS
        return _example_features(self.model_dir, input_fn, {**self.params, "batch_size": batch_size}, self.config.seed)

    # ================================================================ training
    def iteration_estimator(self, iteration_number: int, input_fn: InputFn | None = None) -> PlainEstimator:
        """The plain ``stoker.Estimator`` of one iteration (its model: an ``IterationModel``)."""
        cfg = self.config.replace(
            model_dir=str(self.model_dir / f"iteration-{iteration_number}"),
            seed=self.config.seed + iteration_number,
            keep_best=None,
        )
        built: dict[str, IterationModel] = {}

        def build(params: dict[str, Any]) -> IterationModel:
            device = est.strategy.device
            features = tree_map(lambda t: t.to(device), self._example_features(input_fn))
            previous = _chosen_adanet_loss(self.model_dir, iteration_number - 1) if iteration_number > 0 else None
            model = self._space.build_iteration(
                iteration_number,
                features,
                device,
                adanet_loss_decay=self.adanet_loss_decay,
                replicate_ensemble_in_training=self.replicate_ensemble_in_training,
                previous_adanet_loss=previous,
                metric_fn=self.metric_fn,
            )
            built["model"] = model
            return model

        def optimizer(params: dict[str, Any], parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
            return built["model"].make_optimizer()

        def lr_schedule(params: dict[str, Any], opt: torch.optim.Optimizer) -> Any:
            return built["model"].make_schedule(opt)

        est = PlainEstimator(
            model=build,
            model_fn=_iteration_model_fn,
            optimizer=optimizer,
            lr_schedule=lr_schedule,
            config=cfg,
            params={**self.params, ITERATION_PARAM: iteration_number},
            train_batch_size=self.train_batch_size,
            eval_batch_size=self.eval_batch_size,
        )
        return est

    def train(
        self,
        input_fn: InputFn,
        steps: int | None = None,
        max_steps: int | None = None,
        hooks: Sequence[Hook] = (),
    ) -> Estimator:
        """Run iterations until ``max_iterations``, ``steps`` more steps or global step
        ``max_steps``. Resumes from ``model_dir``: mid-iteration or between iterations."""
        check_train_arguments(steps, max_steps)
        if self.train_batch_size is None:
            raise ConfigError("train: the AdaNet Estimator needs train_batch_size")
        if steps is not None:
            max_steps = self.global_step + steps
        self._example_features(input_fn)
        while True:
            t = self.iteration_number
            if self.max_iterations is not None and t >= self.max_iterations:
                log.info("adanet: max_iterations=%d reached", self.max_iterations)
                break
            start = read_architecture(self.model_dir, t - 1).global_step if t > 0 else 0
            if max_steps is not None and start >= max_steps:
                break
            end = start + self.max_iteration_steps
            target = end if max_steps is None else min(end, max_steps)
            est = self.iteration_estimator(t, input_fn)
            if est.latest_checkpoint() is None:
                est.global_step = start  # the global step runs on across iterations, as in the original
            log.info("adanet: iteration %d, steps %d..%d", t, start, end)
            est.train(input_fn, max_steps=target, hooks=[*hooks, DivergedCandidateHook()])
            if est.interrupted:
                break  # a signal (the process goes on): the iteration is not over, a later train continues it
            reached = est.global_step
            if reached < end and max_steps is not None and reached >= max_steps:
                break  # stopped by max_steps in the middle of the iteration; a later train continues it
            if reached <= start:
                raise DataError(f"adanet: iteration {t} trained no step: input_fn gave no batch")
            if reached < end:
                log.info(
                    "adanet: the data ended at step %d, before iteration %d's end at %d: the iteration ends here",
                    reached,
                    t,
                    end,
                )
            self._finish_iteration(t, est, reached)
        return self

    # ================================================================ choosing
    def _finish_iteration(self, t: int, est: PlainEstimator, step: int) -> None:
        """Choose, save the chosen ensemble and reports, then commit ``architecture-<t>.json``."""
        model = est.model
        assert isinstance(model, IterationModel)
        model.unpack()  # trained batched mixture weights -> each candidate's own combiner
        strategy = est.strategy
        # Every replica takes part in the selection (an Evaluator's evaluation is collective),
        # but replicas' moving averages can differ by their last batch: the chief's choice and
        # averages hold (one broadcast for both).
        chosen_by = choose(
            t, est, model, replay_config=self.replay_config, force_grow=self.force_grow, evaluator=self.evaluator
        )
        index, values, how, ema = strategy.broadcast_object((*chosen_by, model.moving_average_losses()))
        chosen = model.candidates[index]
        previous = read_architecture(self.model_dir, t - 1) if t > 0 else None
        arch = chosen_architecture(t, step, index, chosen, previous)
        members = {w.key for w in chosen.ensemble.weighted_subnetworks}
        reports = self.report_materializer.materialize(est, model, t, members) if self.report_materializer else None
        record = selection_record(t, step, model, index, values, how, ema)
        if strategy.is_chief:
            ensemble = EnsembleModel(chosen.ensemble)
            _commit_iteration(self.model_dir, self.report_dir, arch, ensemble, reports, record)
        strategy.barrier()  # every replica builds the next iteration from the files just written
        self.history.append(record)
        listing = ", ".join(f"{c['name']}={c['adanet_loss_ema']}" for c in record["candidates"])
        log.info(
            "adanet: iteration %d chose %r (index %d, by %s); adanet_loss moving averages: %s",
            t,
            chosen.name,
            index,
            how,
            listing,
        )

    # ================================================================ the final ensemble
    def final_ensemble(self, device: str | torch.device = "cpu") -> EnsembleModel:
        """The latest chosen ensemble as one module, its weights loaded (``weighted_subnetworks``
        gives each member and its mixture weight)."""
        arch = self.architecture()
        device = torch.device(device)
        features = tree_map(lambda t: t.to(device), self._example_features(None))
        step = torch.zeros((), dtype=torch.int64, device=device)
        ensemble = self._space.rebuild(arch.iteration_number, features, step, training=False)
        return self._space.load(ensemble, arch.global_step).to(device).eval()

    def _final_estimator(self) -> tuple[PlainEstimator, storage.Location]:
        arch = self.architecture()
        est = PlainEstimator(
            model=lambda params: self.final_ensemble(est.strategy.device),
            model_fn=self._final_model_fn,
            config=self.config.replace(model_dir=str(self.model_dir / FINAL_DIR), keep_best=None),
            params=self.params,
            train_batch_size=self.train_batch_size,
            eval_batch_size=self.eval_batch_size,
            predict_batch_size=self.predict_batch_size,
        )
        return est, final_checkpoint(self.model_dir, arch.global_step)

    def _final_model_fn(
        self, model: nn.Module, features: Any, labels: Any, mode: ModeKeys, params: dict[str, Any]
    ) -> EstimatorSpec:
        return self.head.spec(as_subnetwork(model(features)).logits, features, labels, mode, self.metric_fn)

    def evaluate(self, input_fn: InputFn, steps: int | None = None, name: str | None = None) -> dict[str, float]:
        """Evaluate the latest chosen ensemble (loss, the head's metrics and ``metric_fn``'s)."""
        est, ckpt = self._final_estimator()
        return est.evaluate(input_fn, steps=steps, checkpoint_path=ckpt, name=name)

    def predict(self, input_fn: InputFn, yield_single_examples: bool = True) -> Iterator[dict[str, torch.Tensor]]:
        """The head's predictions of the latest chosen ensemble for every example of ``input_fn``."""
        est, ckpt = self._final_estimator()
        return est.predict(input_fn, checkpoint_path=ckpt, yield_single_examples=yield_single_examples)

    def export(self, directory: str | os.PathLike[str], example_features: Any = None) -> storage.Location:
        """Write the final ensemble as a ``torch.export`` program (``ensemble.pt2``, any batch
        size), its weights (``model.safetensors``) and its ``architecture.json``; returns
        ``directory`` (a local path or an fsspec URL). ``example_features`` default to the run's
        saved example batch."""
        features = example_features if example_features is not None else self._example_features(None)
        return _write_export(storage.location(directory), self.final_ensemble(), features, self.architecture())


def _read_selection(model_dir: storage.Location, t: int) -> dict[str, Any]:
    """``iteration-<t>/selection.json``: what iteration ``t`` compared and chose."""
    return json.loads(read_text(model_dir / f"iteration-{t}" / "selection.json"))


def _chosen_adanet_loss(model_dir: storage.Location, t: int) -> float:
    """The moving average of ``adanet_loss`` that iteration ``t``'s chosen ensemble ended
    with (NaN if it had diverged)."""
    sel = _read_selection(model_dir, t)
    value = sel["candidates"][sel["chosen_index"]]["adanet_loss_ema"]
    return float("nan") if value is None else float(value)


def _commit_iteration(
    model_dir: storage.Location,
    report_dir: storage.Location,
    arch: Architecture,
    ensemble: EnsembleModel,
    reports: Sequence[Any] | None,
    record: Mapping[str, Any],
) -> None:
    """The chief's writes at the end of iteration ``arch.iteration_number``, in commit order:
    the reports, the chosen ensemble's checkpoint ``final/ckpt-<step>``, ``selection.json``,
    and last ``architecture-<t>.json``, the commit point."""
    t, step = arch.iteration_number, arch.global_step
    if reports is not None:
        text = json.dumps([r.to_dict() for r in reports], indent=1, sort_keys=True)
        atomic_write_text(report_dir / REPORT_FILE.format(t), text)
    final = CheckpointManager(model_dir / FINAL_DIR, keep_checkpoint_max=0)
    final.save(step, ensemble.state_dict(), {"global_step": step, "iteration_number": t})
    atomic_write_text(model_dir / f"iteration-{t}" / "selection.json", json.dumps(record, indent=1, sort_keys=True))
    write_architecture(model_dir, arch)  # the commit point of iteration t


def _write_export(out: storage.Location, model: EnsembleModel, features: Any, arch: Architecture) -> storage.Location:
    """``ensemble.pt2``, ``model.safetensors`` and ``architecture.json`` of ``model`` in ``out``."""
    if isinstance(out, Path):
        out.mkdir(parents=True, exist_ok=True)
        _export_ensemble(model, features, out)
    else:  # torch.export and safetensors write real files: build them locally, then upload
        with tempfile.TemporaryDirectory(prefix="stoker-export-") as tmp:
            _export_ensemble(model, features, Path(tmp))
            storage.write_all(
                [(out / name, (Path(tmp) / name).read_bytes()) for name in ("ensemble.pt2", "model.safetensors")]
            )
    atomic_write_text(out / "architecture.json", arch.serialize())
    return out


def _example_features(model_dir: storage.Location, input_fn: InputFn | None, params: dict[str, Any], seed: int) -> Any:
    """``model_dir``'s saved example batch; without one, the first rows of ``input_fn``'s first
    batch (called with ``params`` as one replica of iteration 0), saved."""
    path = model_dir / EXAMPLE_FEATURES
    if storage.exists(path):
        return torch.load(io.BytesIO(storage.read_bytes(path)), map_location="cpu", weights_only=True)
    if input_fn is None:
        raise CheckpointError(f"{path} is missing: train first (it is written by the first train call)")
    params = {**params, "num_replicas": 1, "replica_index": 0, "cache": None, ITERATION_PARAM: 0}
    return _save_example_features(path, _first_features(input_fn, params, seed))


def _save_example_features(path: storage.Location, features: Any) -> Any:
    """The first ``EXAMPLE_ROWS`` rows of ``features``, written to ``path`` (atomically;
    replicas write the same bytes, each through its own temporary name)."""
    example = tree_map(lambda t: t[:EXAMPLE_ROWS].clone(), features)
    buf = io.BytesIO()
    torch.save(example, buf)
    atomic_write_bytes(path, buf.getvalue())
    return example


def _export_ensemble(model: EnsembleModel, features: Any, out: Path) -> None:
    """``out/ensemble.pt2`` (a ``torch.export`` program for any batch size) and ``out/model.safetensors``."""
    args = features if isinstance(features, tuple) else (features,)
    batch = torch.export.Dim("batch")  # any batch size, not the example's
    dynamic = tree_map(lambda t: {0: batch}, args)
    program = torch.export.export(model, args, dynamic_shapes=dynamic)
    torch.export.save(program, str(out / "ensemble.pt2"))
    safetensors.torch.save_file(
        {k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors")
    )
