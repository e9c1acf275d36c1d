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

``storage`` is read by :func:`study_storage`: a plain path is a SQLite file, a SQLite file's
folder is created (as a model_dir is), and a URL that cannot work is one line naming it.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from .errors import ConfigError
from .storage import check_dir

log = logging.getLogger("stoker")

TRIAL_ATTR = "stoker_trial"  # the user attr naming a trial's directory number
#: the forms ``storage`` takes, for the errors
STORAGE_FORMS = (
    "sqlite:///relative/study.db, sqlite:////absolute/study.db, another SQLAlchemy URL "
    "(postgresql://user@host/db), a path of a SQLite file, or an optuna storage object"
)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # a URL's scheme (a path has none)


def run_study(
    objective: Callable[[Any, str], float],
    *,
    n_trials: int,
    storage: str | os.PathLike[str] | Any,
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
        storage: an Optuna RDB URL (``sqlite:///study.db``), a path of a SQLite file, or an
            optuna storage object (:func:`study_storage`).
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
    check_dir(model_dir, "run_study: model_dir")
    make_sampler = sampler or (lambda s: optuna.samplers.TPESampler(seed=s))
    url = study_storage(storage)
    try:
        study = optuna.create_study(
            storage=url, study_name=study_name, direction=direction, pruner=pruner, load_if_exists=True
        )
    except Exception as e:
        refused = _storage_error(e, storage)
        if refused is None:
            raise
        raise refused from None
    _retry_killed(study, optuna)
    root = Path(model_dir)
    while True:
        done = len(finished_trials(study))
        if done >= n_trials:
            break
        study.sampler = make_sampler(seed + done)
        study.optimize(lambda trial: _run_trial(objective, trial, root), n_trials=1, catch=())
    return study


def study_storage(storage: str | os.PathLike[str] | Any) -> Any:
    """What ``optuna.create_study(storage=...)`` is given for ``storage``.

    * an optuna storage object (``JournalStorage``, ``RDBStorage``): as it is;
    * a path without a URL scheme (``study.db``, ``runs/study.db``): the SQLite file there,
      ``sqlite:///<absolute path>`` (said in a log line), its folder created;
    * ``sqlite:///<path>``: as it is, its folder created (as for a model_dir);
    * another SQLAlchemy URL (``postgresql://...``): as it is, once its driver imports.

    Anything else is a one-line :class:`~stoker.errors.ConfigError` naming ``storage`` and the
    forms it takes: a malformed URL, a database kind SQLAlchemy does not know, a driver that is
    not installed, a SQLite file that is a folder or whose folder cannot be made.
    """
    if not isinstance(storage, (str, os.PathLike)):
        return storage
    text = os.fspath(storage)
    if "://" not in text and not _SCHEME.match(text):
        path = Path(text).expanduser().absolute()
        _sqlite_folder(path, text)
        url = f"sqlite:///{path}"
        log.info("tune: storage %r is a path: the study is kept in the SQLite file %s", text, url)
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(text)
    except ArgumentError:
        raise ConfigError(f"run_study: storage {text!r} is not a database URL; give {STORAGE_FORMS}") from None
    shown = parsed.render_as_string(hide_password=True)
    try:
        parsed.get_dialect().import_dbapi()
    except NoSuchModuleError:
        raise ConfigError(
            f"run_study: storage {shown!r}: {parsed.drivername!r} is not a database SQLAlchemy knows; "
            f"give {STORAGE_FORMS}"
        ) from None
    except ImportError as e:
        raise ConfigError(
            f"run_study: storage {shown!r} needs the {parsed.drivername} driver, which is not installed ({e})"
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        if not parsed.database.startswith("file:"):  # a sqlite URI (?uri=true) is the user's own
            _sqlite_folder(Path(parsed.database).expanduser().absolute(), shown)
    return text


def _sqlite_folder(path: Path, shown: str) -> None:
    """Make the folder of the SQLite file ``path``, or say in one line why it cannot be."""
    if path.is_dir():
        raise ConfigError(
            f"run_study: storage {shown!r}: {str(path)!r} is a folder; name the SQLite file in it "
            f"(e.g. {str(path / 'study.db')!r})"
        )
    try:
        check_dir(path.parent, "the folder")
    except ConfigError as e:
        raise ConfigError(f"run_study: storage {shown!r}: {e}") from None
    path.parent.mkdir(parents=True, exist_ok=True)


def _storage_error(e: Exception, storage: Any) -> ConfigError | None:
    """A database that refused to open, as one line naming ``storage`` (``None``: ``e`` is
    another error, raised as it is)."""
    from sqlalchemy.exc import SQLAlchemyError

    if not isinstance(e, SQLAlchemyError) or not isinstance(storage, (str, os.PathLike)):
        return None
    cause = str(getattr(e, "orig", None) or e).splitlines()[0]
    text = os.fspath(storage)
    if "://" in text:
        from sqlalchemy.engine import make_url

        text = make_url(text).render_as_string(hide_password=True)
    return ConfigError(f"run_study: storage {text!r} cannot be opened: {cause}")


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


__all__ = ["STORAGE_FORMS", "finished_trials", "run_study", "study_storage"]
