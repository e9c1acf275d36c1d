"""Bad input gets a one-line error that says what to change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import stoker
from helpers.processes import PYTHON, python_env, run_process
from helpers.tiny import TinyNet, classifier_fn, eval_input, make_data, make_estimator, train_input
from stoker.errors import ModelFnError


def estimator(model_fn, **kw):  # noqa: ANN001, ANN003, ANN201
    return stoker.Estimator(
        model=lambda p: TinyNet(),
        model_fn=model_fn,
        optimizer=lambda p, ps: torch.optim.SGD(ps, lr=0.1),
        config=stoker.RunConfig(progress_bar=False),
        train_batch_size=16,
        **kw,
    )


def test_tensorflow_style_model_fn_signature():
    def tf_style(features, labels, mode, params):  # noqa: ANN001, ANN202
        return None

    with pytest.raises(
        ModelFnError,
        match=(
            r"must take \(model, features, labels, mode, params\); it takes \(features, labels, mode, params\) \(a "
            r"TensorFlow-style"
        ),
    ):
        estimator(tf_style)


def test_short_model_fn_signature_is_accepted():
    x, y = make_data(32)
    est = estimator(
        lambda model, features, labels: stoker.EstimatorSpec(loss=nn.functional.cross_entropy(model(features), labels))
    )
    est.train(train_input(x, y), max_steps=1)
    assert est.global_step == 1


def test_spec_without_loss_in_training():
    x, y = make_data(32)
    est = estimator(
        lambda model, features, labels, mode, params: stoker.EstimatorSpec(predictions={"p": model(features)})
    )
    with pytest.raises(ModelFnError, match=r"EstimatorSpec\(loss=None\) in TRAIN mode"):
        est.train(train_input(x, y), max_steps=1)


def test_model_fn_must_return_a_spec_and_a_scalar_loss():
    x, y = make_data(32)
    with pytest.raises(ModelFnError, match="must return a stoker.EstimatorSpec; it returned a dict"):
        estimator(lambda model, features, labels, mode, params: {"loss": 1}).train(train_input(x, y), max_steps=1)
    vector = lambda model, features, labels, mode, params: stoker.EstimatorSpec(  # noqa: E731
        loss=nn.functional.cross_entropy(model(features), labels, reduction="none")
    )
    with pytest.raises(ModelFnError, match=r"scalar tensor in TRAIN mode; got \[16\] \(reduce it with .mean\(\)\)"):
        estimator(vector).train(train_input(x, y), max_steps=1)


def test_predictions_must_be_batch_major():
    x, _ = make_data(20)
    est = estimator(
        lambda model, features, labels, mode, params: stoker.EstimatorSpec(predictions={"mean": model(features).mean()})
    )
    est.initialize()
    with pytest.raises(ModelFnError, match=r"predictions\['mean'\] has shape \[\], but the batch has 16 rows"):
        list(est.predict(eval_input(x)))
    est2 = estimator(lambda model, features, labels, mode, params: stoker.EstimatorSpec(predictions=[model(features)]))
    est2.initialize()
    with pytest.raises(ModelFnError, match="predictions must be a dict of tensors; got list"):
        list(est2.predict(eval_input(x)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision": "fp8"}, "precision must be one of fp32, bf16, fp16, bf16-sr; got 'fp8'"),
        ({"iterations_per_loop": 0}, "iterations_per_loop must be a positive integer; got 0"),
        (
            {"save_checkpoints_steps": 10, "save_checkpoints_secs": 5},
            "set at most one of save_checkpoints_steps and save_checkpoints_secs",
        ),
        ({"keep_best": ("accuracy", "up")}, r"keep_best must be \(metric_name, 'min' \| 'max'\)"),
        ({"loss_scale": -1}, "loss_scale must be a positive number or 'dynamic'"),
        ({"device": "tpu"}, "device must be auto, cpu, cuda or cuda:N; got 'tpu'"),
        ({"strategy": "mirrored"}, "strategy must be one of auto, single"),
    ],
)
def test_run_config_names_the_field_and_allowed_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        stoker.RunConfig(**kwargs)


def test_bad_batch_sizes_and_arguments():
    with pytest.raises(ValueError, match="train_batch_size must be a positive integer; got 0"):
        stoker.Estimator(model=TinyNet(), model_fn=classifier_fn, train_batch_size=0)
    est = make_estimator()
    x, y = make_data(32)
    with pytest.raises(ValueError, match="max_steps must be a non-negative integer; got -1"):
        est.train(train_input(x, y), max_steps=-1)
    with pytest.raises(TypeError, match="input_fn must be a function"):
        est.train([1, 2], max_steps=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must return an iterable"):
        est.train(lambda p: 42, max_steps=1)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="needs optimizer="):
        stoker.Estimator(model=TinyNet(), model_fn=classifier_fn, train_batch_size=4).train(
            train_input(x, y), max_steps=1
        )


def test_oversized_eval_batch_is_named():
    x, y = make_data(64)
    est = make_estimator()
    est.train(train_input(x, y), max_steps=1)
    with pytest.raises(ValueError, match="yielded a batch of 32 rows, more than the per-replica batch of 16"):
        est.evaluate(
            lambda p: stoker.data.arrays(x, y, read=stoker.data.ReadOptions(batch_size=32, shuffle=False, num_epochs=1))
        )


def test_multi_replica_without_a_launcher_is_refused_clearly(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ValueError, match="WORLD_SIZE=2 but MASTER_ADDR, MASTER_PORT is not set: launch with torchrun"):
        make_estimator()
    with pytest.raises(ValueError, match="strategy='single' but WORLD_SIZE=2"):
        make_estimator(strategy="single")


def test_cli_version_help_and_usage_error():
    env = python_env()
    out = run_process([PYTHON, "-m", "stoker", "--version"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.strip() == f"stoker {stoker.__version__}"
    out = run_process([PYTHON, "-m", "stoker", "--help"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "usage: stoker" in out.stdout
    out = run_process([PYTHON, "-m", "stoker", "--bogus"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr


# ------------------------------------------------------------------ the error tree stays whole
# Every exception stoker raises for bad input or state is a StokerError (docs/errors.md); these
# few raises of a built-in are not about the user's input, and say why here.
BUILTIN_RAISES_ALLOWED = {
    # Python's protocols: os.fspath() wants TypeError, a module's __getattr__ AttributeError, a
    # sequence's index out of range IndexError (the TFRecord index behind __getitem__)
    ("storage/stores.py", "__fspath__", "TypeError"),
    ("__init__.py", "__getattr__", "AttributeError"),
    ("hooks/__init__.py", "__getattr__", "AttributeError"),
    ("data/tfrecord_index.py", "locate", "IndexError"),
    ("data/tar_io.py", "locate", "IndexError"),  # the tar shards' member index, the same protocol
    # internal invariants of the input workers ("this cannot happen"): a bug report, not user input
    ("data/_workers/threads.py", "_take", "RuntimeError"),
    ("data/_workers/example_threads.py", "take", "RuntimeError"),
    ("data/_workers/processes.py", "read_slot", "RuntimeError"),
    ("data/_workers/processes.py", "_take", "RuntimeError"),
}
BUILTINS = {"ValueError", "TypeError", "KeyError", "IndexError", "RuntimeError", "AttributeError", "Exception"}


def _raises_of_builtins() -> set[tuple[str, str, str]]:
    import ast

    from helpers.paths import ROOT

    found = set()
    package = ROOT / "src" / "stoker"
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                exc = node.exc if isinstance(node, ast.Raise) else None
                name = exc.func.id if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) else None
                if name in BUILTINS:
                    found.add((path.relative_to(package).as_posix(), func.name, name))
    return found


def test_stoker_raises_no_bare_builtin_for_bad_input():
    """A bad argument raises ConfigError (a ValueError), a wrong type from user code UserCodeError
    (a TypeError), a wrong state StateError (a RuntimeError): never the bare built-in."""
    raised = _raises_of_builtins()
    nested_ok = {(f, fn, e) for (f, fn, e) in raised if (f, fn, e) in BUILTIN_RAISES_ALLOWED}
    assert raised - nested_ok == set(), "raise a stoker.errors class (see docs/errors.md) instead"


def test_every_exception_class_stoker_defines_is_a_stoker_error():
    import ast

    from helpers.paths import ROOT

    outside = []
    package = ROOT / "src" / "stoker"
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(_may_be_an_exception(base) for base in node.bases):
                module = ".".join(path.relative_to(ROOT / "src").with_suffix("").parts)
                cls = getattr(__import__(module, fromlist=["_"]), node.name)
                if issubclass(cls, BaseException) and not issubclass(cls, stoker.StokerError):
                    outside.append(f"{module}.{node.name}")
    assert outside == [], "make these StokerError subclasses (keeping the built-in as a second base)"


def _may_be_an_exception(base: object) -> bool:
    """Whether a class base, as written, may name an exception class (checked on the class itself)."""
    import ast

    name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
    return name in BUILTINS or name.endswith(("Error", "Exception", "Interrupt", "Exit"))
