"""model_dir on an object store: fsspec's memory:// in process, and a real S3-protocol server
(moto's ThreadedMotoServer on the loopback address, s3fs as the client) for crashes."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import uuid
from pathlib import Path

import fsspec
import pytest
import torch

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, kill_9_at_a_checkpoint_twice, popen, python_env, run_process
from helpers.stores import stale_index_write_is_refused_and_loses_nothing
from helpers.tiny import make_data, make_estimator, train_input
from stoker import storage
from stoker.checkpoint import CheckpointManager, load_checkpoint
from stoker.errors import StorageError
from stoker.storage import RetryPolicy, UrlPath, location

SCRIPT = SCRIPTS / "train_script.py"


def _memory_url() -> str:
    return f"memory://bucket/{uuid.uuid4().hex[:8]}"


def test_locations_keep_local_paths_local():
    assert location("runs/x") == Path("runs/x") and location("file:///tmp/x") == Path("/tmp/x")
    remote = location("s3://bucket/run")
    assert isinstance(remote, UrlPath) and str(remote / "ckpt-4") == "s3://bucket/run/ckpt-4"
    assert (remote / "ckpt-4").parent == remote and (remote / "ckpt-4").name == "ckpt-4"


def test_a_missing_extra_is_named(monkeypatch):
    # the package's attribute `fsspec.registry` is a read-only view of this dict
    from fsspec.registry import _registry

    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if stoker[gcs] were not installed (dev installs it)
    monkeypatch.delitem(_registry, "gs", raising=False)
    with pytest.raises(StorageError, match=r"gs://b/run.*pip install 'stoker\[gcs\]'"):
        CheckpointManager("gs://b/run")


def test_train_resume_on_memory_store_equals_local(tmp_path):
    x, y = make_data(64)
    make_estimator(tmp_path, save_checkpoints_steps=4).train(train_input(x, y), max_steps=12)
    url = _memory_url()
    make_estimator(url, save_checkpoints_steps=4).train(train_input(x, y), max_steps=8)
    est = make_estimator(url, save_checkpoints_steps=4)
    est.train(train_input(x, y), max_steps=12)
    fs = fsspec.filesystem("memory")
    key = url.removeprefix("memory:/")
    index = json.loads(fs.cat_file(f"{key}/checkpoint.json"))
    assert index["latest"] == "ckpt-12"
    rec = index["checkpoints"][-1]
    assert rec["dir"].startswith("ckpt-12.") and sorted(rec["files"]) == [
        "input-0.json",
        "model.safetensors",
        "train_state.pt",
    ]
    remote = fs.cat_file(f"{key}/{rec['dir']}/model.safetensors")
    assert remote == (tmp_path / "ckpt-12" / "model.safetensors").read_bytes()
    assert b"loss" in fs.cat_file(f"{key}/metrics.csv")  # summaries reach the store too
    assert [p for p in fs.ls(f"{key}/events", detail=False) if "tfevents" in p]
    assert est.evaluate(train_input(x, y), steps=1)["global_step"] == 12


def test_orphan_prefixes_are_removed_at_the_next_save():
    url = _memory_url()
    m = CheckpointManager(url)
    m.save(4, {"w": torch.ones(2)}, {"global_step": 4})
    fs = fsspec.filesystem("memory")
    key = url.removeprefix("memory:/")
    fs.pipe_file(f"{key}/ckpt-8.0123abcd/model.safetensors", b"half")  # a crashed write
    m2 = CheckpointManager(url)  # the next start
    assert m2.latest_step() == 4
    m2.save(8, {"w": torch.zeros(2)}, {"global_step": 8})
    names = storage.listdir(location(url))
    assert "ckpt-8.0123abcd" not in names and len([n for n in names if n.startswith("ckpt-")]) == 2
    assert torch.equal(load_checkpoint(m2.latest_path()).model_state["w"], torch.zeros(2))


# ---------------------------------------------------------------------------- S3 (moto)
def _s3_fs():  # noqa: ANN202
    return fsspec.filesystem("s3")


def test_s3_transient_5xx_and_slow_responses_are_retried_and_reported(s3_env, monkeypatch, caplog):
    import botocore.exceptions
    from s3fs.errors import translate_boto_error

    url = f"s3://bucket/{uuid.uuid4().hex[:8]}"
    m = CheckpointManager(url, retry=RetryPolicy(attempts=4, backoff=0.01, timeout=2.0))
    fs = storage.filesystem(location(url))
    real = fs.pipe_file
    calls = {"n": 0}

    def flaky(path, data, **kw):  # noqa: ANN001, ANN003, ANN202
        calls["n"] += 1
        if calls["n"] in (1, 3):  # HTTP 503 SlowDown, as s3fs raises it
            error = botocore.exceptions.ClientError(
                {
                    "Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                    "ResponseMetadata": {"HTTPStatusCode": 503},
                },
                "PutObject",
            )
            raise translate_boto_error(error) from error
        if calls["n"] == 2:
            time.sleep(0.3)  # slow, but within the timeout
        return real(path, data, **kw)

    monkeypatch.setattr(fs, "pipe_file", flaky)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        m.save(4, {"w": torch.ones(2)}, {"global_step": 4})
    retried = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retried) == 2 and all("reduce your request rate" in r for r in retried), retried
    assert torch.equal(load_checkpoint(m.latest_path()).model_state["w"], torch.ones(2))

    def hung(path, data, **kw):  # noqa: ANN001, ANN003, ANN202
        time.sleep(5)

    monkeypatch.setattr(fs, "pipe_file", hung)
    m.retry = RetryPolicy(attempts=2, backoff=0.01, timeout=0.5)
    with pytest.raises(
        StorageError,
        match=(
            r"ckpt-8 was not written: cannot write s3://bucket/.*: the store did not answer within 0.5 s; .*ckpt-4.* "
            r"stays the latest"
        ),
    ):
        m.save(8, {"w": torch.zeros(2)}, {"global_step": 8})
    monkeypatch.setattr(fs, "pipe_file", real)
    assert m.latest_step() == 4


def test_s3_index_writers_never_lose_each_others_updates(s3_env):
    stale_index_write_is_refused_and_loses_nothing(f"s3://bucket/{uuid.uuid4().hex[:8]}")


def _script(model_dir: str, *extra: str) -> list[str]:
    return [PYTHON, str(SCRIPT), "--model_dir", model_dir, "--max_steps", "30", *extra]


def _s3_latest(url: str) -> str | None:
    fs = _s3_fs()
    key = url.removeprefix("s3://") + "/checkpoint.json"
    fs.invalidate_cache()
    return json.loads(fs.cat_file(key))["latest"] if fs.exists(key) else None


@pytest.mark.slow
def test_s3_kill_9_during_training_and_during_a_write_then_rerun_is_bitwise_equal(s3_env, tmp_path):
    env = {**python_env(), **s3_env}
    ref = run_process(_script(str(tmp_path / "ref")), env=env, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    url = f"s3://bucket/{uuid.uuid4().hex[:8]}"
    kill_9_at_a_checkpoint_twice(_script(url), env, lambda: _s3_latest(url))
    assert _s3_latest(url) != "ckpt-30"
    done = run_process(_script(url), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumed from s3://" in done.stderr
    fs = _s3_fs()
    fs.invalidate_cache()
    index = json.loads(fs.cat_file(url.removeprefix("s3://") + "/checkpoint.json"))
    final = next(r for r in index["checkpoints"] if r["name"] == "ckpt-30")
    assert (
        fs.cat_file(f"{url.removeprefix('s3://')}/{final['dir']}/model.safetensors")
        == (tmp_path / "ref" / "ckpt-30" / "model.safetensors").read_bytes()
    )
    named = {r["dir"] for r in index["checkpoints"]}
    assert {
        p.rsplit("/", 1)[-1] for p in fs.ls(url.removeprefix("s3://"), detail=False) if "/ckpt-" in p
    } == named  # orphans gone


def test_sharded_checkpoint_through_dcp_fsspec_writer_and_reader():
    import torch.distributed.checkpoint as dcp

    from stoker.distributed.sharded import consolidate

    url = _memory_url()
    m = CheckpointManager(url)
    model = torch.nn.Linear(3, 2)
    prefix = m.begin(4)
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(prefix / "dcp"), no_dist=True)  # DCP's fsspec writer
    path = m.save(4, None, {"global_step": 4}, {0: {"skip": 4}}, tmp_dir=prefix)
    loaded = load_checkpoint(path)  # every dcp/ file verified against the index
    assert loaded.dcp_dir == path / "dcp" and loaded.step == 4 and loaded.input_states == {0: {"skip": 4}}
    assert sorted(m.records()[0].files) == ["dcp/.metadata", "dcp/__0_0.distcp", "input-0.json", "train_state.pt"]
    full = consolidate(loaded.dcp_dir)
    assert torch.equal(full["weight"], model.weight.detach()) and torch.equal(full["bias"], model.bias.detach())


_EVALUATOR = """
import sys, json, time
from stoker.checkpoint import CheckpointManager
m = CheckpointManager(sys.argv[1], keep_checkpoint_max=0, keep_best=("loss", "min"))
print("ready", flush=True)
done, deadline = [], time.monotonic() + 120  # a lost save would otherwise keep it waiting
while len(done) < 15 and time.monotonic() < deadline:
    recs = m.records()
    fresh = [r.step for r in recs if r.step not in done]
    for step in fresh:
        m.record_eval(step, {"loss": -float(step)})
        done.append(step)
print(json.dumps(done))
"""


@pytest.mark.slow
def test_s3_trainer_and_a_second_index_writer_racing(s3_env):
    url = f"s3://bucket/{uuid.uuid4().hex[:8]}"
    trainer = CheckpointManager(url, keep_checkpoint_max=0, keep_best=("loss", "min"))
    trainer.save(0, {"w": torch.zeros(1)}, {"global_step": 0})
    env = {**python_env(), **s3_env}
    proc = popen([PYTHON, "-c", _EVALUATOR, url], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # racing from the first save on (started before the evaluator is up, the saves could all be done)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", (
        proc.stderr.read() if proc.stderr else ""
    )
    for step in range(1, 15):
        trainer.save(step, {"w": torch.full((1,), float(step))}, {"global_step": step})
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    evaluated = json.loads(out)
    index = trainer.index()
    assert [r.step for r in index.checkpoints] == list(range(15))  # no save lost
    assert all(r.metrics == {"loss": -float(r.step)} for r in index.checkpoints if r.step in evaluated)
    assert sorted(evaluated) == list(range(15)) and index.best is not None and index.best.step == 14


def test_run_spec_on_a_memory_store():
    from stoker.run_spec import read_run_spec, write_run_spec

    url = _memory_url()
    write_run_spec(url, kind="zoo", model="lenet", dataset="mnist")
    assert read_run_spec(url)["model"] == "lenet"


def test_export_from_a_memory_store_to_one(tmp_path, monkeypatch):
    import tempfile

    from stoker.export import export

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the loader's copy goes

    x, y = make_data(64)
    url = _memory_url()
    est = make_estimator(url, save_checkpoints_steps=4)
    est.train(train_input(x, y), max_steps=4)
    target = export(est, url + "-export", x[:4])
    signature = json.loads(storage.read_bytes(location(target) / "signature.json"))
    assert signature["global_step"] == 4 and signature["checkpoint"].startswith(url + "/ckpt-4.")
    from stoker.export import load_exported

    exported = load_exported(target)  # copied down, loaded, the copy removed
    assert exported.signature == signature
    assert str(exported.path) == url + "-export" and exported.path.name == url.rsplit("/", 1)[1] + "-export"
    assert list(tmp_path.glob("stoker-export-*")) == [], "the temporary copy is removed once loaded"
    eager = est.model.eval()(x[:4])
    torch.testing.assert_close(exported({"features": x[:4]})["logits"], eager, rtol=1e-5, atol=1e-6)
    names = storage.listdir(location(url + "-export"))
    assert names == ["model.pt2", "model.safetensors", "signature.json"]


@pytest.mark.slow  # ~13 s: the harness measures the peak matmul rate first
def test_bench_train_dir_on_a_memory_store(capsys):
    from stoker.cli import main

    url = _memory_url()
    args = [
        "bench",
        "--model",
        "trivial",
        "--batch_size",
        "4",
        "--num_batches",
        "3",
        "--num_warmup_batches",
        "1",
        "--device",
        "cpu",
        "--train_dir",
        url,
        "--save_model_steps",
        "2",
    ]
    try:
        rc = main(args)
    except SystemExit as e:  # the command may exit with its status
        rc = e.code
    assert rc in (0, None)
    names = storage.listdir(location(url))
    assert "checkpoint.json" in names and "run_spec.json" in names
    assert CheckpointManager(url, writer=False).latest_step() == 4


def test_watching_evaluator_on_a_memory_store():
    from helpers.tiny import eval_input

    x, y = make_data(100)
    ex, ey = make_data(64, seed=1)
    url = _memory_url()
    make_estimator(
        url, iterations_per_loop=1, save_checkpoints_steps=2, keep_checkpoint_max=0, keep_best=("accuracy", "max")
    ).train(train_input(x, y), max_steps=6)
    evaluator = make_estimator(url, keep_checkpoint_max=0, keep_best=("accuracy", "max"))
    result = evaluator.evaluate_continuously(eval_input(ex, ey), timeout_secs=30, poll_secs=0.01, order="oldest")
    assert result.evaluated == [2, 4, 6] and "training finished at step 6" in result.stop_reason
    index = CheckpointManager(url, writer=False).index()
    assert all(r.metrics for r in index.checkpoints) and index.best is not None
    assert "metrics.csv" in storage.listdir(location(url) / "eval")  # the scalars reach the store


def test_adanet_search_on_s3_equals_local(s3_env, tmp_path):
    """An AdaNet search on a real S3-protocol server (moto) equals the local one: conditional
    index writes, ETags (the memory:// cases are in tests/adanet/test_adanet_object_store.py)."""
    from helpers.adanet import make_data as adanet_data
    from helpers.adanet import small_search as _adanet_search
    from helpers.adanet import train_input as adanet_input

    torch.set_num_threads(1)
    x, y = adanet_data(48)
    local = _adanet_search(tmp_path / "local")
    local.train(adanet_input(x, y))
    remote = _adanet_search(f"s3://bucket/adanet-{uuid.uuid4().hex[:8]}")
    remote.train(adanet_input(x, y))
    assert remote.architecture().serialize() == local.architecture().serialize()
    mine, theirs = remote.final_ensemble().state_dict(), local.final_ensemble().state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs) and mine.keys() == theirs.keys()
