"""Train the tiny MLP with ``RunConfig(compile="step")`` in ``argv[1]`` to global step ``argv[2]``
(a checkpoint every 4 steps); print inductor's and AOTAutograd's cache counters as JSON
(tests/engine/test_compile_cache.py runs it with fresh compiler caches)."""

from __future__ import annotations

import json
import logging
import sys

import torch

import stoker
from helpers.tiny import TinyNet, classifier_fn, make_data, train_input

logging.basicConfig(level=logging.WARNING, format="%(message)s")
logging.getLogger("stoker").setLevel(logging.INFO)

model_dir, steps = sys.argv[1], int(sys.argv[2])
x, y = make_data(200)
est = stoker.Estimator(
    model=lambda p: TinyNet(dropout=0.2),
    model_fn=classifier_fn,
    optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    config=stoker.RunConfig(
        model_dir=model_dir,
        compile="step",
        progress_bar=False,
        iterations_per_loop=4,
        log_every_n_steps=10**6,
        save_checkpoints_steps=4,
    ),
    train_batch_size=16,
)
est.train(train_input(x, y), max_steps=steps)
from torch._dynamo.utils import counters  # noqa: E402

print(json.dumps({**counters["inductor"], **counters["aot_autograd"]}))
