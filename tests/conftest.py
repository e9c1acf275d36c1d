"""pytest fixtures and hooks for all of stoker's tests; the shared helpers are in helpers/."""

from __future__ import annotations

import logging

import pytest
import torch

# Before any test module imports a helper: the asserts in helpers/ report like a test's own.
pytest.register_assert_rewrite("helpers")


def pytest_configure(config: pytest.Config) -> None:
    torch.set_num_threads(1)  # steady and identical arithmetic in every test process


@pytest.fixture(autouse=True)
def _quiet_stoker() -> None:
    logging.getLogger("stoker").setLevel(logging.WARNING)
