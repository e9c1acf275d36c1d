"""A training run's start: what it imports before its time to full speed starts counting."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.paths import ROOT
from helpers.processes import python_env

SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import torch
from stoker.engine import full_speed, training
from helpers.tiny import make_data, make_estimator, train_input

seen = []
class Clock(full_speed.FullSpeedClock):
    def __init__(self, **kwargs):
        if kwargs.get('enabled'):  # run()'s clock (the trainer holds a disabled one before)
            seen.append('torch._dynamo' in sys.modules)
        super().__init__(**kwargs)
    def restored(self, *args, **kwargs):
        seen.append('torch._dynamo' in sys.modules)
        super().restored(*args, **kwargs)
training.FullSpeedClock = Clock
x, y = make_data(64)
make_estimator({model_dir!r}).train(train_input(x, y), max_steps=2)
print(json.dumps(seen))
"""


def test_torchs_dynamo_import_is_counted_as_start_up_not_as_the_checkpoint_load(tmp_path):
    # torch imports torch._dynamo when the optimizer is built (about 0.7x `import torch`): before
    # the clock started, the restart line said it as "checkpoint load" (3-4 s of a tiny MLP's)
    script = SCRIPT.format(tests=str(ROOT / "tests"), model_dir=str(tmp_path / "m"))
    out = subprocess.run([sys.executable, "-c", script], env=python_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, True]
