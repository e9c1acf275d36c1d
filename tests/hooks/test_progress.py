"""``ProgressBarHook`` without a terminal: a log line every ``every_secs`` seconds (step, rate,
ETA, epoch), at loop boundaries that come anyway, changing neither the loops nor the numbers."""

from __future__ import annotations

import logging
import re
import subprocess
import textwrap

import torch

from helpers.processes import PYTHON, python_env
from helpers.tiny import make_data, make_estimator, train_input
from stoker.checkpoint.io_config import CheckpointConfig
from stoker.config import LoopConfig
from stoker.engine import default_hooks
from stoker.hooks import Hook, ProgressBarHook
from stoker.hooks.progress import duration, progress_line


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class Boundaries(Hook):
    """Records every loop boundary without keeping any (it ends no loop) and, given a clock,
    moves it on by ``tick`` seconds per loop."""

    phase = "timing"
    ends_loops = False

    def __init__(self, clock: Clock | None = None, tick: float = 0.0) -> None:
        self.steps: list[int] = []
        self.clock, self.tick = clock, tick

    def after_loop(self, run, result):  # noqa: ANN001
        self.steps.append(run.global_step)
        if self.clock is not None:
            self.clock.now += self.tick * result.steps / 2


def progress_lines(caplog) -> list[str]:  # noqa: ANN001
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress:")]


def test_without_a_terminal_a_line_every_30_seconds_with_step_epoch_rate_and_eta(caplog):
    clock = Clock()
    bar = ProgressBarHook()  # under pytest stderr is no terminal
    bar._clock = clock.monotonic
    ticks = Boundaries(clock, tick=10.0)  # 10 s per loop of 2 steps: 0.2 steps/sec
    ticks.ends_loops = True
    x, y = make_data(96)  # 6 batches of 16 per epoch
    with caplog.at_level(logging.INFO, logger="stoker"):
        make_estimator(iterations_per_loop=2).train(train_input(x, y), max_steps=20, hooks=[bar, ticks])
    assert progress_lines(caplog) == [
        "progress: step 6/20 (30%), epoch 1.00, 0.2 steps/sec, ETA 1m10s",
        "progress: step 12/20 (60%), epoch 2.00, 0.2 steps/sec, ETA 40s",
        "progress: step 18/20 (90%), epoch 3.00, 0.2 steps/sec, ETA 10s",
    ]
    assert bar._bar is None


def test_the_lines_change_neither_where_loops_end_nor_any_number(caplog):
    x, y = make_data(96)
    runs = []
    for hooks in ([], [ProgressBarHook(every_secs=0.0)]):
        seen = Boundaries()
        est = make_estimator(iterations_per_loop=2, log_every_n_steps=5)
        with caplog.at_level(logging.INFO, logger="stoker"):
            est.train(train_input(x, y), max_steps=20, hooks=[*hooks, seen])
        runs.append((seen.steps, {k: v.clone() for k, v in est.model.state_dict().items()}))
    (alone, weights), (with_lines, weights_with_lines) = runs
    # one process: the loops no hook watches run as one, up to the log line's steps, with or without the lines
    assert alone == with_lines == [5, 10, 15, 20]
    assert all(torch.equal(weights[k], weights_with_lines[k]) for k in weights)
    steps = [int(re.match(r"progress: step (\d+)/20", line)[1]) for line in progress_lines(caplog)]
    assert steps == [5, 10, 15, 20]  # every_secs=0: at every boundary that came


def test_by_default_the_hook_is_installed_and_writes_lines_when_stderr_is_no_terminal():
    def bars(loop: LoopConfig) -> list[Hook]:
        return [h for h in default_hooks(loop, CheckpointConfig()) if isinstance(h, ProgressBarHook)]

    (bar,) = bars(LoopConfig())
    assert (bar.every_secs, bar.ends_loops, bar.would_show()) == (30.0, False, False)
    assert bars(LoopConfig(progress_bar=False)) == []


def test_the_line_says_what_is_known():
    assert progress_line(1200, 10000, 45.2, 2.41) == "step 1200/10000 (12%), epoch 2.41, 45.2 steps/sec, ETA 3m15s"
    assert progress_line(1200, None, 45.2, None) == "step 1200, 45.2 steps/sec"
    assert progress_line(10, 10, 3.0, None) == "step 10/10 (100%), 3 steps/sec, ETA 0s"
    assert [duration(s) for s in (0.4, 59.6, 61, 3599, 7500)] == ["0s", "1m00s", "1m01s", "59m59s", "2h05m"]


def test_a_real_process_with_stderr_to_a_file_logs_progress_lines(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            sys.path.insert(0, sys.argv[1])
            from helpers.tiny import make_data, make_estimator, train_input
            from stoker.hooks import ProgressBarHook

            x, y = make_data(96)
            est = make_estimator(iterations_per_loop=4, log_every_n_steps=8, progress_bar=True)
            # the default hook, with a line at every loop boundary instead of every 30 s
            est.train(train_input(x, y), max_steps=24, hooks=[ProgressBarHook(every_secs=0.0)])
            """
        )
    )
    tests = str(__import__("helpers").__path__[0].rsplit("/", 1)[0])
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr:
        done = subprocess.run(
            [PYTHON, str(script), tests],
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=300,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text  # no bar redrawn into the file
    lines = [line for line in text.splitlines() if "progress:" in line]
    pattern = (
        r"\d\d:\d\d:\d\d stoker INFO: progress: step (\d+)/24 \((\d+)%\), epoch (\d\.\d\d), [\d.e+]+ steps/sec, "
        r"ETA \d+s"
    )
    found = [re.fullmatch(pattern, line) for line in lines]
    assert all(found), lines
    # the loops end at the log line's steps (8, 16, 24): the lines come there, the epoch is 6 batches
    assert [(m[1], m[2], m[3]) for m in found] == [("8", "33", "1.33"), ("16", "67", "2.67"), ("24", "100", "4.00")]


def test_a_resumed_run_counts_its_epochs_from_the_start_of_training(tmp_path, caplog):
    x, y = make_data(96)  # 6 batches of 16 per epoch
    make_estimator(tmp_path, iterations_per_loop=4, log_every_n_steps=4).train(train_input(x, y), max_steps=12)
    with caplog.at_level(logging.INFO, logger="stoker"):
        make_estimator(tmp_path, iterations_per_loop=4, log_every_n_steps=4).train(
            train_input(x, y), max_steps=24, hooks=[ProgressBarHook(every_secs=0.0)]
        )
    epochs = [re.search(r"epoch (\S+),", line)[1] for line in progress_lines(caplog)]
    assert epochs == ["2.67", "3.33", "4.00"]  # steps 16, 20, 24 of 6 per epoch
