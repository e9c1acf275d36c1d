"""``run_spec.json``: how a ``model_dir``'s model is built, and a registry of builders by kind.

A recipe or harness that writes a ``model_dir`` records in ``run_spec.json`` how to rebuild its
model (:func:`write_run_spec`), so ``stoker export MODEL_DIR`` can work from the directory alone.
The module that writes a kind registers the builder of that kind::

    @register_run_spec("charlm")
    def estimator_from_run_spec(spec, model_dir):
        ...
        return estimator, example_features

and :func:`estimator_from_model_dir` looks the kind up. A kind that also registers its
held-out data (:func:`register_eval_input`) can be evaluated by ``stoker evaluate [--watch]``.

A kind's builder is known once the module that registers it has been imported. A kind not yet
known is looked up in the ``stoker.run_spec`` entry points (:mod:`stoker.plugins`) and its
module imported then: stoker declares its own there (``zoo``, ``charlm``, ``bert``), and any
installed package can add a kind the same way. This module is part of the engine: it imports
no recipe, harness or Estimator by name. See docs/export.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from . import plugins, storage
from ._version import __version__
from .errors import ConfigError, ExportError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

RUN_SPEC_FILE = "run_spec.json"
RUN_SPEC_FORMAT = "stoker-run-spec/1"

#: ``builder(spec, model_dir) -> (Estimator reading model_dir, example features for export)``
RunSpecBuilder = Callable[[Mapping[str, Any], str | os.PathLike[str]], tuple[Any, Any]]
_B = TypeVar("_B", bound=RunSpecBuilder)

#: run_spec kind -> its builder; filled by :func:`register_run_spec` as the writers are imported
RUN_SPEC_BUILDERS: dict[str, RunSpecBuilder] = {}


class RunSpecError(ExportError):
    """A ``run_spec.json`` that is missing, unreadable, or of a kind no builder is registered for."""


def write_run_spec(
    model_dir: str | os.PathLike[str], *, kind: str, params: Mapping[str, Any] | None = None, **fields: Any
) -> storage.Location:
    """Record in ``model_dir/run_spec.json`` how the run's model is built.

    ``kind`` names the builder (``"zoo"``: ``model``, ``dataset`` and optional ``num_classes``
    fields; ``"charlm"``: the recipe's config). Other fields are kept as given (JSON values).
    """
    spec = {
        "format": RUN_SPEC_FORMAT,
        "kind": kind,
        **fields,
        "params": dict(params or {}),
        "stoker_version": __version__,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    text = json.dumps(spec, indent=1, default=str) + "\n"
    where = storage.location(model_dir)
    if isinstance(where, storage.UrlPath):  # one object PUT is atomic
        storage.write_all([(where / RUN_SPEC_FILE, text.encode())])
        return where / RUN_SPEC_FILE
    path = where / RUN_SPEC_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RUN_SPEC_FILE}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def read_run_spec(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``model_dir/run_spec.json`` as a dict, or ``None`` when there is none."""
    path = storage.location(model_dir) / RUN_SPEC_FILE
    if not storage.exists(path):
        return None
    try:
        spec = json.loads(storage.read_bytes(path))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunSpecError(f"{path} is unreadable: {e}") from e
    if not isinstance(spec, dict) or "kind" not in spec:
        raise RunSpecError(f"{path} has no 'kind'; see docs/export.md for the run_spec.json format")
    return spec


def register_run_spec(kind: str) -> Callable[[_B], _B]:
    """Decorator: register ``builder(spec, model_dir) -> (estimator, example_features)`` for
    ``kind``. Registering a second, different builder for a kind is an error; registering the
    same function again (a module imported twice) is not."""

    def register(builder: _B) -> _B:
        _register(RUN_SPEC_BUILDERS, kind, builder, f"run_spec kind {kind!r}")
        return builder

    return register


def _register(table: dict[str, Any], kind: str, builder: Callable[..., Any], what: str) -> None:
    """``table[kind] = builder``, refusing a second, different function for ``kind``."""
    known = table.get(kind)
    if known is not None and _qualified(known) != _qualified(builder):
        raise ConfigError(
            f"{what} is already registered to {_qualified(known)}; cannot register {_qualified(builder)} too"
        )
    table[kind] = builder


#: ``eval_input(spec, model_dir) -> (input_fn, steps)``: a kind's held-out data and the batches
#: per evaluation (``None``: all of it), for ``stoker evaluate`` and its ``--watch``
EvalInputBuilder = Callable[
    [Mapping[str, Any], str | os.PathLike[str]], tuple[Callable[[dict[str, Any]], Any], int | None]
]
_E = TypeVar("_E", bound=EvalInputBuilder)
_C = TypeVar("_C", bound="DataclassInstance")
_T = TypeVar("_T")

#: run_spec kind -> the builder of its evaluation input; filled by :func:`register_eval_input`
EVAL_INPUT_BUILDERS: dict[str, EvalInputBuilder] = {}


def register_eval_input(kind: str) -> Callable[[_E], _E]:
    """Decorator: register ``eval_input(spec, model_dir) -> (input_fn, steps)`` for ``kind``, so
    ``stoker evaluate [--watch] MODEL_DIR`` can evaluate its checkpoints (same rules as
    :func:`register_run_spec`)."""

    def register(builder: _E) -> _E:
        _register(EVAL_INPUT_BUILDERS, kind, builder, f"eval input of run_spec kind {kind!r}")
        return builder

    return register


def eval_input_from_run_spec(
    spec: Mapping[str, Any], model_dir: str | os.PathLike[str]
) -> tuple[Callable[[dict[str, Any]], Any], int | None]:
    """The evaluation ``input_fn`` and batches per evaluation of a ``run_spec.json``'s kind."""
    builder = _lookup(EVAL_INPUT_BUILDERS, spec["kind"])
    if builder is None:
        known = ", ".join(sorted(EVAL_INPUT_BUILDERS)) or "none"
        raise RunSpecError(
            f"{RUN_SPEC_FILE} kind {spec['kind']!r} has no evaluation input registered; kinds with one: {known} "
            "(stoker.run_spec.register_eval_input). Evaluate from Python with Estimator.evaluate_continuously"
        )
    return builder(spec, model_dir)


def recipe_config(config_cls: type[_C], spec: Mapping[str, Any], model_dir: str | os.PathLike[str]) -> _C:
    """A recipe's config dataclass from a ``run_spec.json`` it wrote: the saved ``config`` with
    ``params`` over it and ``model_dir`` set to where the spec was read; keys the class does not
    have (a newer or older writer's) are ignored."""
    known = {f.name for f in dataclasses.fields(config_cls)}
    saved = {k: v for k, v in (spec.get("config") or {}).items() if k in known}
    config = config_cls(**saved)
    return dataclasses.replace(
        config, model_dir=os.fspath(model_dir), **{k: v for k, v in spec["params"].items() if k in known}
    )


def run_spec_builder(kind: str) -> RunSpecBuilder:
    """The builder registered for ``kind``, importing its entry point's module if need be;
    :class:`RunSpecError` naming the known kinds if there is none."""
    builder = _lookup(RUN_SPEC_BUILDERS, kind)
    if builder is None:
        raise RunSpecError(
            f"{RUN_SPEC_FILE} kind {kind!r} is unknown; known kinds: {_known_kinds()}. A package adds a kind by "
            f"declaring a {plugins.RUN_SPEC_GROUP!r} entry point to a module that registers its builder with "
            "stoker.run_spec.register_run_spec (see docs/export.md)"
        )
    return builder


def _lookup(table: Mapping[str, _T], kind: str) -> _T | None:
    """``table[kind]``; a kind not registered yet has its entry point's module imported first."""
    if kind not in table:
        try:
            plugins.load(plugins.RUN_SPEC_GROUP, kind)
        except plugins.PluginError as e:
            raise RunSpecError(f"{RUN_SPEC_FILE} kind {kind!r}: {e}") from e
    return table.get(kind)


def _known_kinds() -> str:
    return ", ".join(sorted(set(RUN_SPEC_BUILDERS) | set(plugins.entry_points(plugins.RUN_SPEC_GROUP)))) or "none"


def estimator_from_model_dir(model_dir: str | os.PathLike[str]) -> tuple[Any, Any, dict[str, Any]]:
    """Rebuild the Estimator of a ``model_dir`` from its ``run_spec.json``; also return example
    features for export and the spec."""
    if not storage.exists(storage.location(model_dir)):
        raise RunSpecError(f"model_dir {os.fspath(model_dir)!r} does not exist")
    spec = read_run_spec(model_dir)
    if spec is None:
        raise RunSpecError(
            f"{model_dir} has no {RUN_SPEC_FILE}, so stoker does not know how its model is built (a stoker "
            "recipe or `stoker bench --train_dir` writes one); from Python, build the Estimator and call its "
            "method instead (see docs/export.md)"
        )
    est, example = run_spec_builder(spec["kind"])(spec, model_dir)
    return est, example, spec


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


__all__ = [
    "EVAL_INPUT_BUILDERS",
    "RUN_SPEC_BUILDERS",
    "RUN_SPEC_FILE",
    "RUN_SPEC_FORMAT",
    "RunSpecBuilder",
    "EvalInputBuilder",
    "RunSpecError",
    "eval_input_from_run_spec",
    "estimator_from_model_dir",
    "read_run_spec",
    "register_eval_input",
    "register_run_spec",
    "run_spec_builder",
    "write_run_spec",
]
