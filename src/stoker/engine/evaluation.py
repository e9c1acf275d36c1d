"""``EvaluationRun``: exact loss and metrics of one set of weights over an input, on every replica.

Batches are padded to the static eval batch and masked, so a ragged last batch counts each
real example once; sums stay on the device and are reduced across replicas in one collective
at the end. The run then reports: a log line, TensorBoard scalars in ``model_dir`` and the
result recorded on the evaluated checkpoint (which feeds ``RunConfig.keep_best``).

Evaluation leaves training untouched: it runs with freshly seeded, then restored, RNGs and puts
the model back into training mode if it was.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from ..config.slices import EvalConfig
from ..errors import ConfigError, DataError
from ..metrics import MetricAccumulator
from ..spec import EstimatorSpec, ModeKeys
from ..storage import Location
from ..summary.writer import ScalarWriter
from .infeed import Batch
from .inputs import InputFn, InputPlan, isolated_rng
from .loop import ModelFn, check_spec, detach_cache
from .model_state import ModelState

log = logging.getLogger("stoker")


class EvaluationRun:
    """Evaluates the weights a ``ModelState`` puts in use; reports and records the result."""

    def __init__(self, state: ModelState, inputs: InputPlan, model_fn: ModelFn, *, config: EvalConfig) -> None:
        self.state = state
        self.inputs = inputs
        self.model_fn = model_fn
        self.config = config
        self.strategy = state.strategy
        self._writer: ScalarWriter | None = None  # one events file per Estimator, not per evaluation

    def run(
        self,
        input_fn: InputFn,
        steps: int | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        name: str | None = None,
    ) -> dict[str, float]:
        """``loss``, every metric and ``global_step`` of ``input_fn`` (all, or ``steps`` batches)."""
        results, evaluated = self.compute(input_fn, steps, checkpoint_path)
        self._report(int(results["global_step"]), evaluated, results, name)
        return results

    def compute(
        self, input_fn: InputFn, steps: int | None = None, checkpoint_path: str | os.PathLike[str] | None = None
    ) -> tuple[dict[str, float], Location | None]:
        """The results of :meth:`run` and the checkpoint evaluated (``None``: weights in memory),
        without reporting them (a watching evaluator reports its own way)."""
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ConfigError(f"evaluate: steps must be a positive integer or None; got {steps!r}")
        params = self.inputs.mode_params(ModeKeys.EVAL)
        self.state.wait_for_checkpoint(everywhere=True)  # the chief's asynchronous write of it, on every replica
        step, evaluated = self.state.weights_for_inference(checkpoint_path, "evaluate")
        model = self.state.build_model()
        module = self.state.module
        assert module is not None  # build_model() set it
        was_training = model.training
        model.eval()
        sums = _EvalSums(self.strategy.device)
        with (
            isolated_rng(self.config.seed),
            torch.no_grad(),
            self.state.inference_weights(),  # RunConfig.ema's average, where it asks so
            self.inputs.infeed(input_fn, ModeKeys.EVAL, params) as infeed,
        ):
            for i, batch in enumerate(self.inputs.in_lockstep(infeed)):
                with self.state.precision.forward_context(self.strategy.device):
                    spec = self.model_fn(module, batch.features, batch.labels, ModeKeys.EVAL, params)
                spec = check_spec(spec, ModeKeys.EVAL)
                params["cache"] = detach_cache(spec.cache)
                sums.add(spec, batch)
                if steps is not None and i + 1 >= steps:
                    break
        results, batches = sums.results(self.strategy.all_reduce_sum)
        if not batches:  # an empty evaluation is not one: say so, never report it as results
            raise DataError(
                "evaluate: input_fn yielded no batch (an empty data set, or a source already at its end); "
                "nothing was evaluated"
            )
        results["global_step"] = step
        if was_training:
            model.train()
        return results, evaluated

    def _report(self, step: int, evaluated: Location | None, results: dict[str, float], name: str | None) -> None:
        if not self.strategy.is_chief:
            return
        label = f"eval_{name}" if name else "eval"
        log.info(
            "%s at step %d: %s",
            label,
            step,
            ", ".join(f"{k} = {v:.6g}" for k, v in results.items() if k != "global_step"),
        )
        checkpoints = self.state.checkpoints
        if checkpoints is None:
            return
        if self.config.summaries:
            if self._writer is None:
                self._writer = ScalarWriter(checkpoints.model_dir, tensorboard=True)
            self._writer.write(step, {k: v for k, v in results.items() if k != "global_step"}, prefix=f"{label}/")
            self._writer.flush()
        if name is None and evaluated is not None and evaluated.parent == checkpoints.model_dir:
            self.state.wait_for_checkpoint()  # the index names an asynchronous save once it is written
            if checkpoints.record_eval(step, results):
                assert self.config.keep_best is not None  # record_eval finds a best only with keep_best
                log.info("ckpt-%d is the best so far by %s", step, self.config.keep_best[0])


class _EvalSums:
    """Masked sums of the loss and every metric over an evaluation, kept on the device."""

    def __init__(self, device: torch.device) -> None:
        self.metrics = MetricAccumulator()
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.loss_count = torch.zeros((), dtype=torch.float64, device=device)
        self.batches = 0
        self.warned = False

    def add(self, spec: EstimatorSpec, batch: Batch) -> None:
        self.batches += 1
        mask = batch.mask
        real = mask.to(torch.float64) if mask is not None else None
        if spec.loss is not None:
            loss = spec.loss.detach().to(torch.float64)
            if loss.dim() == 0:
                if batch.rows < (mask.shape[0] if mask is not None else batch.rows) and not self.warned:
                    log.warning(
                        "evaluate: model_fn returned a batch-mean loss for a padded batch; return "
                        "per-example losses (reduction='none') in EVAL mode for an exact eval loss"
                    )
                    self.warned = True
                self.loss_sum += loss * batch.rows
                self.loss_count += batch.rows
            else:
                loss = loss.reshape(loss.shape[0], -1).mean(1)
                self.loss_sum += (loss * real).sum() if real is not None else loss.sum()
                self.loss_count += real.sum() if real is not None else loss.shape[0]
        for metric_name, update in (spec.eval_metrics or {}).items():
            self.metrics.add(metric_name, update, real)

    def results(self, all_reduce_sum: Any) -> tuple[dict[str, float], int]:
        """The mean loss and every metric, and the batches evaluated, after one sum over replicas."""
        keys, totals = self.metrics.flat_totals()
        batches = torch.tensor(float(self.batches), dtype=torch.float64, device=self.loss_sum.device)
        packed = torch.cat(
            [
                torch.stack([self.loss_sum, self.loss_count, batches]),
                totals if totals is not None else self.loss_sum.new_zeros(0),
            ]
        )
        values = all_reduce_sum(packed).cpu().tolist()
        results: dict[str, float] = {}
        if values[1] > 0:
            results["loss"] = values[0] / values[1]
        results.update(self.metrics.results(keys, values[3:]))
        return results, int(values[2])


__all__ = ["EvaluationRun"]
