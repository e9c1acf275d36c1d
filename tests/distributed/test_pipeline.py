"""Pipeline parallelism with real gloo processes: pipelined training equals one process on the
same global batch, resumes bitwise, and its checkpoints read in one process."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import stoker
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, launch_replicas, python_env
from helpers.tiny import classifier_fn, make_data

SCRIPT = SCRIPTS / "pipe_script.py"


def run(nproc: int, *args: str) -> list[str]:
    procs = launch_replicas(SCRIPT, nproc, *args)
    errs = []
    for p in procs:
        _, err = p.communicate(timeout=240)
        errs.append(err)
        assert p.returncode == 0, err[-4000:]
        assert "Traceback" not in err, err[-4000:]  # nor in a thread (the heartbeat's)
    return errs


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def assert_same_run(got: dict, want: dict) -> None:
    """Loss curve, host_call values, weights, exact eval metrics and predictions in input order."""
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
    np.testing.assert_allclose(got["host"], want["host"], rtol=1e-5, atol=1e-7)
    assert got["weights"].keys() == want["weights"].keys()
    for k in want["weights"]:
        np.testing.assert_allclose(got["weights"][k], want["weights"][k], rtol=1e-5, atol=1e-6)
    # evaluation on 203 examples: the last batch padded and masked
    assert got["metrics"]["accuracy"] == want["metrics"]["accuracy"]
    assert got["metrics"]["loss"] == pytest.approx(want["metrics"]["loss"], rel=1e-5)
    assert len(got["predictions"]) == 203
    np.testing.assert_allclose(got["predictions"], want["predictions"], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The reference: the same program in one process (the model runs unsplit)."""
    out = tmp_path_factory.mktemp("one") / "one.json"
    run(1, "--split", "2", "--out", str(out))
    return load(out)


def test_two_stage_1f1b_equals_one_process_and_its_checkpoint_reads_in_one_process(tmp_path, one_process):
    model_dir = tmp_path / "run"
    run(2, "--split", "2", "--schedule", "1f1b", "--model_dir", str(model_dir), "--out", str(tmp_path / "pp.json"))
    pp = load(tmp_path / "pp.json")
    assert pp["world_size"] == 2
    assert_same_run(pp, one_process)
    # one atomic ckpt-12 whose index (and manifest) covers every stage's shard
    ckpt = model_dir / "ckpt-12"
    files = json.loads((model_dir / "checkpoint.json").read_text())["checkpoints"][-1]["files"]
    on_disk = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())
    assert sorted(files) == [f for f in on_disk if f not in ("manifest.json", "evaluation.json")] and {
        "dcp/__0_0.distcp",
        "dcp/__1_0.distcp",
        "dcp/.metadata",
    } <= set(files)
    # stoker checkpoint consolidate -> one model.safetensors that loads into the unsplit model
    from stoker.cli import main as stoker_cli

    assert stoker_cli(["checkpoint", "consolidate", str(model_dir)]) == 0
    import safetensors.torch

    from helpers.pipeline import make_model

    unsplit = make_model({})
    unsplit.load_state_dict(safetensors.torch.load_file(str(ckpt / "model.safetensors")))
    x, y = make_data(203)
    with torch.no_grad():
        np.testing.assert_allclose(unsplit(x).numpy(), np.asarray(pp["predictions"]), rtol=0, atol=1e-6)
    # the pipelined checkpoint evaluates and warm-starts in one process, without consolidating
    est = stoker.Estimator(
        model=make_model, model_fn=classifier_fn, config=stoker.RunConfig(progress_bar=False), eval_batch_size=16
    )

    def eval_input(params):
        return stoker.data.arrays(x, y, read=stoker.data.ReadOptions(shuffle=False, num_epochs=1).for_replica(params))

    metrics = est.evaluate(eval_input, checkpoint_path=ckpt)
    assert metrics["accuracy"] == pp["metrics"]["accuracy"] and metrics["global_step"] == 12
    assert metrics["loss"] == pytest.approx(pp["metrics"]["loss"], rel=1e-6)
    warm = stoker.Estimator(
        model=make_model, model_fn=classifier_fn, warm_start_from=str(ckpt), config=stoker.RunConfig(progress_bar=False)
    )
    for k, v in warm.model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), np.asarray(pp["weights"][k], dtype=np.float32))
    # training on from it in another layout is refused with a clear error
    est = stoker.Estimator(
        model=make_model,
        model_fn=classifier_fn,
        train_batch_size=16,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        config=stoker.RunConfig(model_dir=model_dir, progress_bar=False),
    )
    train_input = lambda params: stoker.data.arrays(x, y, read=stoker.data.ReadOptions().for_replica(params))  # noqa: E731
    with pytest.raises(stoker.errors.CheckpointError, match="2 pipeline stage.*this run has 1.*warm_start_from"):
        est.train(train_input, max_steps=14)


def test_two_stage_gpipe_with_recompute_equals_one_process(tmp_path, one_process):
    run(
        2,
        "--split",
        "2",
        "--schedule",
        "gpipe",
        "--micro",
        "8",
        "--recompute",
        "all",
        "--out",
        str(tmp_path / "pp.json"),
    )
    assert_same_run(load(tmp_path / "pp.json"), one_process)


@pytest.mark.slow
def test_two_replicas_by_two_stages_with_clipping_equal_one_process(tmp_path):
    # clipping by the global norm: the stages' squared norms are summed over the pipeline
    run(1, "--split", "2", "--clip", "0.5", "--out", str(tmp_path / "one.json"))
    run(4, "--split", "2", "--clip", "0.5", "--out", str(tmp_path / "pp.json"))
    got = load(tmp_path / "pp.json")
    assert got["world_size"] == 4
    assert_same_run(got, load(tmp_path / "one.json"))


@pytest.mark.slow
def test_interleaved_1f1b_two_stages_per_process_equals_one_process(tmp_path):
    run(1, "--split", "1,2,3", "--out", str(tmp_path / "one.json"))
    run(
        2, "--split", "1,2,3", "--schedule", "interleaved1f1b", "--per_process", "2", "--out", str(tmp_path / "pp.json")
    )
    assert_same_run(load(tmp_path / "pp.json"), load(tmp_path / "one.json"))


@pytest.mark.slow
def test_two_stages_in_bf16_follow_one_process(tmp_path):
    # autocast runs inside the schedule: bf16 activations cross the stage boundary
    run(1, "--split", "2", "--precision", "bf16", "--out", str(tmp_path / "one.json"))
    run(2, "--split", "2", "--precision", "bf16", "--out", str(tmp_path / "pp.json"))
    one, pp = load(tmp_path / "one.json"), load(tmp_path / "pp.json")
    np.testing.assert_allclose(pp["losses"], one["losses"], rtol=1e-3)  # bf16 rounds per micro-batch
    assert pp["metrics"]["accuracy"] == pytest.approx(one["metrics"]["accuracy"], abs=0.01)


@pytest.mark.slow
def test_kill_9_or_sigterm_of_a_stage_and_the_rerun_resumes_bitwise(tmp_path):
    from stoker.distributed.sharded import consolidate

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    args = ("--split", "2", "--max_steps", "60", "--timeout", "30")
    procs = launch_replicas(SCRIPT, 2, *args, "--model_dir", str(killed), "--sleep", "0.02")
    deadline = time.monotonic() + 120
    while not (killed / "checkpoint.json").exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    time.sleep(0.5)
    procs[1].send_signal(signal.SIGKILL)  # the last stage
    _, err = procs[0].communicate(timeout=90)
    procs[1].wait()
    assert procs[0].returncode not in (0, None)
    assert "process 1 (replica 0, stage 1) (silent for" in err and "stopped responding" in err, err[-3000:]
    latest = json.loads((killed / "checkpoint.json").read_text())["latest"]
    assert int(latest.split("-")[1]) < 60
    run(2, *args, "--model_dir", str(killed))
    run(2, *args, "--model_dir", str(whole))
    a, b = consolidate(killed / "ckpt-60" / "dcp"), consolidate(whole / "ckpt-60" / "dcp")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # SIGTERM to the last stage only: both stages agree, checkpoint the same step and exit 143
    preempted = tmp_path / "preempted"
    procs = launch_replicas(SCRIPT, 2, *args, "--model_dir", str(preempted), "--sleep", "0.02")
    while not (preempted / "checkpoint.json").exists():
        assert time.monotonic() < deadline + 240 and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    errs = [p.communicate(timeout=90)[1] for p in procs]
    assert [p.returncode for p in procs] == [128 + signal.SIGTERM] * 2, errs[0][-2000:]
    step = int(json.loads((preempted / "checkpoint.json").read_text())["latest"].split("-")[1])
    assert step < 60 and all(f"SIGTERM at step {step}: checkpoint" in e for e in errs)
    run(2, *args, "--model_dir", str(preempted))
    c = consolidate(preempted / "ckpt-60" / "dcp")
    assert all(torch.equal(c[k], b[k]) for k in b)


# ------------------------------------------------------------------ clear errors, in one process
def _estimator(**config: object) -> stoker.Estimator:
    from helpers.pipeline import make_model

    return stoker.Estimator(
        model=make_model,
        model_fn=classifier_fn,
        train_batch_size=16,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(progress_bar=False, **config),
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("split", "message"),
    [
        (("2", "nope"), r"'nope' is not a pipeline unit of Sequential; split before one of: 0, 1, 2, 3"),
        (("1", "2", "3", "4"), r"asks for 5 stages, but Sequential has only 4 pipeline units"),
        (("0",), r"splitting before the first unit '0' leaves stage 0 empty"),
        (("3", "1"), r"give the names in the model's order"),
    ],
)
def test_bad_split_points_are_named(split, message):
    est = _estimator(pipeline=stoker.PipelineConfig(split=split))
    with pytest.raises(ValueError, match=message):
        est.model  # noqa: B018 - building the model checks the split, also in one process


def test_bad_pipeline_settings_are_named():
    with pytest.raises(ValueError, match="PipelineConfig.microbatches=3 does not divide"):
        _estimator(pipeline=stoker.PipelineConfig(split=("2",), microbatches=3))
    with pytest.raises(ValueError, match="PipelineConfig.schedule must be one of gpipe, 1f1b, interleaved1f1b"):
        stoker.RunConfig(pipeline=stoker.PipelineConfig(split=("2",), schedule="zb"))
    with pytest.raises(ValueError, match="interleaved1f1b' needs stages_per_process >= 2"):
        stoker.RunConfig(pipeline=stoker.PipelineConfig(split=("2",), schedule="interleaved1f1b"))
    with pytest.raises(ValueError, match="names a module twice"):
        stoker.RunConfig(pipeline=stoker.PipelineConfig(split=("2", "2")))
    with pytest.raises(ValueError, match="set gradient_accumulation_steps=1"):
        stoker.RunConfig(pipeline=stoker.PipelineConfig(split=("2",)), gradient_accumulation_steps=2)


def test_one_process_runs_a_pipelined_program_unsplit():
    x, y = make_data(64)
    est = _estimator(pipeline=stoker.PipelineConfig(split=("2",), microbatches=4), log_every_n_steps=None)
    est.train(lambda params: stoker.data.arrays(x, y, read=stoker.data.ReadOptions().for_replica(params)), max_steps=3)
    assert est.global_step == 3 and sorted(est.model.state_dict()) == [
        "0.0.bias",
        "0.0.weight",
        "1.0.bias",
        "1.0.weight",
        "2.0.bias",
        "2.0.weight",
        "3.bias",
        "3.weight",
    ]


# ------------------------------------------------------------------ the bert recipe
def test_bert_layout_flags():
    from stoker.recipes.bert import BertConfig, pipeline_error

    config = BertConfig(num_layers=4, hidden_layers_per_stage=2, replicas=2)
    assert config.pipeline_split() == ("layers.2",) and config.run_config().pipeline_stages == 2
    assert BertConfig(num_layers=6, hidden_layers_per_stage=2).pipeline_split() == ("layers.2", "layers.4")
    assert BertConfig(num_layers=4, hidden_layers_per_stage=4).pipeline_split() is None
    assert pipeline_error(config, 4) is None
    assert pipeline_error(BertConfig(num_layers=4, hidden_layers_per_stage=2), 1) is None  # one process: unsplit
    assert "need a multiple of 2 processes; torchrun started 3" in pipeline_error(
        BertConfig(hidden_layers_per_stage=2), 3
    )
    assert "needs 4 processes; torchrun started 2" in pipeline_error(config, 2)
    assert "needs torchrun: torchrun --nproc_per_node=4" in pipeline_error(config, 1)
    assert "more than --num_layers (4)" in pipeline_error(BertConfig(num_layers=4, hidden_layers_per_stage=5), 1)
    bad_micro = BertConfig(num_layers=4, hidden_layers_per_stage=2, batch_size=8, pipeline_microbatches=3)
    assert "--pipeline_microbatches (3) must divide the per-replica batch" in pipeline_error(bad_micro, 4)


@pytest.mark.slow
def test_stoker_train_bert_runs_as_two_stages_by_two_replicas_under_torchrun(tmp_path):
    flags = [
        "--model_dir",
        str(tmp_path / "bert"),
        "--hidden_layers_per_stage",
        "2",
        "--replicas",
        "2",
        "--max_steps",
        "4",
        "--corpus_bytes",
        "200000",
        "--eval_steps",
        "2",
        "--hidden_size",
        "32",
        "--intermediate_size",
        "64",
        "--num_heads",
        "2",
        "--eval_every_n_steps",
        "4",
        "--save_checkpoints_steps",
        "2",
        "--device",
        "cpu",
    ]
    out = subprocess.run(
        [
            str(Path(PYTHON).with_name("torchrun")),
            "--standalone",
            "--nproc_per_node=4",
            "-m",
            "stoker",
            "train",
            "bert",
            *flags,
        ],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "stages 2" in out.stdout and "held-out at step 4" in out.stdout
    assert (tmp_path / "bert" / "ckpt-4" / "dcp" / ".metadata").exists()
    # the wrong number of processes is a usage error naming the flags
    bad = subprocess.run(
        [
            str(Path(PYTHON).with_name("torchrun")),
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "stoker",
            "train",
            "bert",
            *flags,
        ],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode != 0 and "--replicas 2 x 2 stage(s)" in bad.stderr
