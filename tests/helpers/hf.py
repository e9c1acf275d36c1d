"""Tiny Hugging Face models, tokenizers and data sets made on the machine (no download), for tests/hf.

Import only after ``pytest.importorskip("transformers")``: this module needs the hf extra.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import DistilBertConfig, PreTrainedTokenizerFast

import stoker
import stoker.hf as hf

WORDS = "the a red blue green cat dog bird runs sleeps sees big small old new fast slow tree house river".split()
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def labelled_texts(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    """``n`` sentences of 3 to 9 words; label 1 when "red" is among them (a rule a tiny model learns)."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]
    return texts, [int("red" in t.split()) for t in texts]


def tokenizer(texts: list[str] | None = None) -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on ``texts`` (default: the test vocabulary), as transformers wraps it."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts or [" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=SPECIAL))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )


def tiny_config(num_labels: int = 2, dropout: float = 0.1, **overrides: Any) -> DistilBertConfig:
    """DistilBERT with 2 layers of width 32 over a 32-token vocabulary (the test words and specials)."""
    settings: dict[str, Any] = dict(
        vocab_size=32,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=32,
        num_labels=num_labels,
        dropout=dropout,
        attention_dropout=dropout,
        seq_classif_dropout=dropout,
    )
    settings.update(overrides)
    return DistilBertConfig(**settings)


def dataset(n: int = 96, seed: int = 0, folder: Path | None = None) -> Dataset:
    """The labelled sentences as a Dataset (with an ``index`` column); memory-mapped from ``folder`` if given."""
    texts, labels = labelled_texts(n, seed)
    data = Dataset.from_dict({"text": texts, "label": labels, "index": list(range(n))})
    if folder is None:
        return data
    data.save_to_disk(str(folder))
    return Dataset.load_from_disk(str(folder))


def input_fn(data: Dataset, tok: PreTrainedTokenizerFast, *, train: bool = True, seed: int = 0, max_length: int = 12):  # noqa: ANN201
    """An input_fn reading ``data`` tokenised to ``max_length`` (training: shuffled, forever)."""
    collate = hf.Tokenize(tokenizer=tok, max_length=max_length)
    return lambda params: hf.hf_dataset(
        data, read=stoker.data.ReadOptions(seed=seed).for_replica(params), collate=collate, train=train
    )


def classifier(
    model_dir: Path | None = None, *, lr: float = 1e-3, model: Any = None, warm_start_from: Any = None, **config: Any
) -> stoker.Estimator:
    """An Estimator fine-tuning the tiny classifier (AdamW, batch 8, loops of 2, no log lines).
    ``config``: RunConfig's fields."""
    from transformers import AutoModelForSequenceClassification

    settings: dict[str, Any] = dict(model_dir=model_dir, iterations_per_loop=2, log_every_n_steps=None)
    settings.update(config)
    return stoker.Estimator(
        model=model or hf.from_config(AutoModelForSequenceClassification, tiny_config()),
        model_fn=hf.model_fn,
        optimizer=lambda params, parameters: torch.optim.AdamW(parameters, lr=lr),
        config=stoker.RunConfig(**settings),
        train_batch_size=8,
        warm_start_from=warm_start_from,
    )
