"""stoker.data.mix: weighted mixtures of sources, one source per batch drawn from the seed;
exact proportions, a golden sequence, bitwise resume (state round trip, workers, re-sharding,
kill -9 of a real training), stopping strategies, the realised proportions in the summaries and
the errors."""

from __future__ import annotations

import csv
import dataclasses
import json
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import stoker
from helpers.mixes import WEIGHTS, mixed_input
from helpers.paths import ROOT, SCRIPTS
from helpers.processes import PYTHON, finished, in_background, popen, python_env
from helpers.tiny import make_data, make_estimator, state_equal
from stoker.data import ReadOptions, arrays, mix
from stoker.data.mix import _Draws
from stoker.errors import CheckpointMismatchError, ConfigError, DataError

X = torch.arange(200, dtype=torch.float32).reshape(100, 2)  # row i is (2i, 2i + 1): its id is x[:, 0] / 2
Y = torch.arange(100)


def sources(  # noqa: ANN201
    batch: int = 4,
    *,
    workers: int = 0,
    kind: str = "auto",
    epochs: int | None = None,
    shard: tuple[int, int] = (1, 0),
    w: tuple[float, float] = (0.7, 0.3),
):
    read = ReadOptions(
        batch_size=batch,
        seed=1,
        num_workers=workers,
        worker_kind=kind,
        num_epochs=epochs,
        num_shards=shard[0],
        shard_index=shard[1],
    )
    return {
        "a": (arrays(X[:60], Y[:60], read=read), w[0]),
        "b": (arrays(X[60:], Y[60:], read=dataclasses.replace(read, seed=2)), w[1]),
    }


def ids(batch: Any) -> list[int]:
    return [int(v) for v in batch[1]]


def take(m: Any, n: int) -> list[Any]:
    return [next(m) for _ in range(n)]


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(a, b, strict=True)
    )


# ---------------------------------------------------------------------------- the draws
def test_a_fixed_seed_draws_a_golden_sequence_of_each_sources_own_batches() -> None:
    m = iter(mix(sources(), seed=3))
    drawn = [m.source_of(g) for g in range(16)]
    assert "".join(drawn) == "baabaaaaaaaaaaab"  # golden: a change to the draws must be deliberate
    batches = take(m, 16)
    alone = {n: iter(s) for n, (s, _) in sources().items()}  # each source read by itself, in order
    for name, batch in zip(drawn, batches, strict=True):
        expected = next(alone[name])
        assert torch.equal(batch[0], expected[0]) and torch.equal(batch[1], expected[1])
    assert m.drawn == {"a": drawn.count("a"), "b": drawn.count("b")} and m.step == 16
    # another seed, other draws; the same seed, the same ones in a new mixture
    assert [mix(sources(), seed=4).source_of(g) for g in range(16)] != drawn
    assert [mix(sources(), seed=3).source_of(g) for g in range(16)] == drawn


def test_realised_proportions_match_the_weights_within_statistical_bounds() -> None:
    weights = [5.0, 3.0, 2.0]  # not normalised: proportions 0.5, 0.3, 0.2
    n = 200_000
    counts = np.bincount(_Draws(11, weights).between(0, n), minlength=3)
    for count, w in zip(counts, weights, strict=True):
        p = w / 10
        assert abs(count / n - p) < 5 * (p * (1 - p) / n) ** 0.5, (counts, weights)  # 5 sigma
    # the blocks the iterator caches draw what one vectorised draw does, across a block boundary
    draws = _Draws(11, weights)
    assert [draws.source_of(g) for g in range(4090, 4100)] == list(_Draws(11, weights).between(4090, 4100))


def test_the_iterator_reports_what_it_drew() -> None:
    m = iter(mix(sources(), seed=3))
    assert m.realised_proportions() == {} and m.summary_scalars() == {}
    take(m, 2000)
    realised = m.realised_proportions()
    assert realised == {n: m.drawn[n] / 2000 for n in ("a", "b")}
    assert abs(realised["a"] - 0.7) < 5 * (0.21 / 2000) ** 0.5
    assert m.summary_scalars() == {"mix/a": realised["a"], "mix/b": realised["b"]}
    # as of an earlier state and the batches after it (a prefetch thread's snapshot): the same
    early = iter(mix(sources(), seed=3))
    take(early, 1500)
    assert early.realised_proportions(early.state_dict(), ahead=500) == realised


def test_with_a_prefetch_thread_the_infeed_reports_what_the_loop_consumed() -> None:
    from stoker.engine.infeed import Infeed, input_scalars

    class Slow:  # 1 ms a batch: the infeed's probe starts its prefetch thread, which reads ahead
        def __init__(self, value: float) -> None:
            self.value, self.read = value, 0

        def __next__(self) -> Any:
            time.sleep(0.001)
            self.read += 1
            return torch.full((4, 2), self.value), torch.zeros(4, dtype=torch.long)

        def state_dict(self) -> dict[str, Any]:
            return {"read": self.read}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            self.read = state["read"]

    m = mix({"a": (Slow(0.0), 0.7), "b": (Slow(1.0), 0.3)}, seed=3)
    with Infeed(m, device=torch.device("cpu"), prefetch_depth=4) as infeed:
        for _ in range(40):
            next(infeed)
        time.sleep(0.05)  # the thread fills its queue: the mixture has drawn past 40
        assert infeed.prefetching and m.step > 40
        drawn = [m.source_of(g) for g in range(40)]
        assert input_scalars(infeed) == {"mix/a": drawn.count("a") / 40, "mix/b": drawn.count("b") / 40}


# ---------------------------------------------------------------------------- exact resume
def test_a_state_dict_round_trip_resumes_bitwise() -> None:
    whole = iter(mix(sources(), seed=3))
    first = take(whole, 37)  # crosses epochs of both sources (15 and 10 batches each)
    state = json.loads(json.dumps(whole.state_dict()))  # what a checkpoint keeps: JSON
    rest = take(whole, 40)
    resumed = iter(mix(sources(), seed=3))
    resumed.load_state_dict(state)
    assert same(take(resumed, 40), rest)
    assert resumed.state_dict() == whole.state_dict()
    assert len(first) == 37 and state["sources"]["a"]["epoch"] >= 1


@pytest.mark.parametrize("epochs", [None, 2])  # sources that jump; finite ones, read instead
def test_advance_is_as_many_batches_read(epochs: int | None) -> None:
    whole = iter(mix(sources(epochs=epochs), seed=3, stopping_strategy="all_exhausted"))
    read = take(whole, 60)
    jumped = iter(mix(sources(epochs=epochs), seed=3, stopping_strategy="all_exhausted"))
    jumped.advance(45)
    assert same(take(jumped, 15), read[45:]) and jumped.state_dict() == whole.state_dict()
    short = iter(mix(sources(epochs=1), seed=3))
    with pytest.raises(ConfigError, match="mix: cannot advance 100 batches: the data ends after 19"):
        short.advance(100)


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_sources_with_workers_give_the_batches_of_sources_without(kind: str) -> None:
    plain = take(iter(mix(sources(), seed=3)), 30)
    m = iter(mix(sources(workers=2, kind=kind), seed=3))
    try:
        first = take(m, 12)
        state = m.state_dict()
        rest = take(m, 18)
        resumed = iter(mix(sources(workers=2, kind=kind), seed=3))
        resumed.load_state_dict(state)
        again = take(resumed, 18)
        resumed.close()
    finally:
        m.close()
    assert same(first + rest, plain) and same(again, rest)


def test_a_resume_on_another_number_of_replicas_keeps_the_global_batches() -> None:
    """2 replicas of batch 4 -> 1 of batch 8 (the same global batch): the same sources drawn
    and the same examples in every global batch as a run on one replica throughout."""
    one = iter(mix(sources(8), seed=3))
    reference = [sorted(ids(b)) for b in take(one, 20)]
    two = [iter(mix(sources(4, shard=(2, r)), seed=3)) for r in range(2)]
    before = [sorted(ids(p) + ids(q)) for p, q in zip(take(two[0], 7), take(two[1], 7), strict=True)]
    resumed = mix(sources(8), seed=3)
    resumed.load_state_dict(resumed.reshard_state_dict([m.state_dict() for m in two]))
    after = [sorted(ids(b)) for b in take(iter(resumed), 13)]
    assert before + after == reference
    assert [m.source_of(g) for g in range(20) for m in two] == [one.source_of(g) for g in range(20) for _ in two]


def test_a_state_of_other_sources_or_another_seed_is_refused() -> None:
    state = mix(sources(), seed=3).state_dict()
    with pytest.raises(CheckpointMismatchError, match="mix: the saved input has seed=3 but this one seed=4"):
        mix(sources(), seed=4).load_state_dict(state)
    renamed = sources()
    renamed["c"] = renamed.pop("b")
    with pytest.raises(CheckpointMismatchError, match="mixes a, b but this one mixes a, c; resume with the same"):
        mix(renamed, seed=3).load_state_dict(state)


# ---------------------------------------------------------------------------- finite sources
def test_first_exhausted_ends_at_the_first_source_that_runs_out() -> None:
    m = iter(mix(sources(epochs=1), seed=3))  # a: 15 batches, b: 10
    out = list(m)
    drawn = [m.source_of(g) for g in range(len(out) + 1)]
    ended_by = drawn[-1]
    assert drawn[:-1].count(ended_by) == {"a": 15, "b": 10}[ended_by]  # its last batch, then none
    assert all(drawn[:-1].count(n) <= {"a": 15, "b": 10}[n] for n in "ab")
    assert m.ended and m.exhausted == {ended_by}
    with pytest.raises(StopIteration):
        next(m)


def test_all_exhausted_starts_a_source_over_until_every_one_ran_out_and_resumes_exactly() -> None:
    def mixture() -> Any:  # a: 15 batches at 0.3, b: 10 batches at 0.7, one pass each
        return iter(mix(sources(epochs=1, w=(0.3, 0.7)), seed=3, stopping_strategy="all_exhausted"))

    m = mixture()
    out = list(m)
    drawn = [m.source_of(g) for g in range(len(out))]
    assert m.exhausted == {"a", "b"} and m.ended
    # b runs out first and starts over: its 11th batch is its first again, and so on
    alone_b = list(iter(sources(epochs=1)["b"][0]))
    from_b = [b for name, b in zip(drawn, out, strict=True) if name == "b"]
    assert len(from_b) > 10 and same(from_b[10:], (alone_b * 9)[: len(from_b) - 10])
    assert drawn.count("a") == 15 and m.source_of(len(out)) == "a"  # it ends where a has none left
    # resumed after b started over, it reads the same to the end, bitwise
    cut = [i for i, n in enumerate(drawn) if n == "b"][10] + 1
    again = mixture()
    take(again, cut)
    resumed = mixture()
    resumed.load_state_dict(json.loads(json.dumps(again.state_dict())))
    assert same(list(resumed), out[cut:]) and resumed.ended


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("given", "kwargs", "match"),
    [
        ({}, {}, r"mix: sources must be a non-empty dict of name -> \(source, weight\); got dict"),
        ("a", {}, r"mix: sources must be a non-empty dict .*; got str"),
        ({"a": "x"}, {}, r"mix: sources\['a'\] must be a \(source, weight\) pair; got str"),
        ({"a": ("S", 0.0)}, {}, r"mix: the weight of 'a' must be a finite number > 0; got 0.0"),
        ({"a": ("S", -1)}, {}, r"the weight of 'a' must be a finite number > 0; got -1"),
        ({"a": ("S", float("nan"))}, {}, r"the weight of 'a' must be a finite number > 0; got nan"),
        ({"a": ("S", True)}, {}, r"the weight of 'a' must be a finite number > 0; got True"),
        ({"": ("S", 1.0)}, {}, r"mix: source names must be non-empty strings; got ''"),
        ({"a": ([1, 2], 1.0)}, {}, r"mix: sources\['a'\] must be an iterator with state_dict\(\) .*; got list"),
        ({"a": ("S", 1.0), "b": ("S", 1.0)}, {}, r"mix: sources 'a' and 'b' are the same object; give each name"),
        ({"a": ("S", 1.0)}, {"seed": 1.5}, r"mix: seed must be an integer; got 1.5"),
        ({"a": ("S", 1.0)}, {"stopping_strategy": "never"}, r"stopping_strategy must be one of first_exhausted, all"),
    ],
)
def test_bad_arguments_are_one_line_config_errors_naming_them(given: Any, kwargs: dict[str, Any], match: str) -> None:
    source = sources()["a"][0]
    if isinstance(given, dict):
        given = {
            k: tuple(source if x == "S" else x for x in v) if isinstance(v, tuple) else v for k, v in given.items()
        }
    with pytest.raises(ConfigError, match=match) as caught:
        mix(given, **kwargs)
    assert "\n" not in str(caught.value)


def test_sources_must_agree_on_the_batch_and_the_structure() -> None:
    a = arrays(X, Y, read=ReadOptions(batch_size=4))
    with pytest.raises(ConfigError, match=r"mix: the sources differ in batch_size \(a: 4, b: 8\); give every source"):
        mix({"a": (a, 1.0), "b": (arrays(X, Y, read=ReadOptions(batch_size=8)), 1.0)})
    wider = arrays(torch.zeros(10, 3), Y[:10], read=ReadOptions(batch_size=4))
    with pytest.raises(
        ConfigError, match=r"source 'b' yields batches of another structure than 'a' \(\[0\] float32 \[3\]"
    ):
        mix({"a": (a, 1.0), "b": (wider, 1.0)})  # at once: one batch of each stoker.data source is built

    class Plain:  # any iterator with state: checked at its first batch
        def __next__(self) -> Any:
            return {"x": torch.zeros(4, 2)}, Y[:4]

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            pass

    m = iter(mix({"a": (a, 1.0), "b": (Plain(), 1e6)}))
    with pytest.raises(ConfigError, match=r"source 'b' yields batches of another structure than 'a' \(\[0\]\['x'\]"):
        next(m)


def test_an_empty_source_started_over_is_a_data_error() -> None:
    class Empty:
        def __next__(self) -> Any:
            raise StopIteration

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            pass

    m = iter(mix({"a": (sources()["a"][0], 1e-9), "b": (Empty(), 1.0)}, stopping_strategy="all_exhausted"))
    with pytest.raises(DataError, match="mix: source 'b' yields no batch, even started over"):
        next(m)


# ---------------------------------------------------------------------------- under the Estimator
def test_training_resumes_bitwise_and_the_summaries_report_the_proportions(tmp_path: Path) -> None:
    x, y = make_data(100)
    whole = make_estimator(tmp_path / "whole", log_every_n_steps=8)
    whole.train(mixed_input(x, y), max_steps=24)
    split = make_estimator(tmp_path / "split", log_every_n_steps=8)
    split.train(mixed_input(x, y), max_steps=12)
    again = make_estimator(tmp_path / "split", log_every_n_steps=8)
    again.train(mixed_input(x, y), max_steps=24)
    assert state_equal(whole.model, again.model)
    rows = {}
    with open(tmp_path / "whole" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            rows[(int(row["step"]), row["tag"])] = float(row["value"])
    m = iter(mixed_input(x, y)({"batch_size": 16}))
    take(m, 24)
    assert {k: v for k, v in rows.items() if k[1].startswith("mix/") and k[0] == 24} == {
        (24, f"mix/{n}"): pytest.approx(p, abs=1e-6) for n, p in m.realised_proportions().items()
    }
    assert {k[0] for k in rows if k[1] == "mix/a"} == {8, 16, 24}
    assert set(WEIGHTS) == {"a", "b"}


@pytest.mark.slow  # ~3 s: importing matplotlib
def test_stoker_plot_draws_the_proportions_in_a_panel_of_their_own(tmp_path: Path) -> None:
    from stoker.summary.inspect import plot_run

    x, y = make_data(100)
    make_estimator(tmp_path / "m", log_every_n_steps=4).train(mixed_input(x, y), max_steps=8)
    panels = plot_run(tmp_path / "m", tmp_path / "curves.png", dpi=40)["panels"]
    assert panels[-1] == "Input mixture" and (tmp_path / "curves.png").stat().st_size > 1000


@pytest.mark.slow  # ~10 s: importing MLflow
def test_a_tracker_gets_the_proportions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind a flag
    uri = (tmp_path / "mlruns").as_uri()
    x, y = make_data(100)
    logger = stoker.hooks.MLflowLogger(tracking_uri=uri, experiment="mix")
    make_estimator(tmp_path / "m", log_every_n_steps=4).train(mixed_input(x, y), max_steps=8, hooks=[logger])
    m = iter(mixed_input(x, y)({"batch_size": 16}))
    expected = []
    for _ in range(2):
        take(m, 4)
        expected.append(m.realised_proportions()["b"])
    history = MlflowClient(tracking_uri=uri).get_metric_history(logger.run_id, "mix/b")
    assert sorted((h.step, h.value) for h in history) == [
        (4, pytest.approx(expected[0])),
        (8, pytest.approx(expected[1])),
    ]


def test_a_mixture_has_no_epochs_to_count() -> None:
    x, y = make_data(100)
    with pytest.raises(ConfigError, match=r"train\(max_epochs=\.\.\.\) needs an input_fn .*; got a Mixture"):
        make_estimator(None).train(mixed_input(x, y), max_epochs=2)


def test_the_log_line_shows_the_proportions(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    x, y = make_data(100)
    est = make_estimator(None, log_every_n_steps=8)
    with caplog.at_level("INFO", logger="stoker"):
        est.train(mixed_input(x, y), max_steps=8)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("step 8"))
    assert "mix/a = 0." in line and "mix/b = 0." in line, line


def test_the_guides_example_mixes_two_text_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "data.md").read_text()
    section = text[text.index("## Mixtures") :]
    example = section[section.index("```python\n") + 10 : section.index("```\n", section.index("```python"))]
    for name, byte in (("web", b"w"), ("books", b"b")):
        (tmp_path / "data" / name).mkdir(parents=True)
        (tmp_path / "data" / name / "a.txt").write_bytes(byte * 4096)
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(example, "docs/data.md", "exec"), scope)
    m = iter(scope["train_input_fn"]({"batch_size": 2}))
    for g in range(20):
        inputs, targets = next(m)
        assert inputs.shape == targets.shape == (2, 64)
        assert set(inputs.flatten().tolist()) == {ord(m.source_of(g)[0])}  # web's bytes are w, books' b
    assert set(m.drawn) == {"web", "books"} and m.drawn["web"] > m.drawn["books"] > 0


# ---------------------------------------------------------------------------- kill -9, real processes
TRAIN = SCRIPTS / "train_script.py"


@pytest.mark.slow
@pytest.mark.parametrize("per", ["batch", "example"])
def test_kill_9_mid_run_then_rerun_is_bitwise_an_uninterrupted_run(tmp_path: Path, per: str) -> None:
    args = ["--max_steps", "60", "--mix", per]
    ref = in_background([PYTHON, str(TRAIN), "--model_dir", str(tmp_path / "ref"), *args])
    crashed = tmp_path / "crashed"
    for _ in range(2):  # killed twice, at random moments once a checkpoint exists
        argv = [PYTHON, str(TRAIN), "--model_dir", str(crashed), *args, "--sleep", "0.02"]
        proc = popen(argv, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not (crashed / "checkpoint.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        time.sleep(random.uniform(0.0, 0.6))
        proc.kill()
        assert proc.wait() == -signal.SIGKILL
    index = json.loads((crashed / "checkpoint.json").read_text())
    assert index["latest"] != "ckpt-60", "the run finished before the kill; slow it down"
    finished(in_background([PYTHON, str(TRAIN), "--model_dir", str(crashed), *args]))
    finished(ref)
    name = "model.safetensors"
    assert (crashed / "ckpt-60" / name).read_bytes() == (tmp_path / "ref" / "ckpt-60" / name).read_bytes()
