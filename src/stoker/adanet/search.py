"""Building iterations and rebuilding chosen ensembles from ``architecture-<t>.json``.

Nothing about an ensemble's *structure* is stored as code or pickles: the ensemble chosen
at iteration ``t`` is rebuilt by replaying the search — for ``i = 0..t``, ask the generator
for iteration ``i``'s builders (given the ensemble rebuilt for ``i - 1``), build the modules
that ``architecture-<i>.json`` names, and form the candidate it names — and its *weights*
are loaded from ``final/ckpt-<step>``. The generator and the strategies must therefore be
deterministic; a rebuild that cannot find a recorded builder or candidate says which.

Every module is built with the global RNGs seeded from ``(RunConfig.seed, iteration,
name)``, so a subnetwork's initial weights do not depend on which other candidates exist,
nor on whether the run was resumed.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import storage
from ..checkpoint.manager import CheckpointManager, check_state_fits, load_checkpoint
from ..errors import CheckpointMismatchError, ConfigError, UserCodeError
from ..rng import rng_state, seed_everything, set_rng_state
from ..storage.stores import Location
from .architecture import Architecture, read_architecture, read_text
from .ensemble import Ensemble, Ensembler, Member, WeightedSubnetwork, subnetwork_key
from .heads import Head, MetricFn
from .iteration import CandidateRecord, EnsembleModel, IterationModel
from .strategy import Strategy
from .subnetwork import (
    Builder,
    Generator,
    MaterializedReport,
    Report,
    Subnetwork,
    as_subnetwork,
    check_builder_name,
    complexity_value,
)

FINAL_DIR = "final"
REPORT_FILE = "iteration-{}.json"


@contextlib.contextmanager
def seeded(seed: int, *parts: object) -> Iterator[None]:
    """Run a block with the global RNGs seeded from ``seed`` and ``parts``; restore them after."""
    saved = rng_state()
    key = "/".join(str(p) for p in (seed, *parts))
    seed_everything(zlib.crc32(key.encode()))
    try:
        yield
    finally:
        set_rng_state(saved)


def final_checkpoint(model_dir: Location, global_step: int) -> Location:
    """The checkpoint of the ensemble chosen at ``global_step``: ``final/ckpt-<step>`` locally;
    on an object store the unique prefix that ``final/checkpoint.json`` (the commit point)
    names for that step."""
    final = model_dir / FINAL_DIR
    if isinstance(final, Path):
        return final / f"ckpt-{global_step}"
    for rec in CheckpointManager(final, writer=False).records():
        if rec.step == global_step:
            return final / rec.directory
    return final / f"ckpt-{global_step}"  # not committed: reported missing by the caller


@dataclass(eq=False)
class SearchSpace:
    """What defines the modules of every iteration: head, generator, strategies, ensemblers."""

    head: Head
    generator: Generator
    strategies: Sequence[Strategy]
    ensemblers: Sequence[Ensembler]
    seed: int
    model_dir: Location  # a local Path or an fsspec URL
    report_dir: Location | None  # None: no report materializer, generators get empty reports

    # ------------------------------------------------------------------ pieces
    def reports_before(self, iteration_number: int) -> tuple[list[MaterializedReport], list[MaterializedReport]]:
        """(reports of subnetworks that made it into a chosen ensemble, all reports) of
        iterations before ``iteration_number``."""
        if self.report_dir is None:
            return [], []
        chosen: list[MaterializedReport] = []
        every: list[MaterializedReport] = []
        for i in range(iteration_number):
            path = self.report_dir / REPORT_FILE.format(i)
            if not storage.exists(path):
                raise CheckpointMismatchError(
                    f"{path} is missing: the report of iteration {i}, which the generator of iteration "
                    f"{iteration_number} receives"
                )
            reports = [MaterializedReport.from_dict(d) for d in json.loads(read_text(path))]
            every.extend(reports)
            chosen.extend(r for r in reports if r.included_in_final_ensemble)
        return chosen, every

    def generate(self, previous: Ensemble | None, iteration_number: int) -> list[Builder]:
        """The generator's builders for ``iteration_number``, names checked unique."""
        chosen, every = self.reports_before(iteration_number)
        builders = list(
            self.generator.generate_candidates(
                previous_ensemble=previous,
                iteration_number=iteration_number,
                previous_ensemble_reports=chosen,
                all_reports=every,
            )
        )
        seen: set[str] = set()
        for b in builders:
            if not isinstance(b, Builder):
                raise UserCodeError(
                    f"generate_candidates must return stoker.adanet.Builder objects; got a {type(b).__name__}"
                )
            name = check_builder_name(b.name)
            if name in seen:
                raise ConfigError(
                    f"two builders of iteration {iteration_number} are named {name!r}: builder names must be "
                    "unique within an iteration"
                )
            seen.add(name)
        return builders

    def build_module(
        self,
        builder: Builder,
        iteration_number: int,
        previous: Ensemble | None,
        features: Any,
        iteration_step: torch.Tensor,
        training: bool,
    ) -> tuple[nn.Module, Subnetwork]:
        """Build ``builder``'s module (seeded) and run it once on the example features."""
        device = iteration_step.device
        with seeded(self.seed, iteration_number, builder.name):
            module = builder.build_subnetwork(
                features=features,
                logits_dimension=self.head.logits_dimension,
                training=training,
                iteration_step=iteration_step,
                previous_ensemble=previous,
            )
            if not isinstance(module, nn.Module):
                raise UserCodeError(
                    f"{type(builder).__name__}.build_subnetwork must return an nn.Module; it returned a "
                    f"{type(module).__name__}"
                )
            module.to(device)
            was_training = module.training
            module.eval()
            with torch.no_grad():
                example = as_subnetwork(module(features))
            module.train(was_training)
        complexity_value(example)  # fail now, naming the problem, not mid-training
        if example.logits.shape[-1] != self.head.logits_dimension:
            raise ConfigError(
                f"subnetwork {builder.name!r} gives logits of shape {list(example.logits.shape)}; the head needs "
                f"{self.head.logits_dimension} logits in the last dimension"
            )
        return module, example

    def candidates(
        self, builders: Sequence[Builder], previous: Ensemble | None, iteration_number: int
    ) -> list[tuple[str, Any, Ensembler]]:
        """(display name, strategy Candidate, ensembler) of every new candidate, in index order."""
        previous_builders = previous.builders if previous is not None else None
        out: list[tuple[str, Any, Ensembler]] = []
        seen: set[str] = set()
        for strategy in self.strategies:
            for cand in strategy.generate_ensemble_candidates(builders, previous_builders):
                for ensembler in self.ensemblers:
                    display = f"t{iteration_number}_{cand.name}" + (
                        f"_{ensembler.name}" if len(self.ensemblers) > 1 else ""
                    )
                    if display in seen:
                        raise ConfigError(
                            f"two candidate ensembles are named {display!r}: strategies must give unique "
                            "candidate names"
                        )
                    seen.add(display)
                    out.append((display, cand, ensembler))
        return out

    def assemble(
        self,
        display: str,
        cand: Any,
        ensembler: Ensembler,
        iteration_number: int,
        previous: Ensemble | None,
        new: dict[str, tuple[Builder, nn.Module, Subnetwork]],
    ) -> Ensemble:
        """Form one candidate: keep the previous members it names, add its new builders."""
        members: list[WeightedSubnetwork] = []
        if cand.previous_ensemble_subnetwork_builders:
            if previous is None:
                raise ConfigError(
                    f"candidate {cand.name!r} keeps previous subnetworks, but there is no previous ensemble"
                )
            for b in cand.previous_ensemble_subnetwork_builders:
                match = [w for w in previous.weighted_subnetworks if w.builder is b]
                if not match:
                    raise ConfigError(
                        f"candidate {cand.name!r} names a previous subnetwork {getattr(b, 'name', b)!r} that is "
                        "not in the previous ensemble"
                    )
                members.append(match[0])
        for b in cand.subnetwork_builders:
            key = subnetwork_key(iteration_number, b.name)
            if key not in new or new[key][0] is not b:
                raise ConfigError(
                    f"candidate {cand.name!r} includes builder {b.name!r}, which is not one of iteration "
                    f"{iteration_number}'s builders"
                )
            _, module, example = new[key]
            members.append(WeightedSubnetwork(b.name, iteration_number, example, module, None, b))
        if not members:
            raise ConfigError(f"candidate {cand.name!r} has no subnetworks")
        with seeded(self.seed, iteration_number, "ensemble", display):
            combiner = ensembler.build_ensemble(
                [Member(w.key, w.name, w.iteration_number, w.subnetwork) for w in members],
                self.head.logits_dimension,
                previous,
            )
        weighted = [
            WeightedSubnetwork(w.name, w.iteration_number, w.subnetwork, w.module, combiner.member_weight(j), w.builder)
            for j, w in enumerate(members)
        ]
        return Ensemble(display, cand.name, ensembler.name, iteration_number, weighted, combiner)

    # ------------------------------------------------------------------ rebuilding
    def rebuild(self, iteration_number: int, features: Any, iteration_step: torch.Tensor, training: bool) -> Ensemble:
        """The ensemble chosen at ``iteration_number``, structure only (weights: ``load``)."""
        previous: Ensemble | None = None
        for i in range(iteration_number + 1):
            arch = read_architecture(self.model_dir, i)
            previous = self._rebuild_one(arch, i, previous, features, iteration_step, training)
        assert previous is not None
        return previous

    def _rebuild_one(
        self,
        arch: Architecture,
        i: int,
        previous: Ensemble | None,
        features: Any,
        iteration_step: torch.Tensor,
        training: bool,
    ) -> Ensemble:
        if not arch.replay_indices:
            raise CheckpointMismatchError(f"architecture-{i}.json has no replay_indices")
        if i > 0 and arch.replay_indices[-1] == 0:  # candidate 0 at t > 0: the previous ensemble was kept
            assert previous is not None
            return previous
        builders = self.generate(previous, i)
        by_name = {b.name: b for b in builders}
        wanted = arch.subnetworks_of(i)
        for name in wanted:
            if name not in by_name:
                raise ConfigError(
                    f"Required subnetwork builder is missing for iteration {i}: {name!r} (architecture-{i}.json "
                    "names it, "
                    f"but the generator now gives {sorted(by_name)}). Generators must be deterministic: the same "
                    "previous ensemble, iteration number and reports must give builders with the same names."
                )
        picked = [by_name[n] for n in wanted]
        new = {}
        for b in picked:
            module, example = self.build_module(b, i, previous, features, iteration_step, training)
            new[subnetwork_key(i, b.name)] = (b, module, example)
        for display, cand, ensembler in self.candidates(picked, previous, i):
            if cand.name == arch.ensemble_candidate_name and ensembler.name == arch.ensembler_name:
                return self.assemble(display, cand, ensembler, i, previous, new)
        raise ConfigError(
            f"Could not find the candidate {arch.ensemble_candidate_name!r} with ensembler "
            f"{arch.ensembler_name!r} that "
            f"architecture-{i}.json names. Are the ensemble strategies and ensemblers the same, and deterministic?"
        )

    def load(self, ensemble: Ensemble, global_step: int) -> EnsembleModel:
        """Load the weights saved for ``ensemble`` at ``global_step`` into its modules."""
        path = final_checkpoint(self.model_dir, global_step)
        if not storage.is_dir(path):
            raise CheckpointMismatchError(
                f"{path} is missing: it holds the weights of the ensemble chosen at step {global_step}"
            )
        state = load_checkpoint(path).model_state or {}
        model = EnsembleModel(ensemble)
        check_state_fits(model, state, f"final ensemble checkpoint {str(path)!r}")
        model.load_state_dict(state)
        return model

    # ------------------------------------------------------------------ one iteration
    def build_iteration(
        self,
        iteration_number: int,
        features: Any,
        device: torch.device,
        *,
        adanet_loss_decay: float,
        replicate_ensemble_in_training: bool,
        previous_adanet_loss: float | None = None,
        metric_fn: MetricFn | None = None,
    ) -> IterationModel:
        """The module of iteration ``t``: the previous ensemble (weights loaded), new subnetworks
        and every candidate ensemble. At ``t > 0``, ``previous_adanet_loss`` is the moving
        average the previous ensemble ended iteration ``t - 1`` with (carried over, not updated)."""
        step = torch.zeros((), dtype=torch.int64, device=device)
        previous: Ensemble | None = None
        if iteration_number > 0:
            previous = self.rebuild(iteration_number - 1, features, step, training=True)
            self.load(previous, read_architecture(self.model_dir, iteration_number - 1).global_step)
        builders = self.generate(previous, iteration_number)
        if not builders:
            raise ConfigError(f"the generator gave no builders for iteration {iteration_number}")
        new: dict[str, tuple[Builder, nn.Module, Subnetwork]] = {}
        for b in builders:
            module, example = self.build_module(b, iteration_number, previous, features, step, training=True)
            new[subnetwork_key(iteration_number, b.name)] = (b, module, example)
        records: list[CandidateRecord] = []
        if previous is not None:
            ensembler = next((e for e in self.ensemblers if e.name == previous.ensembler_name), self.ensemblers[0])
            records.append(CandidateRecord(previous.name, previous, ensembler, is_previous=True))
        for display, cand, ensembler in self.candidates(builders, previous, iteration_number):
            records.append(
                CandidateRecord(
                    display, self.assemble(display, cand, ensembler, iteration_number, previous, new), ensembler, False
                )
            )
        if len(records) == (1 if previous is not None else 0):
            raise ConfigError(f"the ensemble strategies gave no candidate at iteration {iteration_number}")
        reports: dict[str, Report] = {}
        for key, (b, _, _) in new.items():
            report = b.build_subnetwork_report()
            if report is not None:
                reports[key] = report
        frozen = {w.key: w.module for w in previous.weighted_subnetworks} if previous is not None else {}
        return IterationModel(
            iteration_number=iteration_number,
            head=self.head,
            frozen=frozen,
            new={k: (b, m) for k, (b, m, _) in new.items()},
            candidates=records,
            adanet_loss_decay=adanet_loss_decay,
            replicate_ensemble_in_training=replicate_ensemble_in_training,
            iteration_step=step,
            reports=reports,
            previous_adanet_loss=previous_adanet_loss,
            metric_fn=metric_fn,
        )
