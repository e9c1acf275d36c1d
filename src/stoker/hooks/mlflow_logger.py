"""``MLflowLogger``: a training run logged to MLflow, one MLflow run across kills and restarts.

MLflow is imported when the hook starts, never before (``pip install 'stoker[mlflow]'``; the
``mlflow-skinny`` client is enough). What is logged and how each step is logged once is in
``stoker.hooks.tracking`` and docs/callbacks.md.

**Where the runs go.** ``tracking_uri`` if given, else ``MLFLOW_TRACKING_URI``, else a SQLite
database in the run's own folder: ``sqlite:///<model_dir>/mlflow.db``, with the artifacts in
``<model_dir>/mlruns`` (MLflow 3's recommended local store is a SQLite file; MLflow's own default
puts both in the current directory). A run without a local model_dir (kept in memory, or on an
object store) uses MLflow's default, and says so. MLflow 3.13 and later refuse a file store
(``file:./mlruns``, a plain path) unless ``MLFLOW_ALLOW_FILE_STORE=true``: such a URI is refused
when the hook is made, in one line naming the SQLite URI to use instead.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..errors import ConfigError
from .base import RunContext
from .tracking import Point, Tracker, TrackerHook, missing_extra

log = logging.getLogger("stoker")

_BATCH = 1000  # MLflow's limit of metrics per log_batch call
_REFUSES_FILE_STORE = (3, 13)  # the first MLflow that raises for a file store (without the opt-out)
DB_FILE = "mlflow.db"  # the default store's file in the model_dir
ARTIFACTS_DIR = "mlruns"  # and its artifacts' folder


class MLflowLogger(TrackerHook):
    """Log params, training loss and rates every ``every_n_steps`` (default
    ``RunConfig.log_every_n_steps``), every evaluation (as ``eval/<name>``) and the final and
    best checkpoints (artifacts under ``checkpoints/``) to MLflow.

    Args:
        tracking_uri: where MLflow keeps runs (default: ``MLFLOW_TRACKING_URI``, else
            ``sqlite:///<model_dir>/mlflow.db`` with the artifacts in ``<model_dir>/mlruns``).
        experiment: the experiment's name (created if missing; default MLflow's default).
        run_name: the new run's name.
        every_n_steps: how often training values are logged.
        log_checkpoints: log the final and best checkpoints as artifacts at the end.

    The MLflow run's id is kept in checkpoints: a resumed run continues the same MLflow run.
    ``run_id`` is that id once training has started.
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        *,
        every_n_steps: int | None = None,
        log_checkpoints: bool = True,
    ) -> None:
        super().__init__(every_n_steps, log_checkpoints)
        if tracking_uri is not None:
            check_tracking_uri(tracking_uri, "MLflowLogger: tracking_uri")
        elif os.environ.get("MLFLOW_TRACKING_URI"):
            check_tracking_uri(os.environ["MLFLOW_TRACKING_URI"], "MLflowLogger: MLFLOW_TRACKING_URI")
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name

    def _open(self, run: RunContext) -> Tracker:
        uri, artifacts = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None, None
        if uri is None:
            uri, artifacts = default_store(run.model_dir)
        return _MLflow(uri, artifacts, self.experiment, self.run_name)


def default_store(model_dir: str | None) -> tuple[str | None, Path | None]:
    """``(tracking URI, artifact folder)`` of a run given no URI: a SQLite database and an
    artifact folder in a local ``model_dir``, else MLflow's default (``(None, None)``); said in a
    log line either way."""
    if model_dir is None or "://" in model_dir:
        where = "no model_dir" if model_dir is None else f"model_dir {model_dir} is not a local folder"
        log.info(
            "MLflowLogger: %s: runs go to MLflow's default store (sqlite:///%s and ./%s in %s); give "
            "tracking_uri to keep them elsewhere",
            where,
            DB_FILE,
            ARTIFACTS_DIR,
            os.getcwd(),
        )
        return None, None
    folder = Path(model_dir).absolute()
    uri = f"sqlite:///{folder / DB_FILE}"
    log.info("MLflowLogger: runs go to %s, their artifacts to %s", uri, folder / ARTIFACTS_DIR)
    return uri, folder / ARTIFACTS_DIR


def check_tracking_uri(uri: str, name: str) -> None:
    """Refuse, in one line, a file-store URI (``file:...``, a plain path) that the installed
    MLflow would refuse (3.13 and later, without ``MLFLOW_ALLOW_FILE_STORE=true``), naming the
    SQLite URI of the same folder to use instead."""
    parsed = urlparse(uri)
    scheme = parsed.scheme if not re.match(r"^[A-Za-z]:[\\/]", uri) else ""  # C:\ is a path
    if scheme not in ("", "file") or uri == "databricks":  # MLflow's names for a Databricks workspace
        return
    if os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1"):
        return
    version = _mlflow_version()
    if version is None or version < _REFUSES_FILE_STORE:
        return
    folder = Path(unquote(parsed.path) if scheme == "file" else uri or ".").expanduser().absolute()
    shown = ".".join(map(str, version))
    raise ConfigError(
        f"{name}={uri!r} is a file store, which MLflow {shown} refuses; use "
        f"'sqlite:///{folder.parent / DB_FILE}' (a SQLite file; `mlflow migrate-filestore` moves an existing "
        "store into it), leave it unset for one in the model_dir, or set MLFLOW_ALLOW_FILE_STORE=true"
    )


def _mlflow_version() -> tuple[int, int] | None:
    """(major, minor) of the installed MLflow client (``None``: not installed or not readable)."""
    for dist in ("mlflow", "mlflow-skinny"):
        try:
            text = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        found = re.match(r"(\d+)\.(\d+)", text)
        if found:
            return int(found[1]), int(found[2])
    return None


class _MLflow(Tracker):
    def __init__(
        self, tracking_uri: str | None, artifacts: Path | None, experiment: str | None, run_name: str | None
    ) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise missing_extra("mlflow", "mlflow", "MLflowLogger") from e
        if artifacts is not None and tracking_uri is not None:
            _create_store(tracking_uri, artifacts)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment, self.run_name, self.artifacts = experiment, run_name, artifacts
        self.run_id = ""

    def start(self, run_id: str | None, params: Mapping[str, str]) -> str:
        from mlflow.entities import Param

        client = self.client
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            self.run_id = run_id
            return run_id
        experiment_id = "0"
        if self.experiment is not None:
            found = client.get_experiment_by_name(self.experiment)
            experiment_id = (
                found.experiment_id
                if found is not None
                else client.create_experiment(
                    self.experiment, artifact_location=str(self.artifacts) if self.artifacts else None
                )
            )
        self.run_id = client.create_run(experiment_id, run_name=self.run_name).info.run_id
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's limit of params per log_batch call
            client.log_batch(self.run_id, params=items[i : i + 100])
        return self.run_id

    def last_steps(self, keys: set[str]) -> dict[str, int]:
        out = {}
        for key in keys:
            history = self.client.get_metric_history(self.run_id, key)
            if history:
                out[key] = max(m.step for m in history)
        return out

    def log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's limit of params per log_batch call
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log(self, points: list[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key, value, wall, step) for key, value, step, wall in points]
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + _BATCH])

    def log_artifacts(self, directory: Path, name: str) -> None:
        self.client.log_artifacts(self.run_id, str(directory), name)

    def finish(self, ok: bool, interrupted: bool = False) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "KILLED" if interrupted else "FAILED")


def _create_store(uri: str, artifacts: Path) -> None:
    """Create the SQLite store ``uri`` (once) with ``artifacts`` as its default artifact root, so
    MLflow's Default experiment keeps its artifacts there, not in the current directory."""
    database = Path(uri.removeprefix("sqlite:///"))
    if database.exists():
        return
    if importlib.util.find_spec("sqlalchemy") is None or importlib.util.find_spec("alembic") is None:
        raise ImportError(
            f"MLflowLogger: the store {uri} needs SQLAlchemy and Alembic (pip install 'stoker[mlflow]', or the "
            "full mlflow package), or give tracking_uri (an MLflow server's http:// URL)"
        )
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    database.parent.mkdir(parents=True, exist_ok=True)
    SqlAlchemyStore(uri, str(artifacts))


__all__ = ["MLflowLogger", "check_tracking_uri", "default_store"]
