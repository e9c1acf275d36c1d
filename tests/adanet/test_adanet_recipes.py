"""The worked searches behind ``stoker adanet``: the CLI, and (slow) digits' results."""

from __future__ import annotations

import argparse
import json
import statistics

import pytest

from stoker.adanet import cli
from stoker.adanet.recipes import RecipeConfig, run_digits

pytest.importorskip("sklearn")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stoker")
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["adanet", *argv])


def test_cli_breast_cancer_prints_the_search_and_json(tmp_path, capsys):
    args = parse(
        "breast_cancer", "--model_dir", str(tmp_path), "--max_iterations", "2", "--max_iteration_steps", "10", "--json"
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "iteration 0 (to step 10)" in out and "iteration 1 (to step 20)" in out and "best single subnetwork" in out
    results = json.loads(out[out.index("\n{") + 1 :])
    arch = json.loads(results["autoensemble"]["architecture"])
    assert arch["global_step"] == 20 and {s["builder_name"] for s in arch["subnetworks"]} <= {"linear", "dnn"}
    # rerunning resumes: nothing left to train, the same report
    assert args.func(args) == 0
    again = capsys.readouterr().out
    assert (
        json.loads(again[again.index("\n{") + 1 :])["autoensemble"]["architecture"]
        == results["autoensemble"]["architecture"]
    )


def test_cli_rejects_bad_flags(capsys):
    with pytest.raises(SystemExit):
        parse("mnist")
    with pytest.raises(SystemExit):
        parse("digits", "--max_iterations", "0")
    args = parse("digits", "--generators", "linear,rnn", "--model_dir", "unused")
    assert args.func(args) == 2 and "unknown names ['rnn']" in capsys.readouterr().err


def test_cli_refuses_fresh_under_torchrun(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = parse("digits", "--fresh", "--model_dir", "unused")
    assert (
        args.func(args) == 2
        and "--fresh deletes --model_dir, which replicas would race to do" in capsys.readouterr().err
    )


@pytest.mark.slow
def test_digits_linear_le_dnn_adanet_le_cnn_adanet_and_ensembles_beat_their_best_subnetwork(tmp_path):
    runs = [run_digits(RecipeConfig(model_dir=str(tmp_path / f"seed{s}"), seed=s, verbose=False)) for s in (0, 1, 2)]
    acc = {k: statistics.mean(r[k]["ensemble"]["accuracy"] for r in runs) for k in ("linear", "dnn", "cnn")}
    print(f"\nmean held-out accuracy over seeds 0-2: {acc}")
    for kind in ("dnn", "cnn"):
        for s, r in enumerate(runs):
            b = r[kind]["members"][r[kind]["best_member"]]
            print(
                f"  {kind} seed {s}: ensemble acc {r[kind]['ensemble']['accuracy']:.4f} loss "
                f"{r[kind]['ensemble']['loss']:.4f}; "
                f"best subnetwork {r[kind]['best_member']} acc {b['accuracy']:.4f} loss {b['loss']:.4f}; "
                f"{r[kind]['seconds']:.1f} s"
            )
    assert acc["linear"] <= acc["dnn"] <= acc["cnn"], acc
    for kind in ("dnn", "cnn"):  # mean over the seeds, as the ordering above
        best = [r[kind]["members"][r[kind]["best_member"]] for r in runs]
        ensemble = [r[kind]["ensemble"] for r in runs]
        assert statistics.mean(e["accuracy"] for e in ensemble) >= statistics.mean(b["accuracy"] for b in best)
        assert statistics.mean(e["loss"] for e in ensemble) < statistics.mean(b["loss"] for b in best)
