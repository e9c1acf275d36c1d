"""The rules docs/concepts.md states about when hooks act, run on a tiny model.

"A hook that acts every N steps acts at the first loop boundary at or after each multiple of N:
never before it, at most ``iterations_per_loop - 1`` steps after it. Alone, with only such
hooks, the loops before a due step run as one, so it acts exactly at the multiple."
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


def test_with_a_hook_that_watches_every_loop_loops_keep_their_length(caplog):
    # loops of 40 steps end at 40, 80, 120, ...: the first boundary at or after each multiple of 100
    assert logged_steps(caplog, hooks=[EveryLoop()]) == [120, 200, 320, 400]


def test_a_time_based_saver_ends_loops_anywhere_but_the_bound_holds(caplog, tmp_path):
    # The saver guesses its due step from the step rate, so loops end at irregular steps (on
    # this machine e.g. 100, 200, 300, 418, 500, 600, 716, 800, 905, 1000): one line per
    # interval, never before its multiple, at most 39 steps after it.
    steps = logged_steps(caplog, tmp_path, max_steps=1000, save_checkpoints_secs=0.2)
    multiples = range(100, 1001, 100)
    assert len(steps) == len(multiples) and steps[-1] == 1000
    for multiple, step in zip(multiples, steps, strict=True):
        assert multiple <= step <= multiple + 40 - 1, steps
