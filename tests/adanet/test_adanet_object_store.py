"""An AdaNet search whose model_dir is an fsspec URL (memory://, in process): the same choice
and bitwise the same final weights as in a local directory, resumed from the store."""

from __future__ import annotations

import uuid

import fsspec
import pytest
import torch

from helpers.adanet import ITERATIONS, STEPS, eval_input, make_data, train_input
from helpers.adanet import small_search as _search
from stoker import adanet, storage


def _url() -> str:
    return f"memory://adanet/{uuid.uuid4().hex[:8]}"


def test_search_on_memory_store_equals_local_and_resumes(tmp_path):
    torch.set_num_threads(1)
    x, y = make_data(48)
    reports = {"report_materializer": adanet.ReportMaterializer(eval_input(x, y))}  # written at 0, read at 1
    local = _search(tmp_path / "local", **reports)
    local.train(train_input(x, y))
    url = _url()
    remote = _search(url, **reports)
    remote.train(train_input(x, y), max_steps=STEPS + 4)  # stops mid iteration 1
    assert remote.iteration_number == 1 and remote.global_step == STEPS + 4
    assert not (tmp_path / "memory:").exists()  # nothing went to a local directory named after the URL
    resumed = _search(url, **reports)  # a new object: everything it knows comes from the store
    resumed.train(train_input(x, y))

    assert resumed.iteration_number == local.iteration_number == ITERATIONS
    for t in range(ITERATIONS):
        assert resumed.architecture(t).serialize() == local.architecture(t).serialize()
        assert resumed.selection(t) == local.selection(t)
    mine, theirs = resumed.final_ensemble().state_dict(), local.final_ensemble().state_dict()
    assert mine.keys() == theirs.keys()
    for k in mine:
        assert torch.equal(mine[k], theirs[k]), k
    assert resumed.evaluate(eval_input(x, y)) == local.evaluate(eval_input(x, y))

    fs = fsspec.filesystem("memory")
    prefix = url.removeprefix("memory:/")
    names = {p[len(prefix) + 1 :] for p in fs.find(prefix)}
    assert {
        "architecture-0.json",
        "architecture-1.json",
        "example_features.pt",
        "iteration-0/selection.json",
        "iteration-1/selection.json",
    } <= names
    assert "final/checkpoint.json" in names  # the index, the commit point of each chosen ensemble
    assert any(n.startswith(f"final/ckpt-{STEPS * ITERATIONS}.") for n in names)  # its unique prefix
    assert not any(".tmp" in n for n in names)  # no rename protocol on the store
    for t in range(ITERATIONS):
        name = f"report/iteration-{t}.json"
        assert fs.cat_file(f"{prefix}/{name}") == (tmp_path / "local" / name).read_bytes()


def test_export_to_memory_store(tmp_path):
    torch.set_num_threads(1)
    x, y = make_data(48)
    est = _search(_url())
    est.train(train_input(x, y), max_steps=STEPS)
    out = est.export(_url() + "/export")
    local = est.export(tmp_path / "export")
    for name in ("model.safetensors", "architecture.json"):
        assert storage.read_bytes(out / name) == (local / name).read_bytes()
    assert storage.exists(out / "ensemble.pt2")


def test_cli_recipe_on_memory_store_resumes_and_fresh_deletes(capsys):
    pytest.importorskip("sklearn")
    import argparse

    from stoker.adanet import cli

    url = _url()
    parser = argparse.ArgumentParser(prog="stoker")
    cli.add_parser(parser.add_subparsers(dest="command"))
    argv = [
        "adanet",
        "breast_cancer",
        "--model_dir",
        url,
        "--max_iterations",
        "1",
        "--max_iteration_steps",
        "6",
        "--json",
    ]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    first = capsys.readouterr().out
    assert "iteration 0 (to step 6)" in first and storage.exists(storage.location(url) / "architecture-0.json")
    assert not storage.exists(storage.location(url) / "architecture-1.json")
    assert args.func(args) == 0  # resumes: the same report, nothing trained again
    assert capsys.readouterr().out == first
    fs = fsspec.filesystem("memory")
    fs.pipe_file(url.removeprefix("memory:/") + "/stale.txt", b"x")
    fresh = parser.parse_args([*argv, "--fresh"])
    assert fresh.func(fresh) == 0  # --fresh removes the prefix first
    assert not storage.exists(storage.location(url) / "stale.txt")


def test_crash_before_the_commit_put_is_redone_on_the_store(tmp_path, monkeypatch):
    """A failure after the chosen ensemble is saved and before ``architecture-0.json`` is put:
    iteration 0 stays uncommitted on the store, and a rerun redoes its bookkeeping (saving the
    chosen ensemble again) and ends as the uninterrupted local search."""
    from stoker.adanet import estimator as adanet_estimator

    torch.set_num_threads(1)
    x, y = make_data(48)
    local = _search(tmp_path / "local")
    local.train(train_input(x, y))
    url = _url()
    original = adanet_estimator.write_architecture

    def die(model_dir, architecture):  # noqa: ANN001, ANN202
        raise KeyboardInterrupt("killed before the commit")

    monkeypatch.setattr(adanet_estimator, "write_architecture", die)
    with pytest.raises(KeyboardInterrupt):
        _search(url).train(train_input(x, y))
    assert storage.exists(storage.location(url) / "final" / "checkpoint.json")
    assert not storage.exists(storage.location(url) / "architecture-0.json")
    monkeypatch.setattr(adanet_estimator, "write_architecture", original)
    resumed = _search(url)
    assert resumed.iteration_number == 0
    resumed.train(train_input(x, y))
    assert resumed.architecture().serialize() == local.architecture().serialize()
    mine, theirs = resumed.final_ensemble().state_dict(), local.final_ensemble().state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    final = [n for n in storage.listdir(storage.location(url) / "final") if n.startswith("ckpt-")]
    assert sorted(n.split(".")[0] for n in final) == sorted(
        [f"ckpt-{STEPS}", f"ckpt-{STEPS * ITERATIONS}"]
    )  # the re-save replaced the first
