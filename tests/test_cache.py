"""stoker's cache folder and its figures files: a figure is read back under the key it was stored
with; a file that cannot be used is ignored with one log line and rewritten whole."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from stoker import _cache


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_figure_is_read_back_under_its_key_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="stoker"):
        assert _cache.load_figures("f.json") == {}  # missing: nothing to say
    _cache.store_figure("f.json", "cpu|A|torch 1", {"ms": 1.5})
    _cache.store_figure("f.json", "cpu|B|torch 1", {"ms": 2.5})
    assert _cache.load_figures("f.json") == {"cpu|A|torch 1": {"ms": 1.5}, "cpu|B|torch 1": {"ms": 2.5}}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temporary file left beside it
    assert not caplog.records


@pytest.mark.parametrize(("content", "problem"), [("{not json", "is not JSON"), ("[1]", "holds a list, not a mapping")])
def test_an_unusable_file_is_said_once_and_rewritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, problem: str
) -> None:
    (tmp_path / "f.json").write_text(content)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        assert _cache.load_figures("f.json") == {}
        assert _cache.load_figures("f.json") == {}
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"stoker cache {tmp_path / 'f.json'} {problem}")
    assert line.endswith("ignored, the figures are measured again and it is rewritten")
    _cache.store_figure("f.json", "k", 1)
    assert json.loads((tmp_path / "f.json").read_text()) == {"k": 1}


def test_the_cpu_fingerprint_names_the_model_and_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_cache, "cpu_info", lambda: ("AMD EPYC 7B13", frozenset({"avx2", "fma"})))
    one = _cache.cpu_fingerprint()
    assert one.startswith("cpu|AMD EPYC 7B13|flags ")
    monkeypatch.setattr(_cache, "cpu_info", lambda: ("AMD EPYC 7B13", frozenset({"avx2", "fma", "avx512f"})))
    assert _cache.cpu_fingerprint() != one
