"""stoker.hf.model: a transformers model as the Estimator's model, trained on its own loss and
evaluated exactly on its logits (bf16, gradient accumulation, compile, resume)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModel, AutoModelForSequenceClassification  # noqa: E402

import stoker  # noqa: E402
import stoker.hf as hf  # noqa: E402
from helpers import hf as tiny  # noqa: E402
from helpers.tiny import optimizer_state_equal, state_equal  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return tiny.tokenizer()


def features_of(tok, texts: list[str]) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return dict(tok(texts, padding="max_length", max_length=12, truncation=True, return_tensors="pt"))


def test_training_minimises_the_models_own_loss(tok):
    # A multi-label head with label smoothing the model knows nothing of would differ; the model's own
    # problem_type decides the formula: BCE here, cross-entropy for single labels.
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(
        tiny.tiny_config(num_labels=3, dropout=0.0, problem_type="multi_label_classification")
    ).eval()
    texts, _ = tiny.labelled_texts(5)
    features, labels = features_of(tok, texts), torch.tensor([[1.0, 0.0, 1.0]] * 5)
    spec = hf.model_fn(model, features, labels, stoker.ModeKeys.TRAIN, {})
    logits = model(**features).logits
    assert torch.equal(spec.loss, model(**features, labels=labels).loss)
    assert spec.loss.item() == pytest.approx(F.binary_cross_entropy_with_logits(logits, labels).item(), rel=1e-6)
    evaluated = hf.model_fn(model, features, labels, stoker.ModeKeys.EVAL, {})
    assert evaluated.loss.shape == (5,) and evaluated.loss.mean().item() == pytest.approx(spec.loss.item(), rel=1e-6)
    assert set(spec.predictions) == {"logits", "classes"} and torch.equal(spec.predictions["logits"], logits)


def test_evaluation_is_exact_on_a_padded_last_batch(tok):
    # 13 examples in batches of 8: the second batch is padded to 8 and masked; loss and accuracy are
    # the means over the 13 computed by hand.
    est = tiny.classifier()
    est.initialize()
    data = tiny.dataset(13, seed=4)
    results = est.evaluate(tiny.input_fn(data, tok, train=False))
    model = est.model.eval()
    features = features_of(tok, list(data["text"]))
    labels = torch.tensor(list(data["label"]))
    with torch.no_grad():
        logits = model(**features).logits
        assert model(**features, labels=labels).loss.item() == pytest.approx(
            F.cross_entropy(logits, labels).item(), rel=1e-6
        )
    assert results["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-6)
    assert results["accuracy"] == pytest.approx((logits.argmax(-1) == labels).double().mean().item(), abs=1e-12)
    rows = list(est.predict(tiny.input_fn(data, tok, train=False)))
    assert len(rows) == 13 and all(torch.equal(r["classes"], logits[i].argmax()) for i, r in enumerate(rows))


def test_a_regression_head_evaluates_squared_error_per_example(tok):
    est = tiny.classifier(model=hf.from_config(AutoModelForSequenceClassification, tiny.tiny_config(num_labels=1)))
    est.initialize()
    data = tiny.dataset(11).map(lambda row: {"score": float(len(row["text"]))})
    collate = hf.Tokenize(tokenizer=tok, label="score", max_length=12)
    results = est.evaluate(
        lambda params: hf.hf_dataset(
            data, read=stoker.data.ReadOptions().for_replica(params), collate=collate, train=False
        )
    )
    with torch.no_grad():
        predicted = est.model.eval()(**features_of(tok, list(data["text"]))).logits.squeeze(-1).double()
    expected = ((predicted - torch.tensor(list(data["score"]), dtype=torch.float64)) ** 2).mean().item()
    assert results["loss"] == pytest.approx(expected, rel=1e-5)
    assert results["mse"] == pytest.approx(expected, rel=1e-5)


def test_resume_is_bitwise(tmp_path, tok):
    # dropout on: the dropout RNG, AdamW's moments and the data position all come back
    data = tiny.dataset(40)
    whole = tiny.classifier(tmp_path / "whole", save_checkpoints_steps=2)
    whole.train(tiny.input_fn(data, tok), max_steps=6)
    tiny.classifier(tmp_path / "split", save_checkpoints_steps=2).train(tiny.input_fn(data, tok), max_steps=4)
    split = tiny.classifier(tmp_path / "split", save_checkpoints_steps=2)
    split.train(tiny.input_fn(data, tok), max_steps=6)
    assert state_equal(whole.model, split.model)
    assert optimizer_state_equal(whole.state.optimizer, split.state.optimizer)


def test_gradient_accumulation_matches_the_whole_batch(tok):
    data = tiny.dataset(40)
    model = hf.from_config(AutoModelForSequenceClassification, tiny.tiny_config(dropout=0.0))
    whole = tiny.classifier(model=model).train(tiny.input_fn(data, tok), max_steps=3)
    halves = tiny.classifier(model=model, gradient_accumulation_steps=2).train(tiny.input_fn(data, tok), max_steps=3)
    a, b = whole.model.state_dict(), halves.model.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert not state_equal(whole.model, tiny.classifier(model=model).initialize().model)  # it trained


def test_bf16_trains_with_fp32_weights_close_to_fp32(tok):
    data = tiny.dataset(40)
    model = hf.from_config(AutoModelForSequenceClassification, tiny.tiny_config(dropout=0.0))
    fp32 = tiny.classifier(model=model).train(tiny.input_fn(data, tok), max_steps=4)
    bf16 = tiny.classifier(model=model, precision="bf16").train(tiny.input_fn(data, tok), max_steps=4)
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    a, b = fp32.model.state_dict(), bf16.model.state_dict()
    assert 0 < max((a[k] - b[k]).abs().max().item() for k in a) < 2e-2  # autocast ran, and stayed close


@pytest.mark.slow  # inductor compiles the model: about 3 minutes per mode on 2 busy cores
@pytest.mark.parametrize("mode", ["module", "step"])
def test_compiled_training_matches_eager(tok, mode):
    data = tiny.dataset(40)
    model = hf.from_config(AutoModelForSequenceClassification, tiny.tiny_config(dropout=0.0))
    eager = tiny.classifier(model=model).train(tiny.input_fn(data, tok), max_steps=4)
    compiled = tiny.classifier(model=model, compile=mode).train(tiny.input_fn(data, tok), max_steps=4)
    a, b = eager.model.state_dict(), compiled.model.state_dict()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4


def test_from_pretrained_reads_a_local_folder_and_refuses_a_hub_id(tmp_path):
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(tiny.tiny_config()).save_pretrained(tmp_path / "base")
    built = hf.from_pretrained(AutoModelForSequenceClassification, tmp_path / "base")({})
    assert state_equal(built, AutoModelForSequenceClassification.from_pretrained(tmp_path / "base"))
    assert all(p.dtype == torch.float32 for p in built.parameters())
    with pytest.raises(stoker.ConfigError, match="'distilbert-base-uncased' is not a local folder"):
        hf.from_pretrained(AutoModelForSequenceClassification, "distilbert-base-uncased")


def test_model_fn_says_what_it_needs(tok):
    model = AutoModel.from_config(tiny.tiny_config())  # no head: no loss
    features = features_of(tok, ["the red cat"])
    with pytest.raises(stoker.ModelFnError, match="features must be a dict"):
        hf.model_fn(model, features["input_ids"], None, stoker.ModeKeys.PREDICT, {})
    with pytest.raises(stoker.ModelFnError, match="training needs labels"):
        hf.model_fn(model, features, None, stoker.ModeKeys.TRAIN, {})
    with pytest.raises(stoker.ModelFnError, match="DistilBertModel computes no logits and loss: use a model class"):
        hf.model_fn(model, features, torch.tensor([1]), stoker.ModeKeys.TRAIN, {})
    with pytest.raises(stoker.ModelFnError, match="DistilBertModel computes no logits"):
        hf.model_fn(model, features, None, stoker.ModeKeys.PREDICT, {})
