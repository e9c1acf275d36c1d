"""``RunConfig.ema``: the moving average of the weights (``stoker.engine.ema``) against a
hand-written one, with exact values; in every checkpoint and bitwise across a resume; used by
evaluation, prediction and export and never by training."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch
from torch import nn

import stoker
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, finished, in_background, launch_replicas, popen, python_env
from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.errors import ConfigError

X, Y = make_data(64)


# ---------------------------------------------------------------------------- a weight that counts steps
class Counter(nn.Module):
    """One weight ``w`` (and a frozen one): SGD with lr 1 on ``loss = -w`` makes ``w`` = the step."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.frozen = nn.Parameter(torch.full((), 7.0), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * torch.ones(x.shape[0])


def counter_fn(model, features, labels, mode, params):  # noqa: ANN001, ANN201
    w = model(features)
    loss = -w.mean() if mode == stoker.ModeKeys.TRAIN else -w
    return stoker.EstimatorSpec(loss=loss, predictions={"w": w})


def counter(model_dir: Path | None, ema: stoker.EMA | None, **config: object) -> stoker.Estimator:
    return stoker.Estimator(
        model=lambda p: Counter(),
        model_fn=counter_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=1.0),
        config=stoker.RunConfig(
            model_dir=model_dir,
            ema=ema,
            iterations_per_loop=3,
            progress_bar=False,
            log_every_n_steps=None,
            **config,  # type: ignore[arg-type]
        ),
        train_batch_size=4,
    )


def ones(params):  # noqa: ANN001, ANN201
    return stoker.data.arrays(torch.ones(8, 1), read=stoker.data.ReadOptions(shuffle=False).for_replica(params))


def ones_once(params):  # noqa: ANN001, ANN201
    return stoker.data.arrays(torch.ones(4, 1), read=stoker.data.ReadOptions(num_epochs=1).for_replica(params))


def ema_file(model_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(model_dir / f"ckpt-{step}" / "ema.safetensors"))


def test_the_average_of_a_weight_that_counts_steps_has_exact_values(tmp_path: Path) -> None:
    # decay 1/2 from step 1: e_1 = w_1 = 1 (a copy), e_s = (e_{s-1} + s) / 2 = s - 1 + 2^-(s-1)
    est = counter(tmp_path / "every", stoker.EMA(decay=0.5), save_checkpoints_steps=1, keep_checkpoint_max=0)
    est.train(ones, max_steps=7)
    for s in range(1, 8):
        assert ema_file(tmp_path / "every", s)["w"].item() == s - 1 + 2.0 ** -(s - 1), s
    # start at step 2, every 2: a copy at 2 (2.0), then 3.0 at 4, 4.5 at 6, 6.25 at 8; no update between
    est = counter(
        tmp_path / "sparse",
        stoker.EMA(decay=0.5, start_step=2, every_n_steps=2),
        save_checkpoints_steps=1,
        keep_checkpoint_max=0,
    )
    est.train(ones, max_steps=8)
    assert not (tmp_path / "sparse" / "ckpt-1" / "ema.safetensors").exists()  # not started: none written
    got = {s: ema_file(tmp_path / "sparse", s)["w"].item() for s in range(2, 9)}
    assert got == {2: 2.0, 3: 2.0, 4: 3.0, 5: 3.0, 6: 4.5, 7: 4.5, 8: 6.25}
    state = torch.load(tmp_path / "sparse" / "ckpt-8" / "train_state.pt", weights_only=True)
    assert state["ema"] == {"updates": 4, "names": ["w"]}  # the frozen weight is not averaged


def test_evaluation_prediction_and_export_use_the_average_and_training_never_does(tmp_path: Path) -> None:
    est = counter(tmp_path, stoker.EMA(decay=0.5), keep_best=("loss", "min"))
    est.train(ones, max_steps=4)  # w = 4, e = 3 + 1/8
    assert est.evaluate(ones_once)["loss"] == -3.125
    assert [float(r["w"]) for r in est.predict(ones_once)] == [3.125] * 4
    est.export(tmp_path / "export", torch.ones(2, 1))
    assert safetensors.torch.load_file(str(tmp_path / "export" / "model.safetensors"))["w"].item() == 3.125
    signature = json.loads((tmp_path / "export" / "signature.json").read_text())
    assert signature["checkpoint_choice"].endswith("EMA weights")
    assert est.model.w.item() == 4.0  # put back
    est.train(ones, max_steps=6)  # training goes on from the weights, not the average
    assert est.model.w.item() == 6.0
    assert json.loads((tmp_path / "checkpoint.json").read_text())["best"]["value"] == -3.125  # keep_best by it
    # a fresh Estimator reading the checkpoint: the average of ckpt-6 (5 + 1/32)
    assert counter(tmp_path, stoker.EMA(decay=0.5)).evaluate(ones_once)["loss"] == -5.03125
    # use_for_inference=False: kept in checkpoints, inference on the weights
    assert counter(tmp_path, stoker.EMA(decay=0.5, use_for_inference=False)).evaluate(ones_once)["loss"] == -6.0
    assert counter(tmp_path, None).evaluate(ones_once)["loss"] == -6.0


def test_in_memory_evaluation_mid_training_leaves_training_bitwise(tmp_path: Path) -> None:
    est = counter(None, stoker.EMA(decay=0.5))
    est.train_and_evaluate(ones, ones_once, max_steps=6, eval_every_n_steps=2)
    assert est.model.w.item() == 6.0
    assert est.evaluate(ones_once)["loss"] == -(5 + 2.0**-5)


# ---------------------------------------------------------------------------- a real model against a hand loop
class Trajectory(stoker.hooks.Hook):
    """The weights after every step (iterations_per_loop=1: a loop boundary after each)."""

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def after_loop(self, run: stoker.hooks.RunContext, result: stoker.hooks.LoopResult) -> None:
        self.weights[run.global_step] = {k: v.detach().clone() for k, v in run.model.state_dict().items()}


def hand_ema(trajectory: dict[int, dict[str, torch.Tensor]], decay: float, start: int, every: int) -> dict:
    ema: dict[str, torch.Tensor] | None = None
    for step in sorted(trajectory):
        if step < start or step % every:
            continue
        w = trajectory[step]
        if ema is None:
            ema = {k: v.clone() for k, v in w.items()}
        else:
            ema = {k: torch.lerp(ema[k], w[k], 1 - decay) for k in ema}
    assert ema is not None
    return ema


@pytest.mark.parametrize("decay, start, every", [(0.9, 0, 1), (0.75, 5, 3)])
def test_the_average_equals_a_hand_written_one_bitwise(tmp_path: Path, decay: float, start: int, every: int) -> None:
    trajectory = Trajectory()
    est = make_estimator(
        tmp_path / "ema", iterations_per_loop=1, ema=stoker.EMA(decay=decay, start_step=start, every_n_steps=every)
    )
    est.train(train_input(X, Y), max_steps=20, hooks=[trajectory])
    expected = hand_ema(trajectory.weights, decay, start, every)
    got = ema_file(tmp_path / "ema", 20)
    assert set(got) == set(expected)
    for k in expected:
        assert torch.equal(got[k], expected[k]), k
    # the textbook form, in float64, to fp32 rounding: decay * e + (1 - decay) * w
    e64 = None
    for step in sorted(trajectory.weights):
        if step >= start and step % every == 0:
            w = {k: v.double() for k, v in trajectory.weights[step].items()}
            e64 = w if e64 is None else {k: decay * e64[k] + (1 - decay) * w[k] for k in w}
    assert e64 is not None
    for k in e64:
        torch.testing.assert_close(got[k].double(), e64[k], rtol=1e-6, atol=1e-7)
    # and the weights trained as without an average
    plain = make_estimator(tmp_path / "plain", iterations_per_loop=1)
    plain.train(train_input(X, Y), max_steps=20)
    for k, v in plain.model.state_dict().items():
        assert torch.equal(v, est.model.state_dict()[k]), k


@pytest.mark.parametrize("compile", ["module", "step"])
def test_with_a_compiled_model_or_step_the_average_is_the_hand_written_one(tmp_path: Path, compile: str) -> None:
    trajectory = Trajectory()  # the update runs beside the compiled step, eagerly, on its weights
    est = make_estimator(tmp_path, iterations_per_loop=1, compile=compile, ema=stoker.EMA(decay=0.9, start_step=2))
    est.train(train_input(X, Y), max_steps=8, hooks=[trajectory])
    expected, got = hand_ema(trajectory.weights, 0.9, 2, 1), ema_file(tmp_path, 8)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert est.evaluate(eval_input(X, Y))["global_step"] == 8


def test_resumed_anywhere_the_average_is_bitwise_an_uninterrupted_one(tmp_path: Path) -> None:
    ema = stoker.EMA(decay=0.8, start_step=3, every_n_steps=2)
    make_estimator(tmp_path / "ref", save_checkpoints_steps=5, ema=ema).train(train_input(X, Y), max_steps=20)
    for stop in (2, 5, 11):  # before it starts, at a checkpoint, between updates
        model_dir = tmp_path / f"at{stop}"
        make_estimator(model_dir, save_checkpoints_steps=5, ema=ema).train(train_input(X, Y), max_steps=stop)
        make_estimator(model_dir, save_checkpoints_steps=5, ema=ema).train(train_input(X, Y), max_steps=20)
        for name in ("ema.safetensors", "model.safetensors"):
            assert (model_dir / "ckpt-20" / name).read_bytes() == (tmp_path / "ref" / "ckpt-20" / name).read_bytes()


def test_an_asynchronous_save_writes_the_same_average(tmp_path: Path) -> None:
    ema = stoker.EMA(decay=0.8)
    for name, io in (("sync", stoker.CheckpointIO()), ("async", stoker.CheckpointIO(async_save=True))):
        est = make_estimator(tmp_path / name, save_checkpoints_steps=3, ema=ema, checkpoint_io=io)
        est.train(train_input(X, Y), max_steps=9)
    for step in (3, 6, 9):
        name = f"ckpt-{step}/ema.safetensors"
        assert (tmp_path / "async" / name).read_bytes() == (tmp_path / "sync" / name).read_bytes()


def test_turned_on_at_a_resume_it_starts_at_its_next_step(tmp_path: Path) -> None:
    make_estimator(tmp_path, save_checkpoints_steps=4).train(train_input(X, Y), max_steps=8)
    trajectory = Trajectory()
    est = make_estimator(tmp_path, iterations_per_loop=1, ema=stoker.EMA(decay=0.9))
    est.train(train_input(X, Y), max_steps=12, hooks=[trajectory])
    expected = hand_ema(trajectory.weights, 0.9, 9, 1)  # the copy at step 9, the first after the resume
    got = ema_file(tmp_path, 12)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_half_precision_weights_keep_an_fp32_average(tmp_path: Path) -> None:
    est = make_estimator(tmp_path, precision="bf16-sr", ema=stoker.EMA(decay=0.99))
    est.train(train_input(X, Y), max_steps=6)
    assert next(est.model.parameters()).dtype == torch.bfloat16
    assert {t.dtype for t in ema_file(tmp_path, 6).values()} == {torch.float32}
    assert est.evaluate(eval_input(X, Y))["global_step"] == 6  # the average goes into bf16 weights and back


@pytest.mark.parametrize(
    "ema, match",
    [
        (stoker.EMA, None),
        (lambda: stoker.EMA(decay=1.0), r"EMA.decay must be a number in \[0, 1\); got 1.0"),
        (lambda: stoker.EMA(every_n_steps=0), "EMA.every_n_steps must be a positive integer; got 0"),
        (lambda: stoker.EMA(start_step=-1), "EMA.start_step must be an integer >= 0; got -1"),
        (lambda: 0.999, r"RunConfig.ema must be None or a stoker.EMA\(decay=...\); got 0.999"),
    ],
)
def test_bad_settings_are_named(ema, match) -> None:  # noqa: ANN001
    if match is None:
        assert stoker.RunConfig(ema=ema()).ema == stoker.EMA(decay=0.999, start_step=0, every_n_steps=1)
        return
    with pytest.raises(ConfigError, match=match):
        stoker.RunConfig(ema=ema())


def test_with_a_pipeline_it_is_refused() -> None:
    with pytest.raises(ConfigError, match="ema is not supported with a pipeline"):
        stoker.RunConfig(ema=stoker.EMA(), pipeline=stoker.PipelineConfig(split=("fc2",)))


def test_buffers_are_averaged_and_counters_are_not(tmp_path: Path) -> None:
    trajectory = Trajectory()
    est = stoker.Estimator(
        model=lambda p: nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), nn.Linear(6, 3)),
        model_fn=lambda model, x, y, mode, params: stoker.EstimatorSpec(
            loss=nn.functional.cross_entropy(model(x), y), predictions={"logits": model(x)}
        ),
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(
            model_dir=tmp_path, ema=stoker.EMA(decay=0.7), iterations_per_loop=1, progress_bar=False
        ),
        train_batch_size=16,
    )
    est.train(train_input(X, Y), max_steps=9, hooks=[trajectory])
    expected = hand_ema(
        {s: {k: v for k, v in w.items() if v.is_floating_point()} for s, w in trajectory.weights.items()}, 0.7, 0, 1
    )
    got = ema_file(tmp_path, 9)
    assert sorted(got) == sorted(expected) and "1.num_batches_tracked" not in got
    assert "1.running_mean" in got and all(torch.equal(got[k], expected[k]) for k in expected)


# ---------------------------------------------------------------------------- kill -9, real processes
TRAIN = SCRIPTS / "train_script.py"


def test_kill_9_mid_run_then_rerun_gives_the_uninterrupted_average_bitwise(tmp_path: Path) -> None:
    args = ["--max_steps", "60", "--ema", "0.9"]
    ref = in_background([PYTHON, str(TRAIN), "--model_dir", str(tmp_path / "ref"), *args])
    crashed = tmp_path / "crashed"
    for _ in range(2):  # killed twice, at random moments once a checkpoint exists
        argv = [PYTHON, str(TRAIN), "--model_dir", str(crashed), *args, "--sleep", "0.02"]
        proc = popen(argv, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not (crashed / "checkpoint.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        time.sleep(random.uniform(0.0, 0.6))
        proc.kill()
        assert proc.wait() == -signal.SIGKILL
    index = json.loads((crashed / "checkpoint.json").read_text())
    assert index["latest"] != "ckpt-60", "the run finished before the kill; slow it down"
    finished(in_background([PYTHON, str(TRAIN), "--model_dir", str(crashed), *args]))
    finished(ref)
    for name in ("ema.safetensors", "model.safetensors"):
        assert (crashed / "ckpt-60" / name).read_bytes() == (tmp_path / "ref" / "ckpt-60" / name).read_bytes(), name


# ---------------------------------------------------------------------------- replicas: DDP and FSDP2 (gloo, CPU)
def replicas(nproc: int, *args: str) -> None:
    procs = launch_replicas(SCRIPTS / "dist_script.py", nproc, "--opt", "momentum", "--ema", "0.8", *args)
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err


@pytest.mark.slow  # default run under 5 minutes on 2 cores; the fast tests of this area cover the same code
def test_sharded_the_average_is_sharded_like_the_weights_and_resumes(tmp_path: Path) -> None:
    from stoker.distributed.sharded import consolidate

    rep, sh = tmp_path / "rep", tmp_path / "sh"
    replicas(2, "--strategy", "replicated", "--model_dir", str(rep), "--out", str(tmp_path / "rep.json"))
    replicas(2, "--strategy", "sharded", "--model_dir", str(sh), "--max_steps", "6")
    replicas(2, "--strategy", "sharded", "--model_dir", str(sh), "--out", str(tmp_path / "sh.json"))
    dcp = sh / "ckpt-12" / "dcp"
    assert not (sh / "ckpt-12" / "ema.safetensors").exists()
    assert torch.load(sh / "ckpt-12" / "train_state.pt", weights_only=True)["ema"]["updates"] == 10
    ema, reference = consolidate(dcp, key="ema"), ema_file(rep, 12)
    assert sorted(ema) == sorted(reference)
    for k in reference:  # two replicas sharded or replicated: the same average, to reduction order
        torch.testing.assert_close(ema[k], reference[k], rtol=1e-5, atol=1e-6)
    # both evaluated the average, and had their weights back afterwards (read after evaluate and predict)
    sh_out, rep_out = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("sh", "rep"))
    assert sh_out["metrics"]["loss"] == pytest.approx(rep_out["metrics"]["loss"], rel=1e-5)
    for k, v in rep_out["weights"].items():
        torch.testing.assert_close(torch.tensor(sh_out["weights"][k]), torch.tensor(v), rtol=1e-5, atol=1e-6)
    assert not torch.equal(ema["fc1.weight"], torch.tensor(rep_out["weights"]["fc1.weight"]))
    # one process resumes the sharded checkpoint's average
    replicas(1, "--model_dir", str(sh), "--max_steps", "14")
    state = torch.load(sh / "ckpt-14" / "train_state.pt", weights_only=True)["ema"]
    assert state["updates"] == 12 and sorted(ema_file(sh, 14)) == sorted(reference)
