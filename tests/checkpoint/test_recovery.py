"""The index is never a single point of failure (``stoker.checkpoint.recovery``): each checkpoint
carries its manifest and evaluation, and a missing, truncated, stale or foreign ``checkpoint.json``
is rebuilt from them, locally and on object stores, with one warning line; checkpoints written
before manifests make the run refuse, naming ``stoker checkpoint repair``."""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path

import fsspec
import pytest
import torch

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, finished, in_background, python_env, run_process
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker import storage
from stoker.checkpoint import CheckpointIO, CheckpointManager
from stoker.checkpoint.manifest import Evaluation, Manifest
from stoker.errors import CheckpointError

X, Y = make_data(64)


def _index(model_dir: Path) -> dict:
    return json.loads((model_dir / "checkpoint.json").read_text())


def _weights(model_dir: Path, step: int) -> bytes:
    return (model_dir / f"ckpt-{step}" / "model.safetensors").read_bytes()


def _rebuilt_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rebuilt it from the manifests" in r.getMessage()]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train_and_evaluate to step 12 with keep_best: ckpt-4, 8, 12 evaluated, one of them the best."""
    model_dir = tmp_path_factory.mktemp("evaluated")
    est = make_estimator(model_dir, save_checkpoints_steps=4, keep_best=("loss", "min"), keep_checkpoint_max=0)
    est.train_and_evaluate(train_input(X, Y), eval_input(X, Y), max_steps=12, eval_every_n_steps=4)
    return model_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("ref")
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=16)
    return model_dir


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------------------- what a checkpoint carries
def test_each_checkpoint_carries_its_manifest_and_what_the_index_records(evaluated):
    index = _index(evaluated)
    assert index["best"] is not None
    for rec in index["checkpoints"]:
        folder = evaluated / rec["name"]
        manifest = Manifest.parse((folder / "manifest.json").read_bytes())
        assert (manifest.name, manifest.step, manifest.time) == (rec["name"], rec["step"], rec["time"])
        assert dict(manifest.files) == rec["files"] and manifest.total_bytes == rec["bytes"]
        assert {f: (folder / f).stat().st_size for f in rec["files"]} == dict(manifest.sizes)
        evaluation = Evaluation.parse((folder / "evaluation.json").read_bytes())
        assert dict(evaluation.metrics) == rec["metrics"] and evaluation.key == manifest.key
        is_best = index["best"]["name"] == rec["name"]
        assert (evaluation.best is not None) == is_best, rec["name"]
        if is_best:
            assert evaluation.best == ("loss", "min", index["best"]["value"])


def test_the_manifest_names_its_parent_the_latest_when_committed(evaluated):
    index = _index(evaluated)
    names = [r["name"] for r in index["checkpoints"]]
    m = Manifest.parse((evaluated / names[-1] / "manifest.json").read_bytes())
    assert m.parent is not None and m.parent[0] == f"ckpt-{m.step - 4}"


def test_a_best_that_moves_rewrites_the_old_best_s_evaluation(tmp_path):
    m = CheckpointManager(tmp_path, keep_checkpoint_max=0, keep_best=("accuracy", "max"))
    for step in (1, 2):
        m.save(step, {"w": torch.ones(1)}, {"global_step": step})
    assert m.record_eval(1, {"accuracy": 0.5})
    assert Evaluation.parse((tmp_path / "ckpt-1" / "evaluation.json").read_bytes()).best == ("accuracy", "max", 0.5)
    assert m.record_eval(2, {"accuracy": 0.75})
    assert Evaluation.parse((tmp_path / "ckpt-1" / "evaluation.json").read_bytes()).best is None
    assert Evaluation.parse((tmp_path / "ckpt-2" / "evaluation.json").read_bytes()).best == ("accuracy", "max", 0.75)
    m.update_index(lambda index: index.superseding({index.checkpoints[0].key}))  # evaluated: not marked
    assert not Evaluation.parse((tmp_path / "ckpt-1" / "evaluation.json").read_bytes()).superseded


# ---------------------------------------------------------------------------- missing, truncated, stale, foreign
def test_a_lost_index_is_rebuilt_exactly_with_results_and_best(evaluated, tmp_path, caplog):
    model_dir = _copy(evaluated, tmp_path / "run")
    before = _index(model_dir)
    (model_dir / "checkpoint.json").unlink()
    caplog.set_level(logging.WARNING, logger="stoker")
    assert CheckpointManager(model_dir).index().to_json() == {k: v for k, v in before.items() if k != "coverage"}
    assert _index(model_dir) == before  # written back, byte for byte the same content
    [line] = _rebuilt_lines(caplog)
    assert line == (
        f"{model_dir}/checkpoint.json is missing: rebuilt it from the manifests of 3 checkpoint(s) (ckpt-4 to "
        f"ckpt-12); latest ckpt-12, best {before['best']['name']} (loss {before['best']['value']:g})"
    )
    assert not list(model_dir.glob("checkpoint.json.*"))  # nothing to keep


def test_a_lost_index_resumes_from_the_newest_checkpoint_bitwise(reference, tmp_path, caplog):
    model_dir = tmp_path / "run"
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=8)
    (model_dir / "checkpoint.json").unlink()
    caplog.set_level(logging.INFO, logger="stoker")
    est = make_estimator(model_dir, save_checkpoints_steps=4)
    est.train(train_input(X, Y), max_steps=16)
    assert len(_rebuilt_lines(caplog)) == 1
    assert any(r.getMessage() == f"resumed from {model_dir / 'ckpt-8'} (step 8)" for r in caplog.records)
    for step in (8, 12, 16):
        assert _weights(model_dir, step) == _weights(reference, step), step


@pytest.mark.parametrize("damage", ["truncated", "empty", "not an index"])
def test_an_unreadable_index_is_rebuilt_and_its_bytes_kept(evaluated, tmp_path, caplog, damage):
    model_dir = _copy(evaluated, tmp_path / "run")
    good = (model_dir / "checkpoint.json").read_bytes()
    bad = {"truncated": good[: len(good) // 2], "empty": b"", "not an index": b'{"model_checkpoint_path": "x"}'}[damage]
    (model_dir / "checkpoint.json").write_bytes(bad)
    caplog.set_level(logging.WARNING, logger="stoker")
    assert CheckpointManager(model_dir, writer=True).index().encode() == good
    [kept] = model_dir.glob("checkpoint.json.unreadable-*")
    assert kept.read_bytes() == bad
    [line] = _rebuilt_lines(caplog)
    assert line.startswith(f"{model_dir}/checkpoint.json ") and line.endswith(f"the old index is kept as {kept.name}")
    assert "remove" not in line and "delete" not in line


def test_a_stale_index_is_rebuilt_and_nothing_newer_is_written_over(reference, tmp_path, caplog):
    model_dir = tmp_path / "run"
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=4)
    old = (model_dir / "checkpoint.json").read_bytes()  # a copy of the index at step 4
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=12)
    (model_dir / "checkpoint.json").write_bytes(old)  # the copy restored: it names ckpt-4 only
    caplog.set_level(logging.WARNING, logger="stoker")
    est = make_estimator(model_dir, save_checkpoints_steps=4)
    est.train(train_input(X, Y), max_steps=16)
    [line] = _rebuilt_lines(caplog)
    assert "is stale: it names ckpt-4 as the latest, but ckpt-8, ckpt-12 are newer" in line
    [kept] = model_dir.glob("checkpoint.json.stale-*")
    assert kept.read_bytes() == old
    assert [r["step"] for r in _index(model_dir)["checkpoints"]] == [4, 8, 12, 16]
    for step in (8, 12, 16):
        assert _weights(model_dir, step) == _weights(reference, step), step


def test_a_foreign_index_is_rebuilt(evaluated, tmp_path, caplog):
    other = tmp_path / "other"
    make_estimator(other, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=12)
    model_dir = _copy(evaluated, tmp_path / "run")
    mine = _index(model_dir)
    shutil.copy(other / "checkpoint.json", model_dir / "checkpoint.json")  # another run's index
    caplog.set_level(logging.WARNING, logger="stoker")
    assert CheckpointManager(model_dir).index().to_json() == {k: v for k, v in mine.items() if k != "coverage"}
    [line] = _rebuilt_lines(caplog)
    assert "does not describe this model_dir's checkpoints (the index's ckpt-12 was written at" in line
    [kept] = model_dir.glob("checkpoint.json.foreign-*")
    assert kept.read_bytes() == (other / "checkpoint.json").read_bytes()


def test_an_uncommitted_write_is_not_a_stale_index(tmp_path, reference):
    """What a crash between a checkpoint's files and its index write leaves (one folder newer than
    the index, its parent the index's latest, not evaluated) resumes from the index's latest, as
    it always has; the same folder with an evaluation was committed once: the index is stale."""
    model_dir = tmp_path / "run"
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=4)
    at_4 = (model_dir / "checkpoint.json").read_bytes()
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=8)
    evaluated = _copy(model_dir, tmp_path / "evaluated")
    (model_dir / "checkpoint.json").write_bytes(at_4)
    m = CheckpointManager(model_dir)
    assert m.index().latest == "ckpt-4" and m.index().encode() == at_4  # left as it is
    CheckpointManager(evaluated).record_eval(8, {"loss": 0.5})
    (evaluated / "checkpoint.json").write_bytes(at_4)
    assert CheckpointManager(evaluated).index().latest == "ckpt-8"
    est = make_estimator(model_dir, save_checkpoints_steps=4)
    est.train(train_input(X, Y), max_steps=12)
    for step in (8, 12):
        assert _weights(model_dir, step) == _weights(reference, step), step


def test_a_reader_rebuilds_in_memory_and_writes_nothing(evaluated, tmp_path):
    model_dir = _copy(evaluated, tmp_path / "run")
    (model_dir / "checkpoint.json").unlink()
    index = CheckpointManager(model_dir, writer=False).index()
    assert index.latest == "ckpt-12" and index.best is not None
    assert not (model_dir / "checkpoint.json").exists()
    # evaluate from a model_dir without an index (checkpoint_path= a model_dir) reads the same
    res = make_estimator(tmp_path / "elsewhere").evaluate(eval_input(X, Y), checkpoint_path=model_dir)
    assert res["global_step"] == 12


def test_an_index_of_a_newer_stoker_is_refused_not_rebuilt(evaluated, tmp_path):
    model_dir = _copy(evaluated, tmp_path / "run")
    index = _index(model_dir)
    index["format"] = "stoker-checkpoint-index/2"
    (model_dir / "checkpoint.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="written by a newer stoker.*upgrade stoker"):
        CheckpointManager(model_dir).index()
    assert not list(model_dir.glob("checkpoint.json.*"))


# ---------------------------------------------------------------------------- checkpoints from before manifests
def _strip_manifests(model_dir: Path) -> None:
    for f in model_dir.glob("ckpt-*/*.json"):
        if f.name in ("manifest.json", "evaluation.json"):
            f.unlink()


def test_without_manifests_a_lost_index_is_refused_naming_repair(tmp_path):
    model_dir = tmp_path / "run"
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=8)
    _strip_manifests(model_dir)
    (model_dir / "checkpoint.json").unlink()
    before = sorted(p.name for p in model_dir.rglob("*"))
    with pytest.raises(CheckpointError) as info:
        make_estimator(model_dir).train(train_input(X, Y), max_steps=12)
    msg = str(info.value)
    assert msg == (
        f"{model_dir}/checkpoint.json is missing, and ckpt-4, ckpt-8 have no manifest to verify them by (written "
        "before checkpoints had manifests): nothing was changed; run "
        f"`stoker checkpoint repair {model_dir}` to check them and rebuild the index"
    )
    assert sorted(p.name for p in model_dir.rglob("*")) == before


def test_a_checkpoint_from_before_manifests_still_loads_with_its_index(tmp_path):
    model_dir = tmp_path / "run"
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=8)
    _strip_manifests(model_dir)
    est = make_estimator(model_dir, save_checkpoints_steps=4)
    est.train(train_input(X, Y), max_steps=12)
    assert est.global_step == 12 and _index(model_dir)["latest"] == "ckpt-12"


# ---------------------------------------------------------------------------- sharded checkpoints
def test_a_sharded_checkpoint_s_manifest_lists_every_replica_s_files(tmp_path):
    import torch.distributed.checkpoint as dcp

    m = CheckpointManager(tmp_path)
    staging = m.begin(4)
    dcp.save({"model": torch.nn.Linear(3, 2).state_dict()}, checkpoint_id=str(staging / "dcp"), no_dist=True)
    m.save(4, None, {"global_step": 4}, {0: {"skip": 4}}, tmp_dir=staging)
    record = m.index().checkpoints[0]
    manifest = Manifest.parse((tmp_path / "ckpt-4" / "manifest.json").read_bytes())
    assert any(f.startswith("dcp/") for f in manifest.files) and dict(manifest.files) == dict(record.files)
    (tmp_path / "checkpoint.json").unlink()
    assert CheckpointManager(tmp_path).index().checkpoints[0] == record


# ---------------------------------------------------------------------------- object stores
def _memory_url() -> str:
    return f"memory://bucket/{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("damage", ["missing", "truncated", "stale"])
def test_on_an_object_store_the_index_is_rebuilt_and_nothing_deleted(tmp_path, reference, caplog, damage):
    url = _memory_url()
    make_estimator(url, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=4)
    index = storage.location(url) / "checkpoint.json"
    at_4 = storage.read_bytes(index)
    make_estimator(url, save_checkpoints_steps=4, checkpoint_io=CheckpointIO(async_save=True)).train(
        train_input(X, Y), max_steps=8
    )
    fs = fsspec.filesystem("memory")
    key = url.removeprefix("memory:/")
    prefixes = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(key, detail=False) if "/ckpt-" in p)
    if damage == "missing":
        fs.rm(f"{key}/checkpoint.json")
    elif damage == "truncated":
        fs.pipe_file(f"{key}/checkpoint.json", at_4[:40])
    else:
        CheckpointManager(url).record_eval(8, {"loss": 0.5})  # committed: no longer an uncommitted write
        fs.pipe_file(f"{key}/checkpoint.json", at_4)
    caplog.set_level(logging.WARNING, logger="stoker")
    est = make_estimator(url, save_checkpoints_steps=4)
    est.train(train_input(X, Y), max_steps=16)
    assert len(_rebuilt_lines(caplog)) == 1
    after = {p.rsplit("/", 1)[-1] for p in fs.ls(key, detail=False)}
    assert set(prefixes) <= after  # the first save removed no checkpoint as an orphan
    rec = json.loads(fs.cat_file(f"{key}/checkpoint.json"))["checkpoints"][-1]
    assert fs.cat_file(f"{key}/{rec['dir']}/model.safetensors") == _weights(reference, 16)


def test_on_s3_a_lost_index_is_rebuilt(s3_env, reference, caplog):
    url = f"s3://bucket/{uuid.uuid4().hex[:8]}"
    make_estimator(url, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=8)
    fs = fsspec.filesystem("s3")
    fs.rm(url.removeprefix("s3://") + "/checkpoint.json")
    caplog.set_level(logging.WARNING, logger="stoker")
    make_estimator(url, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=12)
    [line] = _rebuilt_lines(caplog)
    assert line.startswith(f"{url}/checkpoint.json is missing: rebuilt it from the manifests of 2 checkpoint(s)")
    index = json.loads(fs.cat_file(url.removeprefix("s3://") + "/checkpoint.json"))
    assert [r["step"] for r in index["checkpoints"]] == [4, 8, 12]
    rec = index["checkpoints"][-1]
    assert fs.cat_file(url.removeprefix("s3://") + f"/{rec['dir']}/model.safetensors") == _weights(reference, 12)


# ---------------------------------------------------------------------------- a real process
def test_real_process_lost_index_then_rerun_is_bitwise_equal(tmp_path):
    """train, delete checkpoint.json, rerun the same command: bitwise the uninterrupted run."""
    script = str(SCRIPTS / "train_script.py")
    ref = in_background([PYTHON, script, "--model_dir", str(tmp_path / "ref"), "--max_steps", "24"])
    run = tmp_path / "run"
    first = run_process(
        [PYTHON, script, "--model_dir", str(run), "--max_steps", "12"], env=python_env(), capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    (run / "checkpoint.json").unlink()
    again = run_process(
        [PYTHON, script, "--model_dir", str(run), "--max_steps", "24"], env=python_env(), capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert f"{run}/checkpoint.json is missing: rebuilt it from the manifests" in again.stderr
    assert f"resumed from {run / 'ckpt-12'} (step 12)" in again.stderr
    finished(ref)
    assert _weights(run, 24) == _weights(tmp_path / "ref", 24)


# ---------------------------------------------------------------------------- the rule, on its own
def _record(step: int, t: float):  # noqa: ANN202
    from stoker.checkpoint import CheckpointRecord

    return CheckpointRecord(name=f"ckpt-{step}", step=step, time=t, bytes=1, files={"f": "0"})


def _folder(step: int, t: float, parent: tuple[str, float] | None, evaluated: bool = False):  # noqa: ANN202
    from stoker.checkpoint.recovery import Found

    manifest = Manifest(f"ckpt-{step}", step, t, {"f": "0"}, {"f": 1}, parent)
    evaluation = Evaluation(f"ckpt-{step}", t, step, {"loss": 1.0}) if evaluated else None
    return Found(f"ckpt-{step}", step, manifest, evaluation)


@pytest.mark.parametrize(
    ("folders", "state"),
    [
        ([(8, 3.0, ("ckpt-4", 2.0), False)], "ok"),  # a crash inside the save of ckpt-8
        ([(8, 3.0, ("ckpt-4", 2.0), True)], "stale"),  # evaluated: it was committed once
        ([(8, 3.0, ("ckpt-6", 2.5), False)], "stale"),  # its parent is not the index's latest
        ([(8, 3.0, ("ckpt-4", 2.0), False), (12, 4.0, ("ckpt-8", 3.0), False)], "stale"),  # two newer
        ([(8, 1.5, ("ckpt-2", 1.0), False)], "ok"),  # written before the index's checkpoints: passed over
    ],
)
def test_which_newer_folders_make_an_index_stale(folders, state):
    from stoker.checkpoint import CheckpointIndex
    from stoker.checkpoint.recovery import assess

    index = CheckpointIndex(latest="ckpt-4", checkpoints=(_record(2, 1.0), _record(4, 2.0)))
    found = {f"ckpt-{s}": _folder(s, t, p, e) for s, t, p, e in folders}
    found["ckpt-4"] = _folder(4, 2.0, ("ckpt-2", 1.0))
    listed = ["ckpt-2", "ckpt-4", *(f"ckpt-{s}" for s, *_ in folders)]
    assert assess(index.encode(), "checkpoint.json", found, listed).state == state


def test_an_index_naming_nothing_beside_a_checkpoint_is_stale():
    from stoker.checkpoint import CheckpointIndex
    from stoker.checkpoint.recovery import assess

    found = {"ckpt-4": _folder(4, 2.0, None)}
    assert assess(CheckpointIndex().encode(), "checkpoint.json", found, ["ckpt-4"]).state == "stale"
    assert assess(None, "checkpoint.json", found, ["ckpt-4"]).state == "missing"
