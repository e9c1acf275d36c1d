"""Time to full speed (stoker.engine.full_speed): every run says in one line where its time
before its first full-speed step went; a resumed run names the step it resumed from."""

from __future__ import annotations

import logging
import re

import torch

import stoker
from helpers.tiny import TinyNet, classifier_fn, make_data, train_input
from stoker.engine.full_speed import FullSpeedClock, process_age

LINE = re.compile(
    r"^time to full speed: [\d.]+ s, at step (\d+) \((start-up and imports [\d.]+ s, )?checkpoint load [\d.]+ s, "
    r"input pipeline [\d.]+ s, compile 0\.0 s, first steps [\d.]+ s; (.*)\)$"
)


def make(model_dir) -> stoker.Estimator:  # noqa: ANN001
    return stoker.Estimator(
        model=lambda p: TinyNet(),
        model_fn=classifier_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.05),
        config=stoker.RunConfig(
            model_dir=model_dir, progress_bar=False, iterations_per_loop=2, log_every_n_steps=10**6
        ),
        train_batch_size=16,
    )


def test_a_first_start_and_a_resume_each_say_one_line_at_their_first_full_speed_step(tmp_path, caplog):
    x, y = make_data(200)
    found, started = [], []
    for end in (4, 8):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="stoker"):
            make(tmp_path / "m").train(train_input(x, y), max_steps=end)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("time to full speed")]
        assert len(lines) == 1, lines
        m = LINE.match(lines[0])
        assert m, lines[0]
        found.append((int(m.group(1)), m.group(3)))
        started.append(m.group(2))
    assert found == [(2, "first start"), (6, "resumed from step 4")]  # the run's second step: the first is warm-up
    assert started[1] is None  # the process's start was said by its first run (here or an earlier test's), once


class _Infeed:
    wait_seconds = 0.0


class _Loop:
    after_step = None


def test_the_clock_counts_compiling_steps_as_compile_and_input_waits_as_input(monkeypatch):
    from stoker.engine import full_speed

    graphs = iter([0, 2, 3, 3])  # at input_started, then after steps 1 (compiled), 2 (compiled), 3
    monkeypatch.setattr(full_speed, "_compiled_graphs", lambda: next(graphs))
    clock = FullSpeedClock()
    clock.restored(100, "from artifacts", 0.25)
    infeed, loop = _Infeed(), _Loop()
    clock.input_started(infeed)
    clock.attach(loop)
    infeed.wait_seconds = 0.5  # step 1 waited for its batch
    loop.after_step(101)
    loop.after_step(102)
    assert not clock.done and clock.seconds["input pipeline"] >= 0.5
    loop.after_step(103)
    assert clock.done and loop.after_step is None  # left the loop at full speed
    assert clock.seconds["compiled artifacts"] == 0.25 and clock.seconds["first steps"] == 0.0
    line = clock.line(103)
    assert "compiled artifacts 0.2 s" in line and "s from artifacts" in line and line.endswith("resumed from step 100)")
    assert process_age() is not None and 0 < process_age() < 10**6


def test_a_run_that_ends_before_full_speed_says_so_at_its_end(tmp_path, caplog):
    x, y = make_data(64)
    with caplog.at_level(logging.INFO, logger="stoker"):
        make(tmp_path / "m").train(train_input(x, y), max_steps=1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("time to full speed")]
    assert len(lines) == 1 and "not reached by the run's end at step 1 (" in lines[0] and "first start" in lines[0]
