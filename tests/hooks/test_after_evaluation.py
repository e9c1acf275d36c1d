"""``Hook.after_evaluation``: every evaluation of ``train_and_evaluate`` reaches every hook once,
when it is made, in phase order; a run resumed from the checkpoint of an evaluated step gets that
evaluation again (from the index, or evaluated again if it was never recorded), so each hook sees
each evaluated step once across the resume."""

from __future__ import annotations

import pytest

from helpers.tiny import eval_input, make_data, make_estimator, train_input
from stoker.hooks import Hook


class Recorder(Hook):
    """Logs its calls as ``(name, event, step)``; the evaluated steps it saw are its checkpointed state."""

    def __init__(self, name: str, log: list[tuple[str, str, int]], phase: str = "reporting") -> None:
        self.name, self.log = name, log
        self.phase = phase  # type: ignore[assignment]
        self.evaluated: list[int] = []

    def after_setup(self, run):  # noqa: ANN001
        self.log.append((self.name, "after_setup", run.global_step))

    def after_loop(self, run, result):  # noqa: ANN001
        self.log.append((self.name, "after_loop", run.global_step))

    def after_evaluation(self, run, metrics):  # noqa: ANN001
        assert metrics is run.last_evaluation and set(metrics) == {"loss", "accuracy", "top2", "global_step"}
        self.evaluated.append(int(metrics["global_step"]))
        self.log.append((self.name, "after_evaluation", int(metrics["global_step"])))

    def end(self, run):  # noqa: ANN001
        self.log.append((self.name, "end", run.global_step))

    def state_dict(self):  # noqa: ANN201
        return {"evaluated": list(self.evaluated)}

    def load_state_dict(self, state):  # noqa: ANN001
        self.evaluated = list(state["evaluated"])

    @property
    def state_key(self) -> str:
        return f"Recorder-{self.name}"


def run(tmp_path, max_steps: int, log: list, eval_fn=None) -> tuple[Recorder, Recorder]:  # noqa: ANN001
    x, y = make_data(48)
    before, after = Recorder("before", log, phase="recording"), Recorder("after", log)
    est = make_estimator(tmp_path, iterations_per_loop=2)
    est.train_and_evaluate(
        train_input(x, y), eval_fn or eval_input(x, y), max_steps=max_steps, eval_every_n_steps=4, hooks=[after, before]
    )
    return before, after


def test_each_evaluation_reaches_every_hook_once_when_it_is_made_in_phase_order(tmp_path):
    log: list = []
    before, after = run(tmp_path, 8, log)
    assert log == [
        ("before", "after_setup", 0),
        ("after", "after_setup", 0),
        ("before", "after_loop", 2),
        ("after", "after_loop", 2),
        ("before", "after_loop", 4),  # recording: before the checkpoint of step 4 and its evaluation
        ("before", "after_evaluation", 4),  # the evaluation phase hands it to every hook, in phase order
        ("after", "after_evaluation", 4),
        ("after", "after_loop", 4),
        ("before", "after_loop", 6),
        ("after", "after_loop", 6),
        ("before", "after_loop", 8),
        ("before", "after_evaluation", 8),
        ("after", "after_evaluation", 8),
        ("after", "after_loop", 8),
        ("before", "end", 8),  # the last evaluation was of the final step: none more at the end
        ("after", "end", 8),
    ]
    assert before.evaluated == after.evaluated == [4, 8]


def test_a_resumed_run_gets_the_evaluation_of_its_start_step_again_so_each_hook_sees_each_step_once(tmp_path):
    whole: list = []
    uninterrupted = run(tmp_path / "whole", 12, whole)
    first: list = []
    run(tmp_path / "resumed", 8, first)
    log: list = []
    before, after = run(tmp_path / "resumed", 12, log)
    # ckpt-8 was written before its evaluation: no hook's state in it holds that evaluation, which
    # EvaluationHook takes back from the index in its after_setup and hands to every hook again
    assert log == [
        ("before", "after_setup", 8),
        ("before", "after_evaluation", 8),  # recording comes before evaluation: set up first
        ("after", "after_evaluation", 8),  # reporting comes after: its state is loaded, after_setup follows
        ("after", "after_setup", 8),
        ("before", "after_loop", 10),
        ("after", "after_loop", 10),
        ("before", "after_loop", 12),
        ("before", "after_evaluation", 12),
        ("after", "after_evaluation", 12),
        ("after", "after_loop", 12),
        ("before", "end", 12),
        ("after", "end", 12),
    ]
    assert before.evaluated == after.evaluated == [4, 8, 12] == uninterrupted[0].evaluated == uninterrupted[1].evaluated


def test_an_evaluation_never_recorded_is_made_again_on_resume_and_handed_on_once(tmp_path):
    x, y = make_data(48)
    calls = []

    def failing_at_the_second(params):  # noqa: ANN001, ANN202
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("killed during the evaluation of step 8")
        return eval_input(x, y)(params)

    with pytest.raises(RuntimeError, match="killed during the evaluation"):
        run(tmp_path, 12, [], eval_fn=failing_at_the_second)
    log: list = []
    before, after = run(tmp_path, 12, log)
    assert log[:4] == [
        ("before", "after_setup", 8),
        ("before", "after_evaluation", 8),  # evaluated again: the index had no result for ckpt-8
        ("after", "after_evaluation", 8),
        ("after", "after_setup", 8),
    ]
    assert before.evaluated == after.evaluated == [4, 8, 12]


def test_a_hook_without_after_evaluation_is_not_called_for_one():
    from stoker.hooks import HookRunner

    class Quiet(Hook):
        pass

    runner = HookRunner([Quiet(), Recorder("r", [])])
    assert len(runner._by_event["after_evaluation"]) == 1


def test_the_hooks_that_act_on_evaluations_are_not_called_after_every_loop():
    import optuna

    from stoker.hooks import EarlyStopping, HookRunner, OptunaPruning, ReduceLROnPlateau

    trial = optuna.create_study().ask()
    runner = HookRunner([EarlyStopping("loss"), ReduceLROnPlateau("loss"), OptunaPruning(trial, "loss")])
    # they took in run.last_evaluation after every loop; now it comes to them, so loops may merge
    assert len(runner._by_event["after_evaluation"]) == 3
    assert runner.first_due_step() is not None
