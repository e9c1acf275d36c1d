"""Continuous evaluation: a watching evaluator beside training, both writing the index.

Real processes (tests/helpers/scripts/continuous_eval_script.py): a trainer with a checkpoint every 2 steps
and keep-3 retention, and an evaluator watching the same model_dir. Every retained checkpoint
gets exactly one evaluation, the index always parses, keep_best points at the evaluator's best,
a kill -9'd evaluator resumes without repeating an evaluation, and without the index lock the
stress test fails (the mutation check).
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, popen, python_env
from helpers.tiny import classifier_fn, eval_input, make_data, make_estimator, train_input
from stoker.bench import BenchConfig, run_benchmark
from stoker.checkpoint import CheckpointRecord, load_checkpoint
from stoker.cli import main
from stoker.engine import ContinuousEvalConfig, ContinuousEvalResult, ContinuousEvaluation
from stoker.errors import ConfigError

SCRIPT = SCRIPTS / "continuous_eval_script.py"


# ============================================================== helpers
def start(role: str, model_dir: Path, *extra: str) -> subprocess.Popen[str]:
    return popen(
        [PYTHON, str(SCRIPT), "--role", role, "--model_dir", str(model_dir), *extra],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_evaluator(model_dir: Path, *extra: str) -> subprocess.Popen[str]:
    """Start an evaluator and wait until it is up (its Estimator has created model_dir)."""
    proc = start("evaluate", model_dir, *extra)
    deadline = time.monotonic() + 120
    while not model_dir.is_dir():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the evaluator did not start"
        time.sleep(0.01)
    return proc


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"process did not finish: {out}\n{err}") from None
    assert proc.returncode == 0, f"{out}\n{err}"
    return out


def read_index(model_dir: Path) -> dict:
    return json.loads((model_dir / "checkpoint.json").read_text())


def evaluations(log: Path) -> list[tuple[int, int, float]]:
    """``(pid, step, accuracy)`` of every evaluation the evaluator processes reported."""
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]
    return [(int(pid), int(step), float(acc)) for pid, step, acc in rows]


class IndexReader(threading.Thread):
    """Reads the index as fast as it can while the writers run; remembers any failure to parse."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(daemon=True)
        self.path = model_dir / "checkpoint.json"
        self.reads = 0
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                text = self.path.read_text()
            except FileNotFoundError:
                time.sleep(0.005)
                continue
            try:
                index = json.loads(text)
                assert index["format"] == "stoker-checkpoint-index/1"
                assert [r["step"] for r in index["checkpoints"]] == sorted(r["step"] for r in index["checkpoints"])
                self.reads += 1
            except (ValueError, KeyError, AssertionError) as e:
                self.errors.append(f"{type(e).__name__}: {e}: {text[:200]!r}")
            time.sleep(0.002)


def check_consistent(model_dir: Path, log: Path, keep: int = 3) -> dict:
    """The end state every run must reach; returns the index."""
    index = read_index(model_dir)
    evals = evaluations(log)
    counts = Counter(step for _, step, _ in evals)
    assert all(n == 1 for n in counts.values()), f"a checkpoint was evaluated twice: {counts}"
    retained = {r["name"]: r for r in index["checkpoints"]}
    # every retained checkpoint has exactly one evaluation, and its record holds that result
    for rec in retained.values():
        assert rec["metrics"], f"{rec['name']} is retained but has no evaluation"
        assert counts[rec["step"]] == 1, rec
        reported = next(acc for _, step, acc in evals if step == rec["step"])
        assert rec["metrics"]["accuracy"] == reported
    # keep_best is the evaluator's best (the first evaluation reaching the maximum), retained
    best_acc = max(acc for _, _, acc in evals)
    first_best = next(step for _, step, acc in evals if acc == best_acc)
    assert index["best"] is not None, "keep_best recorded no best"
    assert (index["best"]["value"], index["best"]["step"]) == (best_acc, first_best), (index["best"], evals)
    assert index["best"]["name"] in retained, "the best checkpoint was removed"
    # retention: the newest `keep`, the best and the latest, nothing else; no orphan directories
    by_step = sorted(retained.values(), key=lambda r: r["step"])
    assert set(retained) <= {r["name"] for r in by_step[-keep:]} | {index["best"]["name"], index["latest"]}
    on_disk = {p.name for p in model_dir.iterdir() if p.name.startswith("ckpt-")}
    assert on_disk == set(retained), f"directories {sorted(on_disk)} but the index retains {sorted(retained)}"
    # scalars: one row per evaluated step and tag in model_dir/eval/metrics.csv
    with open(model_dir / "eval" / "metrics.csv", newline="") as f:
        rows = [(int(r["step"]), r["tag"]) for r in csv.DictReader(f)]
    assert Counter(rows).most_common(1)[0][1] == 1, "a step was logged twice"
    assert {s for s, t in rows if t == "eval/accuracy"} == set(counts), "logged steps differ from the evaluated ones"
    return index


# ============================================================== in one process
def test_evaluates_each_checkpoint_once_in_step_order_and_stops_at_the_marker(tmp_path):
    x, y = make_data(100)
    ex, ey = make_data(64, seed=1)
    trainer = make_estimator(
        tmp_path, iterations_per_loop=1, save_checkpoints_steps=2, keep_checkpoint_max=0, keep_best=("accuracy", "max")
    )
    trainer.train(train_input(x, y), max_steps=6)
    assert json.loads((tmp_path / "finished.json").read_text())["step"] == 6
    evaluator = make_estimator(tmp_path, keep_checkpoint_max=0, keep_best=("accuracy", "max"))
    seen: list[int] = []
    result = evaluator.evaluate_continuously(
        eval_input(ex, ey), timeout_secs=30, poll_secs=0.01, on_result=lambda step, r: seen.append(step), order="oldest"
    )
    assert result.evaluated == seen == [2, 4, 6] and result.skipped == []
    assert "training finished at step 6" in result.stop_reason
    # the recorded values are exactly what evaluate() computes for that checkpoint
    for step in (2, 4, 6):
        again = evaluator.evaluate(eval_input(ex, ey), checkpoint_path=tmp_path / f"ckpt-{step}", name="check")
        rec = next(r for r in read_index(tmp_path)["checkpoints"] if r["step"] == step)
        assert rec["metrics"] == {k: v for k, v in again.items() if k != "global_step"}
    # TensorBoard: eval/<metric> at each checkpoint's step, the recorded values
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "eval" / "events"), size_guidance={"scalars": 0}).Reload()
    assert {"eval/loss", "eval/accuracy", "eval/top2"} <= set(events.Tags()["scalars"])
    recorded = {r["step"]: r["metrics"]["accuracy"] for r in read_index(tmp_path)["checkpoints"]}
    assert {e.step: e.value for e in events.Scalars("eval/accuracy")} == pytest.approx(recorded, abs=1e-7)  # float32
    # a second evaluator finds nothing to do: the index records every result
    again = make_estimator(tmp_path, keep_checkpoint_max=0, keep_best=("accuracy", "max"))
    assert again.evaluate_continuously(eval_input(ex, ey), timeout_secs=30, poll_secs=0.01).evaluated == []
    # training on clears the marker; the evaluator then times out instead of stopping at once
    trainer.train(train_input(x, y), steps=1)
    assert not (tmp_path / "finished.json").exists()
    t0 = time.monotonic()
    later = make_estimator(tmp_path, keep_checkpoint_max=0, keep_best=("accuracy", "max"))
    result = later.evaluate_continuously(eval_input(ex, ey), timeout_secs=0.3, poll_secs=0.01, order="oldest")
    assert result.evaluated == [7] and "no new checkpoint for 0.3 s" in result.stop_reason
    assert time.monotonic() - t0 >= 0.3


def test_finished_marker_is_written_again_when_there_is_nothing_left_to_train(tmp_path):
    x, y = make_data(100)
    make_estimator(tmp_path, iterations_per_loop=2, save_checkpoints_steps=2).train(train_input(x, y), max_steps=4)
    (tmp_path / "finished.json").unlink()  # as if killed between the last checkpoint and the marker
    make_estimator(tmp_path).train(train_input(x, y), max_steps=4)
    assert json.loads((tmp_path / "finished.json").read_text())["step"] == 4
    make_estimator(tmp_path).train(train_input(x, y), steps=2)  # no max_steps: training went on, no marker
    assert not (tmp_path / "finished.json").exists()


def trained_to_step_4(model_dir, iterations_per_loop: int = 2):  # noqa: ANN001, ANN201
    """Train to step 4 with checkpoints at 2 and 4 (all kept); return eval data ``(ex, ey)``."""
    x, y = make_data(100)
    make_estimator(
        model_dir, iterations_per_loop=iterations_per_loop, save_checkpoints_steps=2, keep_checkpoint_max=0
    ).train(train_input(x, y), max_steps=4)
    return make_data(64, seed=1)


def test_last_step_ignores_an_earlier_finished_marker(tmp_path):
    ex, ey = trained_to_step_4(tmp_path)
    est = make_estimator(tmp_path, keep_checkpoint_max=0)
    result = est.evaluate_continuously(
        eval_input(ex, ey), timeout_secs=0.2, poll_secs=0.01, last_step=6, order="oldest"
    )
    assert result.evaluated == [2, 4] and result.stop_reason == "no new checkpoint for 0.2 s"
    result = est.evaluate_continuously(eval_input(ex, ey), timeout_secs=0.2, poll_secs=0.01, last_step=4)
    assert result.evaluated == [] and result.stop_reason.startswith("training finished at step 4")


def test_opening_a_model_dir_leaves_an_in_flight_save_alone(tmp_path):
    # An evaluator opens model_dir (a writing CheckpointManager) while the trainer writes
    # ckpt-N into a temporary directory: only the trainer's own next save cleans leftovers.
    in_flight = tmp_path / ".tmp-ckpt-8-abcdef01"
    in_flight.mkdir(parents=True)
    (in_flight / "model.safetensors").write_bytes(b"half")
    make_estimator(tmp_path, keep_best=("accuracy", "max")).evaluate_continuously(
        eval_input(*make_data(8)), timeout_secs=0.05, poll_secs=0.01
    )
    assert in_flight.is_dir()
    x, y = make_data(100)
    make_estimator(tmp_path, iterations_per_loop=2, save_checkpoints_steps=2).train(train_input(x, y), max_steps=2)
    assert not in_flight.exists()


def test_evaluating_on_another_device_gives_the_same_results(tmp_path):
    ex, ey = trained_to_step_4(tmp_path)
    here = make_estimator(tmp_path / "copy")  # device "auto": its own components
    shutil.copytree(tmp_path, tmp_path / "copy", dirs_exist_ok=True, ignore=shutil.ignore_patterns("copy"))
    there = make_estimator(tmp_path, keep_checkpoint_max=0)
    assert there.config.device == "auto"
    other = there.evaluate_continuously(
        eval_input(ex, ey), timeout_secs=5, poll_secs=0.01, device="cpu", order="oldest"
    )
    same = here.evaluate_continuously(eval_input(ex, ey), timeout_secs=5, poll_secs=0.01, order="oldest")
    assert other.evaluated == same.evaluated == [2, 4]
    assert other.results == same.results
    assert there.state._model is None  # the Estimator's own model was never built: a copy ran on "cpu"


def test_a_step_saved_again_is_evaluated_again_with_its_new_weights(tmp_path):
    ex, ey = trained_to_step_4(tmp_path)
    est = make_estimator(tmp_path, keep_checkpoint_max=0)
    watcher = ContinuousEvaluation(
        est.evaluation, est.state.checkpoints, ContinuousEvalConfig(timeout_secs=5, poll_secs=0.01, order="oldest")
    )
    first = watcher.run(eval_input(ex, ey))
    assert first.evaluated == [2, 4]
    old = load_checkpoint(tmp_path / "ckpt-4")  # a resumed trainer writing ckpt-4 again, other weights
    est.state.checkpoints.save(4, {k: v * 2 for k, v in old.model_state.items()}, old.train_state, old.input_states)
    again = watcher.run(eval_input(ex, ey))
    assert again.evaluated == [4]
    expected = est.evaluate(eval_input(ex, ey), checkpoint_path=tmp_path / "ckpt-4", name="check")
    assert again.results[4] == expected != first.results[4]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_evaluator_on_cuda_beside_a_cpu_trainer(tmp_path):
    x, y = make_data(100)
    ex, ey = make_data(64, seed=1)
    make_estimator(
        tmp_path,
        device="cpu",
        iterations_per_loop=2,
        save_checkpoints_steps=2,
        keep_checkpoint_max=0,
        keep_best=("accuracy", "max"),
    ).train(train_input(x, y), max_steps=4)
    cpu = make_estimator(tmp_path, device="cpu").evaluate(
        eval_input(ex, ey), checkpoint_path=tmp_path / "ckpt-4", name="c"
    )
    est = make_estimator(tmp_path, device="cpu", keep_checkpoint_max=0, keep_best=("accuracy", "max"))
    result = est.evaluate_continuously(
        eval_input(ex, ey), timeout_secs=5, poll_secs=0.01, device="cuda", order="oldest"
    )
    assert result.evaluated == [2, 4]
    assert result.results[4]["accuracy"] == cpu["accuracy"]
    assert result.results[4]["loss"] == pytest.approx(cpu["loss"], rel=1e-5)


def test_a_checkpoint_removed_before_its_evaluation_is_skipped_with_one_line(tmp_path, caplog):
    ex, ey = trained_to_step_4(tmp_path, iterations_per_loop=1)
    evaluator = make_estimator(tmp_path, keep_checkpoint_max=0)
    calls: list[int] = []

    def remove_ckpt_2(model, features, labels, mode, params):  # noqa: ANN001, ANN202
        # the trainer's retention removing ckpt-4 while ckpt-2 is being evaluated
        if not calls:
            evaluator.state.checkpoints.update_index(lambda index: (index.without("ckpt-4"), None))
            shutil.rmtree(tmp_path / "ckpt-4")
        calls.append(1)
        return classifier_fn(model, features, labels, mode, params)

    evaluator.model_fn = remove_ckpt_2
    with caplog.at_level("INFO", logger="stoker"):
        result = evaluator.evaluate_continuously(eval_input(ex, ey), timeout_secs=0.2, poll_secs=0.01, order="oldest")
    assert result.evaluated == [2] and result.skipped == []  # ckpt-4 left the index: never pending
    # a checkpoint named by a stale read of the index, then removed: skipped with one line
    evaluator2 = make_estimator(tmp_path, keep_checkpoint_max=0)
    watcher = ContinuousEvaluation(evaluator2.evaluation, evaluator2.state.checkpoints)
    res = ContinuousEvalResult()
    caplog.clear()
    with caplog.at_level("INFO", logger="stoker"):
        assert (
            watcher.evaluate_one(
                eval_input(ex, ey), CheckpointRecord(name="ckpt-4", step=4, time=0.0, bytes=0, files={}), res
            )
            is None
        )
    assert res.skipped == [4]
    lines = [r.getMessage() for r in caplog.records if "ckpt-4" in r.getMessage()]
    assert lines == ["evaluator: ckpt-4 was removed by retention before it was evaluated; skipped"]


def test_arguments_are_checked(tmp_path):
    est = make_estimator(None)
    with pytest.raises(ValueError, match="needs RunConfig.model_dir"):
        est.evaluate_continuously(eval_input(*make_data(8)))
    est = make_estimator(tmp_path)
    for kwargs, match in (
        ({"steps": 0}, "steps must be a positive integer"),
        ({"timeout_secs": 0}, "timeout_secs must be > 0"),
        ({"poll_secs": -1}, "poll_secs must be > 0"),
    ):
        with pytest.raises(ValueError, match=match):
            est.evaluate_continuously(eval_input(*make_data(8)), **kwargs)


def test_a_watching_evaluator_runs_in_one_process(tmp_path, monkeypatch):
    est = make_estimator(tmp_path)
    monkeypatch.setattr(est.strategy, "world_size", 2)  # as one of two replicas under torchrun
    with pytest.raises(ConfigError, match=r"^evaluate_continuously runs in one process: start it without torchrun"):
        est.evaluate_continuously(eval_input(*make_data(8)), timeout_secs=0.01)


# ============================================================== real processes
def test_trainer_and_watching_evaluator_at_the_same_time(tmp_path):
    model_dir, log = tmp_path / "run", tmp_path / "evaluated.txt"
    reader = IndexReader(model_dir)
    evaluator = start_evaluator(model_dir, "--evaluated_log", str(log), "--sleep", "0.01")
    trainer = start("train", model_dir, "--max_steps", "40", "--sleep", "0.02")
    reader.start()
    try:
        finish(trainer)
        out = finish(evaluator)
    finally:
        reader.stop.set()
        reader.join()
    assert "training finished at step 40" in out
    assert not reader.errors, reader.errors[:3]
    assert reader.reads > 0
    index = check_consistent(model_dir, log)
    assert index["latest"] == "ckpt-40"


def test_kill_9_evaluator_resumes_without_repeating(tmp_path):
    model_dir, log = tmp_path / "run", tmp_path / "evaluated.txt"
    trainer = start("train", model_dir, "--max_steps", "40", "--sleep", "0.03")
    evaluator = start("evaluate", model_dir, "--evaluated_log", str(log), "--sleep", "0.01")
    deadline = time.monotonic() + 180
    while len(evaluations(log)) < 3:  # kill it once it has recorded a few results
        assert evaluator.poll() is None, evaluator.communicate()
        assert time.monotonic() < deadline, "the evaluator recorded nothing"
        time.sleep(0.01)
    evaluator.send_signal(signal.SIGKILL)
    evaluator.wait()
    recorded_before = {r["step"] for r in read_index(model_dir)["checkpoints"] if r["metrics"]}
    first_pid = evaluations(log)[0][0]
    restarted = start("evaluate", model_dir, "--evaluated_log", str(log), "--sleep", "0.01")
    finish(trainer)
    finish(restarted)
    after = [step for pid, step, _ in evaluations(log) if pid != first_pid]
    assert after and not set(after) & recorded_before, (after, recorded_before)
    check_consistent(model_dir, log)


# ============================================================== the command line
CHARLM_TINY = (
    "--corpus_bytes",
    "60000",
    "--max_steps",
    "12",
    "--save_checkpoints_steps",
    "4",
    "--keep_checkpoint_max",
    "2",
    "--d_model",
    "16",
    "--n_layer",
    "1",
    "--n_head",
    "2",
    "--d_head",
    "8",
    "--d_inner",
    "32",
    "--batch_size",
    "4",
    "--eval_batch_size",
    "4",
    "--eval_steps",
    "3",
    "--seq_len",
    "8",
    "--mem_len",
    "8",
    "--iterations_per_loop",
    "2",
    "--log_every_n_steps",
    "100",
)


def test_stoker_evaluate_watch_beside_stoker_train_charlm(tmp_path):
    model_dir = tmp_path / "run"
    # the evaluator starts first: it waits for the trainer's run_spec.json
    watcher = popen(
        [
            PYTHON,
            "-m",
            "stoker",
            "evaluate",
            "--watch",
            str(model_dir),
            "--device",
            "cpu",
            "--timeout_secs",
            "120",
            "--poll_secs",
            "0.05",
        ],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    trainer = popen(
        [
            PYTHON,
            "-m",
            "stoker",
            "train",
            "charlm",
            "--model_dir",
            str(model_dir),
            "--eval_every_n_steps",
            "0",
            *CHARLM_TINY,
        ],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert "without evaluating" in finish(trainer)
    out = finish(watcher)
    assert "training finished at step 12" in out
    index = read_index(model_dir)
    # the default order, newest: a checkpoint is evaluated, or superseded by a newer one
    assert all(bool(r["metrics"]) != bool(r.get("superseded")) for r in index["checkpoints"])
    assert index["checkpoints"][-1]["metrics"]  # the final checkpoint always is evaluated
    assert re.search(r"model_dir totals: \d+ evaluated, \d+ superseded, \d+ removed before reading, 0 discarded", out)
    best = min((r for r in index["checkpoints"] if r["metrics"]), key=lambda r: r["metrics"]["bpc"])
    assert index["best"]["metric"] == "bpc" and index["best"]["value"] == best["metrics"]["bpc"]
    assert f"best {index['best']['name']} with bpc" in out
    with open(model_dir / "eval" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["tag"] for r in rows} == {"eval/loss", "eval/bpc", "eval/ppl"}
    # once more, in this process: the one-shot evaluation gives the recorded numbers again
    assert main(["evaluate", str(model_dir), "--checkpoint", str(model_dir / "ckpt-12")]) == 0
    rec = next(r for r in read_index(model_dir)["checkpoints"] if r["name"] == "ckpt-12")
    assert rec["metrics"] == next(r for r in index["checkpoints"] if r["name"] == "ckpt-12")["metrics"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "gpu0"], "--device must be auto, cpu, cuda or cuda:N"),
        (["--steps", "0"], "--steps must be an integer >= 1; got 0"),
        (["--watch", "--timeout_secs", "0"], "--timeout_secs must be > 0"),
        (["--watch", "--checkpoint", "x"], "--checkpoint evaluates one checkpoint"),
        (["--last_step", "5"], "--last_step applies only with --watch"),
        (["--early_stopping", "loss"], "--early_stopping applies only with --watch"),
        (["--watch", "--early_stopping", "loss:lower"], "EarlyStopping: mode must be one of ('auto', 'min', 'max')"),
        (["--watch", "--early_stopping", "loss:min:x"], "PATIENCE must be an integer"),
        (["--watch", "--early_stopping", "gain"], "EarlyStopping: mode='auto' cannot tell whether 'gain' should go"),
    ],
)
def test_stoker_evaluate_usage_errors_exit_2(tmp_path, capsys, argv, message):
    assert main(["evaluate", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_stoker_evaluate_without_run_spec_says_so(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path)]) == 1
    assert "has no run_spec.json" in capsys.readouterr().err


# ============================================================== stress: both writers hammering the index
def stress(tmp_path: Path, *extra: str, steps: int = 120) -> tuple[Path, Path, IndexReader]:
    """A checkpoint every step with keep-2 retention and an evaluator recording as fast as it can."""
    model_dir, log = tmp_path / "run", tmp_path / "evaluated.txt"
    reader = IndexReader(model_dir)
    evaluator = start_evaluator(model_dir, "--evaluated_log", str(log), "--save_steps", "1", "--keep", "2", *extra)
    trainer = start(
        "train", model_dir, "--max_steps", str(steps), "--save_steps", "1", "--keep", "2", "--sleep", "0.01", *extra
    )
    reader.start()
    try:
        finish(trainer)
        finish(evaluator)
    finally:
        reader.stop.set()
        reader.join()
    return model_dir, log, reader


@pytest.mark.slow
def test_stress_trainer_and_evaluator_hammering_the_index(tmp_path):
    for round_ in range(2):
        model_dir, log, reader = stress(tmp_path / str(round_))
        assert not reader.errors, reader.errors[:3]
        assert reader.reads > 100
        check_consistent(model_dir, log, keep=2)
        assert len(evaluations(log)) >= 10  # the evaluator really raced the trainer


@pytest.mark.slow
def test_mutation_without_the_index_lock_the_stress_test_fails(tmp_path):
    # The same stress with the commit protocols' index lock replaced by nothing in both processes:
    # one writer's read-modify-write of the index overwrites the other's (a lost result, a lost
    # checkpoint record leaving an orphan directory, a lost best). It has failed 4 runs in 4.
    failures = []
    for round_ in range(3):
        model_dir, log, _ = stress(tmp_path / str(round_), "--no_lock")
        try:
            check_consistent(model_dir, log, keep=2)
        except AssertionError as e:
            failures.append(str(e))
            break
    assert failures, "removing the index lock went unnoticed: the stress test does not test the lock"


# ============================================================== stoker bench --eval --eval_interval_secs
BENCH = ("bench", "--model=trivial", "--data_name=cifar10", "--batch_size=8", "--peak_tflops=1", "--device=cpu")


@pytest.mark.slow
def test_bench_eval_interval_secs_watches_the_training_process(tmp_path):
    train_dir = tmp_path / "train"
    watcher = popen(
        [
            PYTHON,
            "-m",
            "stoker",
            *BENCH,
            "--eval",
            f"--train_dir={train_dir}",
            "--eval_interval_secs=0.05",
            "--num_batches=2",
        ],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not train_dir.is_dir():  # the evaluator is up
        assert watcher.poll() is None and time.monotonic() < deadline, watcher.communicate()
        time.sleep(0.01)
    trainer = popen(
        [
            PYTHON,
            "-m",
            "stoker",
            *BENCH,
            f"--train_dir={train_dir}",
            "--num_batches=16",
            "--num_warmup_batches=2",
            "--save_model_steps=2",
            "--max_ckpts_to_keep=2",
        ],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    finish(trainer)
    out = finish(watcher)
    # the warm-up's end (step 2) did not stop the watcher: only the run's last step did
    assert "Stopped watching: training finished at step 18 and every checkpoint up to it is evaluated" in out
    evaluated = [int(m) for m in re.findall(r"^Evaluated checkpoint .*/ckpt-(\d+) ", out, re.M)]
    assert evaluated == sorted(set(evaluated)) and evaluated[-1] == 18
    index = read_index(train_dir)
    # newest-first: each retained checkpoint is evaluated, or superseded by a newer one
    assert all(
        set(r["metrics"]) == {"loss", "top_1_accuracy", "top_5_accuracy"} or r.get("superseded")
        for r in index["checkpoints"]
    )
    assert {r["step"] for r in index["checkpoints"] if not r.get("superseded")} <= set(evaluated)


def test_bench_eval_interval_secs_evaluates_the_newest_and_supersedes_the_rest(tmp_path):
    # in one process, after training (the two processes at once: the slow test above)
    train = BenchConfig(
        model="trivial",
        data_name="cifar10",
        batch_size=8,
        num_batches=8,
        num_warmup_batches=2,
        train_dir=str(tmp_path),
        save_model_steps=2,
        max_ckpts_to_keep=3,
        device="cpu",
        peak_tflops=1.0,
    )
    run_benchmark(train, log=lambda line: None)
    lines: list[str] = []
    result = run_benchmark(
        train.replace(eval=True, eval_interval_secs=0.01, num_batches=2, save_model_steps=None), log=lines.append
    )
    # all three retained checkpoints were pending: the newest is evaluated, as tf_cnn_benchmarks does
    assert [e["global_step"] for e in result["evaluations"]] == [10]
    assert result["superseded_checkpoints"] == [6, 8]
    assert lines[-1] == "Stopped watching: training finished at step 10 and every checkpoint up to it is evaluated"
    assert (
        "Checkpoints of " + str(tmp_path) + ": 1 evaluated, 2 superseded, 0 removed before reading, 0 discarded"
        in lines
    )
    index = read_index(tmp_path)
    assert [r["metrics"].get("top_1_accuracy") for r in index["checkpoints"]] == [
        None,
        None,
        result["evaluations"][0]["top_1_accuracy"],
    ]
    assert [bool(r.get("superseded")) for r in index["checkpoints"]] == [True, True, False]
    assert result["global_step"] == 10 and result["top_1_accuracy"] == result["evaluations"][-1]["top_1_accuracy"]


def test_bench_eval_interval_secs_needs_eval(capsys):
    with pytest.raises(SystemExit) as e:
        main([*BENCH, "--eval_interval_secs=5"])
    assert e.value.code == 2 and "--eval_interval_secs applies only with --eval" in capsys.readouterr().err
