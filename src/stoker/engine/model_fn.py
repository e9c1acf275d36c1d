"""Binding a user's ``model_fn``: its signature is checked once, then it is always called with
``(model, features, labels, mode, params)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..errors import ModelFnError
from ..spec import EstimatorSpec

MODEL_FN_ARGS = ("model", "features", "labels", "mode", "params")


def bind_model_fn(fn: Callable[..., EstimatorSpec]) -> Callable[..., EstimatorSpec]:
    """``fn`` if it takes the five arguments; a wrapper if it takes a prefix of them (e.g.
    ``(model, features, labels)``); else a ``ModelFnError`` that says what to change."""
    if not callable(fn):
        raise ModelFnError(f"model_fn must be callable; got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    kinds = [p.kind for p in sig.parameters.values()]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return fn
    names = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) >= 5:
        return fn
    if len(names) >= 3 and tuple(names) == MODEL_FN_ARGS[: len(names)]:
        n = len(names)
        return lambda model, features, labels, mode, params: fn(*(model, features, labels, mode, params)[:n])
    got = ", ".join(names)
    hint = " (a TensorFlow-style model_fn: stoker passes the built module first)" if names[:1] == ["features"] else ""
    raise ModelFnError(f"model_fn must take (model, features, labels, mode, params); it takes ({got}){hint}")


__all__ = ["MODEL_FN_ARGS", "bind_model_fn"]
