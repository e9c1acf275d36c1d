"""Seeing a run: ``stoker inspect``, ``stoker plot`` and the optional MLPerf log + eval CSV."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.hooks.mlperf import EvalCSV, MLLogger, MLPerfLogHook, evaluate_checkpoints, read_mllog
from stoker.run_spec import write_run_spec
from stoker.summary.cli import add_parser
from stoker.summary.inspect import format_inspection, inspect_run, plot_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A real model_dir: 24 steps, logged every 4, evaluated every 8, best kept by accuracy."""
    model_dir = tmp_path_factory.mktemp("run")
    x, y = make_data(96)
    est = make_estimator(model_dir, keep_best=("accuracy", "max"), log_every_n_steps=4, keep_checkpoint_max=2)
    est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=24, eval_every_n_steps=8)
    write_run_spec(model_dir, kind="script", params={"width": 16})
    return model_dir


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="stoker")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_inspect_lists_checkpoints_best_latest_metrics_and_run_spec(run_dir, capsys):
    info = inspect_run(run_dir)
    index = json.loads((run_dir / "checkpoint.json").read_text())
    names = [c["name"] for c in info["checkpoints"]]
    assert names == [r["name"] for r in index["checkpoints"]] and "ckpt-24" in names
    assert info["latest"] == "ckpt-24" and info["best"]["metric"] == "accuracy"
    best = next(c for c in info["checkpoints"] if c["best"])
    assert best["name"] == info["best"]["name"] and "accuracy" in best["metrics"]
    assert all(c["bytes"] > 0 and c["time"] > 0 and c["present"] for c in info["checkpoints"])
    assert info["metrics"]["loss"]["step"] == 24 and info["metrics"]["eval/accuracy"]["step"] == 24
    assert info["run_spec"]["kind"] == "script"

    assert cli(["inspect", str(run_dir)]) == 0
    page = capsys.readouterr().out
    assert page == format_inspection(info) + "\n"
    assert "ckpt-24 L" in page and "best " + info["best"]["name"] in page
    assert "eval/accuracy" in page and "width=16" in page
    assert cli(["inspect", str(run_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["latest"] == "ckpt-24"
    assert cli(["inspect", str(run_dir / "nope")]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_plot_writes_a_png_of_the_expected_size_that_is_not_blank(run_dir, tmp_path, capsys):
    import matplotlib.image

    out = tmp_path / "curves.png"
    result = plot_run(run_dir, out, dpi=80)
    assert result["panels"][0] == "Loss" and "Throughput" in result["panels"]
    assert any(p.startswith("Evaluation: accuracy") for p in result["panels"])
    pixels = matplotlib.image.imread(str(out))
    width, height = result["size"]
    assert pixels.shape[:2] == (height, width)
    gray = pixels[..., :3].mean(-1)
    assert gray.var() > 1e-3, "the image is blank"
    assert (gray < 0.5).mean() > 0.005, "almost nothing is drawn"

    assert cli(["plot", str(run_dir), "--out", str(tmp_path / "cli.png")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "cli.png").stat().st_size > 10_000
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli(["plot", str(empty), "--out", str(tmp_path / "x.png")]) == 1


def test_mlperf_hook_logs_the_run_epochs_evaluations_and_a_csv(tmp_path):
    x, y = make_data(64)
    est = make_estimator(tmp_path / "run", save_checkpoints_steps=100)
    hook = MLPerfLogHook(
        estimator=est,
        eval_input_fn=eval_input(x, y),
        eval_every_n_steps=8,
        steps_per_epoch=4,
        benchmark="tiny",
        use_mllog=False,
    )
    est.train(train_input(x, y), max_steps=16, hooks=[hook])
    records = read_mllog(tmp_path / "run" / "mlperf.log")
    keys = [(r["event_type"], r["key"]) for r in records]
    assert keys[:4] == [
        ("POINT_IN_TIME", "submission_benchmark"),
        ("POINT_IN_TIME", "global_batch_size"),
        ("POINT_IN_TIME", "seed"),
        ("INTERVAL_START", "run_start"),
    ]
    assert keys[-1] == ("INTERVAL_END", "run_stop") and records[-1]["metadata"]["status"] == "success"
    epochs = [r["metadata"]["epoch_num"] for r in records if r["key"] == "epoch_start"]
    assert epochs == [1, 2, 3, 4]
    assert [r["metadata"]["epoch_num"] for r in records if r["key"] == "epoch_stop"] == epochs
    accuracies = [r for r in records if r["key"] == "eval_accuracy"]
    assert [r["metadata"]["step"] for r in accuracies] == [8, 16]
    assert all(0.0 <= r["value"] <= 1.0 for r in accuracies)
    assert sum(r["key"] == "eval_start" for r in records) == sum(r["key"] == "eval_stop" for r in records) == 2
    assert all(r["metadata"]["file"] and r["metadata"]["lineno"] > 0 for r in records)
    rows = EvalCSV(tmp_path / "run" / "eval_results.csv").rows()
    assert [r["checkpoint"] for r in rows] == ["ckpt-8", "ckpt-16"]
    assert {"step", "epoch", "loss", "accuracy", "eval_seconds", "examples", "examples_per_sec"} <= set(rows[0])
    assert rows[0]["examples"] == "64" and float(rows[1]["epoch"]) == 4.0

    # after the fact: every retained checkpoint, rows appended to another CSV
    again = evaluate_checkpoints(
        est,
        eval_input(x, y),
        tmp_path / "all.csv",
        steps_per_epoch=4,
        logger=MLLogger(tmp_path / "eval.log", use_mllog=False),
    )
    assert [r["step"] for r in again] == [8, 16]
    assert [r["key"] for r in read_mllog(tmp_path / "eval.log")] == ["eval_start", "eval_stop", "eval_accuracy"] * 2


def test_mlperf_target_stops_training_when_reached(tmp_path):
    x, y = make_data(64)
    est = make_estimator(tmp_path / "run")
    hook = MLPerfLogHook(
        estimator=est, eval_input_fn=eval_input(x, y), eval_every_n_steps=4, target=0.0, use_mllog=False
    )
    est.train(train_input(x, y), max_steps=40, hooks=[hook])
    assert est.global_step == 4 and hook.reached_target
    stop = read_mllog(tmp_path / "run" / "mlperf.log")[-1]
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "success"


def test_eval_csv_refuses_changing_columns(tmp_path):
    table = EvalCSV(tmp_path / "t.csv")
    table.write({"checkpoint": "ckpt-1", "accuracy": 0.5})
    table.write({"checkpoint": "ckpt-2", "accuracy": 0.75})
    with pytest.raises(ValueError, match="columns"):
        table.write({"checkpoint": "ckpt-3", "loss": 1.0})
    assert EvalCSV(tmp_path / "t.csv").rows() == [
        {"checkpoint": "ckpt-1", "accuracy": "0.5"},
        {"checkpoint": "ckpt-2", "accuracy": "0.75"},
    ]
    assert np.isfinite(float(EvalCSV(tmp_path / "t.csv").rows()[1]["accuracy"]))
