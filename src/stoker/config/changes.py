"""Changed settings on rerun: what a checkpoint records of the settings that trained it, and what
a resumed run does with each one that differs. :data:`RULES` is the one table of that policy.

Every checkpoint's training state holds ``settings``: the run's ``params``, the ``RunConfig``
fields that shape training, the batch sizes, the ``train`` call's ``max_steps`` and evaluation
cadence, and the optimizer's and LR schedule's hyper-parameters as the run built them. A run that
resumes compares its own settings with those of the checkpoint it resumes from and, for each one
that differs, says in one log line what happens, by the rule of its setting:

- ``apply``: the new value trains from the resumed step; the checkpoint holds nothing of it
  (``max_steps``, evaluation and checkpoint cadence, logging, clipping, precision, ...);
- ``given``: a ``params`` entry is handed to model, model_fn, input_fn, optimizer and schedule as
  given; stoker cannot tell what it shapes (a model that no longer fits the checkpoint's weights
  is refused when they are loaded, and that error names the changed params);
- ``optimizer``: a hyper-parameter of the optimizer or LR schedule (``lr``, ``weight_decay``,
  ``betas``, a ``StepLR``'s ``step_size``, ...). Restoring the checkpoint's optimizer state puts
  its value back over the new one, which would silently be ignored (torch's
  ``Optimizer.load_state_dict`` restores every param group's hyper-parameters).
  ``RunConfig.on_changed_optimizer`` decides: ``"refuse"`` (the default) raises a ``ConfigError``
  naming each, ``"keep"`` trains on with the checkpoint's values, ``"apply"`` with the new ones
  from the resumed step (the optimizer's moments and the schedule's position stay the
  checkpoint's). Tools disagree here (Lightning, Keras and Hugging Face keep the checkpoint's
  value without a word; TPUEstimator, whose rate is a constant of the new graph, applies the new
  one), so neither is a safe guess: the rerun says which;
- ``refuse``: a ``ConfigError``: the checkpoint cannot go on with the new value (its input
  position counts batches of its own size; its weights and random streams come from its seed).
  Rerun with the checkpoint's value, or start a new ``model_dir`` from its weights
  (``warm_start_from``). stoker's data sources refuse a changed seed or sharding the same way.

Settings that do not shape training (``progress_bar``, ``prefetch_depth``, ...) are not recorded;
their rule says so. A checkpoint written before settings were recorded is resumed without a
comparison. Trackers (``stoker.hooks.tracking``) log each change as a ``changed.<step>.<name>`` param.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

#: ``RunConfig.on_changed_optimizer``: what a resumed run does with a changed optimizer or schedule setting
ON_CHANGED_OPTIMIZER: tuple[str, ...] = ("refuse", "keep", "apply")


class Policy(str, enum.Enum):
    """What a resumed run does with a setting whose value differs from its checkpoint's."""

    APPLY = "apply"
    GIVEN = "given"
    OPTIMIZER = "optimizer"
    REFUSE = "refuse"
    UNRECORDED = "unrecorded"


@dataclass(frozen=True)
class Rule:
    """A setting's policy and why (said in the line or error about a change)."""

    policy: Policy
    why: str


_APPLY, _REFUSE, _UNRECORDED = Policy.APPLY, Policy.REFUSE, Policy.UNRECORDED
_LONGEST = 500  # characters of a param's JSON recorded as is; a longer one by its digest
_SAME_STEP = "the same steps, computed another way"
_WATCHING = "how the run is fed, watched or written, not what it trains"

#: The one table: every recorded setting (a ``RunConfig`` field as ``RunConfig.<field>``, the
#: Estimator's batch sizes, the ``train`` call's, and the ``params.``, ``optimizer.`` and
#: ``lr_schedule.`` families) and what a resumed run does when its value changed.
RULES: dict[str, Rule] = {
    # ---- the Estimator's and the train call's
    "params": Rule(Policy.GIVEN, "handed to model, model_fn, input_fn, optimizer and lr_schedule as given"),
    "optimizer": Rule(Policy.OPTIMIZER, "its optimizer state is restored"),
    "optimizer.type": Rule(_REFUSE, "the checkpoint's optimizer state is of its own type"),
    "lr_schedule": Rule(Policy.OPTIMIZER, "its lr_schedule state is restored"),
    "lr_schedule.lr": Rule(_APPLY, "the rate the lr_schedule function gives at the resumed step; it runs as given"),
    "train_batch_size": Rule(_REFUSE, "the checkpoint's input position counts batches of its size"),
    "eval_batch_size": Rule(_APPLY, "evaluation is exact at any batch size"),
    "max_steps": Rule(_APPLY, "training goes on to the new value"),
    "eval_every_n_steps": Rule(_APPLY, "evaluations follow the new cadence from the resumed step"),
    "eval_steps": Rule(_APPLY, "evaluations read the new number of batches"),
    # ---- RunConfig
    "RunConfig.model_dir": Rule(_UNRECORDED, "where the run is"),
    "RunConfig.seed": Rule(_REFUSE, "the checkpoint's weights and random streams come from its seed"),
    "RunConfig.iterations_per_loop": Rule(_APPLY, "loops group the same steps"),
    "RunConfig.save_checkpoints_steps": Rule(_APPLY, "checkpoints follow the new cadence"),
    "RunConfig.save_checkpoints_secs": Rule(_APPLY, "checkpoints follow the new cadence"),
    "RunConfig.keep_checkpoint_max": Rule(_APPLY, "the next checkpoint keeps the new number"),
    "RunConfig.keep_best": Rule(_APPLY, "the best checkpoint is chosen by the new rule"),
    "RunConfig.log_every_n_steps": Rule(_APPLY, "log lines follow the new cadence"),
    "RunConfig.precision": Rule(
        _APPLY, "the checkpoint's weights and optimizer state are converted (into bf16-sr the restore refuses)"
    ),
    "RunConfig.loss_scale": Rule(
        _APPLY, "a static scale is used as given; a dynamic one goes on from the checkpoint's running scale"
    ),
    "RunConfig.gradient_accumulation_steps": Rule(
        _REFUSE, "the checkpoint's input position counts micro-batches of its size"
    ),
    "RunConfig.gradient_clip_norm": Rule(_APPLY, "each step clips to the new norm"),
    "RunConfig.device": Rule(_APPLY, "a checkpoint loads on any device"),
    "RunConfig.compile": Rule(_APPLY, _SAME_STEP),
    "RunConfig.fast_linear": Rule(_APPLY, _SAME_STEP),
    "RunConfig.sgd_in_backward": Rule(_APPLY, _SAME_STEP),
    "RunConfig.cuda_graph": Rule(_APPLY, _SAME_STEP),
    "RunConfig.deterministic": Rule(_APPLY, _SAME_STEP),
    "RunConfig.recompute": Rule(_APPLY, _SAME_STEP),
    "RunConfig.strategy": Rule(_APPLY, "replicas combine the new way"),
    "RunConfig.ddp_bucket_cap_mb": Rule(_APPLY, _SAME_STEP),
    "RunConfig.pipeline": Rule(
        _APPLY, "micro-batches and schedule as given (a change of its stages is refused: the checkpoint's layout)"
    ),
    "RunConfig.ema": Rule(
        _APPLY, "the average goes on from the checkpoint's under the new settings (or starts, if it holds none)"
    ),
    "RunConfig.fast_dev_run": Rule(_UNRECORDED, "a quick run writes no checkpoint"),
    "RunConfig.limit_train_batches": Rule(_APPLY, "every epoch from the resumed step reads the new number of batches"),
    "RunConfig.limit_eval_batches": Rule(_APPLY, "evaluations read the new number of batches"),
    "RunConfig.overfit_batches": Rule(_APPLY, "the batches read over and over are the new number"),
    "RunConfig.prefetch_depth": Rule(_UNRECORDED, _WATCHING),
    "RunConfig.progress_bar": Rule(_UNRECORDED, _WATCHING),
    "RunConfig.summaries": Rule(_UNRECORDED, _WATCHING),
    "RunConfig.distributed_timeout": Rule(_UNRECORDED, _WATCHING),
    "RunConfig.stuck_replica": Rule(_UNRECORDED, _WATCHING),
    "RunConfig.mlperf_log": Rule(_UNRECORDED, _WATCHING),
    "RunConfig.checkpoint_io": Rule(_UNRECORDED, _WATCHING),
    "RunConfig.on_changed_optimizer": Rule(_UNRECORDED, "it decides this rerun's changes"),
}

# Optimizer param-group keys that say how the update is computed, not what it is (torch keeps
# them in the group too): not compared.
_IMPLEMENTATION_KEYS = frozenset({"params", "initial_lr", "fused", "foreach", "capturable", "differentiable"})
# LR scheduler state_dict keys that are its position, not its settings.
_SCHEDULE_STATE_KEYS = frozenset(
    {"last_epoch", "_step_count", "_last_lr", "_get_lr_called_within_step", "_is_initial", "base_lrs", "verbose"}
)


def rule_of(key: str) -> Rule:
    """The rule of a recorded setting (``params.lr`` -> the ``params`` rule)."""
    if key in RULES:
        return RULES[key]
    return RULES[key.split(".", 1)[0]]


class _Absent:
    """A param one side of a comparison does not have."""

    def __repr__(self) -> str:
        return "(not given)"


#: what a comparison shows for a param one side does not have
ABSENT: Any = _Absent()


@dataclass(frozen=True)
class SettingChange:
    """One setting whose value differs from the checkpoint's, and what the resumed run does.

    ``outcome``: ``"applied"`` (the new value trains), ``"given"`` (a param handed on as given)
    or ``"kept"`` (the checkpoint's value trains on). ``also``: the optimizer or schedule changes
    this one stands for (a param that set them: the same values).
    """

    key: str
    old: Any
    new: Any
    rule: Rule
    outcome: str = "applied"
    also: tuple[SettingChange, ...] = ()

    @property
    def restored(self) -> tuple[SettingChange, ...]:
        """The optimizer or schedule settings this change is about: those it stands for, or itself."""
        return self.also or (self,)

    def name(self, names: Mapping[str, str]) -> str:
        """How the user spells it: ``names`` (a command line's flags), else ``params["lr"]``,
        ``RunConfig.seed``, ``optimizer.lr``, ``max_steps``."""
        if self.key in names:
            return names[self.key]
        for change in self.also:
            if change.key in names:
                return names[change.key]
        if self.key.startswith("params."):
            return f'params["{self.key[len("params.") :]}"]'
        if self.key == "lr_schedule.lr":
            return "the lr_schedule's rate"
        return self.key

    @property
    def tracker_name(self) -> str:
        """The name a tracker logs it under: a param's own name (as trackers log params), else the key."""
        name = self.key[len("params.") :] if self.key.startswith("params.") else self.key
        return re.sub(r"[^\w./ -]", "_", name)

    def line(self, checkpoint: str, step: int, names: Mapping[str, str]) -> str:
        """The log line: the setting, both values and what happens."""
        head = f"changed since {checkpoint}: {self.name(names)} {show(self.old)} -> {show(self.new)}"
        if self.outcome == "kept":
            return f"{head}: the checkpoint's {show(self.old)} trains on ({self.rule.why}; on_changed_optimizer='keep')"
        if self.rule.policy is Policy.OPTIMIZER:
            return (
                f"{head}: applied from step {step} over the checkpoint's optimizer state "
                "(on_changed_optimizer='apply'; its moments and the schedule's position go on)"
            )
        if self.rule.policy is Policy.GIVEN:
            return f"{head}: {self.rule.why}"
        return f"{head}: applied ({self.rule.why})"

    def refused(self, checkpoint: str, names: Mapping[str, str]) -> str:
        """Why a refused change cannot go on, for the error."""
        head = f"{self.name(names)} {show(self.old)} -> {show(self.new)}"
        if self.rule.policy is Policy.OPTIMIZER:
            family, _, setting = self.restored[0].key.partition(".")
            return f"{head}: restoring {checkpoint} would silently put back its {family} {setting} {show(self.old)}"
        return f"{head}: {self.rule.why}"


def show(value: Any) -> str:
    """A setting's value as the lines show it (strings quoted)."""
    return repr(value) if isinstance(value, (str, _Absent)) else str(value)


# ==================================================================== what is recorded
class _NotData:
    def __repr__(self) -> str:
        return "NOT_DATA"


#: what :func:`plain` returns for a value that is not data (a function, a module, a tensor)
NOT_DATA: Any = _NotData()


def plain(value: Any) -> Any:
    """``value`` as plain data that compares by value and survives a checkpoint (numbers, strings,
    lists, dicts), or :data:`NOT_DATA` for a value that is not data (a function, a module, a tensor)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, enum.Enum):
        return plain(value.value)
    parts: list[Any] | dict[str, Any]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    elif isinstance(value, (list, tuple)):
        parts = [plain(v) for v in value]
    elif isinstance(value, Mapping):
        parts = {str(k): plain(v) for k, v in value.items()}
    else:
        item = getattr(value, "item", None)  # a 0-dim tensor (a capturable optimizer's lr)
        return plain(item()) if callable(item) and getattr(value, "ndim", None) == 0 else NOT_DATA
    inner = parts.values() if isinstance(parts, dict) else parts
    return NOT_DATA if any(v is NOT_DATA for v in inner) else parts


def params_settings(params: Mapping[str, Any], prefix: str = "params.") -> dict[str, Any]:
    """``params`` as ``params.<key>`` settings (nested mappings as ``params.a.b``); values that are
    not plain data (functions, modules, tensors) are not recorded, and a long one (a vocabulary, a
    list of files) is recorded by its digest, so every checkpoint stays small."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "cache" and prefix == "params.":
            continue
        if isinstance(value, Mapping):
            out.update(params_settings(value, f"{prefix}{key}."))
            continue
        recorded = plain(value)
        if recorded is not NOT_DATA:
            out[f"{prefix}{key}"] = _short(recorded)
    return out


def _short(value: Any) -> Any:
    text = json.dumps(value, sort_keys=True)
    if len(text) <= _LONGEST:
        return value
    size = f"{len(value)} items" if isinstance(value, list) else f"{len(text)} characters"
    return f"<{size}, sha256 {hashlib.sha256(text.encode()).hexdigest()[:16]}>"


def optimizer_settings(optimizer: Any) -> dict[str, Any]:
    """An optimizer's hyper-parameters as built: ``optimizer.<key>`` of its first param group and
    ``optimizer.group<i>.<key>`` of the others (how the update is computed, such as ``fused``, is
    left out)."""
    out: dict[str, Any] = {"optimizer.type": type(optimizer).__name__}
    for i, group in enumerate(optimizer.param_groups):
        prefix = "optimizer." if i == 0 else f"optimizer.group{i}."
        for key, value in group.items():
            if key in _IMPLEMENTATION_KEYS:
                continue
            recorded = plain(value)
            if recorded is not NOT_DATA:
                out[prefix + key] = recorded
    return out


def schedule_settings(schedule: Any) -> dict[str, Any]:
    """An LR schedule's settings as built (its ``state_dict`` less its position), as
    ``lr_schedule.<key>``; a schedule without a ``state_dict`` records none."""
    state_dict = getattr(schedule, "state_dict", None)
    if not callable(state_dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in state_dict().items():
        if key in _SCHEDULE_STATE_KEYS or key.startswith("_"):
            continue
        recorded = plain(value)
        if recorded is not NOT_DATA:
            out[f"lr_schedule.{key}"] = recorded
    return out


def call_settings(
    *, max_steps: int | None = None, eval_every_n_steps: int | None = None, eval_steps: int | None = None
) -> dict[str, Any]:
    """A ``train`` / ``train_and_evaluate`` call's settings (those not given are not compared)."""
    given = {"max_steps": max_steps, "eval_every_n_steps": eval_every_n_steps, "eval_steps": eval_steps}
    return {k: v for k, v in given.items() if v is not None}


# ==================================================================== comparing
def compare(
    recorded: Mapping[str, Any], current: Mapping[str, Any], *, on_changed_optimizer: str
) -> list[SettingChange]:
    """The settings of ``current`` whose value differs from ``recorded`` (keys either lacks are not
    compared), each with its outcome; refused ones come with ``outcome="refused"``."""
    changes: list[SettingChange] = []
    params = {k for k in (*recorded, *current) if k.startswith("params.")}  # a param given or dropped is a change
    for key in [*current, *sorted(params - current.keys())]:
        if key not in recorded and key not in params:
            continue
        old, new = recorded.get(key, ABSENT), current.get(key, ABSENT)
        if _same(old, new):
            continue
        rule = rule_of(key)
        if rule.policy is _UNRECORDED:
            continue
        outcome = {
            Policy.APPLY: "applied",
            Policy.GIVEN: "given",
            Policy.REFUSE: "refused",
            Policy.OPTIMIZER: {"refuse": "refused", "keep": "kept", "apply": "applied"}[on_changed_optimizer],
        }[rule.policy]
        changes.append(SettingChange(key, old, new, rule, outcome))
    return _merge_params(changes)


def _same(a: Any, b: Any) -> bool:
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def _alike(a: SettingChange, b: SettingChange) -> bool:
    """The same old and new values, floats to float32 precision (a rate the optimizer holds as a
    float32 tensor)."""

    def alike(x: Any, y: Any) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return math.isclose(x, y, rel_tol=1e-6)
        return _same(x, y)

    return alike(a.old, b.old) and alike(a.new, b.new)


def _merge_params(changes: list[SettingChange]) -> list[SettingChange]:
    """A changed param whose old and new values are those of changed optimizer or schedule
    settings is what set them: one change under the param's name, by the optimizer's rule."""
    restored = [c for c in changes if c.rule.policy is Policy.OPTIMIZER]
    taken: set[str] = set()
    merged: dict[str, SettingChange] = {}
    for change in changes:
        if change.rule.policy is not Policy.GIVEN:
            continue
        matching = [r for r in restored if r.key not in taken and _alike(r, change)]
        if matching:
            merged[change.key] = dataclasses.replace(
                matching[0], key=change.key, old=change.old, new=change.new, also=tuple(matching)
            )
            taken.update(r.key for r in matching)
    return [merged.get(c.key, c) for c in changes if c.key not in taken]


def distinct(changes: Iterable[SettingChange], names: Mapping[str, str]) -> list[SettingChange]:
    """``changes`` less a param said again under the same name and values by another setting (a
    command line's ``--max_steps`` sets both ``max_steps`` and a param the schedule reads)."""
    changes = list(changes)
    said = {(c.name(names), repr(c.old), repr(c.new)) for c in changes if c.rule.policy is not Policy.GIVEN}
    return [
        c for c in changes if c.rule.policy is not Policy.GIVEN or (c.name(names), repr(c.old), repr(c.new)) not in said
    ]


def refusal(changes: Iterable[SettingChange], checkpoint: str, step: int, names: Mapping[str, str]) -> ConfigError:
    """The one-line error naming each refused change and the ways on."""
    refused = [c for c in distinct(changes, names) if c.outcome == "refused"]
    back = ", ".join(f"{c.name(names)} {show(c.old)}" for c in refused)
    ways = f"rerun with {back}"
    if any(c.rule.policy is Policy.OPTIMIZER for c in refused):
        option = names.get("RunConfig.on_changed_optimizer", "RunConfig.on_changed_optimizer")
        ways += (
            f", or set {option} to 'apply' (train on with the new value from step {step}) or 'keep' "
            "(with the checkpoint's)"
        )
    if any(c.rule.policy is Policy.REFUSE for c in refused):
        model_dir = names.get("RunConfig.model_dir", "model_dir")
        ways += f", or start a new {model_dir}" + (
            " from these weights (warm_start_from)" if model_dir == "model_dir" else ""
        )
    reasons = "; ".join(c.refused(checkpoint, names) for c in refused)
    return ConfigError(f"resuming from {checkpoint} (step {step}) with changed settings: {reasons}. To go on: {ways}")


__all__ = [
    "ABSENT",
    "NOT_DATA",
    "ON_CHANGED_OPTIMIZER",
    "RULES",
    "Policy",
    "Rule",
    "SettingChange",
    "call_settings",
    "compare",
    "distinct",
    "show",
    "optimizer_settings",
    "params_settings",
    "plain",
    "refusal",
    "rule_of",
    "schedule_settings",
]
