"""``RunSettings``: what a training run records of its settings in each checkpoint, and what a
resumed run does with those that changed. The policy (one table) is ``stoker.config.changes``;
this component applies it to a restore: compares, refuses, puts new optimizer or schedule values
over the restored ones where asked, remembers the kept ones and says each change in one line.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from ..checkpoint.manager import LoadedCheckpoint
from ..config import changes
from ..config.changes import NOT_DATA, RULES, Policy, SettingChange, plain
from ..config.run_config import RunConfig
from ..errors import CheckpointError
from ..storage.stores import Location
from .inputs import InputPlan

log = logging.getLogger("stoker")


class RunSettings:
    """The settings one run trains with, as its checkpoints record them.

    ``values``: the facade's (:meth:`given`: params, RunConfig fields, batch sizes, the train
    call's); ``names``: how messages spell a setting (a command line's flags). The optimizer's and
    schedule's come from what the run built (:meth:`built_optimizer`, :meth:`built_schedule`).
    A value kept from the checkpoint at a resume (``on_changed_optimizer="keep"``) is recorded
    as the checkpoint's, since that is what trains.
    """

    def __init__(self, on_changed_optimizer: str = "refuse") -> None:
        self.on_changed_optimizer = on_changed_optimizer
        self.values: dict[str, Any] = {}
        self.names: Mapping[str, str] = {}
        self.changes: list[SettingChange] = []  # found by the last full restore, for the hooks that follow
        self._built: dict[str, Any] = {}
        self._kept: dict[str, Any] = {}
        self._evaluating: dict[str, int | None] = {}

    def given(
        self, params: Mapping[str, Any], config: RunConfig, inputs: InputPlan, *, max_steps: int | None = None
    ) -> None:
        """The facade's settings (``values``): ``params``, ``config``'s fields, ``inputs``' batch sizes
        and, in a train call, its own (``max_steps``, and inside :meth:`evaluating` the evaluations')."""
        self.values = {
            **changes.params_settings(params),
            **config_settings(config),
            "train_batch_size": inputs.train_batch_size,
            "eval_batch_size": inputs.eval_batch_size,
            **changes.call_settings(max_steps=max_steps, **self._evaluating),
        }

    @contextmanager
    def evaluating(self, every_n_steps: int, steps: int | None) -> Iterator[None]:
        """Inside: a train call's settings also hold ``train_and_evaluate``'s ``eval_every_n_steps``
        and ``eval_steps``."""
        self._evaluating = {"eval_every_n_steps": every_n_steps, "eval_steps": steps}
        try:
            yield
        finally:
            self._evaluating = {}

    def built_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's hyper-parameters as the user's function built them (before any schedule step)."""
        self._built = changes.optimizer_settings(optimizer)

    def built_schedule(self, schedule: Any) -> None:
        self._built.update(changes.schedule_settings(schedule))

    def record(self) -> dict[str, Any]:
        """What a checkpoint records (its ``settings``)."""
        return {**self.values, **self._built, **self._kept}

    def compare(self, ckpt: LoadedCheckpoint) -> list[SettingChange]:
        """The settings that differ from those ``ckpt`` recorded (none for a checkpoint written
        before settings were recorded)."""
        recorded = ckpt.train_state.get("settings")
        if not isinstance(recorded, Mapping):
            return []
        current = {**self.values, **self._built}
        return changes.compare(recorded, current, on_changed_optimizer=self.on_changed_optimizer)

    def refuse(self, ckpt: LoadedCheckpoint, found: list[SettingChange]) -> None:
        """A ``ConfigError`` naming the changes the resumed run cannot go on with, if any."""
        if any(c.outcome == "refused" for c in found):
            raise changes.refusal(found, _name(ckpt.path), ckpt.step, self.names)

    def explain(self, error: CheckpointError, found: list[SettingChange]) -> CheckpointError:
        """``error`` (weights that do not fit the model) with the params changed since the checkpoint."""
        given = [c for c in found if c.outcome == "given"]
        if not given:
            return error
        said = "; ".join(f"{c.name(self.names)} {changes.show(c.old)} -> {changes.show(c.new)}" for c in given)
        return CheckpointError(f"{error}. Changed since it was written: {said}")

    def settle(self, found: list[SettingChange], optimizer: torch.optim.Optimizer, schedule: Any) -> None:
        """After a full restore: the resumed step's rate from this run's ``LambdaLR`` function, the
        new optimizer and schedule values over the restored ones where asked (``"apply"``), and
        the kept ones remembered."""
        restored = float(optimizer.param_groups[0]["lr"])
        _rate_from_function(schedule)
        now = float(optimizer.param_groups[0]["lr"])
        if now != restored:  # the function gives this step another rate than the checkpoint's did
            found = [*found, SettingChange("lr_schedule.lr", restored, now, changes.rule_of("lr_schedule.lr"))]
        self._kept = {}
        for change in found:
            if change.rule.policy is not Policy.OPTIMIZER:
                continue
            if change.outcome == "kept":  # recorded as what trains: the checkpoint's values
                self._kept.update({c.key: c.old for c in (change, *change.also)})
                continue
            for restored in change.restored:
                _apply_setting(optimizer, schedule, restored.key, restored.new)
        _rate_from_function(schedule)  # exact at a new base rate
        self.changes = found

    def say(self, checkpoint: Location, step: int) -> None:
        """One line per change the restore of ``checkpoint`` found."""
        for change in changes.distinct(self.changes, self.names):
            line = change.line(_name(checkpoint), step, self.names)
            (log.warning if change.outcome == "kept" else log.info)("%s", line)

    def take_changes(self) -> list[SettingChange]:
        """The changes the last full restore found, once (for the hooks of the run that follows)."""
        found, self.changes = self.changes, []
        return found


def config_settings(config: RunConfig) -> dict[str, object]:
    """The ``RunConfig`` fields that shape training, as each checkpoint records them
    (``RunConfig.<field>`` -> a plain value; the rule of each is in ``stoker.config.changes.RULES``)."""
    out: dict[str, object] = {}
    by_name = {"precision": config.precision_name, "compile": config.compile_mode}  # not the objects given
    for f in dataclasses.fields(config):
        key = f"RunConfig.{f.name}"
        if key not in RULES or RULES[key].policy is Policy.UNRECORDED:
            continue
        value = by_name.get(f.name, getattr(config, f.name))
        recorded = plain(value)
        out[key] = repr(value) if recorded is NOT_DATA else recorded
    return out


def _name(path: Location) -> str:
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def _rate_from_function(schedule: Any) -> None:
    """A restored ``LambdaLR``: the rate of the resumed step from this run's function.

    The restored optimizer holds the rate the checkpoint's function gave for this step. The
    function is code, run as given from the next step on, so the resumed step takes its rate from
    it too: the same value when the function is unchanged (the computation is LambdaLR's own).
    """
    if type(schedule) is not torch.optim.lr_scheduler.LambdaLR:
        return
    step = schedule.last_epoch
    rates = [base * fn(step) for fn, base in zip(schedule.lr_lambdas, schedule.base_lrs, strict=True)]
    for group, rate in zip(schedule.optimizer.param_groups, rates, strict=True):
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(rate)
        else:
            group["lr"] = rate
    schedule._last_lr = [g["lr"] for g in schedule.optimizer.param_groups]


def _apply_setting(optimizer: torch.optim.Optimizer, schedule: Any, key: str, value: Any) -> None:
    """Put this run's value of an optimizer or schedule setting over the restored one.

    ``lr`` under a schedule is its base rate: the schedule's ``base_lrs`` and the groups'
    ``initial_lr`` become the new one, and the rate of the resumed step is scaled by new / old,
    so the schedule goes on from its position at the new base.
    """
    family, _, rest = key.partition(".")
    if family == "lr_schedule":
        setattr(schedule, rest, value)
        return
    index, name = (0, rest) if not rest.startswith("group") else (int(rest[5:].split(".")[0]), rest.split(".", 1)[1])
    group = optimizer.param_groups[index]
    current = group[name]
    if name == "lr" and schedule is not None and hasattr(schedule, "base_lrs"):
        old = float(schedule.base_lrs[index])
        schedule.base_lrs[index] = value
        group["initial_lr"] = value
        value = float(current) * value / old if old else value
    if isinstance(current, torch.Tensor):
        current.fill_(value)
    elif isinstance(current, tuple):
        group[name] = tuple(value)
    else:
        group[name] = value


__all__ = ["RunSettings", "config_settings"]
