"""The checks every mixture makes of what ``mix`` is given (names, weights, one element structure,
values the sources must agree on), shared by the per-batch :class:`~stoker.data.mix.Mixture` and
the per-example :class:`~stoker.data.mix_examples.ExampleMixture` (kept apart from both so neither
mixture module imports the other's)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError

#: What ``stopping_strategy`` may be (Hugging Face ``interleave_datasets``' names).
STOPPING_STRATEGIES: tuple[str, ...] = ("first_exhausted", "all_exhausted")


class Structure:
    """Checks that every source yields batches of one element structure (the same nesting, dtypes
    and per-example shapes): at once for ``stoker.data`` sources (one batch of each is built),
    otherwise at the first batch a source yields in this process."""

    def __init__(self, sources: Mapping[str, Any]) -> None:
        self._first: tuple[str, list[tuple[str, str, tuple[int, ...]]]] | None = None
        self.checked: set[str] = set()
        for name, source in sources.items():
            batch_indices = getattr(source, "batch_indices", None)
            load_batch = getattr(source, "load_batch", None)
            if callable(batch_indices) and callable(load_batch) and int(getattr(source, "batches_per_epoch", 0)) > 0:
                self.check(name, load_batch(batch_indices(0, 0), 0))

    def check(self, name: str, batch: Any) -> None:
        if name in self.checked:
            return
        mine = _signature(batch)
        if self._first is None:
            self._first = (name, mine)
        elif mine != self._first[1]:
            other, theirs = self._first
            raise ConfigError(
                f"mix: source {name!r} yields batches of another structure than {other!r} "
                f"({_describe(mine)} vs {_describe(theirs)}); give every source the same element structure"
            )
        self.checked.add(name)


def _signature(batch: Any, path: str = "") -> list[tuple[str, str, tuple[int, ...]]]:
    """Every leaf of a batch as ``(path, dtype, shape without the batch dimension)``."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return [(path or ".", str(batch.dtype).replace("torch.", ""), tuple(batch.shape[1:]))]
    if isinstance(batch, Mapping):
        return [leaf for k in sorted(batch, key=str) for leaf in _signature(batch[k], f"{path}[{k!r}]")]
    if isinstance(batch, (list, tuple)):
        return [leaf for i, v in enumerate(batch) for leaf in _signature(v, f"{path}[{i}]")]
    return [(path or ".", type(batch).__name__, ())]


def _describe(signature: list[tuple[str, str, tuple[int, ...]]]) -> str:
    return ", ".join(f"{p} {dtype} {list(shape)}" for p, dtype, shape in signature)


def checked_sources(sources: Any) -> tuple[list[str], dict[str, Any], dict[str, float]]:
    """The names (in order), sources and weights of ``mix``'s argument, or a one-line ConfigError."""
    if not isinstance(sources, Mapping) or not sources:
        raise ConfigError(
            f"mix: sources must be a non-empty dict of name -> (source, weight); got {type(sources).__name__}"
        )
    names: list[str] = []
    out: dict[str, Any] = {}
    weights: dict[str, float] = {}
    seen: dict[int, str] = {}
    for name, entry in sources.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"mix: source names must be non-empty strings; got {name!r}")
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise ConfigError(f"mix: sources[{name!r}] must be a (source, weight) pair; got {type(entry).__name__}")
        source, weight = entry
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"mix: the weight of {name!r} must be a finite number > 0; got {weight!r}")
        if not all(callable(getattr(source, a, None)) for a in ("__next__", "state_dict", "load_state_dict")):
            raise ConfigError(
                f"mix: sources[{name!r}] must be an iterator with state_dict() and load_state_dict() "
                f"(a stoker.data source); got {type(source).__name__}"
            )
        if id(source) in seen:
            raise ConfigError(
                f"mix: sources {seen[id(source)]!r} and {name!r} are the same object; give each name its own source"
            )
        seen[id(source)] = name
        names.append(name)
        out[name] = source
        weights[name] = float(weight)
    return names, out, weights


def agreed(sources: Mapping[str, Any], attribute: str, what: str) -> int | None:
    """The sources' common value of ``attribute`` (``None`` if none has it), or a ConfigError."""
    values = {n: getattr(s, attribute) for n, s in sources.items() if isinstance(getattr(s, attribute, None), int)}
    if len(set(values.values())) > 1:
        listed = ", ".join(f"{n}: {v}" for n, v in values.items())
        raise ConfigError(f"mix: the sources differ in {attribute} ({listed}); give every source {what}")
    return next(iter(values.values()), None)
