"""Worked AdaNet searches on scikit-learn's bundled data sets (``stoker adanet <recipe>``).

- ``digits``: 8x8 images of digits 0-9 (1797). A linear baseline (a plain Estimator), the
  ``simple_dnn`` generator (each iteration proposes a DNN as deep as the newest subnetwork
  of the ensemble and one a layer deeper, complexity sqrt(depth)), and a tiny-CNN
  generator growing the number of convolutions the same way.
- ``diabetes``: regression (442 patients, 10 features). DNN candidates of depth d and d+1
  with complexity sqrt(depth), trained mixture weights, and a sweep of ``adanet_lambda``:
  a larger lambda shrinks the mixture weights of the deeper subnetworks.
- ``breast_cancer``: binary classification (569 tumours, 30 features). An
  ``AutoEnsembleEstimator`` over a linear model and a DNN.

Each run prints every iteration's candidates with their moving-average ``adanet_loss``, the
chosen architecture and held-out metrics of the final ensemble against each of its
subnetworks alone. Runs live in ``--model_dir``; rerunning resumes (or only reports).
scikit-learn is needed here only (``pip install scikit-learn``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import data as stoker_data
from .. import storage
from ..config import RunConfig
from ..estimator import Estimator as PlainEstimator
from .autoensemble import AutoEnsembleEstimator, AutoEnsembleSubestimator
from .ensemble import ComplexityRegularizedEnsembler, Ensemble
from .estimator import Estimator
from .heads import BinaryClassHead, Head, MultiClassHead, RegressionHead
from .iteration import EnsembleModel
from .subnetwork import Builder, Generator, MaterializedReport, Subnetwork

__all__ = [
    "CNNBuilder",
    "CNNGenerator",
    "DNNBuilder",
    "RecipeConfig",
    "SimpleDNNGenerator",
    "load_split",
    "run_breast_cancer",
    "run_diabetes",
    "run_digits",
]

Split = tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@dataclass(kw_only=True)
class RecipeConfig:
    """Settings shared by the recipes (the CLI flags)."""

    model_dir: str = "runs/adanet"
    max_iterations: int = 3
    max_iteration_steps: int = 200
    batch_size: int = 64
    learning_rate: float = 3e-3
    seed: int = 0
    fresh: bool = False  # delete model_dir first
    verbose: bool = True


# ====================================================================== data
def load_split(name: str, seed: int = 0, test_fraction: float = 0.2) -> Split:
    """A bundled scikit-learn data set, split by a seeded permutation and standardised with
    the training statistics: per feature, but digits' pixels with one mean and scale, and the
    regression target too."""
    try:
        from sklearn import datasets
    except ImportError as e:  # only the recipes need it
        raise SystemExit("the AdaNet recipes need scikit-learn: pip install scikit-learn") from e
    loader = {
        "digits": datasets.load_digits,
        "diabetes": datasets.load_diabetes,
        "breast_cancer": datasets.load_breast_cancer,
    }[name]
    bunch = loader()
    x = bunch.data.astype(np.float32)
    y = bunch.target
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    if name == "digits":  # pixels: one scale for all, so images keep their shapes (CNNs)
        mean, std = x[train].mean(), x[train].std()
    else:
        mean, std = x[train].mean(0), x[train].std(0)
        std[std == 0] = 1.0
    x = (x - mean) / std
    if name == "diabetes":
        y = y.astype(np.float32)
        y = (y - y[train].mean()) / y[train].std()
        labels = torch.from_numpy(y)
    else:
        labels = torch.from_numpy(y.astype(np.int64))
    features = torch.from_numpy(x)
    return (features[train], labels[train]), (features[test], labels[test])


def train_input(x: torch.Tensor, y: torch.Tensor, seed: int) -> Callable[[dict[str, Any]], Any]:
    """Shuffled batches, repeating; each AdaNet iteration gets its own order of examples."""
    return lambda params: stoker_data.arrays(
        x, y, read=stoker_data.ReadOptions(seed=seed + 1000 * params.get("adanet_iteration", 0)).for_replica(params)
    )


def eval_input(x: torch.Tensor, y: torch.Tensor) -> Callable[[dict[str, Any]], Any]:
    return lambda params: stoker_data.arrays(
        x, y, read=stoker_data.ReadOptions(shuffle=False, num_epochs=1).for_replica(params)
    )


# ====================================================================== builders
class _DNN(nn.Module):
    def __init__(self, in_features: int, depth: int, width: int, logits_dimension: int, dropout: float) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = in_features
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.ReLU(), nn.Dropout(dropout)]
            d = width
        self.hidden = nn.Sequential(*layers)
        self.logits = nn.Linear(d, logits_dimension)
        self.depth = depth

    def forward(self, x: torch.Tensor) -> Subnetwork:
        h = self.hidden(x)
        return Subnetwork(
            last_layer=h, logits=self.logits(h), complexity=math.sqrt(self.depth), shared={"num_layers": self.depth}
        )


class DNNBuilder(Builder):
    """A fully connected network of ``depth`` hidden layers (``linear`` for depth 0),
    complexity ``sqrt(depth)``, trained with Adam."""

    def __init__(self, depth: int, width: int = 64, learning_rate: float = 3e-3, dropout: float = 0.0) -> None:
        self.depth, self.width, self.learning_rate, self.dropout = depth, width, learning_rate, dropout

    @property
    def name(self) -> str:
        return "linear" if self.depth == 0 else f"{self.depth}_layer_dnn"

    def build_subnetwork(
        self,
        features: Any,
        logits_dimension: int,
        training: bool,
        iteration_step: torch.Tensor,
        previous_ensemble: Ensemble | None,
    ) -> nn.Module:
        return _DNN(int(features.shape[-1]), self.depth, self.width, logits_dimension, self.dropout)

    def build_subnetwork_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(parameters, lr=self.learning_rate)


def _newest(previous_ensemble: Ensemble | None, key: str, default: int) -> int:
    """``shared[key]`` of the newest subnetwork of the previous ensemble."""
    if previous_ensemble is None or not previous_ensemble.weighted_subnetworks:
        return default
    shared = previous_ensemble.weighted_subnetworks[-1].subnetwork.shared or {}
    return int(shared.get(key, default))


class SimpleDNNGenerator(Generator):
    """AdaNet's ``simple_dnn``: at each iteration a DNN as deep as the newest subnetwork of
    the ensemble, and one a layer deeper (a linear model and a 1-layer DNN first)."""

    def __init__(self, width: int = 64, learning_rate: float = 3e-3, dropout: float = 0.0) -> None:
        self.width, self.learning_rate, self.dropout = width, learning_rate, dropout

    def generate_candidates(
        self,
        previous_ensemble: Ensemble | None,
        iteration_number: int,
        previous_ensemble_reports: Sequence[MaterializedReport],
        all_reports: Sequence[MaterializedReport],
    ) -> Sequence[Builder]:
        depth = _newest(previous_ensemble, "num_layers", 0)
        return [DNNBuilder(d, self.width, self.learning_rate, self.dropout) for d in (depth, depth + 1)]


class _CNN(nn.Module):
    def __init__(self, side: int, num_conv: int, channels: int, hidden: int, logits_dimension: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 1
        for i in range(num_conv):
            layers += [nn.Conv2d(c, channels, 3, padding=1), nn.ReLU()]
            if i == 0:
                layers.append(nn.MaxPool2d(2))  # 8x8 -> 4x4 after the first convolution
            c = channels
        self.side = side
        self.convs = nn.Sequential(*layers)
        self.dense = nn.Sequential(nn.Flatten(), nn.Linear(channels * (side // 2) ** 2, hidden), nn.ReLU())
        self.logits = nn.Linear(hidden, logits_dimension)
        self.num_conv = num_conv

    def forward(self, x: torch.Tensor) -> Subnetwork:
        h = self.dense(self.convs(x.reshape(-1, 1, self.side, self.side)))
        return Subnetwork(
            last_layer=h, logits=self.logits(h), complexity=math.sqrt(self.num_conv), shared={"num_conv": self.num_conv}
        )


class CNNBuilder(Builder):
    """A tiny CNN on square single-channel images given as flat features: ``num_conv``
    3x3 convolutions (max-pooled once), a dense layer, the logits; complexity ``sqrt(num_conv)``."""

    def __init__(self, num_conv: int, channels: int = 16, hidden: int = 64, learning_rate: float = 3e-3) -> None:
        self.num_conv, self.channels, self.hidden, self.learning_rate = num_conv, channels, hidden, learning_rate

    @property
    def name(self) -> str:
        return f"{self.num_conv}_conv_cnn"

    def build_subnetwork(
        self,
        features: Any,
        logits_dimension: int,
        training: bool,
        iteration_step: torch.Tensor,
        previous_ensemble: Ensemble | None,
    ) -> nn.Module:
        side = int(round(math.sqrt(int(features.shape[-1]))))
        return _CNN(side, self.num_conv, self.channels, self.hidden, logits_dimension)

    def build_subnetwork_optimizer(self, parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(parameters, lr=self.learning_rate)


class CNNGenerator(Generator):
    """Like ``simple_dnn`` for CNNs: as many convolutions as the newest subnetwork, and one more."""

    def __init__(self, channels: int = 16, hidden: int = 64, learning_rate: float = 3e-3) -> None:
        self.channels, self.hidden, self.learning_rate = channels, hidden, learning_rate

    def generate_candidates(
        self,
        previous_ensemble: Ensemble | None,
        iteration_number: int,
        previous_ensemble_reports: Sequence[MaterializedReport],
        all_reports: Sequence[MaterializedReport],
    ) -> Sequence[Builder]:
        n = _newest(previous_ensemble, "num_conv", 1)
        return [CNNBuilder(k, self.channels, self.hidden, self.learning_rate) for k in (n, n + 1)]


# ====================================================================== running and reporting
def _run_config(model_dir: storage.Location, cfg: RecipeConfig) -> RunConfig:
    return RunConfig(
        model_dir=str(model_dir),
        seed=cfg.seed,
        iterations_per_loop=50,
        save_checkpoints_steps=cfg.max_iteration_steps,
        keep_checkpoint_max=1,
        log_every_n_steps=10**6,
        progress_bar=False,
        summaries=False,
    )


def _prepare(model_dir: storage.Location, fresh: bool) -> None:
    if fresh:
        storage.remove_tree(model_dir)


def member_metrics(model: EnsembleModel, head: Head, x: torch.Tensor, y: torch.Tensor) -> dict[str, dict[str, float]]:
    """Held-out loss and head metrics of each subnetwork of ``model`` alone (whole set, one batch)."""
    out: dict[str, dict[str, float]] = {}
    model.eval()
    with torch.no_grad():
        for key, logits in model.subnetwork_logits(x).items():
            m = {"loss": float(head.loss(logits, y))}
            for name, update in head.metrics(logits, y).items():
                totals = {k: float(v.sum()) for k, v in update.stats.items()}
                m[name] = float(update.metric.compute(totals))
            out[key] = m
    return out


def _print_search(est: Estimator, title: str, verbose: bool) -> None:
    if not verbose:
        return
    print(f"\n== {title} ({est.model_dir})")
    for t in range(est.iteration_number):
        sel = est.selection(t)
        cands = ", ".join(
            f"{c['name']}={c['adanet_loss_ema']:.4f}" if c["adanet_loss_ema"] is not None else f"{c['name']}=nan"
            for c in sel["candidates"]
        )
        print(f"  iteration {t} (to step {sel['global_step']}): adanet_loss moving averages: {cands}")
        print(f"    -> chose {sel['chosen']} ({sel['selected_by']}): {sel['subnetworks']}")
    print(f"  architecture: {est.architecture().serialize()}")


def _report(
    est: Estimator, head: Head, test: tuple[torch.Tensor, torch.Tensor], metric: str, verbose: bool
) -> dict[str, Any]:
    """Held-out metrics of the final ensemble and of each of its subnetworks alone."""
    x, y = test
    ensemble = est.evaluate(eval_input(x, y), name="test")
    model = est.final_ensemble()
    members = member_metrics(model, head, x, y)
    sign = -1.0 if metric == "accuracy" else 1.0  # accuracy: higher is better; ties go to the lower loss
    best_key = min(members, key=lambda k: (sign * members[k][metric], members[k]["loss"]))
    weights = {w.key: _l1(w.weight) for w in model.weighted_subnetworks}
    if verbose:
        print(f"  held-out ensemble: {metric} {ensemble[metric]:.4f}, loss {ensemble['loss']:.4f}")
        for key, m in members.items():
            print(
                f"  held-out {key} alone: {metric} {m[metric]:.4f}, loss {m['loss']:.4f} (|mixture weight|_1 "
                f"{weights[key]:.3f})"
            )
        print(
            f"  best single subnetwork: {best_key} ({metric} {members[best_key][metric]:.4f}); ensemble "
            f"{ensemble[metric]:.4f}"
        )
    return {
        "architecture": est.architecture().serialize(),
        "ensemble": {k: v for k, v in ensemble.items() if k != "global_step"},
        "members": members,
        "best_member": best_key,
        "mixture_weight_l1": weights,
    }


def _l1(weight: torch.Tensor | None) -> float:
    return float(weight.detach().abs().sum()) if weight is not None else float("nan")


def _adam_ensembler(lr: float, **kw: Any) -> ComplexityRegularizedEnsembler:
    return ComplexityRegularizedEnsembler(lambda ps: torch.optim.Adam(ps, lr=lr), **kw)


def run_digits(cfg: RecipeConfig, which: Sequence[str] = ("linear", "dnn", "cnn")) -> dict[str, Any]:
    """Linear baseline, simple_dnn AdaNet and tiny-CNN AdaNet on digits; held-out accuracy."""
    (x, y), test = load_split("digits", seed=cfg.seed)
    head = MultiClassHead(10)
    root = storage.location(cfg.model_dir)  # a local path or an fsspec URL
    _prepare(root, cfg.fresh)
    results: dict[str, Any] = {}
    total_steps = cfg.max_iterations * cfg.max_iteration_steps
    if "linear" in which:
        start = time.perf_counter()
        base = PlainEstimator(
            model=lambda p: nn.Linear(64, 10),
            model_fn=head.model_fn,
            optimizer=lambda p, ps: torch.optim.Adam(ps, lr=cfg.learning_rate),
            config=_run_config(root / "linear", cfg).replace(save_checkpoints_steps=total_steps),
            train_batch_size=cfg.batch_size,
        )
        base.train(train_input(x, y, cfg.seed), max_steps=total_steps)
        r = base.evaluate(eval_input(*test), name="test")
        results["linear"] = {
            "ensemble": {k: v for k, v in r.items() if k != "global_step"},
            "seconds": time.perf_counter() - start,
        }
        if cfg.verbose:
            print(
                f"\n== linear baseline ({root / 'linear'}): held-out accuracy {r['accuracy']:.4f}, loss "
                f"{r['loss']:.4f} ({total_steps} steps)"
            )
    generators: dict[str, Generator] = {
        # Small subnetworks: AdaNet grows capacity by ensembling them (wide ones would each
        # fit digits alone, and the ensemble would add little).
        "dnn": SimpleDNNGenerator(width=32, learning_rate=cfg.learning_rate),
        "cnn": CNNGenerator(channels=8, hidden=64, learning_rate=cfg.learning_rate),
    }
    for name in ("dnn", "cnn"):
        if name not in which:
            continue
        start = time.perf_counter()
        est = Estimator(
            head,
            generators[name],
            cfg.max_iteration_steps,
            max_iterations=cfg.max_iterations,
            ensemblers=[_adam_ensembler(cfg.learning_rate)],
            config=_run_config(root / name, cfg),
            train_batch_size=cfg.batch_size,
        )
        est.train(train_input(x, y, cfg.seed))
        _print_search(est, f"{name} AdaNet on digits", cfg.verbose)
        results[name] = _report(est, head, test, "accuracy", cfg.verbose)
        results[name]["seconds"] = time.perf_counter() - start
    return results


def run_diabetes(cfg: RecipeConfig, lambdas: Sequence[float] = (0.0, 0.01, 0.1, 1.0)) -> dict[str, Any]:
    """simple_dnn AdaNet on diabetes (standardised target) for each ``adanet_lambda``."""
    (x, y), test = load_split("diabetes", seed=cfg.seed)
    head = RegressionHead()
    root = storage.location(cfg.model_dir)  # a local path or an fsspec URL
    _prepare(root, cfg.fresh)
    results: dict[str, Any] = {}
    for lam in lambdas:
        est = Estimator(
            head,
            SimpleDNNGenerator(width=32, learning_rate=cfg.learning_rate),
            cfg.max_iteration_steps,
            max_iterations=cfg.max_iterations,
            ensemblers=[
                ComplexityRegularizedEnsembler(
                    lambda ps: torch.optim.SGD(ps, lr=0.05), adanet_lambda=lam, use_bias=True
                )
            ],
            config=_run_config(root / f"lambda-{lam:g}", cfg),
            train_batch_size=cfg.batch_size,
        )
        est.train(train_input(x, y, cfg.seed))
        _print_search(est, f"diabetes, adanet_lambda={lam:g}", cfg.verbose)
        results[f"{lam:g}"] = _report(est, head, test, "mse", cfg.verbose)
    if cfg.verbose:
        print(
            "\n== lambda sweep: held-out MSE (standardised target) and the L1 norm of each subnetwork's mixture weight"
        )
        for lam, r in results.items():
            norms = ", ".join(f"{k} {v:.3f}" for k, v in r["mixture_weight_l1"].items())
            print(f"  lambda={lam}: MSE {r['ensemble']['mse']:.4f}; {norms}")
    return results


def run_breast_cancer(cfg: RecipeConfig) -> dict[str, Any]:
    """AutoEnsemble of a logistic regression and a DNN on breast_cancer."""
    (x, y), test = load_split("breast_cancer", seed=cfg.seed)
    head = BinaryClassHead()
    root = storage.location(cfg.model_dir)  # a local path or an fsspec URL
    _prepare(root, cfg.fresh)
    lr = cfg.learning_rate

    def dnn() -> nn.Module:
        return nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    est = AutoEnsembleEstimator(
        head,
        {
            "linear": AutoEnsembleSubestimator(
                model=lambda: nn.Linear(30, 1), optimizer=lambda ps: torch.optim.Adam(ps, lr=lr)
            ),
            "dnn": AutoEnsembleSubestimator(model=dnn, optimizer=lambda ps: torch.optim.Adam(ps, lr=lr)),
        },
        cfg.max_iteration_steps,
        max_iterations=cfg.max_iterations,
        ensemblers=[_adam_ensembler(lr, adanet_beta=1e-3)],
        config=_run_config(root, cfg),
        train_batch_size=cfg.batch_size,
    )
    est.train(train_input(x, y, cfg.seed))
    _print_search(est, "AutoEnsemble (linear + DNN) on breast_cancer", cfg.verbose)
    return {"autoensemble": _report(est, head, test, "accuracy", cfg.verbose)}
