"""AdaNet searches end to end on tiny data: selection, persistence, resume, replay, reports,
AutoEnsemble, predict and export."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

import stoker
from helpers.adanet import (
    CLASSES,
    IN,
    GrowingGenerator,
    MLPBuilder,
    eval_input,
    make_data,
    make_search,
    run_config,
    train_input,
)
from stoker import adanet


def final_bytes(model_dir: Path) -> bytes:
    index = json.loads((model_dir / "final" / "checkpoint.json").read_text())
    return (model_dir / "final" / index["latest"] / "model.safetensors").read_bytes()


def architectures(model_dir: Path) -> list[str]:
    return [p.read_text() for p in sorted(model_dir.glob("architecture-*.json"))]


# ---------------------------------------------------------------- the search
def test_search_persists_the_originals_architecture_and_grows(tmp_path):
    x, y = make_data()
    est = make_search(tmp_path, steps=12, iterations=2)
    est.train(train_input(x, y))
    assert est.iteration_number == 2
    a0 = json.loads((tmp_path / "architecture-0.json").read_text())
    assert (
        list(a0)
        == sorted(a0)
        == [
            "ensemble_candidate_name",
            "ensembler_name",
            "global_step",
            "iteration_number",
            "replay_indices",
            "subnetworks",
        ]
    )
    assert a0["global_step"] == 12 and a0["iteration_number"] == 0 and a0["ensembler_name"] == "complexity_regularized"
    a1 = est.architecture()
    assert a1.global_step == 24 and len(a1.replay_indices) == 2
    sel = est.selection(1)
    assert sel["candidates"][0]["name"] == est.selection(0)["chosen"]  # candidate 0 at t > 0: the previous ensemble
    assert sel["chosen"] == sel["candidates"][sel["chosen_index"]]["name"]
    # the checkpoints of each iteration record its number
    ckpt = stoker.checkpoint.load_checkpoint(est.iteration_estimator(1).latest_checkpoint())
    assert int(ckpt.model_state["iteration_number"]) == 1
    assert ckpt.model_state["iteration_step"].item() == 12


def test_previous_ensembles_moving_average_is_carried_over_not_updated(tmp_path):
    x, y = make_data()
    est = make_search(tmp_path, steps=12, iterations=3)
    est.train(train_input(x, y))
    for t in (1, 2):
        previous = est.selection(t - 1)
        carried = previous["candidates"][previous["chosen_index"]]["adanet_loss_ema"]
        assert carried is not None
        assert est.selection(t)["candidates"][0]["adanet_loss_ema"] == carried  # the same float: read, not updated
        state = stoker.checkpoint.load_checkpoint(est.iteration_estimator(t).latest_checkpoint()).model_state
        assert state["previous_adanet_loss"].item() == carried
        assert state["adanet_loss_ema"][0].item() == 0.0  # its training-time slot was never written
        assert (state["adanet_loss_ema"][1:] != 0).all()  # the new candidates' were


def test_each_candidate_and_subnetwork_loss_is_summarised_per_iteration(tmp_path):
    x, y = make_data()
    est = make_search(tmp_path, steps=12, iterations=2, run={"summaries": True, "log_every_n_steps": 4})
    est.train(train_input(x, y))
    for t in (0, 1):
        rows = list(csv.DictReader((tmp_path / f"iteration-{t}" / "metrics.csv").open()))
        tags = {r["tag"] for r in rows}
        names = [c["name"] for c in est.selection(t)["candidates"]]
        trained = names[1:] if t else names  # candidate 0 at t > 0 is read, not trained
        assert {f"adanet_loss/{n}" for n in trained} <= tags, tags
        assert f"subnetwork_loss/t{t}_mlp{t + 1}" in tags
        if t:
            assert f"adanet_loss/{names[0]}" not in tags
        # written at the iteration's last step, as finite means of the steps since the previous row
        last = {r["tag"]: float(r["value"]) for r in rows if int(r["step"]) == 12 * (t + 1)}
        for n in trained:
            assert math.isfinite(last[f"adanet_loss/{n}"])


def test_evaluator_objective_never_increases_across_iterations(tmp_path):
    x, y = make_data()
    evaluator = adanet.Evaluator(eval_input(x, y), metric_name="adanet_loss")  # the training set: AdaNet proper
    est = make_search(tmp_path, steps=12, iterations=4, evaluator=evaluator)
    est.train(train_input(x, y))
    chosen = [est.selection(t)["candidates"][est.selection(t)["chosen_index"]]["value"] for t in range(4)]
    assert all(later <= earlier + 1e-9 for earlier, later in zip(chosen, chosen[1:], strict=False)), chosen
    # candidate 0 at t > 0 is the previous ensemble: the same weights give the same value
    for t in range(1, 4):
        assert est.selection(t)["candidates"][0]["value"] == pytest.approx(chosen[t - 1], rel=1e-9)


def test_evaluator_with_a_head_metric_and_maximize(tmp_path):
    x, y = make_data()
    est = make_search(
        tmp_path,
        steps=8,
        iterations=1,
        evaluator=adanet.Evaluator(eval_input(x, y), metric_name="accuracy", objective="maximize"),
    )
    est.train(train_input(x, y))
    sel = est.selection(0)
    values = [c["value"] for c in sel["candidates"]]
    assert sel["selected_by"].startswith("evaluator accuracy") and values[sel["chosen_index"]] == max(values)
    bad = make_search(
        tmp_path / "bad", steps=8, iterations=1, evaluator=adanet.Evaluator(eval_input(x, y), metric_name="auc")
    )
    with pytest.raises(ValueError, match="'auc' is not computed"):
        bad.train(train_input(x, y))


def test_metric_fn_adds_metrics_to_candidates_subnetworks_and_the_final_ensemble(tmp_path):
    x, y = make_data()

    def metric_fn(labels, predictions):  # any of predictions, features, labels, by name
        return {
            "top2": stoker.metrics.TopKAccuracy(2)(predictions["logits"], labels),
            "accuracy": (predictions["class_ids"] != labels).double(),
        }  # replaces the head's (here: the error rate)

    evaluator = adanet.Evaluator(eval_input(x, y), metric_name="top2", objective="maximize")
    est = make_search(tmp_path, steps=8, iterations=2, evaluator=evaluator, metric_fn=metric_fn)
    est.train(train_input(x, y))
    sel = est.selection(1)
    assert sel["selected_by"] == "evaluator top2 (maximize)"
    values = [c["value"] for c in sel["candidates"]]
    assert values[sel["chosen_index"]] == max(values) and all(0.0 < v <= 1.0 for v in values)
    result = est.evaluate(eval_input(x, y))
    # exact: the final ensemble's metrics by hand
    model = est.final_ensemble()
    with torch.no_grad():
        logits = model(x)
    top2 = (logits.topk(2, dim=1).indices == y[:, None]).any(1).double().mean().item()
    accuracy = (logits.argmax(1) == y).double().mean().item()
    assert result["top2"] == pytest.approx(top2, abs=1e-12) and result["accuracy"] == pytest.approx(
        1 - accuracy, abs=1e-12
    )
    with pytest.raises(ValueError, match=r"metric_fn may take only predictions, features and labels.*\['logits'\]"):
        make_search(tmp_path / "bad", metric_fn=lambda logits, labels: {})


class DecayingBuilder(MLPBuilder):
    """SGD at 0.1, halved every 4 steps of the iteration (a per-subnetwork LR schedule)."""

    def build_subnetwork_optimizer(self, parameters):  # noqa: ANN001, ANN201
        return torch.optim.SGD(parameters, lr=0.1)

    def build_subnetwork_lr_schedule(self, optimizer):  # noqa: ANN001, ANN201
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)


class DecayingGenerator(adanet.Generator):
    def generate_candidates(self, previous_ensemble, iteration_number, previous_ensemble_reports, all_reports):  # noqa: ANN001, ANN201
        return [DecayingBuilder(1), MLPBuilder(2)]  # the second keeps its fixed rate


def test_per_subnetwork_lr_schedules_step_per_iteration_and_resume_bitwise(tmp_path):
    x, y = make_data()
    est = make_search(tmp_path / "whole", steps=12, iterations=2, generator=DecayingGenerator())
    est.train(train_input(x, y))
    for t in (0, 1):  # each iteration's schedule starts afresh with its optimizer: 12 steps -> 0.1 / 2**3
        state = stoker.checkpoint.load_checkpoint(est.iteration_estimator(t).latest_checkpoint()).train_state
        schedules = state["schedule"]["schedules"]
        assert list(schedules) == [f"subnetwork/t{t}_mlp1"]
        assert schedules[f"subnetwork/t{t}_mlp1"]["last_epoch"] == 12
        assert schedules[f"subnetwork/t{t}_mlp1"]["_last_lr"] == [pytest.approx(0.1 / 8, rel=1e-12)]
    split = make_search(tmp_path / "split", steps=12, iterations=2, generator=DecayingGenerator())
    split.train(train_input(x, y), max_steps=18)  # stops in the middle of iteration 1
    split = make_search(tmp_path / "split", steps=12, iterations=2, generator=DecayingGenerator())
    split.train(train_input(x, y))
    assert final_bytes(tmp_path / "split") == final_bytes(tmp_path / "whole")


class HarmfulBuilder(adanet.Builder):
    """A subnetwork with large random logits that never learn (lr 0): it only hurts an ensemble."""

    def __init__(self, name: str = "harm") -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def build_subnetwork(self, features, logits_dimension, training, iteration_step, previous_ensemble):  # noqa: ANN001, ANN201
        lin = nn.Linear(IN, logits_dimension)
        with torch.no_grad():
            lin.weight.normal_(0.0, 10.0)
        return lin

    def build_subnetwork_optimizer(self, parameters):  # noqa: ANN001, ANN201
        return torch.optim.SGD(parameters, lr=0.0)


class Scripted(adanet.Generator):
    """Iteration 0: a good MLP; later: the given builders."""

    def __init__(self, later: Sequence[adanet.Builder]) -> None:
        self.later = list(later)

    def generate_candidates(self, previous_ensemble, iteration_number, previous_ensemble_reports, all_reports):  # noqa: ANN001, ANN201
        return [MLPBuilder(1, lr=0.05)] if iteration_number == 0 else list(self.later)


@pytest.mark.parametrize("force_grow", [False, True])
def test_force_grow_never_keeps_the_previous_ensemble(tmp_path, force_grow):
    x, y = make_data()
    est = make_search(
        tmp_path,
        steps=16,
        iterations=2,
        generator=Scripted([HarmfulBuilder("h1"), HarmfulBuilder("h2")]),
        force_grow=force_grow,
    )
    est.train(train_input(x, y))
    sel = est.selection(1)
    if force_grow:
        assert sel["chosen_index"] in (1, 2) and len(est.architecture().subnetworks) == 2
    else:
        assert sel["chosen_index"] == 0  # the new members only hurt: keep the previous ensemble
        assert est.architecture().subnetworks == [(0, "mlp1")] and est.architecture().replay_indices == [0, 0]


def test_force_grow_with_one_new_candidate_skips_evaluation(tmp_path):
    x, y = make_data()
    evaluator = adanet.Evaluator(lambda p: (_ for _ in ()).throw(AssertionError("must not evaluate")))
    est = make_search(
        tmp_path, steps=8, iterations=2, generator=Scripted([HarmfulBuilder()]), force_grow=True, evaluator=evaluator
    )
    est.train(train_input(x, y))  # iteration 0 has one candidate, iteration 1 one new one: no evaluation
    assert est.selection(0)["selected_by"] == "only candidate"
    assert est.selection(1)["chosen_index"] == 1 and est.selection(1)["selected_by"].startswith("force_grow")


class NaNAfter(nn.Module):
    """Gives NaN logits from its 5th training step on (reads the iteration step counter)."""

    def __init__(self, step: torch.Tensor) -> None:
        super().__init__()
        self.lin = nn.Linear(IN, CLASSES)
        self.step = step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        return out * float("nan") if self.training and int(self.step) >= 5 else out


class NaNBuilder(HarmfulBuilder):
    def build_subnetwork(self, features, logits_dimension, training, iteration_step, previous_ensemble):  # noqa: ANN001, ANN201
        return NaNAfter(iteration_step)

    def build_subnetwork_optimizer(self, parameters):  # noqa: ANN001, ANN201
        return torch.optim.Adam(parameters, lr=0.01)


def test_a_diverging_candidate_never_wins_and_does_not_stop_the_search(tmp_path, caplog):
    x, y = make_data()
    gen = adanet.SimpleGenerator([NaNBuilder("nan"), MLPBuilder(1)])
    est = make_search(tmp_path, steps=12, iterations=1, generator=gen)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        est.train(train_input(x, y))
    sel = est.selection(0)
    assert sel["candidates"][0]["name"] == "t0_nan_grow" and sel["candidates"][0]["adanet_loss_ema"] is None  # NaN
    assert sel["chosen"] == "t0_mlp1_grow"
    assert "t0_nan, t0_nan_grow diverged" in caplog.text
    weights = stoker.checkpoint.load_checkpoint(est.iteration_estimator(0).latest_checkpoint()).model_state
    assert all(
        torch.isfinite(v).all() for k, v in weights.items() if k != "adanet_loss_ema"
    )  # the engine saved finite weights
    assert torch.isnan(weights["adanet_loss_ema"][0])


# ---------------------------------------------------------------- resume, replay, determinism
def test_resume_mid_iteration_and_between_iterations_is_bitwise_equal(tmp_path):
    x, y = make_data()
    make_search(tmp_path / "whole").train(train_input(x, y))
    make_search(tmp_path / "split").train(train_input(x, y), max_steps=30)  # stops mid-iteration 1
    make_search(tmp_path / "split").train(train_input(x, y), steps=18)  # to step 48: between iterations
    assert make_search(tmp_path / "split").iteration_number == 2
    make_search(tmp_path / "split").train(train_input(x, y))
    assert final_bytes(tmp_path / "split") == final_bytes(tmp_path / "whole")
    assert architectures(tmp_path / "split") == architectures(tmp_path / "whole")
    # a crash after the chosen ensemble was saved but before the commit redoes the bookkeeping
    (tmp_path / "whole" / "architecture-2.json").unlink()
    make_search(tmp_path / "whole").train(train_input(x, y))
    assert architectures(tmp_path / "split") == architectures(tmp_path / "whole")


def test_replay_rebuilds_the_same_architecture_without_evaluating(tmp_path):
    x, y = make_data()
    first = make_search(tmp_path / "first", steps=10, iterations=3)
    first.train(train_input(x, y))
    indices = first.architecture().replay_indices
    # An evaluator that maximizes the loss would choose differently; replay must not ask it.
    never = adanet.Evaluator(
        lambda p: (_ for _ in ()).throw(AssertionError("replay must not evaluate")), objective="maximize"
    )
    again = make_search(
        tmp_path / "again",
        steps=10,
        iterations=3,
        evaluator=never,
        replay_config=adanet.replay.Config(best_ensemble_indices=indices),
    )
    again.train(train_input(x, y))
    assert architectures(tmp_path / "again") == architectures(tmp_path / "first")
    assert [again.selection(t)["selected_by"] for t in range(3)] == ["replay"] * 3


class Drifting(GrowingGenerator):
    """Non-deterministic: builder names change from call to call."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def generate_candidates(self, previous_ensemble, iteration_number, previous_ensemble_reports, all_reports):  # noqa: ANN001, ANN201
        self.n += 1
        return [MLPBuilder(self.n)]


def test_a_non_deterministic_generator_is_named_when_a_rebuild_fails(tmp_path):
    x, y = make_data()
    est = make_search(tmp_path, steps=4, iterations=2, generator=Drifting())
    with pytest.raises(
        ValueError, match=r"Required subnetwork builder is missing for iteration 0: 'mlp1'.*deterministic"
    ):
        est.train(train_input(x, y))


# ---------------------------------------------------------------- λ and reports
def test_lambda_sweep_shrinks_the_mixture_weights_of_complex_subnetworks(tmp_path):
    x, y = make_data()
    norms = []
    for lam in (0.0, 0.3, 3.0):
        ens = adanet.ComplexityRegularizedEnsembler(lambda ps: torch.optim.SGD(ps, lr=0.05), adanet_lambda=lam)
        gen = adanet.SimpleGenerator([MLPBuilder(1), MLPBuilder(4)])  # complexity 1 and 2
        est = make_search(
            tmp_path / f"l{lam}",
            steps=40,
            iterations=1,
            generator=gen,
            ensemblers=[ens],
            ensemble_strategies=[adanet.AllStrategy()],
        )
        est.train(train_input(x, y))
        weights = {w.key: float(w.weight.detach().abs().sum()) for w in est.final_ensemble().weighted_subnetworks}
        norms.append(weights["t0_mlp4"])
    assert norms[0] > norms[1] > norms[2], norms


class Reporting(MLPBuilder):
    def build_subnetwork_report(self) -> adanet.Report:
        return adanet.Report(
            hparams={"depth": self.depth},
            attributes={"two": torch.tensor(2.0)},
            metrics={"acc": stoker.metrics.Accuracy()},
        )


class ReportingGenerator(GrowingGenerator):
    def generate_candidates(self, previous_ensemble, iteration_number, previous_ensemble_reports, all_reports):  # noqa: ANN001, ANN201
        super().generate_candidates(previous_ensemble, iteration_number, previous_ensemble_reports, all_reports)
        return [Reporting(1), Reporting(2)]


def test_reports_are_materialised_and_handed_to_the_generator(tmp_path):
    x, y = make_data()
    gen = ReportingGenerator()
    est = make_search(
        tmp_path, steps=8, iterations=2, generator=gen, report_materializer=adanet.ReportMaterializer(eval_input(x, y))
    )
    est.train(train_input(x, y))
    reports = json.loads((tmp_path / "report" / "iteration-0.json").read_text())
    assert [r["name"] for r in reports] == ["mlp1", "mlp2"]
    assert (
        reports[0]["hparams"] == {"depth": 1}
        and reports[0]["attributes"] == {"two": 2.0}
        and 0 <= reports[0]["metrics"]["acc"] <= 1
    )
    assert sum(r["included_in_final_ensemble"] for r in reports) == 1
    at_1 = [c for c in gen.calls if c["iteration"] == 1][-1]
    assert [r.name for r in at_1["all_reports"]] == ["mlp1", "mlp2"]
    assert len(at_1["previous_reports"]) == 1 and at_1["previous_reports"][0].included_in_final_ensemble


# ---------------------------------------------------------------- the final ensemble
def test_predict_evaluate_export_and_members_of_the_final_ensemble(tmp_path):
    x, y = make_data()
    est = make_search(tmp_path / "run", steps=12, iterations=2)
    est.train(train_input(x, y))
    model = est.final_ensemble()
    assert isinstance(model, adanet.EnsembleModel) and [w.key for w in model.weighted_subnetworks] == [
        f"t{i}_{n}" for i, n in est.architecture().subnetworks
    ]
    with torch.no_grad():
        logits = model(x)
        members = model.subnetwork_logits(x)
        by_hand = sum(w.weight * members[w.key] for w in model.weighted_subnetworks)
    assert torch.allclose(logits, by_hand, atol=1e-6)
    rows = list(est.predict(eval_input(x)))
    assert len(rows) == len(x) and torch.allclose(torch.stack([r["logits"] for r in rows]), logits, atol=1e-6)
    results = est.evaluate(eval_input(x, y))
    assert results["global_step"] == 24 and results["accuracy"] == pytest.approx(
        float((logits.argmax(-1) == y).float().mean())
    )
    out = est.export(tmp_path / "export")
    program = torch.export.load(str(out / "ensemble.pt2"))
    assert torch.allclose(program.module()(x), logits, atol=1e-5)
    assert (out / "model.safetensors").exists() and json.loads((out / "architecture.json").read_text())[
        "global_step"
    ] == 24
    # an untrained search has no final ensemble yet
    with pytest.raises(stoker.CheckpointError, match="no AdaNet iteration has finished"):
        make_search(tmp_path / "empty").architecture()


def test_autoensemble_of_user_modules(tmp_path):
    x, y = make_data()
    pool = {
        "linear": adanet.AutoEnsembleSubestimator(
            model=lambda: nn.Linear(IN, CLASSES), optimizer=lambda ps: torch.optim.Adam(ps, lr=0.05)
        ),
        "mlp": nn.Sequential(nn.Linear(IN, 16), nn.ReLU(), nn.Linear(16, CLASSES)),
    }
    est = adanet.AutoEnsembleEstimator(
        adanet.MultiClassHead(CLASSES),
        pool,
        10,
        optimizer=lambda ps: torch.optim.Adam(ps, lr=0.05),
        max_iterations=2,
        config=run_config(tmp_path),
        train_batch_size=16,
    )
    est.train(train_input(x, y))
    names = [c["name"] for c in est.selection(0)["candidates"]]
    assert names == ["t0_linear_grow", "t0_mlp_grow"]
    model = est.final_ensemble()
    assert all(w.subnetwork.complexity == 0.0 for w in model.weighted_subnetworks)
    mlps = [w.module for w in model.weighted_subnetworks if w.name == "mlp"]
    assert all(m is not pool["mlp"] for m in mlps)  # copies, re-initialised: the pool's module is untouched
    with pytest.raises(ValueError, match="has no optimizer"):
        adanet.AutoEnsembleEstimator(
            adanet.MultiClassHead(CLASSES), [nn.Linear(IN, CLASSES)], 10, config=run_config(tmp_path / "x")
        )


def test_constructor_errors(tmp_path):
    head, gen = adanet.MultiClassHead(CLASSES), GrowingGenerator()
    with pytest.raises(ValueError, match="model_dir"):
        adanet.Estimator(head, gen, 10, config=stoker.RunConfig())
    with pytest.raises(ValueError, match="max_iteration_steps"):
        adanet.Estimator(head, gen, 0, config=run_config(tmp_path))
    with pytest.raises(ValueError, match="gradient_clip_norm"):
        adanet.Estimator(head, gen, 10, config=run_config(tmp_path, gradient_clip_norm=1.0))
    with pytest.raises(ValueError, match="ensembler names must be unique"):
        adanet.Estimator(
            head, gen, 10, config=run_config(tmp_path), ensemblers=[adanet.MeanEnsembler(), adanet.MeanEnsembler()]
        )
