"""``stoker checkpoint list | verify | repair MODEL_DIR``: output, exit codes (0 ok, 1 damage, 2
usage), ``repair`` idempotent, atomic and ``--dry-run``; local paths and fsspec URLs."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from helpers.cli import run_main
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker import storage
from stoker.checkpoint import CheckpointManager
from stoker.checkpoint.manifest import Manifest
from stoker.checkpoint.verify import apply_repair, plan_repair
from stoker.errors import CheckpointError
from stoker.storage import DEFAULT_RETRY

X, Y = make_data(64)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model_dir = tmp_path_factory.mktemp("trained")
    est = make_estimator(model_dir, save_checkpoints_steps=4, keep_best=("accuracy", "max"))
    est.train_and_evaluate(train_input(X, Y), eval_input(X, Y), max_steps=12, eval_every_n_steps=4)
    return model_dir


@pytest.fixture
def run(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


def _strip_manifests(model_dir: Path) -> None:
    for name in ("manifest.json", "evaluation.json"):
        for f in model_dir.glob(f"ckpt-*/{name}"):
            f.unlink()


def test_list_a_healthy_model_dir(run, capsys):
    code, out, _ = run_main(capsys, "checkpoint", "list", str(run))
    lines = out.splitlines()
    best = json.loads((run / "checkpoint.json").read_text())["best"]
    assert code == 0
    assert lines[0] == (
        f"{run}/checkpoint.json: ok, 3 checkpoints, latest ckpt-12, best {best['name']} "
        f"(accuracy max {best['value']:g})"
    )
    assert lines[1].split() == ["checkpoint", "step", "written", "bytes", "files", "notes", "evaluation"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert list(rows) == ["ckpt-4", "ckpt-8", "ckpt-12"]
    assert "latest" in rows["ckpt-12"] and "best" in rows[best["name"]]
    record = json.loads((run / "checkpoint.json").read_text())["checkpoints"][0]
    cells = rows["ckpt-4"].split()
    assert cells[1] == "4" and cells[5:7] == [f"{record['bytes']:,}", "3"]
    assert f"accuracy={record['metrics']['accuracy']:.6g}" in rows["ckpt-4"]


def test_list_names_repair_when_the_index_is_missing(run, capsys):
    (run / "checkpoint.json").unlink()
    code, out, _ = run_main(capsys, "checkpoint", "list", str(run))
    assert code == 1
    assert out.splitlines()[0] == (
        f"{run}/checkpoint.json is missing; run `stoker checkpoint repair {run}` to rebuild it from the "
        "checkpoints' manifests"
    )
    assert out.count("not in the index") == 3 and not (run / "checkpoint.json").exists()


def test_verify_names_a_flipped_byte(run, capsys):
    code, out, _ = run_main(capsys, "checkpoint", "verify", str(run))
    assert code == 0 and out.splitlines()[-1] == "every checkpoint verifies (3)"
    assert "ckpt-8: ok (3 files, " in out and "sizes and sha256 match its manifest and the index" in out
    _flip_a_byte(run / "ckpt-8" / "model.safetensors")
    code, out, _ = run_main(capsys, "checkpoint", "verify", str(run))
    assert code == 1
    [line] = [line for line in out.splitlines() if line.startswith("ckpt-8")]
    assert line.startswith("ckpt-8: DAMAGED: model.safetensors has sha256 ") and "but its manifest says" in line
    assert out.splitlines()[-1] == "damage found: ckpt-8; 2 of 3 checkpoints verify"
    # one checkpoint on its own: its manifest says what it must be
    assert run_main(capsys, "checkpoint", "verify", str(run / "ckpt-4"))[0] == 0
    code, out, _ = run_main(capsys, "checkpoint", "verify", str(run / "ckpt-8"))
    assert code == 1 and out.startswith("ckpt-8: DAMAGED: model.safetensors")


def test_verify_a_missing_file_and_a_checkpoint_from_before_manifests(run, capsys):
    (run / "ckpt-12" / "input-0.json").unlink()
    (run / "ckpt-4" / "manifest.json").unlink()
    code, out, _ = run_main(capsys, "checkpoint", "verify", str(run))
    assert code == 1
    assert "ckpt-12: DAMAGED: input-0.json is missing (its manifest lists it)" in out
    assert (
        "ckpt-4: ok (3 files" in out and "sha256 match the index); no manifest (written before checkpoints had" in out
    )


def test_verify_a_sharded_checkpoint_names_a_damaged_slice(tmp_path, capsys):
    import torch
    import torch.distributed.checkpoint as dcp

    m = CheckpointManager(tmp_path)
    staging = m.begin(4)
    dcp.save({"model": torch.nn.Linear(3, 2).state_dict()}, checkpoint_id=str(staging / "dcp"), no_dist=True)
    m.save(4, None, {"global_step": 4}, {0: {"skip": 4}}, tmp_dir=staging)
    code, out, _ = run_main(capsys, "checkpoint", "verify", str(tmp_path))
    files = len(json.loads((tmp_path / "checkpoint.json").read_text())["checkpoints"][0]["files"])
    assert code == 0 and f"ckpt-4: ok ({files} files" in out
    [piece] = [p for p in (tmp_path / "ckpt-4" / "dcp").iterdir() if p.suffix == ".distcp"]
    _flip_a_byte(piece)
    code, out, _ = run_main(capsys, "checkpoint", "verify", str(tmp_path))
    assert code == 1 and f"ckpt-4: DAMAGED: dcp/{piece.name} has sha256" in out


def test_repair_rebuilds_a_lost_index_then_finds_nothing_to_do(run, capsys):
    good = (run / "checkpoint.json").read_bytes()
    (run / "checkpoint.json").unlink()
    code, out, _ = run_main(capsys, "checkpoint", "repair", str(run), "--dry-run")
    assert code == 1 and out.splitlines()[-1] == "--dry-run: nothing was written"
    assert f"would write {run}/checkpoint.json: 3 checkpoints, latest ckpt-12" in out
    assert not (run / "checkpoint.json").exists()
    code, out, _ = run_main(capsys, "checkpoint", "repair", str(run))
    assert code == 0, out
    assert (run / "checkpoint.json").read_bytes() == good  # everything the index held, from the manifests
    code, out, _ = run_main(capsys, "checkpoint", "repair", str(run))
    assert code == 0 and out.splitlines()[-1] == "nothing to repair"
    assert (run / "checkpoint.json").read_bytes() == good and not list(run.glob("checkpoint.json.*"))


def test_repair_keeps_a_truncated_index_and_rebuilds_around_a_damaged_checkpoint(run, capsys):
    good = (run / "checkpoint.json").read_bytes()
    (run / "checkpoint.json").write_bytes(good[:100])
    _flip_a_byte(run / "ckpt-12" / "train_state.pt")
    code, out, _ = run_main(capsys, "checkpoint", "repair", str(run))
    assert code == 1  # the damage itself is not repairable
    assert "ckpt-12: DAMAGED: train_state.pt has sha256" in out and "kept in the index, not the latest" in out
    index = json.loads((run / "checkpoint.json").read_text())
    assert index["latest"] == "ckpt-8" and [r["name"] for r in index["checkpoints"]] == ["ckpt-4", "ckpt-8", "ckpt-12"]
    [kept] = run.glob("checkpoint.json.unreadable-*")
    assert kept.read_bytes() == good[:100] and f"the old one is kept as {kept.name}" in out
    # training resumes from ckpt-8, and saving step 12 again replaces the damaged folder
    est = make_estimator(run, save_checkpoints_steps=4)
    est.train(train_input(X, Y), max_steps=12)
    assert est.global_step == 12
    assert run_main(capsys, "checkpoint", "verify", str(run))[0] == 0


def test_repair_adds_manifests_to_checkpoints_from_before_them(run, capsys):
    _strip_manifests(run)
    (run / "checkpoint.json").unlink()
    with pytest.raises(CheckpointError, match=r"have no manifest .* run `stoker checkpoint repair"):
        make_estimator(run).train(train_input(X, Y), max_steps=16)
    code, out, _ = run_main(capsys, "checkpoint", "repair", str(run))
    assert code == 0, out
    assert "ckpt-4: unverified (3 files, " in out and "its files decode, which is all that can be checked" in out
    assert "wrote 3 manifest(s): ckpt-4, ckpt-8, ckpt-12" in out
    for step in (4, 8, 12):
        Manifest.parse((run / f"ckpt-{step}" / "manifest.json").read_bytes())
    index = json.loads((run / "checkpoint.json").read_text())
    assert index["latest"] == "ckpt-12" and index["best"] is None  # nothing recorded the results
    assert run_main(capsys, "checkpoint", "verify", str(run))[0] == 0
    est = make_estimator(run, save_checkpoints_steps=4)
    est.train(train_input(X, Y), max_steps=16)
    assert est.global_step == 16


def test_repair_writes_manifests_from_a_healthy_index(run, capsys):
    good = (run / "checkpoint.json").read_bytes()
    (run / "ckpt-8" / "manifest.json").unlink()
    code, out, _ = run_main(capsys, "checkpoint", "repair", str(run))
    assert code == 0 and "wrote 1 manifest(s): ckpt-8" in out
    assert (run / "checkpoint.json").read_bytes() == good  # the index stays
    record = json.loads(good)["checkpoints"][1]
    manifest = Manifest.parse((run / "ckpt-8" / "manifest.json").read_bytes())
    assert (manifest.time, dict(manifest.files)) == (record["time"], record["files"])


def test_repair_writes_nothing_when_the_index_changed_meanwhile(run):
    (run / "checkpoint.json").unlink()
    plan = plan_repair(run, DEFAULT_RETRY)
    (run / "checkpoint.json").write_bytes(b"{}")  # another writer got there in between
    with pytest.raises(CheckpointError, match="changed while repair read the checkpoints"):
        apply_repair(CheckpointManager(run, writer=False).protocol, plan)
    assert (run / "checkpoint.json").read_bytes() == b"{}"


@pytest.mark.parametrize(
    "args",
    [("list", "{missing}"), ("verify", "{missing}"), ("repair", "{missing}"), ("repair",), ("verify", "{file}")],
)
def test_usage_errors_exit_2(tmp_path, capsys, args):
    (tmp_path / "file").write_text("x")
    given = [a.format(missing=tmp_path / "nothing", file=tmp_path / "file") for a in args]
    code, out, err = run_main(capsys, "checkpoint", *given)
    assert code == 2
    assert "is not a model_dir" in out or "error: the following arguments are required: MODEL_DIR" in err


def test_list_verify_repair_on_an_object_store(capsys):
    url = f"memory://bucket/{uuid.uuid4().hex[:8]}"
    make_estimator(url, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=8)
    index = storage.location(url) / "checkpoint.json"
    good = storage.read_bytes(index)
    storage.write_all([(index, good[:50])])
    assert run_main(capsys, "checkpoint", "list", url)[0] == 1
    code, out, _ = run_main(capsys, "checkpoint", "verify", url)
    assert code == 1 and out.count(": ok (3 files") == 2
    code, out, _ = run_main(capsys, "checkpoint", "repair", url)
    assert code == 0, out
    assert json.loads(storage.read_bytes(index)) == json.loads(good)
    assert run_main(capsys, "checkpoint", "repair", url)[1].splitlines()[-1] == "nothing to repair"
