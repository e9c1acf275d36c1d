"""The global RNGs: seeding as torch.manual_seed does, and states that survive a checkpoint."""

from __future__ import annotations

import io
import random

import numpy as np
import torch

from stoker.rng import rng_state, seed_everything, set_rng_state


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_seed_everything_seeds_like_the_libraries_own_seeding():
    seed_everything(1234)
    ours = draws()
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    assert ours == draws()


def test_a_state_through_a_weights_only_checkpoint_restores_every_stream_exactly():
    seed_everything(7)
    draws()
    buffer = io.BytesIO()
    torch.save(rng_state(), buffer)
    expected = draws()
    draws()  # move on, then go back
    set_rng_state(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    assert draws() == expected


def test_a_state_written_before_the_tensor_form_still_restores():
    seed_everything(11)
    state = rng_state()
    version, internal, gauss = state["python"]
    state["python"] = [version, internal.tolist(), gauss]  # how older checkpoints hold it
    expected = draws()
    set_rng_state(state)
    assert draws() == expected
