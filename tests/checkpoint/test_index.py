"""``checkpoint.json`` as a type (``stoker.checkpoint.index``) and the commit protocol choice.

The fixtures in ``data/`` are indexes written by stoker before the type existed (a local
model_dir with a best, a NaN metric, a superseded record and a watching evaluator's coverage;
an object-store model_dir whose record carries its unique prefix in ``dir``): parsing and
encoding them again must give the very same bytes, or existing model_dirs would change format.
``local_checkpoint_after_updates.json`` is what that manager wrote after three updates of the
first; the typed manager must write the same bytes for the same updates.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from stoker.checkpoint import (
    INDEX_FORMAT,
    INDEX_VERSION,
    Best,
    CheckpointIndex,
    CheckpointManager,
    CheckpointRecord,
    Coverage,
    LocalDirectory,
    ObjectStore,
    commit_protocol,
)
from stoker.errors import CheckpointError
from stoker.storage import DEFAULT_RETRY, location

DATA = Path(__file__).parent / "data"
FIXTURES = ["local_checkpoint.json", "object_store_checkpoint.json", "local_checkpoint_after_updates.json"]


@pytest.mark.parametrize("name", FIXTURES)
def test_parse_then_encode_gives_the_bytes_an_existing_model_dir_holds(name):
    data = (DATA / name).read_bytes()
    index = CheckpointIndex.parse(data)
    assert index.encode() == data
    assert CheckpointIndex.parse(json.loads(data)).encode() == data  # from a decoded dict too
    assert index.version == INDEX_VERSION == 1


def test_updates_write_the_bytes_the_dict_based_manager_wrote(tmp_path):
    # local_checkpoint_after_updates.json: what the manager before the type (dicts) wrote after
    # these three updates of local_checkpoint.json (a new best, retention dropping the old
    # best, coverage counting an evaluation and a discarded one).
    (tmp_path / "checkpoint.json").write_bytes((DATA / "local_checkpoint.json").read_bytes())
    m = CheckpointManager(tmp_path, keep_checkpoint_max=2, keep_best=("accuracy", "max"))
    assert m.record_eval(6, {"accuracy": 0.9, "loss": 0.1, "global_step": 6}, coverage=True)
    assert m.record_eval(8, {"accuracy": 0.95, "loss": 0.05})
    assert not m.record_eval(4, {"accuracy": 1.0}, coverage=True)  # not retained: discarded
    assert (tmp_path / "checkpoint.json").read_bytes() == (DATA / "local_checkpoint_after_updates.json").read_bytes()


def test_the_local_fixture_reads_as_typed_fields():
    index = CheckpointIndex.parse((DATA / "local_checkpoint.json").read_bytes())
    assert index.latest == "ckpt-8"
    assert index.best == Best(name="ckpt-2", step=2, metric="accuracy", mode="max", value=0.75)
    assert [(r.name, r.step, r.directory, r.superseded, r.evaluated) for r in index.checkpoints] == [
        ("ckpt-2", 2, "ckpt-2", False, True),
        ("ckpt-6", 6, "ckpt-6", True, False),
        ("ckpt-8", 8, "ckpt-8", False, True),
    ]
    assert math.isnan(index.checkpoints[2].metrics["loss"])
    assert index.coverage == Coverage(evaluated=(2, 8), superseded=(6,), removed=(4,), discarded=())
    assert index.coverage_line() == "2 evaluated, 1 superseded, 1 removed before reading, 0 discarded"
    assert sorted(index.checkpoints[0].files) == ["input-0.json", "model.safetensors", "train_state.pt"]
    store = CheckpointIndex.parse((DATA / "object_store_checkpoint.json").read_bytes())
    assert store.checkpoints[0].directory == "ckpt-5.05b2c737" and store.coverage is None


def test_a_manager_writes_what_the_type_encodes(tmp_path):
    m = CheckpointManager(tmp_path, keep_checkpoint_max=1, keep_best=("loss", "min"))
    m.save(1, {"w": torch.ones(1)}, {"global_step": 1})
    m.record_eval(1, {"loss": 0.5, "global_step": 1})
    m.save(2, {"w": torch.ones(1)}, {"global_step": 2})
    data = (tmp_path / "checkpoint.json").read_bytes()
    raw = json.loads(data)
    assert raw["format"] == INDEX_FORMAT and raw["latest"] == "ckpt-2" and "coverage" not in raw
    assert [r["name"] for r in raw["checkpoints"]] == ["ckpt-1", "ckpt-2"]  # the best is kept
    assert raw["checkpoints"][0]["metrics"] == {"loss": 0.5} and "dir" not in raw["checkpoints"][0]
    assert m.index().encode() == data
    assert m.best() == Best(name="ckpt-1", step=1, metric="loss", mode="min", value=0.5)


def test_an_empty_index_and_no_index():
    assert CheckpointIndex.parse(None) == CheckpointIndex()
    empty = CheckpointIndex().encode()
    assert json.loads(empty) == {"format": INDEX_FORMAT, "latest": None, "best": None, "checkpoints": []}
    assert CheckpointIndex.parse(empty).encode() == empty


def _fixture() -> dict:
    return json.loads((DATA / "local_checkpoint.json").read_bytes())


def _set(obj: dict, path: list, value: object) -> dict:
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "named", "says"),
    [
        (["latest"], 3, "latest", "must be a checkpoint name or null, got a number 3"),
        (["checkpoints"], {}, "checkpoints", "must be a list, got an object"),
        (["checkpoints", 1, "step"], "6", "checkpoints[1].step", 'must be an integer, got a string "6"'),
        (["checkpoints", 2, "files"], _DELETE, "checkpoints[2].files", "is missing"),
        (["checkpoints", 0, "metrics", "loss"], "x", "checkpoints[0].metrics", "must be an object of numbers"),
        (["checkpoints", 0, "bytes"], True, "checkpoints[0].bytes", "must be an integer, got a boolean"),
        (["checkpoints", 0, "size"], 1, "checkpoints[0].size", "is not a field of stoker's checkpoint index"),
        (["best", "mode"], "up", "best.mode", "must be one of ['min', 'max']"),
        (["best"], [], "best", "must be an object or null, got a list"),
        (["coverage", "removed"], [4, "x"], "coverage.removed", "must be a list of integers"),
        (["coverage", "discarded"], _DELETE, "coverage.discarded", "is missing"),
    ],
)
def test_a_malformed_index_is_refused_naming_the_field(path, value, named, says):
    bad = json.dumps(_set(_fixture(), path, value)).encode()
    with pytest.raises(CheckpointError) as e:
        CheckpointIndex.parse(bad, "/runs/a/checkpoint.json")
    assert f"/runs/a/checkpoint.json is malformed: {named!r} {says}" in str(e.value)


def test_unreadable_json_and_another_format_are_refused():
    with pytest.raises(CheckpointError, match=r"checkpoint.json is unreadable \(Expecting"):
        CheckpointIndex.parse(b'{"format": ')
    with pytest.raises(
        CheckpointError, match=r"has format 'tf-checkpoint'; this stoker reads 'stoker-checkpoint-index/1'"
    ):
        CheckpointIndex.parse(json.dumps({**_fixture(), "format": "tf-checkpoint"}))
    with pytest.raises(CheckpointError, match=r"has no 'format' field"):
        CheckpointIndex.parse(json.dumps({k: v for k, v in _fixture().items() if k != "format"}))
    with pytest.raises(CheckpointError, match=r"must be a JSON object, got a list"):
        CheckpointIndex.parse(b"[]")


def test_an_index_from_a_newer_stoker_is_refused_naming_both_versions(tmp_path):
    newer = {**_fixture(), "format": "stoker-checkpoint-index/2", "shards": {"layout": "new"}}
    (tmp_path / "checkpoint.json").write_text(json.dumps(newer))
    with pytest.raises(CheckpointError) as e:
        CheckpointManager(tmp_path, writer=False).latest_path()
    msg = str(e.value)
    assert "is index version 2 ('stoker-checkpoint-index/2'), written by a newer stoker" in msg
    assert "this stoker reads version 1 ('stoker-checkpoint-index/1')" in msg and "upgrade stoker" in msg
    with pytest.raises(CheckpointError, match="index version 2"):  # a writer refuses to overwrite it
        CheckpointManager(tmp_path).save(1, {"w": torch.ones(1)}, {"global_step": 1})
    assert json.loads((tmp_path / "checkpoint.json").read_text()) == newer


def test_changes_return_new_indexes_and_leave_the_old_one_alone():
    index = CheckpointIndex.parse((DATA / "local_checkpoint.json").read_bytes())
    before = index.encode()
    rec = CheckpointRecord(name="ckpt-2", step=2, time=1.0, bytes=3, files={"a": "0" * 64})
    added, replaced = index.adding(rec)  # ckpt-2 saved again: its old best no longer applies
    assert replaced == [] and added.latest == "ckpt-2" and added.best is None
    assert [r.step for r in added.checkpoints] == [2, 6, 8] and added.record("ckpt-2") == rec
    evaluated, became_best = index.with_evaluation(6, {"accuracy": 0.9}, ("accuracy", "max"))
    assert became_best and evaluated.best == Best(name="ckpt-6", step=6, metric="accuracy", mode="max", value=0.9)
    assert index.with_evaluation(7, {"accuracy": 1.0}, ("accuracy", "max")) == (index, False)  # not indexed
    assert not index.with_evaluation(6, {"accuracy": math.nan}, ("accuracy", "max"))[1]  # NaN is never best
    with pytest.raises(CheckpointError, match=r"keep_best names metric 'top1', but evaluation returned only"):
        index.with_evaluation(6, {"accuracy": 0.9}, ("top1", "max"))
    kept, dropped = index.keeping({"ckpt-8"})
    assert [r.name for r in dropped] == ["ckpt-2", "ckpt-6"] and kept.coverage == index.coverage  # both handled
    assert index.encode() == before  # frozen: nothing above changed it


def test_the_commit_protocol_is_chosen_from_the_storage(tmp_path):
    local = commit_protocol(tmp_path, DEFAULT_RETRY)
    assert type(local) is LocalDirectory and local.finished_in_commit
    store = commit_protocol(location("memory://bucket/run"), DEFAULT_RETRY)
    assert type(store) is ObjectStore and not store.finished_in_commit
    assert store.record_dir(store.begin(3)) is not None and local.record_dir(tmp_path) is None
    assert type(CheckpointManager(tmp_path, writer=False).protocol) is LocalDirectory
    assert type(CheckpointManager("memory://bucket/run2", writer=False).protocol) is ObjectStore


def test_each_protocol_commits_a_record_that_round_trips(tmp_path):
    for model_dir in (str(tmp_path / "local"), "memory://bucket/roundtrip"):
        m = CheckpointManager(model_dir, keep_checkpoint_max=0)
        path = m.save(3, {"w": torch.ones(2)}, {"global_step": 3})
        rec = m.index().record("ckpt-3")
        assert rec is not None and path.name == rec.directory
        assert (rec.dir is None) == isinstance(m.model_dir, Path)  # a store names its unique prefix
        assert CheckpointIndex.parse(m.index().encode()) == m.index()
