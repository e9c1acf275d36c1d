"""``NanLossHook(on_nan="rollback")``: a bad step is rolled back and its input batches passed over.

The exactness claim: a run that rolls back over the poisoned stream batches ends with weights
bitwise equal to a run over the same stream with those batches taken out (with gradient
accumulation, every micro-batch of the bad step), whatever the loop length and checkpoint
interval; the records of the rollbacks ride in the checkpoint's input state.
"""

from __future__ import annotations

import json
import signal

import pytest
import torch

import stoker
from helpers.paths import SCRIPTS
from helpers.processes import PYTHON, finished, in_background, launch_replicas, python_env, run_process
from helpers.rollback import POISONED, make, omitting, poisoned_data, train_input
from stoker.engine.infeed import with_rollback
from stoker.hooks import Hook, NanLossHook
from stoker.summary.writer import read_metrics_csv

SCRIPT = SCRIPTS / "rollback_script.py"


def weights(est: stoker.Estimator) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in est.model.state_dict().items()}


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize(
    ("accumulation", "max_steps", "skipped"),
    [(1, 16, [[9], [13]]), (2, 9, [[8, 9], [12, 13]])],  # with 2 micro-batches a step, both of the bad step go
)
def test_rollback_equals_a_run_whose_stream_never_had_the_bad_batches(tmp_path, accumulation, max_steps, skipped):
    x, y = poisoned_data(batch=4 // accumulation)  # stream batches are micro-batches
    est = make(tmp_path / "a", gradient_accumulation_steps=accumulation)
    est.train(train_input(x, y), max_steps=max_steps, hooks=[NanLossHook(on_nan="rollback")])
    assert est.global_step == max_steps
    ref = make(tmp_path / "b", gradient_accumulation_steps=accumulation)
    ref.train(omitting(x, y, {b for s in skipped for b in s}), max_steps=max_steps)
    assert_bitwise(weights(est), weights(ref))
    # the records ride in the input position of every later checkpoint
    state = json.loads((tmp_path / "a" / f"ckpt-{max_steps}" / "input-0.json").read_text())
    assert [r["batches"] for r in state["rollbacks"]] == skipped
    assert state["raw"] == max_steps * accumulation + 2 * accumulation
    assert all("loss is inf" in r["reason"] or "loss is nan" in r["reason"] for r in state["rollbacks"])
    rows = [r for r in read_metrics_csv(tmp_path / "a") if r["tag"] == "rollbacks"]
    assert rows and rows[-1]["value"] == 2.0  # counted in the summaries
    # without a poisoned batch nothing is recorded: the input state keeps its old form
    clean = json.loads((tmp_path / "b" / f"ckpt-{max_steps}" / "input-0.json").read_text())
    assert "rollbacks" not in clean and "raw" not in clean


def test_a_spike_rolls_back_like_a_nan(tmp_path):
    x, y = poisoned_data(value=30.0)  # a finite loss, far above the median of the recent ones
    hook = NanLossHook(on_nan="rollback", spike_factor=4.0, spike_window=5)
    est = make(tmp_path / "a")
    est.train(train_input(x, y), max_steps=16, hooks=[hook])
    state = json.loads((tmp_path / "a" / "ckpt-16" / "input-0.json").read_text())
    assert [r["batches"] for r in state["rollbacks"]] == [[9], [13]]
    assert "over 4 x the median" in state["rollbacks"][0]["reason"]
    ref = make(tmp_path / "b")
    ref.train(omitting(x, y, set(POISONED)), max_steps=16, hooks=[NanLossHook(spike_factor=4.0, spike_window=5)])
    assert_bitwise(weights(est), weights(ref))  # the reference sees no spike: the same window, restored


def test_a_spike_stops_the_run_when_not_rolling_back(tmp_path):
    x, y = poisoned_data(value=30.0)
    with pytest.raises(stoker.NanLossError, match=r"at step 10 \(over 4 x the median [\d.]+ of the last 5 losses\)"):
        make(tmp_path).train(train_input(x, y), max_steps=16, hooks=[NanLossHook(spike_factor=4.0, spike_window=5)])


def test_max_rollbacks_then_stops_with_nan_loss_error(tmp_path):
    x, y = poisoned_data()
    est = make(tmp_path)
    with pytest.raises(stoker.NanLossError, match=r"at step 13 \(1 rollback\(s\) already, max_rollbacks=1\)"):
        est.train(train_input(x, y), max_steps=16, hooks=[NanLossHook(on_nan="rollback", max_rollbacks=1)])


def test_the_default_still_stops_and_rollback_needs_a_checkpoint(tmp_path):
    x, y = poisoned_data()
    with pytest.raises(stoker.NanLossError, match=r"loss is (inf|nan) at step 10: training stopped"):
        make(tmp_path / "a").train(train_input(x, y), max_steps=16)
    x, y = poisoned_data(poisoned=[2])
    with pytest.raises(stoker.NanLossError, match="no checkpoint to roll back to"):
        make(tmp_path / "b").train(train_input(x, y), max_steps=16, hooks=[NanLossHook(on_nan="rollback")])


class SaveBeforeTheGuard(Hook):
    phase = "timing"  # the first phase, before NanLossHook's: it checkpoints the step the guard then finds bad

    def after_loop(self, run, result):  # noqa: ANN001
        run.save_checkpoint()


def test_no_rollback_to_a_checkpoint_written_after_the_bad_step(tmp_path):
    x, y = poisoned_data(value=30.0)  # a spike: finite weights, so the early save succeeds
    hooks = [NanLossHook(on_nan="rollback", spike_factor=4.0, spike_window=5), SaveBeforeTheGuard()]
    with pytest.raises(stoker.NanLossError, match="not before the bad step: no good checkpoint to roll back to"):
        make(tmp_path).train(train_input(x, y), max_steps=16, hooks=hooks)


def test_bad_arguments_name_themselves():
    with pytest.raises(stoker.ConfigError, match="on_nan must be one of stop, rollback; got 'skip'"):
        NanLossHook(on_nan="skip")
    with pytest.raises(stoker.ConfigError, match="max_rollbacks"):
        NanLossHook(max_rollbacks=-1)
    with pytest.raises(stoker.ConfigError, match="spike_factor"):
        NanLossHook(spike_factor=0.5)


def test_with_rollback_counts_stream_positions_past_earlier_rollbacks():
    record = {"step": 0, "reason": "r"}
    first = with_rollback(
        {"source": {"pos": 1}, "skip": 0}, steps_after=2, accumulation=1, raw_default=5, record=record
    )
    assert first["raw"] == 5 and first["rollbacks"][0]["batches"] == [7]
    # from the same checkpoint again: the 3rd batch consumed after it is now stream batch 8
    second = with_rollback(first, steps_after=2, accumulation=1, raw_default=0, record=record)
    assert [r["batches"] for r in second["rollbacks"]] == [[7], [8]]
    # a source without state counts its replay: that is its stream position
    third = with_rollback({"source": None, "skip": 4}, steps_after=0, accumulation=2, raw_default=99, record=record)
    assert third["raw"] == 4 and third["rollbacks"][0]["batches"] == [4, 5]


@pytest.mark.parametrize(
    "after_save",
    [pytest.param(False, marks=pytest.mark.slow), True],  # ~17 s each on a busy 2-core machine
    ids=["before-its-checkpoint", "after-its-checkpoint"],
)
def test_kill_9_after_a_rollback_then_rerun_is_bitwise_equal(tmp_path, after_save):
    # The first rollback (step 10, to ckpt-8) is followed by the boundary at step 12: killed there
    # before ckpt-12 is written, the rerun resumes from ckpt-8 and rolls back again; killed after,
    # it resumes from ckpt-12, whose input state holds the record; both then roll back at step 13.
    reference = in_background([PYTHON, str(SCRIPT), "--model_dir", str(tmp_path / "ref")])
    argv = [PYTHON, str(SCRIPT), "--model_dir", str(tmp_path / "run")]
    killed = run_process([*argv, "--kill_at", "12", *(["--after_save"] if after_save else [])], env=python_env())
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / "run" / "ckpt-12").exists() == after_save
    rerun = run_process(argv, env=python_env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stderr.count("rolled back to") == (1 if after_save else 2)
    finished(reference)
    final = "ckpt-16/model.safetensors"
    assert (tmp_path / "run" / final).read_bytes() == (tmp_path / "ref" / final).read_bytes()
    state = json.loads((tmp_path / "run" / "ckpt-16" / "input-0.json").read_text())
    assert [r["batches"] for r in state["rollbacks"]] == [[9], [13]]


@pytest.mark.slow
def test_two_replicas_roll_back_together_and_equal_two_replicas_without_the_batches(tmp_path):
    # Replica 0's stream batches 9 and 13 are poisoned; the loss is averaged over replicas, so
    # both see the NaN at the same boundary, roll back to the same checkpoint and each passes
    # over its own batch at that stream position (the global batch of that step).
    rolled = launch_replicas(SCRIPT, 2, "--model_dir", str(tmp_path / "a"), "--out", str(tmp_path / "a.json"))
    omitted = launch_replicas(
        SCRIPT, 2, "--model_dir", str(tmp_path / "b"), "--omit", "--out", str(tmp_path / "b.json")
    )
    for proc in [*rolled, *omitted]:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads((tmp_path / "b.json").read_text())
    for rank in (0, 1):
        state = json.loads((tmp_path / "a" / "ckpt-16" / f"input-{rank}.json").read_text())
        assert [r["batches"] for r in state["rollbacks"]] == [[9], [13]]
