"""A third-party package adds a run_spec kind and a recipe through entry points, as pip would install it.

The package is written into a directory with its ``*.dist-info`` (``METADATA`` and
``entry_points.txt``, what ``pip install --target`` leaves), which the ``stoker`` processes get on
their ``PYTHONPATH``: stoker never names it, yet ``stoker train demo``, ``stoker export`` and
``stoker evaluate`` rebuild its model. The model is one weight trained from zero on ``x = 1,
y = 1`` with plain SGD (lr 0.1, MSE), so after ``n`` steps ``w = 1 - 0.8**n`` exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.paths import ROOT
from helpers.processes import python_env
from stoker import plugins

DEMO = """
import argparse, os
import torch
from torch import nn
import stoker
from stoker.run_spec import register_eval_input, register_run_spec, write_run_spec

HELP = "one weight learns y = x"
DESCRIPTION = "A demo recipe from another package."


def model_fn(model, features, labels, mode, params):
    out = model(features)
    if mode == stoker.ModeKeys.PREDICT:
        return stoker.EstimatorSpec(predictions={"y": out})
    per_example = ((out - labels) ** 2).mean(-1)
    return stoker.EstimatorSpec(loss=per_example.mean(), eval_metrics={"mse": stoker.metrics.Mean()(per_example)})


def make_model(params):
    model = nn.Linear(1, 1, bias=False)
    nn.init.zeros_(model.weight)
    return model


def input_fn(params):
    while True:
        yield torch.ones(params["batch_size"], 1), torch.ones(params["batch_size"], 1)


def estimator(model_dir):
    return stoker.Estimator(
        model=make_model, model_fn=model_fn,
        optimizer=lambda params, parameters: torch.optim.SGD(parameters, lr=0.1),
        config=stoker.RunConfig(model_dir=model_dir, device="cpu", progress_bar=False),
        train_batch_size=4, eval_batch_size=4, predict_batch_size=2)


@register_run_spec("demo")
def from_spec(spec, model_dir):
    return estimator(os.fspath(model_dir)), torch.ones(2, 1)


@register_eval_input("demo")
def eval_input(spec, model_dir):
    return input_fn, 2


def add_arguments(parser):
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=5)


def run(args):
    write_run_spec(args.model_dir, kind="demo")
    estimator(args.model_dir).train(input_fn, max_steps=args.max_steps)
    return 0
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A directory as ``pip install --target`` leaves it: the package and its dist-info."""
    root = tmp_path_factory.mktemp("site")
    (root / "stoker_demo_plugin").mkdir()
    (root / "stoker_demo_plugin" / "__init__.py").write_text(DEMO)
    info = root / "stoker_demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stoker-demo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[stoker.run_spec]\ndemo = stoker_demo_plugin\n\n[stoker.recipes]\ndemo = stoker_demo_plugin\n"
    )
    return root


def stoker(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = python_env()
    env["PYTHONPATH"] = str(site) + os.pathsep + env["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "stoker", *args], capture_output=True, text=True, env=env, timeout=240)


@pytest.fixture(scope="module")
def demo_run(site, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``stoker train demo`` run once for 5 steps; the two tests below read its model_dir and do not
    write into it (a ``stoker`` process costs seconds, most of them importing torch)."""
    model_dir = tmp_path_factory.mktemp("demo") / "run"
    return model_dir, stoker(site, "train", "demo", "--model_dir", str(model_dir), "--max_steps", "5")


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; a pip install and three CLI runs
def test_an_installed_package_adds_a_recipe_a_kind_and_they_train_export_and_evaluate(site, demo_run, tmp_path):
    (model_dir, trained), out = demo_run, tmp_path / "exported"
    listed = stoker(site, "train", "--help")
    assert listed.returncode == 0 and "demo" in listed.stdout and "charlm" in listed.stdout

    assert trained.returncode == 0, trained.stderr
    assert json.loads((model_dir / "run_spec.json").read_text())["kind"] == "demo"

    exported = stoker(site, "export", str(model_dir), "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert "of a demo run" in exported.stdout
    from stoker.export import load_exported

    y = load_exported(out)({"features": torch.ones(3, 1)})["y"]
    assert torch.allclose(y, torch.full((3, 1), 1 - 0.8**5), atol=1e-6, rtol=0)

    evaluated = stoker(site, "evaluate", str(model_dir))
    assert evaluated.returncode == 0, evaluated.stderr
    mse = float(evaluated.stdout.split("mse = ")[1].split(",")[0].split()[0])
    assert mse == pytest.approx(0.8**10, rel=1e-5)


@pytest.mark.slow  # the default run stays under 5 minutes on 2 cores; it needs the installed run above
def test_without_the_package_the_kind_is_unknown_and_the_error_says_how_to_add_one(demo_run, tmp_path):
    model_dir, trained = demo_run  # a model_dir the plugin wrote (kind "demo")
    assert trained.returncode == 0, trained.stderr
    bare = subprocess.run(
        [sys.executable, "-m", "stoker", "export", str(model_dir), "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert bare.returncode == 1
    assert "kind 'demo' is unknown; known kinds: bert, charlm, zoo." in bare.stderr
    assert "'stoker.run_spec' entry point" in bare.stderr


def test_a_broken_plugin_is_named_and_does_not_break_the_other_recipes(tmp_path):
    info = tmp_path / "broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[stoker.recipes]\nbroken = no_such_module_here\n")
    out = stoker(tmp_path, "train", "--help")
    assert out.returncode == 0, out.stderr
    assert "broken" in out.stdout and "unavailable" in out.stdout and "charlm" in out.stdout


def test_the_builtin_table_is_what_pyproject_declares():
    # Without package metadata (a source tree on PYTHONPATH) stoker falls back to plugins.BUILTIN.
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]
    assert {group: dict(declared[group]) for group in plugins.BUILTIN} == plugins.BUILTIN
