"""Seeing a run: ``stoker inspect MODEL_DIR`` (what is in it) and ``stoker plot MODEL_DIR`` (curves).

Both read only files: ``checkpoint.json`` (checkpoints, their step, time, size and
evaluation results, the best one), ``metrics.csv`` (every logged value) and ``run_spec.json``
(how the run was made, when a recipe wrote one). Neither imports the model or loads weights,
so they work on a run in progress and on a copy of a model_dir without its code.

:func:`inspect_run` and :func:`plot_run` return dicts; printing is :func:`format_inspection`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import storage
from ..checkpoint.index import INDEX_NAME, CheckpointIndex, Coverage
from ..checkpoint.manager import CheckpointManager
from ..errors import StokerError
from ..run_spec import RUN_SPEC_FILE  # a light module: no torch.export, no recipe
from .writer import CSV_NAME, read_metrics_csv

THROUGHPUT_TAGS = ("examples_per_sec", "steps_per_sec")
_NOT_METRICS = {"learning_rate", "input_wait_fraction", *THROUGHPUT_TAGS}


class InspectError(StokerError):
    """The directory is not a stoker model_dir, or holds nothing to show."""


# ==================================================================== inspect
def inspect_run(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``model_dir`` holds: checkpoints (step, time, bytes, eval metrics, latest / best),
    the newest value of every tag in ``metrics.csv``, and the run spec if there is one."""
    root = storage.location(model_dir)  # a local directory or an fsspec URL
    if not storage.is_dir(root):
        raise InspectError(f"{root} is not a directory")
    has_index, has_csv = storage.exists(root / INDEX_NAME), storage.exists(root / CSV_NAME)
    spec_path = root / RUN_SPEC_FILE
    has_spec = storage.exists(spec_path)
    if not (has_index or has_csv or has_spec):
        raise InspectError(f"{root} is not a stoker model_dir: it has no {INDEX_NAME}, {CSV_NAME} or {RUN_SPEC_FILE}")
    index = CheckpointManager(root, writer=False).index() if has_index else CheckpointIndex()
    best = index.best
    checkpoints = [
        {
            "name": rec.name,
            "step": rec.step,
            "time": rec.time,
            "bytes": rec.bytes,
            "metrics": dict(rec.metrics),
            "latest": rec.name == index.latest,
            "best": best is not None and rec.name == best.name,
            "superseded": rec.superseded,
            "present": storage.is_dir(root / rec.directory),  # on an object store: its unique prefix
        }
        for rec in index.checkpoints
    ]
    rows = read_metrics_csv(root) if has_csv else []
    latest_values: dict[str, dict[str, float]] = {}
    for row in rows:  # the CSV is in write order, so the last row of a tag is its newest value
        latest_values[row["tag"]] = {"step": row["step"], "value": row["value"], "wall_time": row["wall_time"]}
    spec = None
    if has_spec:
        try:
            spec = json.loads(storage.read_bytes(spec_path))
        except (OSError, StokerError, json.JSONDecodeError) as e:
            spec = {"error": f"unreadable: {e}"}
    return {
        "model_dir": str(root),
        "run_spec": spec,
        "checkpoints": checkpoints,
        "latest": index.latest,
        "best": None if best is None else best.to_json(),
        "coverage": None if index.coverage is None else index.coverage.to_json(),  # what watching evaluators did
        "metrics": latest_values,
        "metric_rows": len(rows),
        "first_logged": min((r["wall_time"] for r in rows), default=None),
        "last_logged": max((r["wall_time"] for r in rows), default=None),
    }


def format_inspection(info: Mapping[str, Any]) -> str:
    """A human-readable page of :func:`inspect_run`'s result."""
    lines = [f"model_dir  {info['model_dir']}"]
    spec = info.get("run_spec")
    if spec:
        params = spec.get("params") or {}
        what = (
            spec.get("kind", "?")
            + (f" {spec['model']}" if "model" in spec else "")
            + (f" ({spec['dataset']})" if "dataset" in spec else "")
        )
        lines.append(
            f"run spec   {what}; written {spec.get('written', '?')} by stoker {spec.get('stoker_version', '?')}"
        )
        if params:
            lines.append("           " + ", ".join(f"{k}={v}" for k, v in params.items()))
    else:
        lines.append(f"run spec   none ({RUN_SPEC_FILE} absent: made by a script, not a recipe)")
    if info["first_logged"] is not None:
        span = info["last_logged"] - info["first_logged"]
        lines.append(f"logged     {_when(info['first_logged'])} .. {_when(info['last_logged'])} ({_duration(span)})")
    cks = info["checkpoints"]
    best = info.get("best")
    lines.append("")
    if not cks:
        lines.append("checkpoints: none")
    else:
        best_text = (
            f"; best {best['name']} by {best['metric']} ({best['mode']}) = {best['value']:.6g}"
            if best
            else "; no best (RunConfig.keep_best unset or no evaluation yet)"
        )
        lines.append(f"checkpoints: {len(cks)} retained; latest {info['latest']}{best_text}")
        lines.append(f"  {'name':<14}{'step':>9}  {'written':<19}  {'size':>9}  evaluation")
        for c in cks:
            marks = ("L" if c["latest"] else "") + ("B" if c["best"] else "") + ("" if c["present"] else " missing")
            evals = ", ".join(f"{k}={v:.4g}" for k, v in sorted(c["metrics"].items())) or (
                "superseded" if c.get("superseded") else "-"
            )
            size = _size(c["bytes"]) if c["bytes"] is not None else "?"
            written = _when(c["time"]) if c["time"] else "?"
            lines.append(
                f"  {c['name'] + (' ' + marks if marks else ''):<14}{c['step']:>9}  {written:<19}  {size:>9}  {evals}"
            )
        lines.append("  (L = latest, B = best)")
    if info.get("coverage") is not None:
        lines.append(f"watching evaluator: {Coverage.parse(info['coverage']).line()}")
    lines.append("")
    values = info["metrics"]
    if not values:
        lines.append(f"metrics: none ({CSV_NAME} absent or empty)")
    else:
        lines.append(f"latest metrics ({CSV_NAME}, {info['metric_rows']} rows):")
        width = max(len(t) for t in values)
        for tag in sorted(values, key=lambda t: (t.startswith("eval"), t)):
            v = values[tag]
            lines.append(
                f"  {tag:<{width}}  step {v['step']:>8}  {_number(v['value'])}{_derived(tag, v['value'], spec)}"
            )
    return "\n".join(lines)


def _derived(tag: str, value: float, spec: Mapping[str, Any] | None) -> str:
    """For a language model's training loss, the ppl and bpc it means (nats per character)."""
    if spec and spec.get("kind") == "charlm" and tag == "loss":
        return f"  (ppl {math.exp(min(value, 700.0)):.3f}, bpc {value / math.log(2):.4f})"
    return ""


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _number(v: float) -> str:
    return f"{v:.6g}"


# ==================================================================== plot
def _series(rows: Sequence[Mapping[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """tag -> (steps, values), sorted by step, the newest value kept when a resumed run
    logged a step again."""
    by_tag: dict[str, dict[int, float]] = {}
    for row in rows:  # write order: a later row for the same step replaces the earlier one
        by_tag.setdefault(row["tag"], {})[row["step"]] = row["value"]
    return {tag: (sorted(vals), [vals[s] for s in sorted(vals)]) for tag, vals in by_tag.items()}


def _read_run_spec(root: Path) -> dict[str, Any] | None:
    """``run_spec.json`` of the run, or None (missing or unreadable)."""
    if (root / RUN_SPEC_FILE).exists():
        try:
            return json.loads((root / RUN_SPEC_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return None
    return None


def _plan_panels(series: dict[str, Any], spec: dict[str, Any] | None) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """The plot's panels: (title, y label, [(tag, legend)]), in drawing order."""
    lm = bool(spec and spec.get("kind") == "charlm")
    loss_unit = "loss (nats/char)" if lm else "loss"
    panels: list[tuple[str, str, list[tuple[str, str]]]] = []
    loss_lines = [
        (t, label)
        for t, label in (("loss", "training (mean over the logging interval)"), ("eval/loss", "evaluation"))
        if t in series
    ]
    if loss_lines:
        panels.append(("Loss", loss_unit, loss_lines))
    eval_metrics = sorted(t for t in series if t.startswith("eval") and "/" in t and not t.endswith("/loss"))
    for tag in eval_metrics:
        name = tag.split("/", 1)[1]
        label = {"bpc": "bits per character", "ppl": "perplexity"}.get(name, name)
        panels.append((f"Evaluation: {name} ({tag.split('/')[0]})", label, [(tag, tag)]))
    other = sorted(t for t in series if "/" not in t and t != "loss" and t not in _NOT_METRICS)
    for tag in other:  # host_call values
        panels.append((f"Training: {tag}", tag, [(tag, tag)]))
    if "examples_per_sec" in series:
        seq_len = (spec.get("params") or {}).get("seq_len") if lm and spec else None
        unit = f"segments / second ({seq_len} chars each)" if seq_len else "examples / second"
        panels.append(("Throughput", unit, [("examples_per_sec", "examples/sec (global batch)")]))
    if "learning_rate" in series:
        panels.append(("Learning rate", "learning rate", [("learning_rate", "learning rate")]))
    mixture = sorted(t for t in series if t.startswith("mix/"))  # stoker.data.mix's realised proportions
    if mixture:
        panels.append(("Input mixture", "proportion of batches read", [(t, t.split("/", 1)[1]) for t in mixture]))
    return panels


def plot_run(
    model_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    width_in: float = 11.0,
    panel_height_in: float = 3.4,
    dpi: int = 100,
) -> dict[str, Any]:
    """Draw the run's curves into a PNG: training loss (with evaluation loss), each evaluation
    metric, throughput, the learning rate and a mixture's realised proportions, all against the
    global step.

    Returns ``{"path", "panels" (titles), "size" (pixels: width, height)}``. Uses matplotlib's
    Agg canvas directly (no pyplot, no display, no global backend change).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    root = Path(model_dir)
    if not root.is_dir():
        raise InspectError(f"{root} is not a directory")
    rows = read_metrics_csv(root)
    if not rows:
        raise InspectError(f"{root / CSV_NAME} is missing or empty: nothing to plot (was RunConfig.summaries off?)")
    series = _series(rows)
    spec = _read_run_spec(root)
    panels = _plan_panels(series, spec)
    if not panels:
        raise InspectError(f"{root / CSV_NAME} holds no loss, evaluation or throughput values to plot")

    ncols = 2 if len(panels) > 1 else 1
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(width_in, panel_height_in * nrows), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    title = root.resolve().name + (
        f"  ({spec.get('kind')}{' ' + spec['model'] if 'model' in spec else ''})" if spec else ""
    )
    fig.suptitle(title, fontsize=13)
    # One step range for every panel, so a single evaluation lines up with the loss curve.
    lo = min(min(steps) for steps, _ in series.values())
    hi = max(max(steps) for steps, _ in series.values())
    pad = max((hi - lo) * 0.03, 1)
    for i, (panel_title, ylabel, lines) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for tag, legend in lines:
            steps, values = series[tag]
            marker = "o" if len(steps) < 30 else None
            ax.plot(steps, values, marker=marker, markersize=4, linewidth=1.6, label=legend)
        ax.set_title(panel_title, fontsize=11)
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_xlabel("global step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=9)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=dpi)
    return {
        "path": str(out),
        "panels": [p[0] for p in panels],
        "size": (round(width_in * dpi), round(panel_height_in * nrows * dpi)),
    }


__all__ = ["InspectError", "format_inspection", "inspect_run", "plot_run"]
