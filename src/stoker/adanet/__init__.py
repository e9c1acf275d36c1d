"""``stoker.adanet``: AdaNet adaptive structural learning (Cortes et al., ICML 2017) on stoker.

Each iteration ``t`` proposes candidate subnetworks (a ``Generator`` of ``Builder``s),
trains all of them *and* every candidate ensemble they form (``Strategy`` x ``Ensembler``)
in the same steps on the same batches, and keeps the candidate ensemble with the best
AdaNet objective ``head loss + sum_j (lambda r(h_j) + beta) ||w_j||_1``; its subnetworks are
frozen and the next iteration grows from it.

Design: an outer loop over plain Estimators, one per iteration
--------------------------------------------------------------
Each iteration is one ordinary ``stoker.Estimator`` in ``model_dir/iteration-<t>/`` whose
model is an ``IterationModel``: one ``nn.Module`` holding the frozen previous ensemble, the
iteration's new subnetworks, every candidate's mixture weights, and the selection state
(moving averages, iteration number) as buffers. Its ``model_fn`` computes every loss of
the iteration in one step and one backward pass; a composite optimizer steps each
subnetwork's own optimizer and each ensembler's optimizer.

Why not a single Estimator for the whole search? An Estimator builds its model once and
keeps it; AdaNet's model changes shape at every iteration, so a single Estimator would
need the TF original's trick of overwriting the latest checkpoint with a grown graph (and
an engine that tolerates a model swap). With one Estimator per iteration:

- resume *mid-iteration* is exactly the engine's own bitwise resume of ``iteration-<t>/``
  (weights, optimizers, RNGs, input position, moving averages);
- resume *between iterations* needs no special state: ``architecture-<t>.json`` is written
  last, atomically, after the chosen ensemble's weights (``final/ckpt-<step>``) and reports;
  an iteration without it is resumed or its (deterministic) bookkeeping redone;
- the structure of every ensemble is rebuilt from ``architecture-*.json`` by replaying the
  (deterministic) generator and strategies, as in the original; weights come from
  ``final/ckpt-<step>``, an ordinary stoker checkpoint of the final ensemble;
- no engine change is needed. The costs: one directory of checkpoints per iteration, and
  the data pipeline restarts at every iteration (as the original's ``input_fn`` did).

Layout of ``model_dir``::

    architecture-<t>.json     the ensemble chosen at t (the original's JSON; commit point)
    example_features.pt       the example batch (2 rows) every build uses, for shapes
    iteration-<t>/            iteration t's Estimator: ckpt-<step>/, checkpoint.json, selection.json
    final/ckpt-<step>/        the ensemble chosen when the iteration ending at <step> ended
    report/iteration-<t>.json materialised reports (with a ReportMaterializer)

AdaNet sits above the engine, beside the harness: it may import the Estimator and the layers
below it, never the harness, the recipes or the ``stoker`` command.
"""

from . import replay
from .architecture import Architecture
from .autoensemble import AutoEnsembleEstimator, AutoEnsembleSubestimator
from .ensemble import (
    Combiner,
    ComplexityRegularizedEnsembler,
    Ensemble,
    Ensembler,
    MeanEnsembler,
    Member,
    MixtureWeightType,
    WeightedSubnetwork,
    subnetwork_key,
)
from .estimator import Estimator
from .evaluator import Evaluator, Objective, ReportMaterializer, select_best
from .heads import BinaryClassHead, Head, MetricFn, MultiClassHead, RegressionHead
from .iteration import CandidateOptimizers, EnsembleModel, IterationModel, bias_corrected_ema
from .strategy import AllStrategy, Candidate, GrowStrategy, SoloStrategy, Strategy
from .subnetwork import Builder, Generator, MaterializedReport, Report, SimpleGenerator, Subnetwork

__all__ = [
    "AllStrategy",
    "Architecture",
    "AutoEnsembleEstimator",
    "AutoEnsembleSubestimator",
    "BinaryClassHead",
    "Builder",
    "Candidate",
    "CandidateOptimizers",
    "Combiner",
    "ComplexityRegularizedEnsembler",
    "Ensemble",
    "EnsembleModel",
    "Ensembler",
    "Estimator",
    "Evaluator",
    "Generator",
    "GrowStrategy",
    "Head",
    "IterationModel",
    "MaterializedReport",
    "MeanEnsembler",
    "Member",
    "MixtureWeightType",
    "MetricFn",
    "MultiClassHead",
    "Objective",
    "RegressionHead",
    "Report",
    "ReportMaterializer",
    "SimpleGenerator",
    "SoloStrategy",
    "Strategy",
    "Subnetwork",
    "WeightedSubnetwork",
    "bias_corrected_ema",
    "replay",
    "select_best",
    "subnetwork_key",
]
