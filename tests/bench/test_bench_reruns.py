"""``stoker bench --train_dir`` rerun with changed flags: each change is one line naming the flag
(tf_cnn_benchmarks' rule: a rate or optimizer flag applies from the resumed step), and a flag the
checkpoint cannot go on with is refused naming it (exit 1, nothing trained)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.cli import run_main
from stoker.checkpoint.manager import CheckpointManager

QUICK = ["bench", "--model=trivial", "--data_name=cifar10", "--peak_tflops=1", "--device=cpu", "--num_warmup_batches=0"]


def test_a_rerun_names_each_changed_flag_and_refuses_what_cannot_go_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run = [*QUICK, f"--train_dir={tmp_path}", "--batch_size=8"]
    code, _, err = run_main(capsys, *run, "--num_batches=4", "--init_learning_rate=0.01")
    assert code == 0, err

    code, out, err = run_main(capsys, *run, "--num_batches=6", "--init_learning_rate=0.02", "--iterations_per_loop=2")
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("changed since")] == [
        "changed since ckpt-4: --iterations_per_loop 1 -> 2: applied (loops group the same steps)",
        "changed since ckpt-4: --num_warmup_batches + --num_batches 4 -> 6: applied (training goes on to the new "
        "value)",
        "changed since ckpt-4: --init_learning_rate 0.01 -> 0.02: applied from step 4 over the checkpoint's "
        "optimizer state (on_changed_optimizer='apply'; its moments and the schedule's position go on)",
    ]

    again = [*QUICK, f"--train_dir={tmp_path}", "--batch_size=16", "--iterations_per_loop=2"]
    code, _, err = run_main(capsys, *again, "--num_batches=8", "--init_learning_rate=0.02", "--tf_random_seed=3")
    assert code == 1
    assert err.strip().splitlines()[-1] == (
        "stoker bench: error: resuming from ckpt-6 (step 6) with changed settings: --tf_random_seed 1234 -> 3: the "
        "checkpoint's weights and random streams come from its seed; --batch_size 8 -> 16: the checkpoint's input "
        "position counts batches of its size. To go on: rerun with --tf_random_seed 1234, --batch_size 8, or start "
        "a new --train_dir"
    )
    assert CheckpointManager(tmp_path, writer=False).latest_step() == 6
