"""MLflowLogger and WandbLogger against a real MLflow file store and W&B's offline mode, read
back through their own readers; one tracker run with each step once after kill -9."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from callback_runs import kill_at_random_moments, run_to_end

from helpers.processes import python_env
from helpers.tiny import eval_input, make_data, make_estimator, train_input

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

import stoker  # noqa: E402
from stoker.hooks.wandb_logger import offline_files  # noqa: E402


@pytest.fixture(autouse=True)
def _file_store(monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind a flag


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_mlflow_logs_params_training_values_evaluations_and_checkpoints(tmp_path):
    uri = (tmp_path / "mlruns").as_uri()
    x, y = make_data(48)
    est = make_estimator(
        tmp_path / "m", iterations_per_loop=2, log_every_n_steps=4, keep_best=("accuracy", "max"), params={"width": 16}
    )
    logger = stoker.hooks.MLflowLogger(tracking_uri=uri, experiment="tiny", run_name="first")
    results = est.train_and_evaluate(
        train_input(x, y), eval_input(x, y), max_steps=12, eval_every_n_steps=6, hooks=[logger]
    )
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert run.data.params["width"] == "16" and run.data.params["global_batch_size"] == "16"
    assert [s for s, _ in history(client, logger.run_id, "loss")] == [4, 8, 12]
    assert [s for s, _ in history(client, logger.run_id, "learning_rate")] == [4, 8, 12]
    assert history(client, logger.run_id, "eval/accuracy")[-1] == (12, results["accuracy"])
    assert [s for s, _ in history(client, logger.run_id, "eval/loss")] == [6, 12]
    artifacts = {a.path for a in client.list_artifacts(logger.run_id, "checkpoints")}
    assert "checkpoints/ckpt-12" in artifacts
    files = {a.path for a in client.list_artifacts(logger.run_id, "checkpoints/ckpt-12")}
    assert "checkpoints/ckpt-12/model.safetensors" in files


def test_mlflow_resumes_the_same_run_without_repeating_a_step(tmp_path):
    uri = (tmp_path / "mlruns").as_uri()
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2, log_every_n_steps=2, save_checkpoints_steps=4)
    first = stoker.hooks.MLflowLogger(tracking_uri=uri, experiment="tiny")
    est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=8, eval_every_n_steps=4, hooks=[first])
    again = make_estimator(tmp_path / "m", iterations_per_loop=2, log_every_n_steps=2, save_checkpoints_steps=4)
    second = stoker.hooks.MLflowLogger(tracking_uri=uri, experiment="tiny")
    again.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=16, eval_every_n_steps=4, hooks=[second])
    assert second.run_id == first.run_id
    client = MlflowClient(tracking_uri=uri)
    assert len(client.search_runs([client.get_experiment_by_name("tiny").experiment_id])) == 1
    assert [s for s, _ in history(client, first.run_id, "loss")] == [2, 4, 6, 8, 10, 12, 14, 16]
    assert [s for s, _ in history(client, first.run_id, "eval/loss")] == [4, 8, 12, 16]


def test_without_a_tracking_uri_the_store_is_in_the_model_dir(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    x, y = make_data(48)
    logger = stoker.hooks.MLflowLogger(experiment="tiny")
    with caplog.at_level("INFO", logger="stoker"):
        make_estimator("m", iterations_per_loop=2, log_every_n_steps=2).train(
            train_input(x, y), max_steps=4, hooks=[logger]
        )
    model_dir = tmp_path / "m"
    uri = f"sqlite:///{model_dir / 'mlflow.db'}"
    assert f"MLflowLogger: runs go to {uri}, their artifacts to {model_dir / 'mlruns'}" in caplog.messages
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # nothing in the current directory
    client = MlflowClient(tracking_uri=uri)
    assert [s for s, _ in history(client, logger.run_id, "loss")] == [2, 4]
    artifacts = client.get_run(logger.run_id).info.artifact_uri
    assert artifacts.startswith(str(model_dir / "mlruns")) or artifacts.startswith((model_dir / "mlruns").as_uri())
    assert (model_dir / "mlruns").is_dir() and any((model_dir / "mlruns").rglob("model.safetensors"))
    again = stoker.hooks.MLflowLogger(experiment="tiny")  # a rerun continues the same MLflow run there
    make_estimator("m", iterations_per_loop=2, log_every_n_steps=2).train(train_input(x, y), max_steps=8, hooks=[again])
    assert again.run_id == logger.run_id
    assert [s for s, _ in history(client, logger.run_id, "loss")] == [2, 4, 6, 8]


def test_without_a_model_dir_mlflow_s_default_store_is_used_and_said(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    x, y = make_data(48)
    logger = stoker.hooks.MLflowLogger()
    with caplog.at_level("INFO", logger="stoker"):
        make_estimator(None, iterations_per_loop=2).train(train_input(x, y), max_steps=2, hooks=[logger])
    assert (
        "MLflowLogger: no model_dir: runs go to MLflow's default store (sqlite:///mlflow.db and ./mlruns in "
        f"{tmp_path}); give tracking_uri to keep them elsewhere"
    ) in caplog.messages
    assert MlflowClient(tracking_uri="sqlite:///mlflow.db").get_run(logger.run_id).info.status == "FINISHED"


@pytest.mark.parametrize("form", ["file:{d}/mlruns", "file://{d}/mlruns", "{d}/mlruns"])
def test_a_file_store_uri_is_refused_in_one_line_with_the_sqlite_uri(tmp_path, monkeypatch, form):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    from stoker.hooks.mlflow_logger import _mlflow_version

    if _mlflow_version() < (3, 13):
        pytest.skip("MLflow before 3.13 keeps file stores")
    uri = form.format(d=tmp_path)
    with pytest.raises(stoker.errors.ConfigError) as e:
        stoker.hooks.MLflowLogger(tracking_uri=uri)
    major, minor = _mlflow_version()
    assert str(e.value) == (
        f"MLflowLogger: tracking_uri={uri!r} is a file store, which MLflow {major}.{minor} refuses; use "
        f"'sqlite:///{tmp_path / 'mlflow.db'}' (a SQLite file; `mlflow migrate-filestore` moves an existing store "
        "into it), leave it unset for one in the model_dir, or set MLFLOW_ALLOW_FILE_STORE=true"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the same from the environment
    with pytest.raises(stoker.errors.ConfigError, match=r"^MLflowLogger: MLFLOW_TRACKING_URI='.*' is a file store"):
        stoker.hooks.MLflowLogger()
    assert list(tmp_path.iterdir()) == []  # refused when made: nothing written
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's opt-out is honoured
    stoker.hooks.MLflowLogger(tracking_uri=uri)
    stoker.hooks.MLflowLogger(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    stoker.hooks.MLflowLogger(tracking_uri="http://127.0.0.1:5000")


def test_mlflow_3_13_refuses_a_file_store_as_the_hook_says(tmp_path, monkeypatch):
    """What the refusal above stands for: the installed MLflow's own exception."""
    from mlflow.exceptions import MlflowException

    from stoker.hooks.mlflow_logger import _mlflow_version

    if _mlflow_version() < (3, 13):
        pytest.skip("MLflow before 3.13 keeps file stores")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    with pytest.raises(MlflowException, match="MLFLOW_ALLOW_FILE_STORE=true"):
        MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri()).create_experiment("x")


def test_without_the_package_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2)
    with pytest.raises(ImportError, match=r"pip install 'stoker\[mlflow\]'"):
        est.train(train_input(x, y), max_steps=2, hooks=[stoker.hooks.MLflowLogger()])


def test_importing_the_hooks_imports_no_tracker():
    code = (
        "import sys, stoker.hooks; stoker.hooks.EarlyStopping; stoker.hooks.MLflowLogger; stoker.hooks.WandbLogger;"
        " stoker.hooks.OptunaPruning; print(sorted(m for m in ('mlflow', 'wandb', 'optuna') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_mlflow_kill_9_anywhere_gives_one_run_with_each_step_once(tmp_path):
    env = {**python_env(), "MLFLOW_ALLOW_FILE_STORE": "true"}
    ref_uri, uri = (tmp_path / "ref-mlruns").as_uri(), (tmp_path / "mlruns").as_uri()
    run_to_end(tmp_path / "ref", "--mlflow", ref_uri, "--max_steps", "40", env=env)
    kill_at_random_moments(tmp_path / "killed", "--mlflow", uri, "--max_steps", "40", times=3, seed=3, env=env)
    run_to_end(tmp_path / "killed", "--mlflow", uri, "--max_steps", "40", env=env)
    ref_client, client = MlflowClient(tracking_uri=ref_uri), MlflowClient(tracking_uri=uri)
    (ref_run,) = ref_client.search_runs([ref_client.get_experiment_by_name("callbacks").experiment_id])
    (run,) = client.search_runs([client.get_experiment_by_name("callbacks").experiment_id])  # one run
    assert run.info.status == "FINISHED"
    for key in ("loss", "learning_rate", "eval/loss", "eval/accuracy"):
        got, want = history(client, run.info.run_id, key), history(ref_client, ref_run.info.run_id, key)
        assert got == want, key  # each step once, with the uninterrupted run's values
    steps = [s for s, _ in history(client, run.info.run_id, "steps_per_sec")]
    assert steps == sorted(set(steps))


if os.environ.get("WANDB_TESTS_SKIP"):  # pragma: no cover
    pytest.skip("W&B tests skipped", allow_module_level=True)


def wandb_history(root, run_id: str, artifacts: list[tuple[str, list[str]]] | None = None) -> list[dict[str, float]]:
    """The history rows of every offline file of ``run_id`` under ``root`` (and its artifacts,
    name and files, into ``artifacts``), read as W&B writes them: a LevelDB-style log of
    ``wandb_internal_pb2.Record`` protobufs."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for path in offline_files(root / "wandb", run_id):
        data, pos, buf = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if length == 0 and kind == 0:
                pos += left
                continue
            buf += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a whole record, or its last piece
                record = pb.Record()
                record.ParseFromString(buf)
                buf = b""
                if record.WhichOneof("record_type") == "artifact" and artifacts is not None:
                    artifacts.append((record.artifact.name, sorted(e.path for e in record.artifact.manifest.contents)))
                if record.WhichOneof("record_type") == "history":
                    items = record.history.item
                    rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def test_offline_files_are_a_runs_folders_oldest_first_suffixed_ones_included(tmp_path):
    names = [
        "offline-run-20260101_000001-abc",
        "offline-run-20260101_000000-abc-10",
        "offline-run-20260101_000000-abc-2",
        "offline-run-20260101_000000-abc",
        "offline-run-20260101_000000-xabc",  # other runs, whatever their folder's name
        "offline-run-20260101_000000-abc-x",
    ]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"run-{'xabc' if name.endswith('xabc') else 'abc'}.wandb").touch()
    found = [p.relative_to(tmp_path).as_posix() for p in offline_files(tmp_path, "abc")]
    assert found == [f"{n}/run-abc.wandb" for n in (names[3], names[2], names[1], names[0])]


def test_wandb_offline_one_run_each_step_once(tmp_path, monkeypatch):
    """Both starts in one second, pinned (W&B names the second folder ``offline-run-<time>-<id>-1``):
    the rows of that folder were missed, and the test failed whenever the runs were that quick."""
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    x, y = make_data(48)
    hooks = []
    start = time.time()

    class StartClock:  # wandb.init's only use of time is the start time its folder is named by
        def __getattr__(self, name: str) -> object:
            return getattr(time, name)

        def time(self) -> float:
            return start

    monkeypatch.setattr(wandb.sdk.wandb_init, "time", StartClock())
    for max_steps in (8, 16):
        est = make_estimator(tmp_path / "m", iterations_per_loop=2, log_every_n_steps=4, save_checkpoints_steps=4)
        hook = stoker.hooks.WandbLogger(project="tiny", dir=str(tmp_path), log_checkpoints=max_steps == 16)
        est.train_and_evaluate(
            train_input(x, y), eval_input(x, y), max_steps=max_steps, eval_every_n_steps=8, hooks=[hook]
        )
        hooks.append(hook)
    assert hooks[0].run_id == hooks[1].run_id
    deadline = time.monotonic() + 30
    while len(rows := wandb_history(tmp_path, hooks[0].run_id)) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)  # wandb's service process may still be writing the last file
    assert [p.parent.name.rsplit("-", 1)[1] for p in offline_files(tmp_path / "wandb", hooks[0].run_id)] == [
        hooks[0].run_id,
        "1",
    ]
    steps = [r["_step"] for r in rows]
    assert steps == sorted(set(steps)) == [4, 8, 12, 16]  # each step once, in order, across the two runs
    assert [r["_step"] for r in rows if "eval/loss" in r] == [8, 16]
    assert all("loss" in r and "learning_rate" in r for r in rows)
    artifacts: list[tuple[str, list[str]]] = []
    wandb_history(tmp_path, hooks[0].run_id, artifacts)
    files = ["evaluation.json", "input-0.json", "manifest.json", "model.safetensors", "train_state.pt"]
    assert (f"{hooks[0].run_id}-ckpt-16", files) in artifacts  # the checkpoint with its own manifest


@pytest.mark.slow
def test_two_replicas_log_one_run_from_the_chief_and_stop_together(tmp_path):
    from callback_runs import SCRIPT

    from helpers.processes import launch_replicas

    uri = (tmp_path / "mlruns").as_uri()
    args = (
        "--model_dir",
        str(tmp_path / "m"),
        "--mlflow",
        uri,
        "--max_steps",
        "40",
        "--early_stopping",
        "loss:min:1:10",
    )
    procs = launch_replicas(SCRIPT, 2, *args)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    steps = {json.loads(out.strip().splitlines()[-1])["global_step"] for out, _ in outs}
    assert steps == {8}  # both replicas stop at the 2nd evaluation
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("callbacks").experiment_id])
    assert [s for s, _ in history(client, run.info.run_id, "eval/loss")] == [4, 8]
    # the script logs every 3 steps in loops of 2: loops end at the logging steps too (docs/device_loop.md),
    # so the chief logs at 3 and 6, and the rest of the interval when the run stops at 8
    assert [s for s, _ in history(client, run.info.run_id, "loss")] == [3, 6, 8]


def wandb_series(rows: list[dict[str, float]], key: str) -> list[tuple[int, float]]:
    return [(int(r["_step"]), r[key]) for r in rows if key in r]


@pytest.mark.slow
def test_wandb_kill_9_anywhere_gives_one_run_with_each_step_once(tmp_path):
    pytest.importorskip("wandb")
    env = {**python_env(), "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path / "wandb-dir")}
    args = ("--max_steps", "40")
    run_to_end(tmp_path / "ref", "--wandb", str(tmp_path / "ref-wb"), *args, env=env)
    # killed mid-loop, inside a checkpoint write and mid-loop again, then run to the end
    kill_at_random_moments(tmp_path / "killed", "--wandb", str(tmp_path / "wb"), *args, times=3, seed=3, env=env)
    run_to_end(tmp_path / "killed", "--wandb", str(tmp_path / "wb"), *args, env=env)
    (ref_dir,) = (tmp_path / "ref-wb" / "wandb").glob("offline-run-*")
    ref_rows = wandb_history(tmp_path / "ref-wb", ref_dir.name.rsplit("-", 1)[1])
    dirs = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    (run_id,) = {d.name.rsplit("-", 1)[1] for d in dirs}  # one W&B run across the four processes
    assert len(dirs) == 4, dirs  # one offline directory per process
    rows = wandb_history(tmp_path / "wb", run_id)  # every file, oldest first
    steps = [r["_step"] for r in rows]
    assert steps == sorted(set(steps)) == [r["_step"] for r in ref_rows]  # each step once, in order, none lost
    for key in ("loss", "learning_rate", "eval/loss", "eval/accuracy"):
        assert wandb_series(rows, key) == wandb_series(ref_rows, key), key  # the uninterrupted run's values
