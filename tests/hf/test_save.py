"""stoker.hf.save: a checkpoint written as a save_pretrained folder that transformers loads back with
equal outputs, and warm start from such a folder."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

import safetensors.torch  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
)

import stoker  # noqa: E402
import stoker.hf as hf  # noqa: E402
from helpers import hf as tiny  # noqa: E402
from helpers.tiny import TinyNet, classifier_fn, state_equal  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return tiny.tokenizer()


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tok):
    """The tiny classifier trained 4 steps with checkpoints at 2 and 4."""
    model_dir = tmp_path_factory.mktemp("run")
    est = tiny.classifier(model_dir, save_checkpoints_steps=2)
    est.train(tiny.input_fn(tiny.dataset(40), tok), max_steps=4)
    return est


def logits(model, tok, texts: list[str]) -> torch.Tensor:  # noqa: ANN001
    features = tok(texts, padding="max_length", max_length=12, return_tensors="pt")
    with torch.no_grad():
        return model.eval()(**features).logits


def test_the_folder_loads_back_with_equal_outputs_and_the_tokenizer(tmp_path, trained, tok):
    folder = hf.save_pretrained(trained, tmp_path / "hf", tokenizer=tok)
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    loaded = AutoModelForSequenceClassification.from_pretrained(folder)
    texts, _ = tiny.labelled_texts(9, seed=3)
    assert torch.equal(logits(loaded, tok, texts), logits(trained.model, tok, texts))
    # HF's own names: what the model's own save_pretrained writes
    trained.model.save_pretrained(tmp_path / "own")
    theirs = safetensors.torch.load_file(tmp_path / "own" / "model.safetensors")
    ours = safetensors.torch.load_file(folder / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    reloaded_tok = AutoTokenizer.from_pretrained(folder)
    assert reloaded_tok("the red cat")["input_ids"] == tok("the red cat")["input_ids"]


def test_any_checkpoint_from_a_new_estimator_and_a_folder_written_before_is_replaced(tmp_path, trained, tok):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "stale.bin").write_bytes(b"x")
    reader = tiny.classifier(trained.model_dir)  # never trained in this process
    folder = hf.save_pretrained(reader, tmp_path / "hf", checkpoint_path=f"{trained.model_dir}/ckpt-2")
    assert not (folder / "stale.bin").exists() and not (folder / "tokenizer.json").exists()
    saved = safetensors.torch.load_file(folder / "model.safetensors")
    ckpt_2 = safetensors.torch.load_file(f"{trained.model_dir}/ckpt-2/model.safetensors")
    assert saved.keys() == ckpt_2.keys() and all(torch.equal(saved[k], ckpt_2[k]) for k in saved)
    assert not torch.equal(saved["classifier.weight"], trained.model.state_dict()["classifier.weight"])  # not ckpt-4
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # nothing left beside it


def test_best_writes_the_checkpoint_keep_best_chose(tmp_path, tok):
    data = tiny.dataset(40)
    est = tiny.classifier(tmp_path / "run", keep_best=("loss", "max"), save_checkpoints_steps=2)  # the worst
    est.train_and_evaluate(tiny.input_fn(data, tok), tiny.input_fn(data, tok, train=False), 4, eval_every_n_steps=2)
    chosen = est.state.checkpoints.best()
    assert chosen is not None and chosen.name == "ckpt-2"  # not the newest: the loss fell
    folder = hf.save_pretrained(est, tmp_path / "hf", best=True)
    saved = safetensors.torch.load_file(folder / "model.safetensors")
    want = safetensors.torch.load_file(tmp_path / "run" / chosen.name / "model.safetensors")
    assert all(torch.equal(saved[k], want[k]) for k in saved)
    with pytest.raises(stoker.ConfigError, match="best=True needs a model_dir whose evaluations chose"):
        hf.save_pretrained(tiny.classifier(), tmp_path / "none", best=True)


def test_warm_start_from_the_folder_takes_every_weight(tmp_path, trained, tok):
    folder = hf.save_pretrained(trained, tmp_path / "hf")
    est = tiny.classifier(warm_start_from=folder, seed=7)
    est.initialize()  # builds the model, warm-started
    assert est.warm_start_report.not_found == [] and est.warm_start_report.shape_mismatch == []
    assert state_equal(est.model, trained.model)


def test_tied_weights_are_written_once_and_warm_started_whole(tmp_path, tok):
    config = BertConfig(
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    est = stoker.Estimator(model=hf.from_config(AutoModelForMaskedLM, config), model_fn=hf.model_fn).initialize()
    folder = hf.save_pretrained(est, tmp_path / "mlm")
    names = set(safetensors.torch.load_file(folder / "model.safetensors"))
    assert "cls.predictions.decoder.weight" not in names and "bert.embeddings.word_embeddings.weight" in names
    loaded = AutoModelForMaskedLM.from_pretrained(folder)
    texts, _ = tiny.labelled_texts(4)
    assert torch.equal(logits(loaded, tok, texts), logits(est.model, tok, texts))
    warm = stoker.Estimator(
        model=hf.from_config(AutoModelForMaskedLM, config),
        model_fn=hf.model_fn,
        config=stoker.RunConfig(seed=3),
        warm_start_from=folder,
    ).initialize()
    assert warm.warm_start_report.not_found == [] and "cls.predictions.decoder.weight" in warm.warm_start_report.loaded
    assert state_equal(warm.model, est.model)


def test_a_model_that_is_not_a_transformers_model_is_named(tmp_path):
    est = stoker.Estimator(model=TinyNet(), model_fn=classifier_fn).initialize()
    with pytest.raises(stoker.ConfigError, match="is a TinyNet, not a transformers model"):
        hf.save_pretrained(est, tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []
