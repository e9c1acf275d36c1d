"""Fine-tune a Hugging Face sequence classifier on stoker (docs/migration/from-huggingface.md).

The task, made on this machine: sentences from the docstrings of Python's standard library,
labelled 1 when they speak of a return value (the word "return", "returns" or "returned"), a
rule the model must learn to look for anywhere in the sentence. The model is a small
``transformers`` classifier: a local ``save_pretrained`` folder given with ``--base``, or
otherwise a 2-layer DistilBERT made from a config. Nothing is downloaded.

    python examples/finetune_hf.py --model_dir DIR --steps 300

Everything goes into DIR: the tokenizer and the data set (made on the first run, read again
after), stoker's checkpoints, and at the end ``DIR/hf``, the fine-tuned model as a
``save_pretrained`` folder with its tokenizer, which it then loads back with plain
``transformers`` to print the held-out accuracy. Run it again with the same DIR and a larger
``--steps`` and it resumes from the newest checkpoint, exactly where it stopped.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DistilBertConfig,
    PreTrainedTokenizerFast,
)

import stoker
import stoker.hf as hf
from stoker.data import ReadOptions, stdlib_corpus

MAX_LENGTH = 32  # tokens per sentence: every batch is [batch, 32]
RETURN_WORDS = {"return", "returns", "returned"}


def docstring_sentences(limit: int = 6000) -> list[str]:
    """First sentences of the standard library's docstrings: 4 to 30 words each, unique, sorted."""
    found: set[str] = set()
    for path in stdlib_corpus(max_bytes=2 * 2**20):  # the first 2 MiB of modules, by name
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Module):
                doc = ast.get_docstring(node)
                sentence = " ".join((doc or "").split(". ")[0].split())
                if 4 <= len(sentence.split()) <= 30:
                    found.add(sentence)
    return sorted(found)[:limit]


def label(sentence: str) -> int:
    return int(bool(RETURN_WORDS & set(re.findall(r"[a-z]+", sentence.lower()))))


def prepare(model_dir: Path) -> tuple[PreTrainedTokenizerFast, Dataset, Dataset]:
    """The tokenizer and the training and held-out sets, made on the first run and read after
    (the data sets memory-mapped from their Arrow files)."""
    data_dir = model_dir / "data"
    if not (data_dir / "held_out").exists():
        sentences = docstring_sentences()
        rows = {"text": sentences, "label": [label(s) for s in sentences]}
        everything = Dataset.from_dict(rows)
        fifth = [i % 5 == 0 for i in range(len(sentences))]  # every fifth sentence is held out
        everything.select([i for i, out in enumerate(fifth) if not out]).save_to_disk(str(data_dir / "train"))
        everything.select([i for i, out in enumerate(fifth) if out]).save_to_disk(str(data_dir / "held_out"))
    train = Dataset.load_from_disk(str(data_dir / "train"))
    held_out = Dataset.load_from_disk(str(data_dir / "held_out"))
    if not (model_dir / "tokenizer" / "tokenizer.json").exists():
        words = Tokenizer(models.WordLevel(unk_token="[UNK]"))
        words.normalizer = normalizers.Lowercase()
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.WordLevelTrainer(min_frequency=2, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
        words.train_from_iterator(list(train["text"]), trainer)
        PreTrainedTokenizerFast(
            tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
        ).save_pretrained(model_dir / "tokenizer")
    return AutoTokenizer.from_pretrained(model_dir / "tokenizer"), train, held_out


def small_config(tokenizer: PreTrainedTokenizerFast) -> DistilBertConfig:
    """The model made when no ``--base`` is given: a 2-layer DistilBERT of width 64 (157k weights here)."""
    return DistilBertConfig(
        vocab_size=len(tokenizer),
        dim=64,
        n_layers=2,
        n_heads=4,
        hidden_dim=128,
        max_position_embeddings=MAX_LENGTH,
        num_labels=2,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_estimator(model_dir: Path, tokenizer: PreTrainedTokenizerFast, base: str | None) -> stoker.Estimator:
    if base is not None:  # a local save_pretrained folder; a new classification head if it has none
        model = hf.from_pretrained(AutoModelForSequenceClassification, base, num_labels=2)
    else:
        model = hf.from_config(AutoModelForSequenceClassification, small_config(tokenizer))
    return stoker.Estimator(
        model=model,
        model_fn=hf.model_fn,  # the model's own loss; per-example loss and accuracy in evaluation
        optimizer=lambda params, parameters: torch.optim.AdamW(parameters, lr=params["learning_rate"]),
        config=stoker.RunConfig(
            model_dir=model_dir,
            iterations_per_loop=10,
            save_checkpoints_steps=50,
            log_every_n_steps=50,
            progress_bar=False,
        ),
        params={"learning_rate": 1e-3},
        train_batch_size=32,
    )


def held_out_accuracy(folder: Path, held_out: Dataset) -> float:
    """The accuracy of the saved folder, loaded with plain transformers (no stoker)."""
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    correct = 0
    for start in range(0, held_out.num_rows, 128):
        rows = held_out[start : start + 128]
        features = tokenizer(rows["text"], padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
        with torch.no_grad():
            predicted = model(**features).logits.argmax(-1)
        correct += int((predicted == torch.tensor(rows["label"])).sum())
    return correct / held_out.num_rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", required=True, help="data, tokenizer, checkpoints and the hf/ folder")
    parser.add_argument("--steps", type=int, default=300, help="train up to this global step; default %(default)s")
    parser.add_argument("--base", help="a local save_pretrained folder to start from (default: a new small model)")
    args = parser.parse_args()
    model_dir = Path(args.model_dir)

    tokenizer, train, held_out = prepare(model_dir)
    collate = hf.Tokenize(tokenizer=tokenizer, max_length=MAX_LENGTH)  # tokenised as each batch is built

    def train_input_fn(params: dict) -> hf.HFDatasetSource:
        # shuffled every epoch from (seed, epoch); its position is saved in every checkpoint
        return hf.hf_dataset(train, read=ReadOptions(seed=0).for_replica(params), collate=collate)

    est = build_estimator(model_dir, tokenizer, args.base)
    latest = est.latest_checkpoint()
    print(
        f"{train.num_rows} training and {held_out.num_rows} held-out sentences, "
        f"{sum(train['label'])} of the training ones about a return value; "
        + (f"resuming from {latest.name}" if latest else "new run")
    )
    est.train(train_input_fn, max_steps=args.steps)
    folder = hf.save_pretrained(est, model_dir / "hf", tokenizer=tokenizer)
    accuracy = held_out_accuracy(folder, held_out)
    print(f"step {est.global_step}: held-out accuracy {accuracy:.4f} ({folder}, read back with transformers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
