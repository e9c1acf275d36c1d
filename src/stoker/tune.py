"""``run_study``: an Optuna study whose trials are stoker training runs, each in its own model_dir.

The study lives in Optuna's RDB storage (e.g. ``sqlite:///study.db``) and every trial's
checkpoints in ``model_dir/trial-<N>``, so the whole search survives kill -9:

* trials that finished (complete or pruned) are never run again: running the same study again
  only runs the trials still missing up to ``n_trials``;
* a trial the kill interrupted (left ``RUNNING`` in the storage) is marked failed and retried as
  a new Optuna trial with the same parameters and the same ``trial-<N>`` directory, so its
  training resumes from its newest checkpoint (exactly, as every stoker run does);
* the sampler is seeded again before each trial from ``seed`` and the number of finished
  trials, so the trials a resumed study samples are those the uninterrupted one would have.

One process runs a study at a time (a ``RUNNING`` trial found at the start is taken as killed).
optuna is imported when a study runs (``pip install 'stoker[optuna]'``). See docs/callbacks.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from .errors import ConfigError

log = logging.getLogger("stoker")

TRIAL_ATTR = "stoker_trial"  # the user attr naming a trial's directory number


def run_study(
    objective: Callable[[Any, str], float],
    *,
    n_trials: int,
    storage: str,
    model_dir: str | os.PathLike[str],
    study_name: str = "stoker",
    direction: Literal["minimize", "maximize"] = "minimize",
    seed: int = 0,
    sampler: Callable[[int], Any] | None = None,
    pruner: Any = None,
) -> Any:
    """Run ``objective(trial, trial_model_dir) -> value`` until the study has ``n_trials``
    finished trials; return the ``optuna.Study``.

    Args:
        objective: trains one trial in ``trial_model_dir`` (e.g. ``train_and_evaluate`` with
            ``hooks=[OptunaPruning(trial, monitor)]``) and returns the value to optimise.
        n_trials: finished (complete or pruned) trials the study should have in the end.
        storage: an Optuna RDB URL, e.g. ``sqlite:///study.db``.
        model_dir: the trials' directories go under it (``trial-<N>``).
        study_name, direction: the Optuna study's (created, or loaded if it exists).
        seed: seeds the sampler before each trial (with the number of finished trials).
        sampler: ``sampler(seed) -> optuna sampler`` (default ``TPESampler(seed=seed)``).
        pruner: an Optuna pruner (default Optuna's ``MedianPruner``).
    """
    try:
        import optuna
    except ImportError as e:
        raise ImportError("stoker.tune needs the optuna package: pip install 'stoker[optuna]'") from e
    if not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigError(f"run_study: n_trials must be an integer >= 1; got {n_trials!r}")
    if direction not in ("minimize", "maximize"):
        raise ConfigError(f"run_study: direction must be 'minimize' or 'maximize'; got {direction!r}")
    make_sampler = sampler or (lambda s: optuna.samplers.TPESampler(seed=s))
    study = optuna.create_study(
        storage=storage, study_name=study_name, direction=direction, pruner=pruner, load_if_exists=True
    )
    _retry_killed(study, optuna)
    root = Path(model_dir)
    while True:
        done = len(finished_trials(study))
        if done >= n_trials:
            break
        study.sampler = make_sampler(seed + done)
        study.optimize(lambda trial: _run_trial(objective, trial, root), n_trials=1, catch=())
    return study


def finished_trials(study: Any) -> list[Any]:
    """The study's complete and pruned trials, in order."""
    from optuna.trial import TrialState

    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))


def _run_trial(objective: Callable[[Any, str], float], trial: Any, root: Path) -> float:
    number = trial.user_attrs.get(TRIAL_ATTR)
    if number is None:  # a new trial: the next directory number (a retry keeps its own)
        taken = [t.user_attrs[TRIAL_ATTR] for t in trial.study.get_trials(deepcopy=False) if TRIAL_ATTR in t.user_attrs]
        number = max(taken, default=-1) + 1
        trial.set_user_attr(TRIAL_ATTR, number)
    trial_dir = root / f"trial-{number}"
    trial.set_user_attr("model_dir", str(trial_dir))
    resumed = (trial_dir / "checkpoint.json").exists()
    log.info("tune: trial %d in %s%s", trial.number, trial_dir, " (resuming a killed trial)" if resumed else "")
    return objective(trial, str(trial_dir))


def _retry_killed(study: Any, optuna: Any) -> None:
    """Mark the trials a killed process left running as failed and queue each again, with its
    parameters and its directory (it resumes from its checkpoints)."""
    from optuna.trial import TrialState

    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        number = trial.user_attrs.get(TRIAL_ATTR, trial.number)
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(trial.params, user_attrs={TRIAL_ATTR: number})
        log.info("tune: trial %d was interrupted; it is queued again and resumes in trial-%d", trial.number, number)


__all__ = ["finished_trials", "run_study"]
