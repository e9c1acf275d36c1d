"""Compiled artifacts beside the checkpoints (stoker.checkpoint.compiled): one content-addressed
bundle under ``compiled/``, referenced by each checkpoint as one of its files, deleted once no
retained checkpoint references it; locally and on an object store (moto)."""

from __future__ import annotations

import hashlib
import logging

import pytest
import torch

from stoker import storage
from stoker.checkpoint import CheckpointManager
from stoker.checkpoint.compiled import (
    COMPILED_DIR,
    CompiledBundle,
    checkpoint_reference,
    fingerprint_id,
    read_bundle,
)
from stoker.errors import CheckpointError

FP = {"torch": "2.13.0+cpu", "device": "cpu", "compile": "step", "model": "0123456789abcdef"}


def save(mgr: CheckpointManager, step: int, bundle: CompiledBundle | None) -> None:
    mgr.save(step, {"w": torch.full((2,), float(step))}, {"global_step": step}, compiled=bundle)


def bundles(model_dir) -> list[str]:  # noqa: ANN001
    return storage.listdir(storage.location(model_dir) / COMPILED_DIR)


def check_shared_then_collected(model_dir) -> None:  # noqa: ANN001
    mgr = CheckpointManager(model_dir, keep_checkpoint_max=2)
    one, two = CompiledBundle(FP, b"first graphs"), CompiledBundle(FP, b"first graphs, recompiled")
    save(mgr, 1, one)
    save(mgr, 2, one)
    assert bundles(model_dir) == [one.name]  # written once, shared
    assert one.name == f"{fingerprint_id(FP)}-{hashlib.sha256(b'first graphs').hexdigest()}.bin"
    for rec in mgr.records():
        ref_name, ref_data = one.reference()
        assert rec.files[ref_name] == hashlib.sha256(ref_data).hexdigest()  # listed with its sha256
        ref = checkpoint_reference(storage.location(model_dir) / rec.directory)
        assert ref is not None and ref.name == one.name and dict(ref.fingerprint) == FP
        assert read_bundle(storage.location(model_dir), ref) == b"first graphs"
    save(mgr, 3, two)
    assert sorted(bundles(model_dir)) == sorted([one.name, two.name])  # ckpt-2 still references `one`
    save(mgr, 4, two)  # retention drops ckpt-2: nothing references `one` any more
    assert bundles(model_dir) == [two.name]
    save(mgr, 5, None)
    save(mgr, 6, None)
    assert bundles(model_dir) == []


def test_a_bundle_is_written_once_shared_by_checkpoints_and_removed_when_unreferenced(tmp_path):
    check_shared_then_collected(tmp_path / "m")


def test_the_same_on_an_object_store(s3_env):
    check_shared_then_collected("s3://bucket/compiled-artifacts")


def test_a_corrupted_bundle_or_reference_is_refused_by_its_sha256(tmp_path):
    mgr = CheckpointManager(tmp_path / "m")
    bundle = CompiledBundle(FP, b"graphs")
    save(mgr, 1, bundle)
    ckpt = mgr.latest_path()
    assert ckpt is not None
    (tmp_path / "m" / COMPILED_DIR / bundle.name).write_bytes(b"grapHs")
    ref = checkpoint_reference(ckpt)
    assert ref is not None
    with pytest.raises(CheckpointError, match=r"has sha256 .* but its checkpoint says"):
        read_bundle(mgr.model_dir, ref)
    ref_file = ckpt / bundle.reference()[0]
    ref_file.write_bytes(ref_file.read_bytes().replace(b'"step"', b'"none"'))  # another fingerprint, same name
    with pytest.raises(CheckpointError, match="sha256"):
        checkpoint_reference(ckpt)


def test_a_bundle_that_cannot_be_written_leaves_the_checkpoint_without_it(tmp_path, monkeypatch, caplog):
    from stoker.checkpoint import manager

    def fail(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise OSError("disk full")

    monkeypatch.setattr(manager, "write_bundle", fail)
    mgr = CheckpointManager(tmp_path / "m")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        save(mgr, 1, CompiledBundle(FP, b"graphs"))
    monkeypatch.undo()
    assert [r.step for r in mgr.records()] == [1]
    assert not any(f.startswith("compiled-") for f in mgr.records()[0].files)
    assert "compiled artifacts not saved with the checkpoint (disk full)" in caplog.text
    assert checkpoint_reference(mgr.latest_path()) is None
