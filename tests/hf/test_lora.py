"""stoker.hf.lora: LoRA adapters trained on a frozen base, checkpoints of the adapters only (small),
bitwise resume, a refused resume on another base, and merge-and-save to a save_pretrained folder."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")
peft = pytest.importorskip("peft")

import safetensors.torch  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForSequenceClassification  # noqa: E402

import stoker  # noqa: E402
import stoker.hf as hf  # noqa: E402
from helpers import hf as tiny  # noqa: E402
from helpers.tiny import optimizer_state_equal  # noqa: E402
from stoker.hf.lora import FINGERPRINT_KEY  # noqa: E402

LORA = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_lin", "v_lin"], task_type="SEQ_CLS")


@pytest.fixture(scope="module")
def tok():
    return tiny.tokenizer()


@pytest.fixture(scope="module")
def data():
    return tiny.dataset(40)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A base classifier saved as a folder (the model a LoRA run starts from)."""
    folder = tmp_path_factory.mktemp("base") / "model"
    torch.manual_seed(11)
    AutoModelForSequenceClassification.from_config(tiny.tiny_config()).save_pretrained(folder)
    return folder


def lora_estimator(model_dir, base_folder, **config):  # noqa: ANN001, ANN003, ANN201
    model = hf.with_lora(hf.from_pretrained(AutoModelForSequenceClassification, base_folder), LORA)
    return tiny.classifier(model_dir, model=model, lr=1e-2, save_checkpoints_steps=2, **config)


def test_adapters_train_on_a_frozen_base_and_checkpoints_hold_them_only(tmp_path, base, data, tok):
    est = lora_estimator(tmp_path / "run", base)
    before = {k: v.clone() for k, v in est.initialize().model.named_parameters()}
    est.train(tiny.input_fn(data, tok), max_steps=4)
    after = dict(est.model.named_parameters())
    trainable = {k for k, p in after.items() if p.requires_grad}
    assert trainable and all("lora_" in k or "modules_to_save" in k for k in trainable)
    assert all(torch.equal(before[k], after[k]) for k in after if k not in trainable)  # the base did not move
    assert all(not torch.equal(before[k], after[k]) for k in trainable if "lora_B" in k)  # the adapters did
    # the checkpoint: the trainable weights and the base's fingerprint, nothing else
    ckpt = tmp_path / "run" / "ckpt-4" / "model.safetensors"
    saved = safetensors.torch.load_file(ckpt)
    assert set(saved) == trainable | {FINGERPRINT_KEY}
    adapter_bytes = sum(after[k].numel() * after[k].element_size() for k in trainable)
    full_bytes = (base / "model.safetensors").stat().st_size
    assert adapter_bytes < ckpt.stat().st_size < adapter_bytes + 4096  # the adapters and a header of names
    assert ckpt.stat().st_size < full_bytes / 5  # a ninth here: the tiny model's trained head is much of it
    # the optimizer state too: moments for the adapters only
    moments = torch.load(tmp_path / "run" / "ckpt-4" / "train_state.pt", weights_only=True)["optimizer"]["state"]
    assert len(moments) == len(trainable)


def test_resume_is_bitwise(tmp_path, base, data, tok):
    whole = lora_estimator(tmp_path / "whole", base)
    whole.train(tiny.input_fn(data, tok), max_steps=6)
    lora_estimator(tmp_path / "split", base).train(tiny.input_fn(data, tok), max_steps=4)
    split = lora_estimator(tmp_path / "split", base)
    split.train(tiny.input_fn(data, tok), max_steps=6)
    a, b = whole.model.state_dict(), split.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert optimizer_state_equal(whole.state.optimizer, split.state.optimizer)
    full_a, full_b = dict(whole.model.named_parameters()), dict(split.model.named_parameters())
    assert all(torch.equal(full_a[k], full_b[k]) for k in full_a)  # the rebuilt base is the same


def test_a_resume_on_another_base_is_refused(tmp_path, base, data, tok):
    lora_estimator(tmp_path / "run", base).train(tiny.input_fn(data, tok), max_steps=2)
    other = tmp_path / "other"
    torch.manual_seed(12)
    AutoModelForSequenceClassification.from_config(tiny.tiny_config()).save_pretrained(other)
    with pytest.raises(stoker.CheckpointMismatchError, match="trained on another base model"):
        lora_estimator(tmp_path / "run", other).train(tiny.input_fn(data, tok), max_steps=4)


def test_merge_and_save_writes_a_plain_model_with_the_adapted_outputs(tmp_path, base, data, tok):
    est = lora_estimator(tmp_path / "run", base)
    est.train(tiny.input_fn(data, tok), max_steps=4)
    merged = hf.save_pretrained(est, tmp_path / "merged", tokenizer=tok)
    assert {p.name for p in merged.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    names = set(safetensors.torch.load_file(merged / "model.safetensors"))
    assert names == set(safetensors.torch.load_file(base / "model.safetensors"))  # the base's names, no lora_
    features = tok(tiny.labelled_texts(9, seed=5)[0], padding="max_length", max_length=12, return_tensors="pt")
    with torch.no_grad():
        adapted = est.model.eval()(**features).logits
        plain = AutoModelForSequenceClassification.from_pretrained(merged).eval()(**features).logits
        unadapted = AutoModelForSequenceClassification.from_pretrained(base).eval()(**features).logits
    assert torch.allclose(plain, adapted, atol=1e-5) and not torch.allclose(plain, unadapted, atol=1e-3)
    # PEFT's own adapter folder, for tools that load adapters on a base
    adapter = hf.save_pretrained(est, tmp_path / "adapter", merge_adapters=False)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    reloaded = peft.PeftModel.from_pretrained(AutoModelForSequenceClassification.from_pretrained(base), adapter)
    with torch.no_grad():
        assert torch.allclose(reloaded.eval()(**features).logits, adapted, atol=1e-6)


def test_what_is_not_a_peft_config_or_has_nothing_to_train_is_named():
    with pytest.raises(stoker.ConfigError, match="must be a peft.PeftConfig"):
        hf.with_lora(hf.from_config(AutoModelForSequenceClassification, tiny.tiny_config()), {"r": 4})
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(stoker.ConfigError, match="no trainable parameter"):
        hf.adapters_only(frozen)
