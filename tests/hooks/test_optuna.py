"""OptunaPruning and stoker.tune: reports, a clean prune, and a study killed with SIGKILL that
resumes (the interrupted trial from its checkpoint) to the same trials as an uninterrupted one."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

from helpers.paths import ROOT
from helpers.processes import PYTHON, finished, in_background, popen, python_env
from helpers.tiny import eval_input, make_data, make_estimator, train_input

optuna = pytest.importorskip("optuna")

import stoker  # noqa: E402
import stoker.tune  # noqa: E402
from stoker.errors import ConfigError  # noqa: E402
from stoker.tune import run_study  # noqa: E402

EXAMPLE = ROOT / "examples" / "tune_digits.py"


def test_reports_each_evaluation_and_prunes_cleanly(tmp_path):
    study = optuna.create_study(
        pruner=optuna.pruners.ThresholdPruner(lower=2.0, n_warmup_steps=6)
    )  # any top2, after step 6
    trial = study.ask()
    x, y = make_data(48)
    est = make_estimator(tmp_path / "m", iterations_per_loop=2)
    with pytest.raises(optuna.TrialPruned, match="pruned at step 8"):
        est.train_and_evaluate(
            train_input(x, y),
            eval_input(x, y),
            max_steps=40,
            eval_every_n_steps=4,
            hooks=[stoker.hooks.OptunaPruning(trial, "top2")],
        )
    assert sorted(trial.storage.get_trial(trial._trial_id).intermediate_values) == [4, 8]
    assert json.loads((tmp_path / "m" / "checkpoint.json").read_text())["latest"] == "ckpt-8"
    again = make_estimator(tmp_path / "m", iterations_per_loop=2)
    with pytest.raises(optuna.TrialPruned):  # a pruned run rerun stops at once
        again.train_and_evaluate(
            train_input(x, y),
            eval_input(x, y),
            max_steps=40,
            eval_every_n_steps=4,
            hooks=[stoker.hooks.OptunaPruning(trial, "top2")],
        )
    assert again.global_step == 8


def test_run_study_reuses_finished_trials(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    calls = []

    def objective(trial, model_dir):
        calls.append(model_dir)
        return (trial.suggest_float("x", -1, 1) - 0.5) ** 2

    study = run_study(objective, n_trials=3, storage=storage, model_dir=tmp_path / "t")
    assert [c.rsplit("/", 1)[-1] for c in calls] == ["trial-0", "trial-1", "trial-2"]
    again = run_study(objective, n_trials=3, storage=storage, model_dir=tmp_path / "t")
    assert len(calls) == 3 and [t.value for t in again.trials] == [t.value for t in study.trials]
    with pytest.raises(ConfigError, match="n_trials must be an integer >= 1"):
        run_study(objective, n_trials=0, storage=storage, model_dir=tmp_path / "t")


def _one(trial, model_dir):  # noqa: ANN001, ANN202
    return trial.suggest_float("x", -1, 1)


def test_a_sqlite_file_in_a_new_folder_gets_its_folder(tmp_path):
    db = tmp_path / "new" / "folder" / "study.db"
    study = run_study(_one, n_trials=1, storage=f"sqlite:///{db}", model_dir=tmp_path / "t")
    assert db.is_file() and len(study.trials) == 1


def test_a_plain_path_is_a_sqlite_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = run_study(_one, n_trials=1, storage="studies/study.db", model_dir="t")
    assert (tmp_path / "studies" / "study.db").is_file()
    again = run_study(_one, n_trials=2, storage=tmp_path / "studies" / "study.db", model_dir="t")  # a Path too
    assert [t.value for t in again.trials][:1] == [study.trials[0].value] and len(again.trials) == 2
    assert stoker.tune.study_storage("s.db") == f"sqlite:///{tmp_path / 's.db'}"
    storage = optuna.storages.InMemoryStorage()
    assert stoker.tune.study_storage(storage) is storage  # a storage object as it is


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        (
            "sqlite:/tmp/study.db",
            "run_study: storage 'sqlite:/tmp/study.db' is not a database URL; give " + stoker.tune.STORAGE_FORMS,
        ),
        (
            "sqlite3:///study.db",
            "run_study: storage 'sqlite3:///study.db': 'sqlite3' is not a database SQLAlchemy knows; give "
            + stoker.tune.STORAGE_FORMS,
        ),
        (
            "mysql+nosuchdriver://u:secret@host/db",
            "run_study: storage 'mysql+nosuchdriver://u:***@host/db': 'mysql+nosuchdriver' is not a database "
            "SQLAlchemy knows; give " + stoker.tune.STORAGE_FORMS,
        ),
    ],
    ids=["one-slash", "unknown-kind", "unknown-driver"],
)
def test_a_malformed_storage_url_is_one_line_naming_it(tmp_path, storage, message):
    with pytest.raises(ConfigError) as e:
        run_study(_one, n_trials=1, storage=storage, model_dir=tmp_path / "t")
    assert str(e.value) == message and e.value.__cause__ is None and e.value.__suppress_context__  # one traceback
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_a_missing_driver_is_named(tmp_path, monkeypatch):
    import sqlalchemy.dialects.postgresql.psycopg2 as pg

    def missing():  # noqa: ANN202
        raise ImportError("No module named 'psycopg2'")

    monkeypatch.setattr(pg.PGDialect_psycopg2, "import_dbapi", classmethod(lambda cls: missing()))
    with pytest.raises(ConfigError) as e:
        run_study(_one, n_trials=1, storage="postgresql+psycopg2://u:secret@db/study", model_dir=tmp_path / "t")
    assert str(e.value) == (
        "run_study: storage 'postgresql+psycopg2://u:***@db/study' needs the postgresql+psycopg2 driver, "
        "which is not installed (No module named 'psycopg2')"
    )


def test_sqlite_files_that_cannot_be_used_are_one_line(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a database, and not a folder either" * 10)
    cases = {
        f"sqlite:///{a_file}/study.db": (
            f"run_study: storage 'sqlite:///{a_file}/study.db': the folder {str(a_file)!r} is a file, not a "
            "directory; give a directory (created if missing)"
        ),
        f"sqlite:///{tmp_path}": (
            f"run_study: storage 'sqlite:///{tmp_path}': {str(tmp_path)!r} is a folder; name the SQLite file in it "
            f"(e.g. {str(tmp_path / 'study.db')!r})"
        ),
        f"sqlite:///{a_file}": f"run_study: storage 'sqlite:///{a_file}' cannot be opened: file is not a database",
    }
    for storage, message in cases.items():
        with pytest.raises(ConfigError) as e:
            run_study(_one, n_trials=1, storage=storage, model_dir=tmp_path / "t")
        assert str(e.value) == message and e.value.__cause__ is None
    assert a_file.read_text() == "not a database, and not a folder either" * 10  # nothing lost
    with pytest.raises(ConfigError, match=r"^run_study: model_dir '.*notes.txt' is a file, not a directory"):
        run_study(_one, n_trials=1, storage=f"sqlite:///{tmp_path / 's.db'}", model_dir=a_file)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_optuna_pruning_needs_a_trial():
    study = optuna.create_study()
    with pytest.raises(ConfigError) as e:
        stoker.hooks.OptunaPruning(study, "loss")
    assert str(e.value) == (
        "OptunaPruning: trial must be the optuna trial the objective is given (optuna.trial.Trial); got Study"
    )


def trial_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_tune_example_killed_mid_study_resumes_to_the_same_trials(tmp_path):
    args = ("--trials", "4")
    reference = in_background(
        [
            PYTHON,
            str(EXAMPLE),
            *args,
            "--storage",
            f"sqlite:///{tmp_path / 'ref.db'}",
            "--model_dir",
            str(tmp_path / "ref"),
        ]
    )
    storage, trials = f"sqlite:///{tmp_path / 'study.db'}", tmp_path / "trials"
    command = [PYTHON, str(EXAMPLE), *args, "--storage", storage, "--model_dir", str(trials)]
    proc = popen(command, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (trials / "trial-1" / "checkpoint.json").exists():  # the 2nd trial is training
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = popen(command, env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = done.communicate(timeout=600)
    assert done.returncode == 0, err
    assert re.search(r"resumed from \S+/trial-1/ckpt-\d+", err)  # the killed trial, from its checkpoint
    want = finished(reference, timeout=600).stdout
    assert trial_lines(out) == trial_lines(want) and len(trial_lines(out)) == 4
    assert out.splitlines()[-1] == want.splitlines()[-1]  # the same best trial
