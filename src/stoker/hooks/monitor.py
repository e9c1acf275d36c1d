"""What ``EarlyStopping`` and ``ReduceLROnPlateau`` watch: one evaluation metric or one training
value, which direction is better, and its value at each check.

``source="eval"`` (the default) takes in each evaluation of ``train_and_evaluate`` once, when it
is made (the hook's ``after_evaluation``). ``source="train"`` watches the training
loss (``"loss"``) or a ``host_call`` value: at the first loop boundary at or past each multiple
of ``every_n_steps`` (default ``RunConfig.log_every_n_steps``, the interval of the log line), its
mean over the steps since the last check. That mean is summed step by step in step order and the
partial sum is kept in checkpoints, so a resumed run checks at the same steps with bitwise the
same values, wherever its loops began.

``mode="auto"`` reads the direction from the name (:func:`resolve_mode`): Keras infers it the
same way, and refuses what it cannot tell.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .base import LoopResult, Phase, RunContext, every_n_steps_due, next_due_step

log = logging.getLogger("stoker")

MODES = ("auto", "min", "max")
SOURCES = ("eval", "train")

#: The phase of a hook watching each source: a training value's check before the checkpoint saver
#: (the checkpoint of a check's step holds that check's outcome), an evaluation's after the
#: evaluation it acts on.
PHASE_OF_SOURCE: dict[str, Phase] = {"train": "recording", "eval": "decisions"}

# Words (between non-letters) that say which way a metric should go. "loss" and "error" may end
# a longer word (logloss, nllloss); a name with both kinds (top1_error) is an error: minimised.
_MINIMISED = re.compile(r"(loss|error)(?![a-z])|(?<![a-z])(err|mse|mae|rmse|nll|perplexity|ppl|bpc)(?![a-z])")
_MAXIMISED = re.compile(r"(?<![a-z])(accuracy|acc|auc|precision|recall|f1|top[_-]?(\d+|k))(?![a-z])")
AUTO_RULE = (
    "names with loss, error, mse, mae, rmse, nll, perplexity, ppl or bpc are minimised, names with "
    "accuracy, acc, auc, precision, recall, f1 or top-k (top5, top_5_accuracy) maximised"
)


def resolve_mode(owner: str, monitor: str, mode: str) -> str:
    """``mode``, or for ``"auto"`` the direction the name says (:data:`AUTO_RULE`); a
    ``ConfigError`` stating the rule when the name says none."""
    if mode not in MODES:
        raise ConfigError(f"{owner}: mode must be one of {MODES}; got {mode!r}")
    if mode != "auto":
        return mode
    name = monitor.lower()
    if _MINIMISED.search(name):
        return "min"
    if _MAXIMISED.search(name):
        return "max"
    raise ConfigError(
        f"{owner}: mode='auto' cannot tell whether {monitor!r} should go down or up ({AUTO_RULE}); "
        "give mode='min' or mode='max'"
    )


def check_monitor(owner: str, monitor: object) -> str:
    """``monitor`` if it can name a metric or training value; a ``ConfigError`` from ``owner`` else."""
    if not isinstance(monitor, str) or not monitor:
        raise ConfigError(
            f"{owner}: monitor must be the name of an evaluation metric or a training value; got {monitor!r}"
        )
    return monitor


def monitored_value(owner: str, monitor: str, results: Mapping[str, float]) -> float:
    """``results[monitor]`` as a float; a ``ConfigError`` from ``owner`` naming the metrics the
    evaluation has when it lacks ``monitor``."""
    if monitor not in results:
        available = sorted(k for k in results if k != "global_step")
        raise ConfigError(f"{owner}: monitor={monitor!r} is not among the evaluation's metrics {available}")
    return float(results[monitor])


def check_positive_int(owner: str, name: str, value: object, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{owner}: {name} must be an integer >= {minimum}; got {value!r}")
    return value


def check_number(owner: str, name: str, value: object) -> float | None:
    """``value`` as a float (``None`` stays ``None``); a ``ConfigError`` unless it is a finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{owner}: {name} must be a finite number or None; got {value!r}")
    return float(value)


class Monitor:
    """The value one hook watches (module docstring): its name, ``source``, direction, and the
    observations new at each loop boundary, each ``(step, value)`` taken in once."""

    def __init__(
        self, owner: str, name: object, mode: str = "auto", source: str = "eval", every_n_steps: int | None = None
    ) -> None:
        self.owner = owner
        self.name = check_monitor(owner, name)
        if source not in SOURCES:
            raise ConfigError(f"{owner}: source must be one of {SOURCES}; got {source!r}")
        if every_n_steps is not None:
            if source != "train":
                raise ConfigError(
                    f"{owner}: every_n_steps applies to source='train' (evaluations come every "
                    f"eval_every_n_steps of train_and_evaluate); got every_n_steps={every_n_steps!r}"
                )
            check_positive_int(owner, "every_n_steps", every_n_steps)
        self.source, self.every_n_steps = source, every_n_steps
        self.mode = resolve_mode(owner, self.name, mode)
        self.seen_step = -1  # the step of the last value taken in
        self._every = every_n_steps  # source="train": resolved when training starts
        # source="train": the steps since the last check (where they began, their sum and count)
        self._since: int | None = None
        self._sum, self._count = 0.0, 0

    @property
    def checks(self) -> str:
        """What one observation is, for messages: ``"evaluation(s)"`` or ``"check(s) of the ..."``."""
        if self.source == "eval":
            return "evaluation(s)"
        return f"check(s) of its mean over {self._every or 'every_n_steps'} steps"

    def better(self, value: float, than: float) -> bool:
        """Whether ``value`` is strictly better than ``than`` in this direction (NaN never is)."""
        return value < than if self.mode == "min" else value > than

    def value(self, results: Mapping[str, float]) -> float:
        """The monitored metric of an evaluation's ``results`` (:func:`monitored_value`)."""
        return monitored_value(self.owner, self.name, results)

    # ------------------------------------------------------------ observations
    def start(self, run: RunContext) -> tuple[int, float] | None:
        """In ``after_setup`` (states restored), ``source="train"``: a resumed run's check of its
        start step when a checkpoint written before that check is where it resumed (``None``:
        none; always for evaluations, which come through :meth:`evaluation`)."""
        if self.source == "eval":
            return None
        every = self.every_n_steps or run.info.log_every_n_steps
        if every is None:
            raise ConfigError(
                f"{self.owner}: source='train' checks every every_n_steps steps (default "
                "RunConfig.log_every_n_steps, None here); give every_n_steps"
            )
        self._every = every
        if self._since is None:
            self._since = run.global_step
        return self._check(run.global_step)

    def take(self, run: RunContext, result: LoopResult) -> tuple[int, float] | None:
        """``source="train"``, at a loop boundary: the check that falls there, if any (``None``: none)."""
        if self.source == "eval":
            return None
        self._add(result)
        return self._check(run.global_step)

    def evaluation(self, metrics: Mapping[str, float]) -> tuple[int, float] | None:
        """``source="eval"``: the observation of the evaluation ``metrics`` (``after_evaluation``),
        or ``None`` for one already taken in (a value of ``source="train"`` is never one)."""
        if self.source != "eval":
            return None
        step = int(metrics["global_step"])
        if step <= self.seen_step:
            return None
        value = self.value(metrics)
        self.seen_step = step
        return step, value

    def scheduled_after(self, step: int) -> int | None:
        """``source="train"``: the first multiple of ``every_n_steps`` after ``step``, where the
        next check falls (``None``: evaluations, or before training starts)."""
        if self.source != "train" or self._every is None:
            return None
        return next_due_step(step, self._every)

    def _add(self, result: LoopResult) -> None:
        values = result.losses if self.name == "loss" else result.values.get(self.name)
        if values is None:
            if not result.steps:
                return
            available = sorted({"loss", *result.values})
            raise ConfigError(
                f"{self.owner}: monitor={self.name!r} (source='train') is not among the training values "
                f"{available} (the loss and the model_fn's host_call values)"
            )
        total = self._sum
        for v in values:  # one by one in step order: the same sum however the loops fell
            total += v
        self._sum, self._count = total, self._count + len(values)

    def _check(self, step: int) -> tuple[int, float] | None:
        assert self._since is not None and self._every is not None, "start() comes first"
        if not self._count or not every_n_steps_due(self._since, step, self._every):
            return None
        value = self._sum / self._count
        self._since, self._sum, self._count = step, 0.0, 0
        self.seen_step = step
        return step, value

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Merged into the hook's state: what is watched, the last step taken in, and for
        ``source="train"`` the steps since the last check."""
        state: dict[str, Any] = {"monitor": [self.name, self.source, self.mode], "seen_step": self.seen_step}
        if self.source == "train":
            state["interval"] = [self._since, self._sum, self._count]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> bool:
        """Restore :meth:`state_dict`'s part of ``state``; ``False`` (nothing restored, said in
        the log) when the checkpoint's hook watched something else (another name, source or mode)."""
        watched = state.get("monitor")
        if watched is not None and list(watched) != [self.name, self.source, self.mode]:
            name, source, mode = watched
            log.info(
                "%s: the checkpoint's state watched %r (source=%r, mode=%r), this run watches %r (source=%r, "
                "mode=%r): it starts afresh",
                self.owner,
                name,
                source,
                mode,
                self.name,
                self.source,
                self.mode,
            )
            return False
        self.seen_step = int(state.get("seen_step", -1))
        interval = state.get("interval")
        if self.source == "train" and interval is not None:
            since, total, count = interval
            self._since, self._sum, self._count = None if since is None else int(since), float(total), int(count)
        return True


__all__ = [
    "AUTO_RULE",
    "MODES",
    "PHASE_OF_SOURCE",
    "SOURCES",
    "Monitor",
    "check_monitor",
    "check_number",
    "check_positive_int",
    "monitored_value",
    "resolve_mode",
]
