"""Checkpoint layout, index, atomicity, retention, best, corruption and warm start."""

from __future__ import annotations

import hashlib
import io
import json
import logging

import pytest
import safetensors.torch
import torch

import stoker
from helpers.tiny import TinyNet, eval_input, make_data, make_estimator, train_input
from stoker import checkpoint as ckpt_mod
from stoker.checkpoint import load_checkpoint
from stoker.errors import CheckpointError, DamagedCheckpointError, StorageError
from stoker.storage import stores as storage_mod


def test_layout_index_and_hashes(tmp_path):
    x, y = make_data(64)
    est = make_estimator(tmp_path, save_checkpoints_steps=4)
    est.train(train_input(x, y), max_steps=10)
    index = json.loads((tmp_path / "checkpoint.json").read_text())
    assert index["latest"] == "ckpt-10"
    assert [r["step"] for r in index["checkpoints"]] == [4, 8, 10]
    for rec in index["checkpoints"]:
        d = tmp_path / rec["name"]
        assert sorted(rec["files"]) == ["input-0.json", "model.safetensors", "train_state.pt"]
        for fname, sha in rec["files"].items():
            assert hashlib.sha256((d / fname).read_bytes()).hexdigest() == sha
    # weights readable without stoker; train state with weights_only=True
    weights = safetensors.torch.load_file(str(tmp_path / "ckpt-10" / "model.safetensors"))
    assert set(weights) == set(est.model.state_dict())
    state = torch.load(tmp_path / "ckpt-10" / "train_state.pt", weights_only=True)
    assert state["global_step"] == 10 and {"optimizer", "rng", "schedule"} <= set(state)
    assert not any(p.name.startswith(".tmp") for p in tmp_path.iterdir())
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "events").is_dir()


def test_keep_checkpoint_max_and_keep_best(tmp_path):
    x, y = make_data(64)
    est = make_estimator(
        tmp_path, save_checkpoints_steps=2, iterations_per_loop=2, keep_checkpoint_max=2, keep_best=("accuracy", "max")
    )
    m = ckpt_mod.CheckpointManager(tmp_path, keep_checkpoint_max=2, keep_best=("accuracy", "max"))
    est.train(train_input(x, y), max_steps=2)
    est.evaluate(eval_input(x, y))
    m.record_eval(2, {"accuracy": 0.99})  # pretend step 2 was the best
    est.train(train_input(x, y), max_steps=10)
    m.record_eval(10, {"accuracy": 0.5})
    names = sorted(p.name for p in tmp_path.glob("ckpt-*"))
    assert names == ["ckpt-10", "ckpt-2", "ckpt-8"]  # 2 newest + the best
    index = json.loads((tmp_path / "checkpoint.json").read_text())
    assert index["best"]["name"] == "ckpt-2" and index["best"]["value"] == 0.99


def test_evaluation_feeds_keep_best(tmp_path):
    x, y = make_data(64)
    est = make_estimator(tmp_path, keep_best=("loss", "min"), keep_checkpoint_max=1)
    final = est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=12, eval_every_n_steps=4)
    index = json.loads((tmp_path / "checkpoint.json").read_text())
    evaluated = {r["step"]: r["metrics"]["loss"] for r in index["checkpoints"] if r["metrics"]}
    assert index["best"]["value"] == min([index["best"]["value"], *evaluated.values()])
    assert final["global_step"] == 12
    assert index["latest"] == "ckpt-12"


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_refused_by_evaluate_and_skipped_by_resume(tmp_path, caplog):
    x, y = make_data(64)
    make_estimator(tmp_path, save_checkpoints_steps=4).train(train_input(x, y), max_steps=8)
    _flip_a_byte(tmp_path / "ckpt-8" / "model.safetensors")
    with pytest.raises(
        DamagedCheckpointError, match=r"ckpt-8.*model.safetensors has sha256 .* but the index says .*ckpt-4"
    ) as info:
        make_estimator(tmp_path).evaluate(eval_input(x, y))
    assert "delete" not in str(info.value)
    # the offered one loads
    res = make_estimator(tmp_path).evaluate(eval_input(x, y), checkpoint_path=tmp_path / "ckpt-4")
    assert res["global_step"] == 4
    # training resumes from ckpt-4, says so once, and ends bitwise as an uninterrupted run
    caplog.set_level(logging.WARNING, logger="stoker")
    resumed = make_estimator(tmp_path, save_checkpoints_steps=4)
    resumed.train(train_input(x, y), max_steps=12)
    lines = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(lines) == 1 and "ckpt-8 is damaged (model.safetensors has sha256" in lines[0], lines
    assert f"resuming from {tmp_path / 'ckpt-4'}, the newest checkpoint that verifies" in lines[0]
    reference = make_estimator(tmp_path / "ref", save_checkpoints_steps=4)
    reference.train(train_input(x, y), max_steps=12)
    for step in (8, 12):  # the damaged ckpt-8 was saved again, whole
        a = (tmp_path / f"ckpt-{step}" / "model.safetensors").read_bytes()
        assert a == (tmp_path / "ref" / f"ckpt-{step}" / "model.safetensors").read_bytes(), step


def test_every_checkpoint_damaged_is_an_error_not_a_start_at_step_0(tmp_path):
    x, y = make_data(64)
    make_estimator(tmp_path, save_checkpoints_steps=4).train(train_input(x, y), max_steps=8)
    for step in (4, 8):
        _flip_a_byte(tmp_path / f"ckpt-{step}" / "train_state.pt")
    with pytest.raises(CheckpointError, match=r"every retained checkpoint in .* is damaged \(ckpt-8, ckpt-4\)"):
        make_estimator(tmp_path).train(train_input(x, y), max_steps=12)
    assert json.loads((tmp_path / "checkpoint.json").read_text())["latest"] == "ckpt-8"  # nothing changed


def test_crash_during_save_leaves_previous_checkpoint_latest(tmp_path, monkeypatch):
    x, y = make_data(64)
    est = make_estimator(tmp_path, save_checkpoints_steps=4)
    est.train(train_input(x, y), max_steps=4)
    real = storage_mod._write_durably
    calls = {"n": 0}

    def failing(path, data):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return real(path, data)

    monkeypatch.setattr(storage_mod, "_write_durably", failing)
    with pytest.raises(
        StorageError,
        match=r"checkpoint ckpt-8 was not written: cannot write .*: OSError: disk full; .*ckpt-4. stays the latest",
    ):
        est.train(train_input(x, y), max_steps=8)
    index = json.loads((tmp_path / "checkpoint.json").read_text())
    assert index["latest"] == "ckpt-4"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("ckpt-", ".tmp"))) == ["ckpt-4"]


def test_shape_mismatch_is_one_clear_error(tmp_path):
    x, y = make_data(64)
    make_estimator(tmp_path).train(train_input(x, y), max_steps=2)
    other = stoker.Estimator(
        model=lambda p: TinyNet(width=32),
        model_fn=make_estimator().model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(model_dir=str(tmp_path), progress_bar=False),
        train_batch_size=16,
    )
    with pytest.raises(
        CheckpointError,
        match=r"fc1.weight is \[16, 8\] in the checkpoint but \[32, 8\] in the model; fc1.bias.*new model_dir",
    ):
        other.train(train_input(x, y), max_steps=4)


def test_warm_start_with_name_filter_reports_missing(tmp_path):
    x, y = make_data(64)
    src = make_estimator(tmp_path / "src")
    src.train(train_input(x, y), max_steps=3)
    settings = stoker.WarmStartSettings(ckpt_to_initialize_from=tmp_path / "src", vars_to_warm_start="fc1\\..*")
    est = stoker.Estimator(
        model=lambda p: TinyNet(),
        model_fn=src.model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(model_dir=str(tmp_path / "dst"), progress_bar=False, seed=5),
        train_batch_size=16,
        warm_start_from=settings,
    )
    assert torch.equal(est.model.fc1.weight, src.model.fc1.weight)
    assert not torch.equal(est.model.fc2.weight, src.model.fc2.weight)
    assert est.warm_start_report.loaded == ["fc1.weight", "fc1.bias"]
    # a renamed variable that is not found is reported
    safetensors.torch.save_file({"w": torch.zeros(16, 8)}, str(tmp_path / "w.safetensors"))
    report = ckpt_mod.warm_start(
        TinyNet(),
        stoker.WarmStartSettings(
            ckpt_to_initialize_from=tmp_path / "w.safetensors",
            vars_to_warm_start=["fc1.weight", "fc2.weight"],
            var_name_to_prev_var_name={"fc1.weight": "w"},
        ),
    )
    assert report.loaded == ["fc1.weight"] and report.not_found == ["fc2.weight"]


def test_train_state_refuses_pickled_objects(tmp_path):
    buf = io.BytesIO()
    torch.save({"x": object()}, buf)
    with pytest.raises(Exception, match="(?i)weights_only|unsupported"):
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)


def test_evaluate_without_checkpoint_or_training_is_an_error(tmp_path):
    x, y = make_data(64)
    with pytest.raises(CheckpointError, match="no checkpoint in model_dir .* has not been trained"):
        make_estimator(tmp_path).evaluate(eval_input(x, y))
    with pytest.raises(CheckpointError, match=r"^checkpoint_path '.*nope' does not exist$"):
        make_estimator(tmp_path).evaluate(eval_input(x, y), checkpoint_path=tmp_path / "nope")


def test_an_incomplete_checkpoint_is_refused_and_resume_falls_back(tmp_path):
    x, y = make_data(64)
    make_estimator(tmp_path, save_checkpoints_steps=4).train(train_input(x, y), max_steps=8)
    (tmp_path / "ckpt-8" / "train_state.pt").unlink()
    with pytest.raises(DamagedCheckpointError, match=r"ckpt-8' is corrupt: train_state.pt missing .*ckpt-4"):
        load_checkpoint(tmp_path / "ckpt-8")
    resumed = make_estimator(tmp_path, save_checkpoints_steps=4)
    resumed.train(train_input(x, y), max_steps=12)
    assert resumed.global_step == 12
    reference = make_estimator(tmp_path / "ref", save_checkpoints_steps=4)
    reference.train(train_input(x, y), max_steps=12)
    assert torch.equal(reference.model.fc1.weight, resumed.model.fc1.weight)


def test_eval_metrics_in_the_index_leave_out_the_step(tmp_path):
    x, y = make_data(64)
    est = make_estimator(tmp_path)
    est.train(train_input(x, y), max_steps=2)
    est.evaluate(eval_input(x, y))
    rec = json.loads((tmp_path / "checkpoint.json").read_text())["checkpoints"][-1]
    assert set(rec["metrics"]) == {"loss", "accuracy", "top2"}


def test_a_failed_index_write_leaves_neither_the_checkpoint_nor_a_temporary_index(tmp_path, monkeypatch):
    x, y = make_data(64)
    est = make_estimator(tmp_path, save_checkpoints_steps=4)
    est.train(train_input(x, y), max_steps=4)
    real = storage_mod._write_durably

    def failing(path, data):  # noqa: ANN001, ANN202
        if path.name.startswith(".checkpoint.json."):
            raise OSError("disk full")
        return real(path, data)

    monkeypatch.setattr(storage_mod, "_write_durably", failing)
    with pytest.raises(
        StorageError,
        match=r"checkpoint ckpt-8 was not written: cannot write .*: OSError: disk full; .*ckpt-4. stays the latest",
    ):
        est.train(train_input(x, y), max_steps=8)
    index = json.loads((tmp_path / "checkpoint.json").read_text())
    assert index["latest"] == "ckpt-4"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("ckpt-", "."))) == ["ckpt-4"]
