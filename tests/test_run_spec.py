"""run_spec.json's registry: builders register by kind; the engine looks them up, never imports them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stoker.run_spec import (
    RUN_SPEC_BUILDERS,
    RunSpecError,
    estimator_from_model_dir,
    read_run_spec,
    register_run_spec,
    run_spec_builder,
    write_run_spec,
)


@pytest.fixture
def scratch_kind():
    yield "test-scratch-kind"
    RUN_SPEC_BUILDERS.pop("test-scratch-kind", None)


def test_a_registered_builder_rebuilds_from_the_model_dir(tmp_path, scratch_kind):
    @register_run_spec(scratch_kind)
    def build(spec, model_dir):
        return ("estimator", spec["params"]["width"], str(model_dir)), "example"

    write_run_spec(tmp_path, kind=scratch_kind, params={"width": 16})
    est, example, spec = estimator_from_model_dir(tmp_path)
    assert est == ("estimator", 16, str(tmp_path)) and example == "example" and spec["kind"] == scratch_kind
    assert run_spec_builder(scratch_kind) is build
    assert register_run_spec(scratch_kind)(build) is build  # the same function again: a re-import, fine

    def other(spec, model_dir):
        return None, None

    with pytest.raises(ValueError, match="already registered"):
        register_run_spec(scratch_kind)(other)


def test_unknown_kind_and_missing_spec_are_clear_errors(tmp_path):
    assert read_run_spec(tmp_path) is None
    with pytest.raises(RunSpecError, match="has no run_spec.json"):
        estimator_from_model_dir(tmp_path)
    write_run_spec(tmp_path, kind="script")
    with pytest.raises(
        RunSpecError,
        match=r"kind 'script' is unknown; known kinds: bert, charlm, zoo\. .*'stoker.run_spec' entry point",
    ):
        estimator_from_model_dir(tmp_path)
    (tmp_path / "run_spec.json").write_text("{not json")
    with pytest.raises(RunSpecError, match="unreadable"):
        read_run_spec(tmp_path)


def test_the_engine_registers_nothing_and_each_kind_is_imported_through_its_entry_point():
    code = (
        "import stoker, stoker.export, stoker.run_spec as r; before = sorted(r.RUN_SPEC_BUILDERS); "
        "[r.run_spec_builder(kind) for kind in ('zoo', 'charlm', 'bert')]; "
        "print(before, sorted(r.RUN_SPEC_BUILDERS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "['bert',", "'charlm',", "'zoo']"]
