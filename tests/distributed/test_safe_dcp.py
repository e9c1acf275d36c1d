"""A sharded checkpoint's ``dcp/`` never runs code, on every path that reads one.

DCP itself unpickles ``.metadata`` with ``pickle.load`` and every non-tensor entry of its slices
with ``torch.load(weights_only=False)``. Each hostile checkpoint here is a *genuine DCP
checkpoint* whose index and manifest hashes match its files, so only stoker's decoders stand
between it and the unpickler: resume, evaluate, predict, ``stoker evaluate``, ``stoker export``,
``stoker checkpoint consolidate``, warm start (from the model_dir and from loose files), and
``stoker inspect`` (which decodes nothing).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch

from helpers.cli import run_main
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.checkpoint import load_checkpoint, warm_start
from stoker.distributed.dcp_metadata import load_dcp_metadata
from stoker.distributed.sharded import DCP_DIR, consolidate, save_sharded
from stoker.errors import CheckpointError, CorruptCheckpointError
from stoker.run_spec import (
    EVAL_INPUT_BUILDERS,
    RUN_SPEC_BUILDERS,
    register_eval_input,
    register_run_spec,
    write_run_spec,
)

KIND = "test-safe-dcp"
X, Y = make_data(64)


class _Touch:
    """Unpickling this creates ``path``: proof that code from the file ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def _build(spec, model_dir):  # noqa: ANN001, ANN202 - a run_spec builder for this module's model_dirs
    return make_estimator(model_dir, save_checkpoints_steps=4), X[:2]


def _eval(spec, model_dir):  # noqa: ANN001, ANN202
    return eval_input(X, Y), None


@pytest.fixture(autouse=True, scope="module")
def _registered_kind():
    """This module's run_spec kind, registered while its tests run only: the registry is
    process-wide, and other modules' tests list the known kinds."""
    register_run_spec(KIND)(_build)
    register_eval_input(KIND)(_eval)
    yield
    RUN_SPEC_BUILDERS.pop(KIND, None)
    EVAL_INPUT_BUILDERS.pop(KIND, None)


def _rehash(model_dir: Path, ckpt: str) -> None:
    """Make the index record and the manifest of ``ckpt`` list exactly its files as they are now."""
    folder = model_dir / ckpt
    own = {"manifest.json", "evaluation.json"}
    files = {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name not in own
    }
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    index_path = model_dir / "checkpoint.json"
    index = json.loads(index_path.read_text())
    rec = next(r for r in index["checkpoints"] if r["name"] == ckpt)
    rec["files"] = sha
    index_path.write_text(json.dumps(index))
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"] = {n: {"bytes": len(files[n]), "sha256": sha[n]} for n in files}
    manifest_path.write_text(json.dumps(manifest))


def _shard(model_dir: Path, ckpt: str, marker: Path | None = None, where: str = "entry") -> None:
    """Turn ``ckpt`` into a sharded checkpoint (model and optimizer in ``dcp/``, as
    ``Sharded`` writes them). ``marker``: make it hostile, ``where`` = ``entry`` (one weight is
    a pickle, which the genuine metadata declares as bytes) or ``metadata`` (``.metadata``
    replaced by a pickle)."""
    folder = model_dir / ckpt
    est = make_estimator(model_dir, save_checkpoints_steps=4)
    est.evaluate(eval_input(X, Y), checkpoint_path=folder)  # the model now holds ckpt's weights
    est.state.build_for_training()
    model, optimizer = est.state.build_model(), est.state.optimizer
    optimizer.load_state_dict(load_checkpoint(folder).train_state["optimizer"])
    (folder / "model.safetensors").unlink()
    shutil.rmtree(folder / DCP_DIR, ignore_errors=True)
    if marker is not None and where == "entry":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(model, optimizer)
        name = next(iter(model_state))
        model_state[name] = _Touch(marker)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder / DCP_DIR), no_dist=True)
    else:
        save_sharded(folder / DCP_DIR, model, optimizer)
    if marker is not None and where == "metadata":
        (folder / DCP_DIR / ".metadata").write_bytes(pickle.dumps(_Touch(marker)))
    _rehash(model_dir, ckpt)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("run")
    make_estimator(model_dir, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=8)
    write_run_spec(model_dir, kind=KIND)
    return model_dir


@pytest.fixture()
def copy(trained, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(trained, model_dir)
    return model_dir


def test_a_genuine_sharded_checkpoint_reads_on_every_path(copy, tmp_path, capsys):
    want = make_estimator(copy).evaluate(eval_input(X, Y), checkpoint_path=copy / "ckpt-8")
    _shard(copy, "ckpt-8")
    assert sorted(p.name for p in (copy / "ckpt-8" / DCP_DIR).iterdir()) == [".metadata", "__0_0.distcp"]
    got = make_estimator(copy).evaluate(eval_input(X, Y), checkpoint_path=copy / "ckpt-8")
    assert got["loss"] == want["loss"]
    weights = consolidate(copy / "ckpt-8" / DCP_DIR)
    assert sorted(weights) == sorted(make_estimator(copy).model.state_dict())
    code, out, _ = run_main(capsys, "checkpoint", "consolidate", str(copy), "--out", str(tmp_path / "w.safetensors"))
    assert code == 0 and "wrote" in out
    make_estimator(copy, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=12)  # resumes from it
    assert (copy / "ckpt-12" / "model.safetensors").exists()


@pytest.mark.parametrize("where", ["entry", "metadata"])
def test_a_hostile_dcp_is_refused_by_every_reader_and_runs_nothing(copy, tmp_path, capsys, where):
    marker = tmp_path / "code-ran"
    _shard(copy, "ckpt-8", marker, where)
    previous = r"previous retained checkpoint is .*ckpt-4"
    refusals = [
        ("resume", lambda: make_estimator(copy, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=12)),
        ("evaluate", lambda: make_estimator(copy).evaluate(eval_input(X, Y), checkpoint_path=copy / "ckpt-8")),
        ("predict", lambda: list(make_estimator(copy).predict(eval_input(X), checkpoint_path=copy / "ckpt-8"))),
        ("warm start", lambda: warm_start(torch.nn.Linear(8, 3), str(copy / "ckpt-8"))),
    ]
    for what, call in refusals:
        with pytest.raises(CorruptCheckpointError, match=r"ckpt-8.*dcp.*refus") as info:
            call()
        assert not marker.exists(), what
        if what != "warm start":
            assert re.search(previous, str(info.value)), (what, info.value)
    for argv in (
        ("checkpoint", "consolidate", str(copy)),
        ("evaluate", str(copy), "--checkpoint", str(copy / "ckpt-8")),
        ("export", str(copy), "--out", str(tmp_path / "exp"), "--checkpoint", str(copy / "ckpt-8")),
    ):
        code, out, err = run_main(capsys, *argv)
        assert code == 1 and "ckpt-8" in out + err and "refus" in out + err, (argv, out, err)
        assert "Traceback" not in out + err
        assert not marker.exists(), argv
    code, out, err = run_main(capsys, "inspect", str(copy))  # reads JSON only: shows the run
    assert code == 0 and "ckpt-8" in out and not marker.exists()
    with pytest.raises(CheckpointError):  # the loader of consolidate, given the dcp/ directly
        consolidate(copy / "ckpt-8" / DCP_DIR)
    assert not marker.exists()


def test_warm_start_from_a_loose_hostile_folder_without_index_or_manifest(copy, tmp_path):
    marker = tmp_path / "code-ran"
    _shard(copy, "ckpt-8", marker, "entry")
    loose = tmp_path / "loose" / "ckpt-8"
    shutil.copytree(copy / "ckpt-8", loose)
    (loose / "manifest.json").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"dcp.*refus"):
        warm_start(torch.nn.Linear(8, 3), str(loose))
    assert not marker.exists()
    _shard(copy, "ckpt-4", marker, "metadata")
    loose = tmp_path / "loose2" / "ckpt-4"
    shutil.copytree(copy / "ckpt-4", loose)
    (loose / "manifest.json").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"dcp/.metadata"):
        warm_start(torch.nn.Linear(8, 3), str(loose))
    assert not marker.exists()


def test_consolidate_refuses_a_dcp_file_whose_hash_differs_before_reading_it(copy, tmp_path, capsys):
    _shard(copy, "ckpt-8")
    slice_file = copy / "ckpt-8" / DCP_DIR / "__0_0.distcp"
    data = bytearray(slice_file.read_bytes())
    data[-1] ^= 0xFF
    slice_file.write_bytes(bytes(data))
    code, out, _ = run_main(capsys, "checkpoint", "consolidate", str(copy))
    assert code == 1 and "dcp/__0_0.distcp has sha256" in out and "refusing to load it" in out
    assert not (copy / "ckpt-8" / "model.safetensors").exists()
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(copy / "ckpt-8")


def test_metadata_that_reaches_through_an_allowed_module_is_refused(tmp_path):
    """A dotted name (protocol 4) reaches ``os.system`` through the metadata module's own import of
    ``os``: the unpickler before this release let it through, as it allowed that module's every name."""

    def text(s: str) -> bytes:
        return pickle.SHORT_BINUNICODE + bytes([len(s)]) + s.encode()

    marker = tmp_path / "code-ran"
    payload = (
        b"\x80\x04"
        + text("torch.distributed.checkpoint.metadata")
        + text("os.system")
        + pickle.STACK_GLOBAL
        + text(f"touch {marker}")
        + pickle.TUPLE1
        + pickle.REDUCE
        + pickle.STOP
    )
    with pytest.raises(pickle.UnpicklingError, match=r"metadata\.os\.system is not allowed"):
        load_dcp_metadata(payload)
    assert not marker.exists()


def test_metadata_that_points_a_slice_outside_its_directory_is_refused(copy, tmp_path, capsys):
    """A slice at ``../...`` would read another file (another run's weights) into the consolidated ones."""
    _shard(copy, "ckpt-4")
    _shard(copy, "ckpt-8")
    meta = copy / "ckpt-8" / DCP_DIR / ".metadata"
    metadata = load_dcp_metadata(meta.read_bytes())
    for info in metadata.storage_data.values():
        info.relative_path = "../../ckpt-4/dcp/__0_0.distcp"
    meta.write_bytes(pickle.dumps(metadata))
    _rehash(copy, "ckpt-8")
    with pytest.raises(CorruptCheckpointError, match=r"dcp/.metadata.*not a file of the dcp/ directory"):
        load_checkpoint(copy / "ckpt-8")
    code, out, _ = run_main(capsys, "checkpoint", "consolidate", str(copy / "ckpt-8"))
    assert code == 1 and "not a file of the dcp/ directory" in out
    with pytest.raises(CorruptCheckpointError, match="not a file of the dcp/ directory"):
        consolidate(copy / "ckpt-8" / DCP_DIR)


def test_a_sharded_checkpoint_that_does_not_fit_says_so_in_one_line(copy, tmp_path):
    """DCP reports a failure as a ``CheckpointException`` (a BaseException whose text is every
    rank's traceback): the error names the cause in one line instead."""
    import torch.distributed.checkpoint as dcp

    folder = copy / "ckpt-8"
    (folder / "model.safetensors").unlink()
    dcp.save({"model": {"other.weight": torch.zeros(2)}}, checkpoint_id=str(folder / DCP_DIR), no_dist=True)
    _rehash(copy, "ckpt-8")
    with pytest.raises(CheckpointError, match="does not fit the model or optimizer") as info:
        make_estimator(copy).evaluate(eval_input(X, Y), checkpoint_path=folder)
    assert "\n" not in str(info.value) and "Traceback" not in str(info.value), info.value
