"""The Estimator's components, one job each; ``stoker.Estimator`` wires them together.

- ``ModelState``: builds the model, optimizer, schedule and loss scaler; restores and saves
  them (checkpoints, warm start); knows which checkpoint memory holds.
- ``InputPlan``: global batch sizes per mode, per-replica params for ``input_fn`` and
  ``model_fn``, infeeds, replicas in lockstep.
- ``TrainingRun``: one ``train`` call: hooks between device loops (``loop.py``).
- ``EvaluationRun``: exact loss and metrics, reported and recorded on the checkpoint.
- ``PredictionRun``: predictions in input order, gathered from every replica.
- ``ContinuousEvaluation``: a separate process evaluating each new checkpoint as training
  writes it, recording the results in the index.

Also here: the device loop (``loop.py``) and the infeed (``infeed.py``) that drive a training
step, the step variants ``steps.py`` picks (``compiled_step.py``, ``cuda_graph_step.py``,
``pipeline_step.py``), and ``stoker evaluate`` (``cli.py``).

The bench harness, AdaNet and a watching evaluator can use any of them on their own. The
engine may import the layers below it (checkpoint, storage, data, distributed, hooks, memory,
summary, run_spec and the top-level config, spec, precision, metrics, rng, errors); it never
imports the harness, the recipes, AdaNet, serving or the ``stoker`` command.
"""

from .evaluation import EvaluationRun
from .evaluator import (
    ContinuousEvalConfig,
    ContinuousEvalResult,
    ContinuousEvaluation,
    evaluation_on_device,
    watching,
)
from .inputs import InputFn, InputPlan, check_batch_size, isolated_rng
from .model_fn import bind_model_fn
from .model_state import ModelArg, ModelState, OptimizerFn, ScheduleFn
from .prediction import PredictionRun, check_predictions
from .training import (
    TrainingRun,
    check_train_arguments,
    default_hooks,
    evaluation_schedule,
    train_end,
    train_hooks,
)

__all__ = [
    "ContinuousEvalConfig",
    "ContinuousEvalResult",
    "ContinuousEvaluation",
    "EvaluationRun",
    "InputFn",
    "InputPlan",
    "ModelArg",
    "ModelState",
    "OptimizerFn",
    "PredictionRun",
    "ScheduleFn",
    "TrainingRun",
    "bind_model_fn",
    "check_batch_size",
    "check_predictions",
    "check_train_arguments",
    "default_hooks",
    "evaluation_schedule",
    "train_end",
    "evaluation_on_device",
    "isolated_rng",
    "train_hooks",
    "watching",
]
