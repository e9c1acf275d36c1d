"""The rules docs/concepts.md states about when hooks act, run on a tiny model.

"A hook that acts every N steps acts exactly at each multiple of N, counted from step 0: a loop
that would pass one ends there instead." Alone with only such hooks, the loops before a due
step run as one; with a hook that watches every loop they keep their length between; a
time-based saver ends loops anywhere, and the multiples still hold.
"""

from __future__ import annotations

import logging
import re

import pytest

from helpers.tiny import make_data, make_estimator, train_input
from stoker.hooks import Hook

STEP = re.compile(r"^step (\d+), loss = ")


class EveryLoop(Hook):
    """A hook that wants every loop boundary (it has a ``before_loop``), as a user's hook may."""

    def before_loop(self, run, steps):  # noqa: ANN001, ANN201
        pass


def logged_steps(
    caplog: pytest.LogCaptureFixture, model_dir=None, hooks=(), max_steps: int = 400, **config
) -> list[int]:  # noqa: ANN001
    x, y = make_data(64)
    est = make_estimator(model_dir, iterations_per_loop=40, log_every_n_steps=100, **config)
    with caplog.at_level(logging.INFO, logger="stoker"):
        est.train(train_input(x, y), max_steps=max_steps, hooks=list(hooks))
    return [int(m[1]) for r in caplog.records if (m := STEP.match(r.getMessage()))]


def test_alone_with_interval_hooks_only_a_hook_acts_exactly_at_each_multiple(caplog):
    assert logged_steps(caplog) == [100, 200, 300, 400]


def test_with_a_hook_that_watches_every_loop_a_hook_still_acts_exactly_at_each_multiple(caplog):
    ends: list[int] = []

    class Ends(EveryLoop):
        def after_loop(self, run, result):  # noqa: ANN001, ANN201
            ends.append(run.global_step)

    assert logged_steps(caplog, hooks=[Ends()]) == [100, 200, 300, 400]
    # loops of 40 keep their length between, cut at each multiple of 100
    assert ends == [40, 80, 100, 120, 160, 200, 240, 280, 300, 320, 360, 400]


def test_a_time_based_saver_ends_loops_anywhere_but_the_multiples_hold(caplog, tmp_path):
    # The saver guesses its due step from the step rate, so loops end at irregular steps; the
    # logging hook still acts exactly at each multiple of 100.
    steps = logged_steps(caplog, tmp_path, max_steps=1000, save_checkpoints_secs=0.2)
    assert steps == list(range(100, 1001, 100))
