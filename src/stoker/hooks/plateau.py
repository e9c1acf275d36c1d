"""``ReduceLROnPlateau``: lower the learning rate when a metric stops improving.

torch's ``torch.optim.lr_scheduler.ReduceLROnPlateau`` rule, driven by the evaluations of
``train_and_evaluate`` (``after_evaluation``) or by a training value every N steps
(``source="train"``, as ``EarlyStopping``: ``monitor.py``) instead of a per-epoch call. The
hook's state is kept in checkpoints and the learning rate itself is in the optimizer's, so a
resumed run lowers it at the same steps to the same values. The learning rate is written to the
summaries (``learning_rate`` in TensorBoard and ``metrics.csv``) like every run's.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .base import Hook, LoopResult, RunContext
from .monitor import PHASE_OF_SOURCE, Monitor, check_positive_int

log = logging.getLogger("stoker")

THRESHOLD_MODES = ("rel", "abs")


class ReduceLROnPlateau(Hook):
    """Multiply every param group's learning rate by ``factor`` when ``monitor`` has not improved
    for more than ``patience`` checks (torch's rule and defaults).

    A check improves on the best when, with ``threshold_mode="rel"``, it is better than
    ``best * (1 -/+ threshold)``, with ``"abs"`` than ``best -/+ threshold`` (``mode`` says
    which direction is better; ``"auto"``, the default, reads it from the name as
    ``EarlyStopping`` does). After a reduction, ``cooldown`` checks are not counted. No group
    goes below ``min_lr`` (a number, or one per param group); a change smaller than ``eps`` is
    not made.

    ``source="eval"`` (default): the checks are the evaluations of ``train_and_evaluate`` (give
    the hook there; ``train`` refuses it). ``source="train"``: the training loss (``"loss"``) or a
    ``host_call`` value, its mean over each ``every_n_steps`` steps (default
    ``RunConfig.log_every_n_steps``), in ``train`` or ``train_and_evaluate``.

    The learning rate is changed in the optimizer's param groups, which checkpoints keep. A
    chainable schedule (StepLR, ExponentialLR, ...: each step scales the current rate) composes
    with it; a schedule that sets the rate from the step alone (LambdaLR, OneCycleLR) overwrites it.
    """

    phase = PHASE_OF_SOURCE["eval"]

    def __init__(
        self,
        monitor: str,
        mode: str = "auto",
        factor: float = 0.1,
        patience: int = 10,
        min_lr: float | list[float] = 0.0,
        *,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        eps: float = 1e-8,
        source: str = "eval",
        every_n_steps: int | None = None,
    ) -> None:
        owner = "ReduceLROnPlateau"
        self.watch = Monitor(owner, monitor, mode, source, every_n_steps)
        if not (isinstance(factor, (int, float)) and 0 < factor < 1):
            raise ConfigError(f"{owner}: factor must be a number in (0, 1); got {factor!r}")
        if threshold_mode not in THRESHOLD_MODES:
            raise ConfigError(f"{owner}: threshold_mode must be one of {THRESHOLD_MODES}; got {threshold_mode!r}")
        self.monitor, self.mode, self.factor = monitor, self.watch.mode, float(factor)
        self.patience = check_positive_int(owner, "patience", patience, minimum=0)
        self.cooldown = check_positive_int(owner, "cooldown", cooldown, minimum=0)
        self.min_lr, self.threshold, self.threshold_mode, self.eps = min_lr, threshold, threshold_mode, eps
        self.phase = PHASE_OF_SOURCE[self.watch.source]
        self.needs_evaluations = source == "eval"
        if source == "eval":
            self.due_step = sys.maxsize  # evaluations come through after_evaluation: no call after loops
        self.best = math.inf if self.mode == "min" else -math.inf
        self.num_bad = 0
        self.cooldown_counter = 0
        self.reductions: list[tuple[int, list[float]]] = []  # (step, learning rates after)

    @property
    def source(self) -> str:
        """``"eval"`` or ``"train"``: what ``monitor`` names."""
        return self.watch.source

    def improves(self, value: float, best: float) -> bool:
        """torch's ``is_better``."""
        if self.mode == "min":
            return value < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return value > (best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold)

    def observe(self, step: int, results: Mapping[str, float], optimizer: Any) -> bool:
        """Take in the evaluation ``results`` of ``step``; whether the learning rates were lowered."""
        seen = self.watch.evaluation({**results, "global_step": step})
        return seen is not None and self.decide(*seen, optimizer)

    def decide(self, step: int, value: float, optimizer: Any) -> bool:
        """Take in ``value``, the check of ``step``; whether the learning rates were lowered."""
        if self.improves(value, self.best):
            self.best, self.num_bad = value, 0
        else:
            self.num_bad += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad = 0
        if self.num_bad <= self.patience:
            return False
        self.cooldown_counter, self.num_bad = self.cooldown, 0
        return self._reduce(step, optimizer)

    def _reduce(self, step: int, optimizer: Any) -> bool:
        groups = optimizer.param_groups
        floors = self.min_lr if isinstance(self.min_lr, list) else [self.min_lr] * len(groups)
        if len(floors) != len(groups):
            raise ConfigError(f"ReduceLROnPlateau: min_lr has {len(floors)} values for {len(groups)} param groups")
        changed = False
        for group, floor in zip(groups, floors, strict=True):
            old = float(group["lr"])
            new = max(old * self.factor, floor)
            if old - new > self.eps:
                group["lr"] = new
                changed = True
        if changed:
            self.reductions.append((step, [float(g["lr"]) for g in groups]))
        return changed

    def after_setup(self, run: RunContext) -> None:
        self._decide(run, self.watch.start(run))  # source="train": a resumed run's check of its start step

    def after_loop(self, run: RunContext, result: LoopResult) -> None:  # source="train"
        self._decide(run, self.watch.take(run, result))

    def after_evaluation(self, run: RunContext, metrics: dict[str, float]) -> None:
        self._decide(run, self.watch.evaluation(metrics))

    def scheduled_after(self, step: int) -> int | None:
        """``source="train"``: the next check's step (loops end there); ``None`` for evaluations."""
        return self.watch.scheduled_after(step)

    def _decide(self, run: RunContext, seen: tuple[int, float] | None) -> None:
        if seen is None:
            return
        step, value = seen
        if self.decide(step, value, run.optimizer) and run.is_chief:
            lrs = ", ".join(f"{lr:.6g}" for lr in self.reductions[-1][1])
            what = self.monitor if self.source == "eval" else f"the training {self.monitor}"
            log.info("ReduceLROnPlateau: %s has not improved: learning rate now %s (step %d)", what, lrs, step)

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.watch.state_dict(),
            "best": self.best,
            "num_bad": self.num_bad,
            "cooldown_counter": self.cooldown_counter,
            "reductions": [[s, list(lrs)] for s, lrs in self.reductions],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.watch.load_state_dict(state):
            return
        self.best, self.num_bad = float(state["best"]), int(state["num_bad"])
        self.cooldown_counter = int(state["cooldown_counter"])
        self.reductions = [(int(s), list(lrs)) for s, lrs in state["reductions"]]


__all__ = ["ReduceLROnPlateau"]
