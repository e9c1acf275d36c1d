"""The flat ``RunConfig`` spellings before 0.2, in one place; they go away in 0.3.

``pipeline_split=``, ``loss_scale_init=``, ``async_checkpoints=``, ... (``DEPRECATED``) still
work for one release, as keywords and as attributes, with a ``DeprecationWarning`` naming the new
spelling. ``install(RunConfig)`` adds them to the class; deleting this module and that call (and
``GROUP_DEFAULTS``' identity check, see ``RunConfig``'s field defaults) removes them.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Any

from ..checkpoint.io_config import CheckpointIO
from ..distributed.pipeline import PipelineConfig, check_schedule
from ..errors import ConfigError
from ..precision import LossScale

#: the release in which the flat spellings are removed
REMOVED_IN = "0.3"

#: the flat spellings before 0.2 (keywords and attributes) -> (the RunConfig field, the group's field)
DEPRECATED: dict[str, tuple[str, str]] = {
    "pipeline_split": ("pipeline", "split"),
    "pipeline_microbatches": ("pipeline", "microbatches"),
    "pipeline_schedule": ("pipeline", "schedule"),
    "pipeline_stages_per_process": ("pipeline", "stages_per_process"),
    "loss_scale_init": ("loss_scale", "init"),
    "loss_scale_growth_interval": ("loss_scale", "growth_interval"),
    "async_checkpoints": ("checkpoint_io", "async_save"),
    "storage_retry": ("checkpoint_io", "retry"),
}

#: the groups' default objects, which RunConfig's fields use as defaults: a field that still holds
#: its default object was not given, so an old keyword may fill it
DEFAULT_LOSS_SCALE = LossScale()
DEFAULT_CHECKPOINT_IO = CheckpointIO()
GROUP_DEFAULTS: dict[str, object] = {
    "pipeline": None,
    "loss_scale": DEFAULT_LOSS_SCALE,
    "checkpoint_io": DEFAULT_CHECKPOINT_IO,
}
_GROUPS: dict[str, type] = {"pipeline": PipelineConfig, "loss_scale": LossScale, "checkpoint_io": CheckpointIO}
_CLASS_NAMES = {"pipeline": "PipelineConfig", "loss_scale": "LossScale", "checkpoint_io": "CheckpointIO"}


def install(cls: type) -> None:
    """Give ``RunConfig`` the old keywords (its ``__init__`` folds them into their groups) and
    the old attributes (read with a warning)."""
    dataclass_init = vars(cls)["__init__"]

    @functools.wraps(dataclass_init)
    def init(self: Any, **kwargs: Any) -> None:
        dataclass_init(self, **new_spelling(kwargs))

    cls.__init__ = init  # type: ignore[misc]  # the deprecated flat keywords, then the dataclass's
    for name in DEPRECATED:
        setattr(cls, name, _old_attribute(name))


def _old_attribute(name: str) -> property:
    """The flat attribute ``name`` before 0.2: reads its group's field with a ``DeprecationWarning``."""
    group, attr = DEPRECATED[name]
    where = f"RunConfig.{group}.{attr}" + (
        " (RunConfig.pipeline is None without a pipeline)" if group == "pipeline" else ""
    )

    def read(config: Any) -> Any:
        warnings.warn(
            f"RunConfig.{name} is deprecated; read {where}; the old attribute goes away after 0.2",
            DeprecationWarning,
            stacklevel=2,
        )
        value = getattr(config, group)
        if value is None:  # no pipeline: what the flat fields held then
            return {"split": None, "microbatches": 1, "schedule": "1f1b", "stages_per_process": 1}[attr]
        return getattr(LossScale.of(value) if group == "loss_scale" else value, attr)

    return property(read, doc=f"Deprecated: read {where}.")


def new_spelling(kwargs: dict[str, Any], base: Any = None) -> dict[str, Any]:
    """``kwargs`` with the deprecated flat keywords folded into their groups (a warning each).

    Building a config (``base`` is ``None``), an old keyword beside its group given as an object
    (anything but the default) is a ``ConfigError``; the short forms ``loss_scale="dynamic"`` /
    ``128`` are not group objects and take ``loss_scale_init`` / ``loss_scale_growth_interval``
    as before. Replacing (``base``, a ``RunConfig``, given), the old keywords change ``base``'s
    group, and an old keyword beside its group is an error.
    """
    old = {name: kwargs[name] for name in kwargs if name in DEPRECATED}
    if not old:
        return kwargs
    new = {k: v for k, v in kwargs.items() if k not in DEPRECATED}
    by_group: dict[str, dict[str, Any]] = {}
    for name, value in old.items():
        group, attr = DEPRECATED[name]
        by_group.setdefault(group, {})[attr] = value
    for group, values in by_group.items():
        names = [n for n in old if DEPRECATED[n][0] == group]
        given = group in new and (base is not None or _is_group_object(group, new[group]))
        if given:
            spelled = ", ".join(f"{n}=" for n in names)
            raise ConfigError(
                f"RunConfig: {spelled} and {group}= both given; {spelled} is the deprecated spelling of "
                f"{group}={_CLASS_NAMES[group]}(...): pass only {group}={_new_form(group, values)}"
            )
    for name in old:
        group, attr = DEPRECATED[name]
        warnings.warn(
            f"RunConfig({name}=...) is deprecated; use RunConfig({group}={_CLASS_NAMES[group]}({attr}=...)) "
            f"(stoker.{_CLASS_NAMES[group]}); the old keyword goes away after 0.2",
            DeprecationWarning,
            stacklevel=3,  # the caller of RunConfig(...) or RunConfig.replace(...)
        )
    for group, values in by_group.items():
        start = getattr(base, group) if base is not None else new.get(group, GROUP_DEFAULTS[group])
        new[group] = _merge(group, start, values)
    return new


def _is_group_object(group: str, value: object) -> bool:
    """Whether ``value`` is a group object someone passed (not the field's default)."""
    return isinstance(value, _GROUPS[group]) and value is not GROUP_DEFAULTS[group]


def _merge(group: str, start: Any, values: dict[str, Any]) -> Any:
    """``start`` (the group, its default or a short form) with the deprecated keywords' ``values`` set."""
    if group == "loss_scale":
        scale = LossScale.of(start)
        if not scale.dynamic:  # as before 0.2: a static scale has no initial scale to set
            values = {k: v for k, v in values.items() if k != "init"}
        return dataclasses.replace(scale, **values)
    if group == "checkpoint_io":
        return dataclasses.replace(start, **values)
    # pipeline: the split makes a pipeline; the other keywords without one are checked and have no effect
    current = {} if start is None else {f.name: getattr(start, f.name) for f in dataclasses.fields(start)}
    settings = {**current, **values}
    if settings.get("split") is None:
        check_schedule(
            settings.get("microbatches", 1), settings.get("schedule", "1f1b"), settings.get("stages_per_process", 1)
        )
        return None
    return PipelineConfig(**settings)


def _new_form(group: str, values: dict[str, Any]) -> str:
    """How the deprecated keywords' ``values`` are spelled now, e.g. ``LossScale(init=1048576.0)``."""
    return f"{_CLASS_NAMES[group]}({', '.join(f'{k}={v!r}' for k, v in values.items())})"


__all__ = [
    "DEFAULT_CHECKPOINT_IO",
    "DEFAULT_LOSS_SCALE",
    "DEPRECATED",
    "GROUP_DEFAULTS",
    "REMOVED_IN",
    "install",
    "new_spelling",
]
