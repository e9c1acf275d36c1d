"""AdaNet building blocks with exact expected values: ensemblers, regulariser, moving
average, selection, naming, the architecture file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import stoker
from helpers.adanet import CLASSES, IN, MLPBuilder
from stoker import adanet
from stoker.adanet.ensemble import BatchedWeightedSum, Member
from stoker.adanet.search import SearchSpace


def member(key: str, logits: torch.Tensor, last_layer: torch.Tensor | None = None, complexity: float = 0.0) -> Member:
    sub = adanet.Subnetwork(
        last_layer=logits if last_layer is None else last_layer, logits=logits, complexity=complexity
    )
    return Member(key, key, 0, sub)


# ---------------------------------------------------------------- ensemblers
def test_regulariser_and_adanet_loss_exact():
    torch.manual_seed(0)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    labels = torch.tensor([0, 2, 1, 2])
    ens = adanet.ComplexityRegularizedEnsembler(adanet_lambda=0.5, adanet_beta=0.1)
    combiner = ens.build_ensemble([member("a", a, complexity=1.0), member("b", b, complexity=4.0)], 3, None)
    with torch.no_grad():
        combiner.mixture_weights[0].fill_(-0.3)
        combiner.mixture_weights[1].fill_(2.0)
    outs = [
        adanet.Subnetwork(last_layer=a, logits=a, complexity=1.0),
        adanet.Subnetwork(last_layer=b, logits=b, complexity=4.0),
    ]
    logits, reg = combiner(outs)
    # (lambda * r + beta) * |w|: (0.5 * 1 + 0.1) * 0.3 + (0.5 * 4 + 0.1) * 2.0 = 0.18 + 4.2
    assert reg.item() == pytest.approx(4.38, abs=1e-6)
    assert torch.allclose(logits, -0.3 * a + 2.0 * b)
    head = adanet.MultiClassHead(3)
    adanet_loss = head.loss(logits, labels) + reg
    assert adanet_loss.item() == pytest.approx(F.cross_entropy(-0.3 * a + 2.0 * b, labels).item() + 4.38, abs=1e-6)


def test_regulariser_vector_and_matrix_use_entrywise_l1():
    a = torch.randn(2, 3)
    vec = adanet.ComplexityRegularizedEnsembler(mixture_weight_type="vector", adanet_lambda=1.0, adanet_beta=0.5)
    c = vec.build_ensemble([member("a", a, complexity=2.0)], 3, None)
    with torch.no_grad():
        c.mixture_weights[0].copy_(torch.tensor([1.0, -2.0, 0.5]))
    _, reg = c([adanet.Subnetwork(last_layer=a, logits=a, complexity=2.0)])
    assert reg.item() == pytest.approx((1.0 * 2.0 + 0.5) * 3.5)
    mat = adanet.ComplexityRegularizedEnsembler(mixture_weight_type="matrix", adanet_beta=1.0)
    h = torch.randn(2, 4)
    c = mat.build_ensemble([member("a", a, last_layer=h)], 3, None)
    with torch.no_grad():
        c.mixture_weights[0].copy_(torch.arange(12.0).reshape(4, 3) - 6.0)
    _, reg = c([adanet.Subnetwork(last_layer=h, logits=a)])
    assert reg.item() == pytest.approx(float((torch.arange(12.0) - 6.0).abs().sum()))


def test_no_regulariser_when_lambda_and_beta_are_zero():
    a = torch.randn(2, 3)
    c = adanet.ComplexityRegularizedEnsembler().build_ensemble([member("a", a, complexity=9.0)], 3, None)
    assert c([adanet.Subnetwork(last_layer=a, logits=a, complexity=9.0)])[1] is None


def test_default_initialisers():
    a, h = torch.randn(2, 3), torch.randn(2, 5)
    members = [member(k, a, h) for k in ("a", "b", "c")]
    scalar = adanet.ComplexityRegularizedEnsembler().build_ensemble(members, 3, None)
    assert [w.shape for w in scalar.mixture_weights] == [torch.Size([])] * 3
    assert all(w.item() == pytest.approx(1 / 3) for w in scalar.mixture_weights)
    vector = adanet.ComplexityRegularizedEnsembler(mixture_weight_type=adanet.MixtureWeightType.VECTOR).build_ensemble(
        members, 3, None
    )
    assert all(torch.equal(w, torch.full((3,), 1 / 3)) for w in vector.mixture_weights)
    matrix = adanet.ComplexityRegularizedEnsembler(mixture_weight_type="matrix", use_bias=True).build_ensemble(
        members, 3, None
    )
    assert all(torch.equal(w, torch.zeros(5, 3)) for w in matrix.mixture_weights)
    assert torch.equal(matrix.bias, torch.zeros(3))
    const = adanet.ComplexityRegularizedEnsembler(mixture_weight_initializer=0.25).build_ensemble(members, 3, None)
    assert all(w.item() == 0.25 for w in const.mixture_weights)
    custom = adanet.ComplexityRegularizedEnsembler(
        mixture_weight_type="vector", mixture_weight_initializer=lambda t: t.copy_(torch.tensor([1.0, 2.0, 3.0]))
    ).build_ensemble(members[:1], 3, None)
    assert torch.equal(custom.mixture_weights[0], torch.tensor([1.0, 2.0, 3.0]))
    # no optimizer: the weights are not trained (the original's default)
    assert not scalar.mixture_weights[0].requires_grad
    trained = adanet.ComplexityRegularizedEnsembler(lambda ps: torch.optim.SGD(ps, lr=0.1)).build_ensemble(
        members, 3, None
    )
    assert trained.mixture_weights[0].requires_grad


def test_warm_start_mixture_weights_from_the_previous_ensemble():
    a = torch.randn(2, 3)
    ens = adanet.ComplexityRegularizedEnsembler(warm_start_mixture_weights=True, use_bias=True)
    prev_combiner = ens.build_ensemble([member("t0_a", a)], 3, None)
    with torch.no_grad():
        prev_combiner.mixture_weights[0].fill_(0.7)
        prev_combiner.bias.copy_(torch.tensor([1.0, 2.0, 3.0]))
    prev = adanet.Ensemble(
        "t0_a_grow",
        "a_grow",
        ens.name,
        0,
        [adanet.WeightedSubnetwork("a", 0, member("t0_a", a).example, nn.Identity(), prev_combiner.mixture_weights[0])],
        prev_combiner,
    )
    grown = ens.build_ensemble([member("t0_a", a), member("t1_b", a)], 3, prev)
    assert grown.mixture_weights[0].item() == pytest.approx(0.7)  # warm-started
    assert grown.mixture_weights[1].item() == pytest.approx(0.5)  # new member: 1/N
    assert torch.equal(grown.bias, torch.tensor([1.0, 2.0, 3.0]))
    cold = adanet.ComplexityRegularizedEnsembler(use_bias=True).build_ensemble(
        [member("t0_a", a), member("t1_b", a)], 3, prev
    )
    assert cold.mixture_weights[0].item() == pytest.approx(0.5) and torch.equal(cold.bias, torch.zeros(3))


def test_matrix_mixture_weights_use_the_last_layer_not_the_logits():
    h = torch.randn(4, 5)
    logits = torch.full((4, 3), 1e6)  # would dominate if used
    c = adanet.ComplexityRegularizedEnsembler(mixture_weight_type="matrix", use_bias=True).build_ensemble(
        [member("a", logits, h)], 3, None
    )
    w = torch.randn(5, 3)
    with torch.no_grad():
        c.mixture_weights[0].copy_(w)
        c.bias.copy_(torch.tensor([0.5, -0.5, 0.0]))
    out, _ = c([adanet.Subnetwork(last_layer=h, logits=logits)])
    assert torch.allclose(out, h @ w + torch.tensor([0.5, -0.5, 0.0]))


def test_mean_ensembler_is_the_mean_of_logits():
    xs = [torch.randn(4, 3) for _ in range(3)]
    c = adanet.MeanEnsembler().build_ensemble([member(str(i), x) for i, x in enumerate(xs)], 3, None)
    out, reg = c([adanet.Subnetwork(last_layer=x, logits=x) for x in xs])
    assert torch.allclose(out, (xs[0] + xs[1] + xs[2]) / 3) and reg is None
    assert list(c.parameters()) == []


@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_batched_weighted_sums_equal_the_per_candidate_ones(kind):
    torch.manual_seed(1)
    outs = {
        k: adanet.Subnetwork(last_layer=torch.randn(4, 3), logits=torch.randn(4, 3), complexity=c)
        for k, c in (("p", 1.0), ("a", 2.0), ("b", 3.0))
    }
    ens = adanet.ComplexityRegularizedEnsembler(
        lambda ps: torch.optim.SGD(ps, lr=1.0),
        mixture_weight_type=kind,
        adanet_lambda=0.3,
        adanet_beta=0.2,
        use_bias=True,
    )
    combiners = [
        ens.build_ensemble([member(k, outs[k].logits) for k in keys], 3, None)
        for keys in (["p", "a"], ["p", "b"], ["b"])
    ]
    with torch.no_grad():
        for c in combiners:
            for w in c.mixture_weights:
                w.copy_(torch.randn(w.shape))
            c.bias.copy_(torch.randn(3))
    batched = BatchedWeightedSum(combiners)
    assert batched.keys == ["p", "a", "b"]
    logits, reg = batched([outs[k] for k in batched.keys])
    for i, c in enumerate(combiners):
        ref_logits, ref_reg = c([outs[k] for k in c.members])
        assert torch.allclose(logits[i], ref_logits, atol=1e-6)
        assert reg[i].item() == pytest.approx(ref_reg.item(), rel=1e-6)
    # A candidate reads only its own members: a NaN member poisons only the candidates with it.
    outs["b"].logits[0, 0] = float("nan")
    logits, reg = batched([outs[k] for k in batched.keys])
    assert torch.isfinite(logits[0]).all() and not torch.isfinite(logits[1]).all()
    with torch.no_grad():
        batched.weights.add_(1.0)
    batched.unpack()
    assert combiners[1].mixture_weights[1].sum().item() == pytest.approx(batched.weights[1, 1].sum().item())


# ---------------------------------------------------------------- strategies and naming
class Named(adanet.Builder):
    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def build_subnetwork(self, features, logits_dimension, training, iteration_step, previous_ensemble):  # noqa: ANN001, ANN201
        return nn.Linear(IN, logits_dimension)

    def build_subnetwork_optimizer(self, parameters):  # noqa: ANN001, ANN201
        return torch.optim.SGD(parameters, lr=0.1)


def test_strategy_candidate_names():
    a, b, p = Named("a"), Named("b"), Named("p")
    grow = adanet.GrowStrategy().generate_ensemble_candidates([a, b], [p])
    assert [
        (c.name, [x.name for x in c.subnetwork_builders], [x.name for x in c.previous_ensemble_subnetwork_builders])
        for c in grow
    ] == [("a_grow", ["a"], ["p"]), ("b_grow", ["b"], ["p"])]
    (everything,) = adanet.AllStrategy().generate_ensemble_candidates([a, b], [p])
    assert everything.name == "all" and len(everything.subnetwork_builders) == 2
    solo = adanet.SoloStrategy().generate_ensemble_candidates([a, b], [p])
    assert [c.name for c in solo] == ["a_solo", "b_solo"] and all(
        not c.previous_ensemble_subnetwork_builders for c in solo
    )


def space(
    tmp_path: Path, builders: list[adanet.Builder], ensemblers: list[adanet.Ensembler] | None = None, strategies=None
) -> SearchSpace:  # noqa: ANN001
    return SearchSpace(
        head=adanet.MultiClassHead(CLASSES),
        generator=adanet.SimpleGenerator(builders),
        strategies=strategies or [adanet.GrowStrategy(), adanet.AllStrategy(), adanet.SoloStrategy()],
        ensemblers=ensemblers or [adanet.ComplexityRegularizedEnsembler()],
        seed=0,
        model_dir=tmp_path,
        report_dir=None,
    )


def test_iteration_candidate_order_and_display_names(tmp_path):
    m = space(tmp_path, [Named("a"), Named("b")]).build_iteration(
        0, torch.randn(2, IN), torch.device("cpu"), adanet_loss_decay=0.9, replicate_ensemble_in_training=False
    )
    assert [c.name for c in m.candidates] == ["t0_a_grow", "t0_b_grow", "t0_all", "t0_a_solo", "t0_b_solo"]
    two = [adanet.ComplexityRegularizedEnsembler(), adanet.MeanEnsembler()]
    m = space(tmp_path, [Named("a")], two, [adanet.GrowStrategy()]).build_iteration(
        0, torch.randn(2, IN), torch.device("cpu"), adanet_loss_decay=0.9, replicate_ensemble_in_training=False
    )
    assert [c.name for c in m.candidates] == ["t0_a_grow_complexity_regularized", "t0_a_grow_mean"]


def test_builder_names_must_be_unique_and_plain(tmp_path):
    with pytest.raises(ValueError, match="two builders of iteration 0 are named 'a'"):
        space(tmp_path, [Named("a"), Named("a")]).generate(None, 0)
    with pytest.raises(ValueError, match="may not contain"):
        space(tmp_path, [Named("a.b")]).generate(None, 0)


# ---------------------------------------------------------------- moving average and selection
def test_bias_corrected_moving_average_arithmetic():
    biased = torch.zeros((), dtype=torch.float64)
    for v in (1.0, 2.0, 4.0):
        biased = 0.9 * biased + 0.1 * v
    # biased = 0.1*0.81*1 + 0.1*0.9*2 + 0.1*4 = 0.661; corrected = 0.661 / (1 - 0.9**3) = 0.661 / 0.271
    assert adanet.bias_corrected_ema(biased, 3, 0.9).item() == pytest.approx(0.661 / 0.271, rel=1e-12)
    assert adanet.bias_corrected_ema(torch.tensor(0.1, dtype=torch.float64), 1, 0.9).item() == pytest.approx(1.0)
    assert math.isnan(adanet.bias_corrected_ema(torch.zeros(()), 0, 0.9).item())


def test_iteration_model_tracks_each_candidates_adanet_loss(tmp_path):
    torch.manual_seed(0)
    ens = adanet.ComplexityRegularizedEnsembler(
        lambda ps: torch.optim.SGD(ps, lr=0.0), adanet_lambda=0.2, adanet_beta=0.05
    )
    builders = [MLPBuilder(1, lr=0.0, optimizer="sgd"), MLPBuilder(2, lr=0.0, optimizer="sgd")]
    m = space(tmp_path, builders, [ens], [adanet.GrowStrategy(), adanet.AllStrategy()]).build_iteration(
        0, torch.randn(2, IN), torch.device("cpu"), adanet_loss_decay=0.9, replicate_ensemble_in_training=False
    )
    m.eval()  # no dropout: the per-batch losses below are exactly what training sees
    opt = m.make_optimizer()
    batches = [(torch.randn(5, IN), torch.randint(0, CLASSES, (5,))) for _ in range(3)]
    per_batch = []
    for x, y in batches:
        with torch.no_grad():
            spec = m._eval_step(x, y)
        per_batch.append([float(spec.eval_metrics[f"{c.name}/adanet_loss"].mean()) for c in m.candidates])
        m(x, y, stoker.ModeKeys.TRAIN).loss.backward()  # lr 0: the weights do not move
        opt.step()
        opt.zero_grad()
    biased = [0.0] * len(m.candidates)
    for losses in per_batch:
        biased = [0.9 * b + 0.1 * v for b, v in zip(biased, losses, strict=True)]
    expected = [b / (1 - 0.9**3) for b in biased]
    assert m.moving_average_losses() == pytest.approx(expected, rel=1e-5)
    # and adanet_loss = head loss + regulariser for the "all" candidate (both members, 1/2 each)
    x, y = batches[0]
    outs = [m.subnetworks[k](x) for k in ("t0_mlp1", "t0_mlp2")]
    logits = 0.5 * outs[0].logits + 0.5 * outs[1].logits
    reg = (0.2 * 1.0 + 0.05) * 0.5 + (0.2 * math.sqrt(2) + 0.05) * 0.5
    assert per_batch[0][2] == pytest.approx(F.cross_entropy(logits, y).item() + reg, rel=1e-5)


def test_select_best_nan_never_wins():
    assert adanet.select_best([float("nan"), 2.0, 1.0]) == 2
    assert adanet.select_best([3.0, float("nan"), 1.0], "maximize") == 0
    assert adanet.select_best([1.0, 1.0]) == 0  # ties: the lower index
    assert adanet.select_best([0.5, 2.0, 1.0], start=1) == 2  # force_grow skips candidate 0
    with pytest.raises(ValueError, match="NaN"):
        adanet.select_best([float("nan"), float("nan")])


# ---------------------------------------------------------------- architecture file and heads
def test_architecture_json_string():
    arch = adanet.Architecture(
        ensemble_candidate_name="linear_grow",
        ensembler_name="complexity_regularized",
        iteration_number=1,
        global_step=200,
        subnetworks=[(0, "linear"), (1, "1_layer_dnn")],
        replay_indices=[0, 1],
    )
    expected = (
        '{"ensemble_candidate_name": "linear_grow", "ensembler_name": "complexity_regularized", "global_step": 200, '
        '"iteration_number": 1, "replay_indices": [0, 1], '
        '"subnetworks": [{"builder_name": "linear", "iteration_number": 0}, '
        '{"builder_name": "1_layer_dnn", "iteration_number": 1}]}'
    )
    assert arch.serialize() == expected
    assert adanet.Architecture.deserialize(expected) == arch


def test_heads_losses_and_predictions():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    labels = torch.tensor([0, 2])
    mc = adanet.MultiClassHead(3)
    assert torch.allclose(mc.loss(logits, labels, "none"), F.cross_entropy(logits, labels, reduction="none"))
    assert torch.equal(mc.predictions(logits)["class_ids"], torch.tensor([0, 1]))
    binary = adanet.BinaryClassHead()
    z = torch.tensor([[0.5], [-2.0]])
    assert binary.loss(z, torch.tensor([1, 0])).item() == pytest.approx(
        F.binary_cross_entropy_with_logits(z, torch.tensor([[1.0], [0.0]])).item()
    )
    assert torch.equal(binary.predictions(z)["class_ids"], torch.tensor([1, 0]))
    reg = adanet.RegressionHead()
    assert reg.loss(torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])).item() == pytest.approx((1 + 4) / 2)
    with pytest.raises(ValueError, match="n_classes"):
        adanet.MultiClassHead(1)


def test_candidate_optimizers_step_and_state_round_trip():
    a, b = nn.Linear(2, 1), nn.Linear(2, 1)
    opts = adanet.CandidateOptimizers(
        {"a": torch.optim.SGD(a.parameters(), lr=0.1), "b": torch.optim.Adam(b.parameters(), lr=0.1)}
    )
    assert len(opts.param_groups) == 2 and opts.param_groups[0]["lr"] == 0.1
    (a(torch.ones(1, 2)).sum() + b(torch.ones(1, 2)).sum()).backward()
    opts.step()
    opts.zero_grad(set_to_none=True)
    state = opts.state_dict()
    fresh = adanet.CandidateOptimizers(
        {"a": torch.optim.SGD(a.parameters(), lr=0.1), "b": torch.optim.Adam(b.parameters(), lr=0.1)}
    )
    fresh.load_state_dict(state)
    assert fresh.state_dict()["optimizers"]["b"]["state"][0]["step"] == 1
    with pytest.raises(ValueError, match="not this iteration's"):
        adanet.CandidateOptimizers({"a": torch.optim.SGD(a.parameters(), lr=0.1)}).load_state_dict(state)


@pytest.mark.parametrize("replicate", [False, True])
def test_frozen_subnetworks_train_mode_follows_replicate_ensemble_in_training(tmp_path, replicate):
    s = space(tmp_path, [MLPBuilder(1)], strategies=[adanet.GrowStrategy()])
    x = torch.randn(2, IN)
    prev = s.build_iteration(0, x, torch.device("cpu"), adanet_loss_decay=0.9, replicate_ensemble_in_training=False)
    # pretend iteration 0 chose its only candidate, then build iteration 1 around it
    prev_ens = prev.candidates[0].ensemble
    m = adanet.IterationModel(
        iteration_number=1,
        head=adanet.MultiClassHead(CLASSES),
        frozen={w.key: w.module for w in prev_ens.weighted_subnetworks},
        new={"t1_mlp2": (MLPBuilder(2), MLPBuilder(2).build_subnetwork(x, CLASSES, True, torch.zeros(()), prev_ens))},
        candidates=[prev.candidates[0]],
        adanet_loss_decay=0.9,
        replicate_ensemble_in_training=replicate,
        iteration_step=torch.zeros((), dtype=torch.int64),
    )
    m.train()
    assert m.subnetworks["t1_mlp2"].training
    assert m.subnetworks["t0_mlp1"].training is replicate  # dropout in the frozen member only if replicated
    assert not any(p.requires_grad for p in m.subnetworks["t0_mlp1"].parameters())
