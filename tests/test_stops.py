"""Graceful stops are as exact as kill -9: a run stopped by SIGTERM or SIGINT at any step, rerun
with the same command, ends bitwise as the uninterrupted run (weights, best checkpoint, the steps
evaluated, the tracker's history with each step once); loops end on every step a hook is
scheduled at, counted from step 0. Real processes and real signals (helpers/stops.py)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

import stoker
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON
from helpers.stops import Job, Stop, ending, install, mlflow_history
from helpers.tiny import eval_input, make_data, make_estimator, state_equal, train_input
from stoker.hooks import Hook, PreemptionHook
from stoker.summary.writer import read_metrics_csv


class Boundaries(Hook):
    """Records every loop boundary and every checkpoint written (called after every loop)."""

    phase = "signals"  # after every built-in hook

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.saves: list[int] = []

    def after_setup(self, run):  # noqa: ANN001
        run.on_checkpoint.append(lambda path: self.saves.append(int(str(path).rsplit("-", 1)[1])))

    def after_loop(self, run, result):  # noqa: ANN001
        self.steps.append(run.global_step)


def evaluated_steps(model_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics_csv(model_dir) if r["tag"] == "eval/loss"]


def multiples(*ns: int, upto: int) -> list[int]:
    return sorted({k for n in ns for k in range(n, upto + 1, n)} | {upto})


# ------------------------------------------------------------------ where loops end (item 2)
def test_evaluations_and_checkpoints_fall_on_their_steps_counted_from_step_0(tmp_path):
    x, y = make_data(64)
    ex, ey = make_data(32, seed=1)

    def train_and_evaluate(max_steps: int) -> Boundaries:
        est = make_estimator(tmp_path, iterations_per_loop=10, save_checkpoints_steps=15, log_every_n_steps=7)
        seen = Boundaries()
        est.train_and_evaluate(
            train_input(x, y), eval_input(ex, ey), max_steps=max_steps, eval_every_n_steps=25, hooks=[seen]
        )
        return seen

    first = train_and_evaluate(33)
    assert first.steps == [s for s in multiples(7, 10, 15, 25, upto=33)]  # 7, 10, 14, 15, 20, 21, 25, 28, 30, 33
    second = train_and_evaluate(60)  # resumed at 33: the same schedule, not counted from 33
    assert second.steps == [s for s in multiples(7, 10, 15, 25, upto=60) if s > 33]
    assert evaluated_steps(tmp_path) == [25, 33, 50, 60]  # 33 and 60: each train_and_evaluate's end
    assert first.saves == [15, 25, 30, 33] and second.saves == [45, 50, 60]


def test_iterations_per_loop_1_and_merged_loops_keep_the_schedule(tmp_path):
    x, y = make_data(64)
    ex, ey = make_data(32, seed=1)
    for iterations in (1, 7):  # 7: merged loops (no hook watches every loop) run to the due steps
        est = make_estimator(
            tmp_path / str(iterations), iterations_per_loop=iterations, save_checkpoints_steps=9, log_every_n_steps=None
        )
        est.train_and_evaluate(train_input(x, y), eval_input(ex, ey), max_steps=30, eval_every_n_steps=12)
        assert evaluated_steps(tmp_path / str(iterations)) == [12, 24, 30]
        index = stoker.checkpoint.CheckpointManager(tmp_path / str(iterations), writer=False).index()
        assert [r.step for r in index.checkpoints] == [12, 18, 24, 27, 30]


@pytest.mark.parametrize("compile_mode", [False, pytest.param("step", marks=pytest.mark.slow)])
def test_how_steps_are_cut_into_loops_changes_no_number(tmp_path, compile_mode):
    """Loops of 1, loops of 7 cut at every multiple of 3 and 5 (checkpoints, logging), and
    merged loops end with bitwise the same weights and the same summed loss."""
    x, y = make_data(64)
    runs = {}
    for name, config in {
        "one": dict(iterations_per_loop=1),
        "cut": dict(iterations_per_loop=7, save_checkpoints_steps=3, log_every_n_steps=5),
        "merged": dict(iterations_per_loop=7, log_every_n_steps=None),
    }.items():
        est = make_estimator(tmp_path / name, compile=compile_mode, **config)
        seen = Boundaries() if name != "merged" else None
        est.train(train_input(x, y), max_steps=30, hooks=[seen] if seen else [])
        runs[name] = est
    assert state_equal(runs["one"].model, runs["cut"].model) and state_equal(runs["one"].model, runs["merged"].model)


# ------------------------------------------------------------------ a signal in this process
def test_a_signal_mid_interval_is_not_an_evaluation_and_the_rerun_ends_as_one_run(tmp_path):
    """A real SIGTERM (sent to this process inside step 13's device loop), PreemptionHook without
    exiting: training stops at 13 with a checkpoint that is no evaluation, and a second call
    ends bitwise as an uninterrupted run."""
    x, y = make_data(64)
    ex, ey = make_data(32, seed=1)

    def train_and_evaluate(model_dir: Path, hooks: list[Hook]) -> tuple[stoker.Estimator, dict[str, float]]:
        est = make_estimator(model_dir, iterations_per_loop=4, save_checkpoints_steps=6, keep_best=("accuracy", "max"))
        result = est.train_and_evaluate(
            train_input(x, y), eval_input(ex, ey), max_steps=30, eval_every_n_steps=10, hooks=hooks
        )
        return est, result

    _, want = train_and_evaluate(tmp_path / "ref", [])
    undo = install(Stop("sigterm", 13))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        est, stopped = train_and_evaluate(tmp_path / "run", [PreemptionHook(exit_process=False)])
    finally:
        undo()
    assert signal.getsignal(signal.SIGTERM) is previous
    assert est.global_step == 13
    assert stopped["global_step"] == 10  # the newest evaluation; none at the stop
    assert evaluated_steps(tmp_path / "run") == [10]
    record = stoker.checkpoint.CheckpointManager(tmp_path / "run", writer=False).index().record("ckpt-13")
    assert record is not None and not record.evaluated
    _, got = train_and_evaluate(tmp_path / "run", [])
    assert got == want
    assert ending(tmp_path / "run") == ending(tmp_path / "ref")
    assert evaluated_steps(tmp_path / "run") == [10, 20, 30]


def test_the_first_signal_hands_every_signal_back_to_the_previous_handlers(tmp_path):
    x, y = make_data(64)
    got: list[int] = []
    before = {sig: signal.signal(sig, lambda signum, _: got.append(signum)) for sig in (signal.SIGTERM, signal.SIGINT)}

    class SecondSignal(Hook):
        def after_loop(self, run, result):  # noqa: ANN001
            if run.global_step == 4:
                os.kill(os.getpid(), signal.SIGTERM)  # the first: PreemptionHook's
                os.kill(os.getpid(), signal.SIGINT)  # the second, of the other kind: the previous handler's

    try:
        est = make_estimator(tmp_path, iterations_per_loop=2)
        est.train(train_input(x, y), max_steps=20, hooks=[PreemptionHook(exit_process=False), SecondSignal()])
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert est.global_step == 4 and got == [signal.SIGINT]


@pytest.mark.parametrize("step", [11, 14, 17], ids=["rolled-back-to-8", "rolled-back-to-12", "after-both"])
def test_a_signal_around_a_nan_rollback_ends_as_the_uninterrupted_run(tmp_path, step):
    """NanLossHook(on_nan="rollback") over a stream with poisoned batches (helpers/rollback.py):
    a SIGTERM in a loop whose NaN rolls it back stops the run at the checkpoint restored (the
    signal is not lost with the loop); one in a loop without a NaN stops at its end. Rerun, both
    end bitwise as the uninterrupted run."""
    from helpers.rollback import make, poisoned_data
    from helpers.rollback import train_input as poisoned_input
    from stoker.hooks import NanLossHook

    x, y = poisoned_data()
    make(tmp_path / "ref").train(poisoned_input(x, y), max_steps=20, hooks=[NanLossHook(on_nan="rollback")])
    undo = install(Stop("sigterm", step))
    try:
        est = make(tmp_path / "run")
        hooks = [NanLossHook(on_nan="rollback"), PreemptionHook(exit_process=False)]
        est.train(poisoned_input(x, y), max_steps=20, hooks=hooks)
    finally:
        undo()
    assert est.interrupted and est.global_step == {11: 8, 14: 12, 17: 17}[step]  # NaN at 10 and 13
    make(tmp_path / "run").train(poisoned_input(x, y), max_steps=20, hooks=[NanLossHook(on_nan="rollback")])
    assert ending(tmp_path / "run") == ending(tmp_path / "ref")


def test_optuna_pruning_stopped_mid_interval_reports_and_prunes_as_the_uninterrupted_trial(tmp_path):
    optuna = pytest.importorskip("optuna")
    x, y = make_data(48)
    ex, ey = make_data(32, seed=1)

    def train_and_evaluate(model_dir: Path, trial: object, hooks: list[Hook]) -> stoker.Estimator:
        est = make_estimator(model_dir, iterations_per_loop=4)
        pruning = stoker.hooks.OptunaPruning(trial, "accuracy")
        est.train_and_evaluate(
            train_input(x, y), eval_input(ex, ey), max_steps=40, eval_every_n_steps=5, hooks=[pruning, *hooks]
        )
        return est

    def trial() -> object:  # prunes once accuracy is below 0.6 after step 12
        study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(lower=0.6, n_warmup_steps=12))
        return study.ask()

    reference = trial()
    with pytest.raises(optuna.TrialPruned, match="pruned at step 15"):
        train_and_evaluate(tmp_path / "ref", reference, [])
    stopped = trial()
    undo = install(Stop("sigterm", 7))
    try:
        est = train_and_evaluate(tmp_path / "run", stopped, [PreemptionHook(exit_process=False)])
    finally:
        undo()
    assert est.global_step == 7 and est.interrupted
    with pytest.raises(optuna.TrialPruned, match="pruned at step 15"):
        train_and_evaluate(tmp_path / "run", stopped, [])
    values = [t.storage.get_trial(t._trial_id).intermediate_values for t in (reference, stopped)]  # type: ignore[attr-defined]
    assert values[0] == values[1] and sorted(values[0]) == [5, 10, 15]
    assert ending(tmp_path / "run") == ending(tmp_path / "ref")


# ------------------------------------------------------------------ real processes (item 1)
CALLBACKS = Job(
    argv=(
        PYTHON,
        str(SCRIPTS / "callbacks_script.py"),
        *("--max_steps", "40", "--iterations_per_loop", "4", "--eval_every", "5", "--save_every", "6"),
        *("--log_every", "3", "--early_stopping", "accuracy:max:4:0", "--plateau", "accuracy:max:0.5:1"),
    ),
    env=(("MLFLOW_ALLOW_FILE_STORE", "true"),),
)


@pytest.mark.parametrize(
    ("kind", "step", "mlflow"),
    [
        ("sigterm", 13, False),
        pytest.param("sigterm", 13, True, marks=pytest.mark.slow),
        pytest.param("sigint", 22, True, marks=pytest.mark.slow),
    ],
    ids=["sigterm", "sigterm-mlflow", "sigint-mlflow"],
)
def test_a_stop_mid_interval_with_every_callback_ends_as_the_uninterrupted_run(
    tmp_path, monkeypatch, kind, step, mlflow
):
    """train_and_evaluate with EarlyStopping, ReduceLROnPlateau, keep_best (and MLflowLogger),
    stopped by a real signal inside a loop between two evaluations, then rerun."""
    extra: tuple[str, ...] = ()
    if mlflow:
        pytest.importorskip("mlflow")
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        extra = ("--mlflow", (tmp_path / "ref-mlruns").as_uri())
    reference = Job(CALLBACKS.argv + extra, env=CALLBACKS.env).start(tmp_path / "ref")
    if mlflow:
        extra = ("--mlflow", (tmp_path / "mlruns").as_uri())
    job = Job(CALLBACKS.argv + extra, env=CALLBACKS.env)
    ((_, _, err),) = job.run_stopped(tmp_path / "run", Stop(kind, step))
    assert f"{signal.Signals(Stop(kind, step).signum).name} at step {step}: checkpoint" in err
    assert "Traceback" not in err
    assert evaluated_steps(tmp_path / "run") == list(range(5, step, 5))  # none at the stop
    job.run_ok(tmp_path / "run")
    out, err = reference[0].communicate(timeout=300)
    assert reference[0].returncode == 0, err
    want = ending(tmp_path / "ref")
    assert want.evaluated_steps == [5, 10, 15, 20, 25]  # the plateau cuts at 15 and 25, early stopping at 25
    assert ending(tmp_path / "run") == want
    if not mlflow:
        return
    got, history = mlflow_history((tmp_path / "mlruns").as_uri()), mlflow_history((tmp_path / "ref-mlruns").as_uri())
    assert got.keys() == history.keys()
    for key in ("loss", "learning_rate", "eval/loss", "eval/accuracy"):
        assert got[key] == history[key], key  # each step once, with the uninterrupted run's values
    for key in got:  # rates are timings, the rest exact: each at the uninterrupted run's steps, once
        assert [s for s, _ in got[key]] == [s for s, _ in history[key]], key


@pytest.mark.slow
def test_two_replicas_one_signalled_mid_interval_end_as_the_uninterrupted_run(tmp_path, monkeypatch):
    """SIGTERM to replica 1 only, during step 16 (a loop end no evaluation, checkpoint or log
    line falls on): the replicas agree there, both checkpoint step 16 and exit 143; rerun, the
    two-replica run ends bitwise as the uninterrupted one, MLflow's history (from the chief)
    each step once."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uris = {name: (tmp_path / f"{name}-mlruns").as_uri() for name in ("ref", "run")}
    jobs = {name: Job(CALLBACKS.argv + ("--mlflow", uri), processes=2, env=CALLBACKS.env) for name, uri in uris.items()}
    reference = jobs["ref"].start(tmp_path / "ref")
    outs = jobs["run"].run_stopped(tmp_path / "run", Stop("sigterm", 16, rank=1))
    assert all("SIGTERM at step 16: checkpoint" in err for _, _, err in outs), [err[-1500:] for _, _, err in outs]
    assert evaluated_steps(tmp_path / "run") == [5, 10, 15]
    jobs["run"].run_ok(tmp_path / "run")
    for p in reference:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    assert ending(tmp_path / "run") == ending(tmp_path / "ref")
    got, want = mlflow_history(uris["run"]), mlflow_history(uris["ref"])
    for key in ("loss", "learning_rate", "eval/loss", "eval/accuracy"):
        assert got[key] == want[key], key


@pytest.mark.parametrize("kind", ["sigterm", pytest.param("sigint", marks=pytest.mark.slow)])
def test_a_second_signal_inside_the_stop_checkpoint_ends_the_process_at_once(tmp_path, kind):
    """A second signal, sent inside the write of the first one's checkpoint, goes to the default
    handler: SIGTERM ends the process at once, SIGINT raises KeyboardInterrupt there; the rerun
    resumes from the newest complete checkpoint (the one before) and still ends bitwise as the
    uninterrupted run."""
    reference = CALLBACKS.start(tmp_path / "ref")
    ((code, _, err),) = CALLBACKS.run(tmp_path / "run", [Stop(kind, 13), Stop(kind, 13, "checkpoint")])
    if kind == "sigterm":
        assert code == -signal.SIGTERM, err[-3000:]
    else:  # Python's handler: KeyboardInterrupt in the write, out of train (no stoker exit status)
        assert code not in (0, 128 + signal.SIGINT) and "KeyboardInterrupt" in err, err[-3000:]
    index = stoker.checkpoint.CheckpointManager(tmp_path / "run", writer=False).index()
    assert index.latest == "ckpt-12"
    CALLBACKS.run_ok(tmp_path / "run")
    out, err = reference[0].communicate(timeout=300)
    assert reference[0].returncode == 0, err
    assert ending(tmp_path / "run") == ending(tmp_path / "ref")


# ------------------------------------------------------------------ stoker bench --train_dir
BENCH = Job(
    argv=(
        PYTHON,
        str(SCRIPTS / "bench_script.py"),
        *("bench", "--model=trivial", "--data_name=cifar10", "--batch_size=8", "--peak_tflops=1", "--device=cpu"),
        *("--num_batches=40", "--num_warmup_batches=5", "--iterations_per_loop=4", "--display_every=100"),
        *("--eval_during_training_every_n_steps=10", "--num_eval_batches=2", "--save_model_steps=6"),
    ),
    dir_flag="--train_dir",
)
EVALUATION = re.compile(r"^Running (?:final )?evaluation at global_step (\d+)$", re.M)


def test_bench_train_dir_stopped_mid_interval_ends_as_the_uninterrupted_run(tmp_path):
    """The evaluations during training count from the first timed step of the run from step 0
    (18, 28, 38: warm-up 5 rounded to 8), not from where a resumed process starts timing."""
    reference = BENCH.start(tmp_path / "ref")
    ((_, out, err),) = BENCH.run_stopped(tmp_path / "run", Stop("sigterm", 23))
    assert "SIGTERM at step 23: checkpoint" in err + out
    ((_, rest, _),) = BENCH.run_ok(tmp_path / "run")
    assert "Resuming from global step 23" in rest
    want, _ = reference[0].communicate(timeout=300)
    assert reference[0].returncode == 0
    assert [int(s) for s in EVALUATION.findall(want)] == [18, 28, 38, 48]
    assert [int(s) for s in EVALUATION.findall(out + rest)] == [18, 28, 38, 48]
    assert ending(tmp_path / "run") == ending(tmp_path / "ref")
    assert ending(tmp_path / "ref").latest == "ckpt-48"


# ------------------------------------------------------------------ AdaNet
ADANET = Job(argv=(PYTHON, str(SCRIPTS / "adanet_script.py")))


def adanet_outcome(model_dir: Path) -> tuple[bytes, list[str]]:
    """The final ensemble's weights (3 iterations of 24 steps) and every architecture file."""
    weights = (model_dir / "final" / "ckpt-72" / "model.safetensors").read_bytes()
    return weights, [p.read_text() for p in sorted(model_dir.glob("architecture-*.json"))]


@pytest.mark.slow
def test_adanet_stopped_inside_an_iteration_ends_as_the_uninterrupted_search(tmp_path):
    reference = ADANET.start(tmp_path / "ref")
    ((_, _, err),) = ADANET.run_stopped(tmp_path / "run", Stop("sigterm", 30))  # iteration 1: steps 24-48
    assert "SIGTERM at step 30: checkpoint" in err
    assert not (tmp_path / "run" / "architecture-1.json").exists()
    ADANET.run_ok(tmp_path / "run")
    reference[0].communicate(timeout=300)
    assert reference[0].returncode == 0
    assert adanet_outcome(tmp_path / "run") == adanet_outcome(tmp_path / "ref")


def test_adanet_stopped_by_a_signal_in_a_process_that_goes_on_does_not_end_the_iteration(tmp_path):
    """With PreemptionHook(exit_process=False) the search returns at the stop, its iteration
    not chosen (a stop is not the data's end), and a later train continues it."""
    from helpers.adanet import make_data, make_search
    from helpers.adanet import train_input as adanet_input

    x, y = make_data()
    undo = install(Stop("sigint", 30))
    try:
        est = make_search(tmp_path, iterations=2)
        est.train(adanet_input(x, y), hooks=[PreemptionHook(exit_process=False)])
    finally:
        undo()
    assert est.iteration_number == 1 and not (tmp_path / "architecture-1.json").exists()
    again = make_search(tmp_path, iterations=2)
    again.train(adanet_input(x, y))
    assert again.architecture().global_step == 48
