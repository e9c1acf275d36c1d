"""Every kernels test measures into its own cache directory and starts with no linear choices
made, so no test depends on what this machine measured before or on another test's choices."""

from __future__ import annotations

import pytest

from stoker.kernels import linear


@pytest.fixture(autouse=True)
def _own_cache_and_fresh_choices(tmp_path, monkeypatch):  # noqa: ANN001, ANN202
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    linear.reset_choices()
    yield
    linear.reset_choices()
