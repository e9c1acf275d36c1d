"""``ReduceLROnPlateau``: lower the learning rate when an evaluation metric stops improving.

torch's ``torch.optim.lr_scheduler.ReduceLROnPlateau`` rule, driven by the evaluations of
``train_and_evaluate`` (``run.last_evaluation``) instead of a per-epoch call. The hook's state
is kept in checkpoints and the learning rate itself is in the optimizer's, so a resumed run
lowers it at the same steps to the same values. The learning rate is written to the summaries
(``learning_rate`` in TensorBoard and ``metrics.csv``) like every run's.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from ..errors import ConfigError
from .base import Hook, LoopResult, RunContext
from .early_stopping import MODES, check_monitor, check_positive_int, monitored_value

log = logging.getLogger("stoker")

THRESHOLD_MODES = ("rel", "abs")


class ReduceLROnPlateau(Hook):
    """Multiply every param group's learning rate by ``factor`` when ``monitor`` has not improved
    for more than ``patience`` evaluations (torch's rule and defaults).

    An evaluation improves on the best when, with ``threshold_mode="rel"``, it is better than
    ``best * (1 -/+ threshold)``, with ``"abs"`` than ``best -/+ threshold`` (``mode`` says
    which direction is better). After a reduction, ``cooldown`` evaluations are not counted.
    No group goes below ``min_lr`` (a number, or one per param group); a change smaller than
    ``eps`` is not made.

    The learning rate is changed in the optimizer's param groups, which checkpoints keep. A
    chainable schedule (StepLR, ExponentialLR, ...: each step scales the current rate) composes
    with it; a schedule that sets the rate from the step alone (LambdaLR, OneCycleLR) overwrites it.
    """

    priority = 37  # after EvaluationHook (35), whose results it reads at the same boundary

    def __init__(
        self,
        monitor: str,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        min_lr: float | list[float] = 0.0,
        *,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        eps: float = 1e-8,
    ) -> None:
        owner = "ReduceLROnPlateau"
        check_monitor(owner, monitor)
        if mode not in MODES:
            raise ConfigError(f"{owner}: mode must be one of {MODES}; got {mode!r}")
        if not (isinstance(factor, (int, float)) and 0 < factor < 1):
            raise ConfigError(f"{owner}: factor must be a number in (0, 1); got {factor!r}")
        if threshold_mode not in THRESHOLD_MODES:
            raise ConfigError(f"{owner}: threshold_mode must be one of {THRESHOLD_MODES}; got {threshold_mode!r}")
        self.monitor, self.mode, self.factor = monitor, mode, float(factor)
        self.patience = check_positive_int(owner, "patience", patience, minimum=0)
        self.cooldown = check_positive_int(owner, "cooldown", cooldown, minimum=0)
        self.min_lr, self.threshold, self.threshold_mode, self.eps = min_lr, threshold, threshold_mode, eps
        self.best = math.inf if mode == "min" else -math.inf
        self.num_bad = 0
        self.cooldown_counter = 0
        self.seen_step = -1
        self.reductions: list[tuple[int, list[float]]] = []  # (step, learning rates after)

    def improves(self, value: float, best: float) -> bool:
        """torch's ``is_better``."""
        if self.mode == "min":
            return value < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return value > (best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold)

    def observe(self, step: int, results: dict[str, float], optimizer: Any) -> bool:
        """Take in the evaluation of ``step``; whether the learning rates were lowered."""
        if step <= self.seen_step:
            return False
        self.seen_step = step
        value = monitored_value("ReduceLROnPlateau", self.monitor, results)
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
        self._take(run)  # a resumed run gets back the evaluation of the step it resumed at

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        self._take(run)

    def _take(self, run: RunContext) -> None:
        ev = run.last_evaluation
        if ev is None or int(ev["global_step"]) > run.global_step:
            return
        step = int(ev["global_step"])
        if self.observe(step, ev, run.optimizer) and run.is_chief:
            lrs = ", ".join(f"{lr:.6g}" for lr in self.reductions[-1][1])
            log.info("ReduceLROnPlateau: %s has not improved: learning rate now %s (step %d)", self.monitor, lrs, step)

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "num_bad": self.num_bad,
            "cooldown_counter": self.cooldown_counter,
            "seen_step": self.seen_step,
            "reductions": [[s, list(lrs)] for s, lrs in self.reductions],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.num_bad = float(state["best"]), int(state["num_bad"])
        self.cooldown_counter, self.seen_step = int(state["cooldown_counter"]), int(state["seen_step"])
        self.reductions = [(int(s), list(lrs)) for s, lrs in state["reductions"]]


__all__ = ["ReduceLROnPlateau"]
