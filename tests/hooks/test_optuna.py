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
