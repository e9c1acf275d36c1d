"""Retention with ``keep_best=(metric, mode, k)``: the ``k`` best by the metric are never deleted,
nor the newest; the same ones are kept after the index is rebuilt from the checkpoints' own files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import stoker
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.checkpoint import CheckpointManager
from stoker.checkpoint.index import CheckpointIndex, CheckpointRecord
from stoker.checkpoint.manifest import Manifest
from stoker.errors import ConfigError

X, Y = make_data(64)


def _folders(model_dir: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in model_dir.glob("ckpt-*"))


def _save(manager: CheckpointManager, step: int) -> None:
    manager.save(step, {"w": torch.full((2,), float(step))}, {"global_step": step})


# Evaluations recorded on ckpt-1..8 (loss, min): the 3 best are 2 (0.1), 5 (0.2) and 7 (0.2, a tie
# with 5 that loses to the earlier step); 8 is the newest; everything else goes.
LOSSES = {1: 0.9, 2: 0.1, 3: 0.5, 4: float("nan"), 5: 0.2, 6: 0.7, 7: 0.2, 8: 0.8}


def test_the_k_best_and_the_newest_are_kept_exactly(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_checkpoint_max=1, keep_best=("loss", "min", 3))
    kept = {}
    for step, loss in LOSSES.items():
        _save(manager, step)
        manager.record_eval(step, {"loss": loss})
        kept[step] = _folders(tmp_path)
    assert kept[1] == [1]
    assert kept[3] == [1, 2, 3]  # three evaluated: all among the 3 best
    assert kept[4] == [1, 2, 3, 4]  # ckpt-4 is the newest (a NaN is never among the best)
    assert kept[5] == [2, 3, 5]  # 1 (0.9) dropped for 5 (0.2); 4 is no longer the newest
    assert kept[6] == [2, 3, 5, 6]  # ckpt-6 (0.7) is the newest
    assert kept[7] == [2, 5, 7]  # 7 ties 5 at 0.2: both beat 3 (0.5)
    assert kept[8] == [2, 5, 7, 8]
    index = manager.index()
    assert index.best is not None and index.best.name == "ckpt-2"
    assert [r.step for r in index.top("loss", "min", 3)] == [2, 5, 7]


def test_max_mode_and_an_unevaluated_newest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_checkpoint_max=0, keep_best=("accuracy", "max", 2))
    for step, acc in {1: 0.5, 2: 0.9, 3: 0.7}.items():
        _save(manager, step)
        manager.record_eval(step, {"accuracy": acc})
    assert _folders(tmp_path) == [1, 2, 3]  # keep_checkpoint_max=0 keeps all
    manager = CheckpointManager(tmp_path, keep_checkpoint_max=1, keep_best=("accuracy", "max", 2))
    _save(manager, 4)  # not evaluated yet: kept as the newest
    assert _folders(tmp_path) == [2, 3, 4]


def test_the_same_k_are_kept_after_the_index_is_rebuilt(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_checkpoint_max=0, keep_best=("loss", "min", 3))
    for step, loss in LOSSES.items():
        _save(manager, step)
        manager.record_eval(step, {"loss": loss})
    (tmp_path / "checkpoint.json").unlink()  # lost: rebuilt from manifest.json + evaluation.json
    rebuilt = CheckpointManager(tmp_path, keep_checkpoint_max=1, keep_best=("loss", "min", 3))
    _save(rebuilt, 9)
    assert _folders(tmp_path) == [2, 5, 7, 9]
    assert rebuilt.index().best is not None and rebuilt.index().best.name == "ckpt-2"


def _record(step: int, stop: bool = False, **metrics: float) -> CheckpointRecord:
    return CheckpointRecord(f"ckpt-{step}", step, float(step), 1, {"f": "0"}, metrics, stop=stop)


def test_a_stop_checkpoint_takes_no_slot_of_the_newest_once_a_newer_one_exists(tmp_path: Path) -> None:
    """A run stopped at 22 (ckpt-22, off the schedule) and rerun to 25 keeps what the
    uninterrupted run keeps: ckpt-22 is not among the newest 3 and goes, ckpt-15 stays."""
    retain = CheckpointManager(tmp_path, keep_checkpoint_max=3, keep_best=("loss", "min", 2)).retention.retain
    steps = [_record(5, loss=0.1), _record(10, loss=0.5), _record(15), _record(20, loss=0.4)]
    stopped = CheckpointIndex(latest="ckpt-22", checkpoints=(*steps, _record(22, stop=True)))
    kept, dropped = retain(stopped)
    assert [r.step for r in kept.checkpoints] == [5, 15, 20, 22] and dropped == ["ckpt-10"]  # the newest: counted
    rerun = CheckpointIndex(latest="ckpt-25", checkpoints=(*kept.checkpoints, _record(25)))
    kept, dropped = retain(rerun)
    assert [r.step for r in kept.checkpoints] == [5, 15, 20, 25] and dropped == ["ckpt-22"]
    for best in ({"loss": 0.05}, {}):  # among the 2 best, a stop checkpoint stays; so with keep all
        stop = replace(_record(22, stop=True), metrics=best)
        index = CheckpointIndex(latest="ckpt-25", checkpoints=(*steps, stop, _record(25)))
        assert [r.step for r in retain(index)[0].checkpoints] == ([5, 15, 20, 22, 25] if best else [5, 15, 20, 25])
    keep_all = CheckpointManager(tmp_path, keep_checkpoint_max=0).retention.retain
    assert [r.step for r in keep_all(rerun)[0].checkpoints] == [5, 15, 20, 25]  # as the uninterrupted run: no 22


def test_a_stop_checkpoint_says_so_in_its_index_and_manifest(tmp_path: Path) -> None:
    """``stop`` is written only when true (other records and manifests read and write as before),
    survives a rebuild from the manifests, and a step saved again on schedule is a normal one."""
    manager = CheckpointManager(tmp_path, keep_checkpoint_max=2)
    _save(manager, 1)
    manager.save(2, {"w": torch.zeros(2)}, {"global_step": 2}, stop=True)
    records = json.loads((tmp_path / "checkpoint.json").read_bytes())["checkpoints"]
    assert [r.get("stop") for r in records] == [None, True]
    manifests = [json.loads((tmp_path / f"ckpt-{s}" / "manifest.json").read_bytes()) for s in (1, 2)]
    assert [m.get("stop") for m in manifests] == [None, True]
    assert Manifest.parse(json.dumps(manifests[1])).stop and not Manifest.parse(json.dumps(manifests[0])).stop
    (tmp_path / "checkpoint.json").unlink()  # lost: rebuilt from manifest.json files
    rebuilt = CheckpointManager(tmp_path, keep_checkpoint_max=2)
    assert [r.stop for r in rebuilt.index().checkpoints] == [False, True]
    _save(rebuilt, 2)  # the same step on schedule: a normal record
    assert [r.stop for r in rebuilt.index().checkpoints] == [False, False]
    rebuilt.save(3, {"w": torch.zeros(2)}, {"global_step": 3}, stop=True)
    _save(rebuilt, 4)
    assert _folders(tmp_path) == [2, 4]


def test_train_and_evaluate_keeps_the_k_best_of_its_evaluations(tmp_path: Path) -> None:
    seen: dict[int, float] = {}

    class Record(stoker.hooks.Hook):
        phase = "decisions"
        needs_evaluations = True

        def after_evaluation(self, run: stoker.hooks.RunContext, metrics: dict[str, float]) -> None:
            seen[int(metrics["global_step"])] = metrics["loss"]

    est = make_estimator(tmp_path, keep_checkpoint_max=1, keep_best=("loss", "min", 2), iterations_per_loop=2)
    est.train_and_evaluate(train_input(X, Y), eval_input(X, Y), max_steps=16, eval_every_n_steps=2, hooks=[Record()])
    assert sorted(seen) == [2, 4, 6, 8, 10, 12, 14, 16]
    two_best = sorted(seen, key=lambda s: (seen[s], s))[:2]
    assert _folders(tmp_path) == sorted({*two_best, 16})
    index = json.loads((tmp_path / "checkpoint.json").read_text())
    assert index["best"]["step"] == two_best[0]


@pytest.mark.parametrize("bad", [("loss", "min", 0), ("loss", "min", 2.0), ("loss", "up", 2), ("loss",)])
def test_a_bad_keep_best_names_both_forms(bad: tuple) -> None:
    with pytest.raises(ConfigError, match=r"keep_best must be \(metric_name, 'min' \| 'max'\), or .* k\)"):
        stoker.RunConfig(keep_best=bad)


def test_k_of_one_is_the_pair() -> None:
    assert stoker.RunConfig(keep_best=("loss", "min", 1)).keep_best == ("loss", "min")
    assert stoker.RunConfig(keep_best=["acc", "max", 3]).keep_best == ("acc", "max", 3)
