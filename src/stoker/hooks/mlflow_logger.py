"""``MLflowLogger``: a training run logged to MLflow, one MLflow run across kills and restarts.

MLflow is imported when the hook starts, never before (``pip install 'stoker[mlflow]'``; the
``mlflow-skinny`` client is enough). What is logged and how each step is logged once is in
``stoker.hooks.tracking`` and docs/callbacks.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .base import RunContext
from .tracking import Point, Tracker, TrackerHook, missing_extra

_BATCH = 1000  # MLflow's limit of metrics per log_batch call


class MLflowLogger(TrackerHook):
    """Log params, training loss and rates every ``every_n_steps`` (default
    ``RunConfig.log_every_n_steps``), every evaluation (as ``eval/<name>``) and the final and
    best checkpoints (artifacts under ``checkpoints/``) to MLflow.

    Args:
        tracking_uri: where MLflow keeps runs (default: MLflow's own, ``MLFLOW_TRACKING_URI``).
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
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name

    def _open(self, run: RunContext) -> Tracker:
        return _MLflow(self.tracking_uri, self.experiment, self.run_name)


class _MLflow(Tracker):
    def __init__(self, tracking_uri: str | None, experiment: str | None, run_name: str | None) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise missing_extra("mlflow", "mlflow", "MLflowLogger") from e
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.experiment, self.run_name = experiment, run_name
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
            experiment_id = found.experiment_id if found is not None else client.create_experiment(self.experiment)
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

    def log(self, points: list[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(key, value, wall, step) for key, value, step, wall in points]
        for i in range(0, len(metrics), _BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + _BATCH])

    def log_artifacts(self, directory: Path, name: str) -> None:
        self.client.log_artifacts(self.run_id, str(directory), name)

    def finish(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


__all__ = ["MLflowLogger"]
