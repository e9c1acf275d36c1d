"""stoker.hf.data: a datasets.Dataset read like every stoker source (order, shards, exact resume), and
the collate steps that tokenise or pad."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("datasets")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

import stoker  # noqa: E402
import stoker.hf as hf  # noqa: E402
from helpers import hf as tiny  # noqa: E402
from stoker.data import ReadOptions  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    return tiny.tokenizer()


@pytest.fixture(scope="module")
def on_disk(tmp_path_factory):
    """50 labelled sentences saved and loaded back: memory-mapped Arrow files."""
    return tiny.dataset(50, folder=tmp_path_factory.mktemp("data") / "sentences")


def index_batches(source, n: int) -> list[list[int]]:  # noqa: ANN001
    return [next(source)[0]["index"].tolist() for _ in range(n)]


def by_index(rows):  # noqa: ANN001, ANN201
    return {"index": torch.tensor(rows["index"])}, torch.tensor(rows["label"])


@pytest.mark.parametrize(
    "read", [ReadOptions(seed=3, batch_size=4), ReadOptions(seed=5, batch_size=3, num_shards=2, shard_index=1)]
)
def test_the_order_and_shards_are_those_of_every_source(on_disk, read):
    # the examples of each batch, over three epochs, are the ones stoker.data.arrays reads in that place
    assert on_disk.cache_files  # memory-mapped from disk, not in memory
    source = iter(hf.hf_dataset(on_disk, read=read, collate=by_index))
    arrays = iter(stoker.data.arrays({"index": torch.arange(50)}, torch.zeros(50), read=read))
    per_epoch = len(source)
    assert per_epoch == len(arrays) == 50 // read.num_shards // read.batch_size
    assert index_batches(source, 3 * per_epoch) == index_batches(arrays, 3 * per_epoch)


def test_resume_reads_bitwise_the_batches_an_uninterrupted_run_reads(tmp_path, tok):
    tiny.dataset(50).save_to_disk(str(tmp_path / "data"))
    read, collate = ReadOptions(seed=1, batch_size=4), hf.Tokenize(tokenizer=tok, max_length=10)
    whole = iter(hf.hf_dataset(Dataset.load_from_disk(str(tmp_path / "data")), read=read, collate=collate))
    expected = [next(whole) for _ in range(20)]  # past the end of an epoch (12 batches)
    first = iter(hf.hf_dataset(Dataset.load_from_disk(str(tmp_path / "data")), read=read, collate=collate))
    for _ in range(7):
        next(first)
    state = first.state_dict()
    resumed = hf.hf_dataset(Dataset.load_from_disk(str(tmp_path / "data")), read=read, collate=collate)
    resumed.load_state_dict(state)
    for (features, labels), (want_features, want_labels) in zip(
        [next(resumed) for _ in range(13)], expected[7:], strict=True
    ):
        assert features.keys() == want_features.keys() == {"input_ids", "attention_mask"}
        assert all(torch.equal(features[k], want_features[k]) for k in features) and torch.equal(labels, want_labels)


def test_worker_processes_build_the_same_batches(on_disk, tok):
    collate = hf.Tokenize(tokenizer=tok, max_length=10)
    inline = iter(hf.hf_dataset(on_disk, read=ReadOptions(seed=2, batch_size=5), collate=collate))
    workers = iter(hf.hf_dataset(on_disk, read=ReadOptions(seed=2, batch_size=5, num_workers=2), collate=collate))
    for _ in range(12):
        (a, la), (b, lb) = next(inline), next(workers)
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(la, lb)
    workers.close()


def test_a_resume_into_other_data_is_refused(tok):
    collate = hf.Tokenize(tokenizer=tok)
    first = iter(hf.hf_dataset(tiny.dataset(50, seed=0), read=ReadOptions(batch_size=4), collate=collate))
    next(first)
    state = first.state_dict()
    other = tiny.dataset(50, seed=1)  # the same size, other sentences
    with pytest.raises(stoker.CheckpointMismatchError, match="fingerprint"):
        hf.hf_dataset(other, read=ReadOptions(batch_size=4), collate=collate).load_state_dict(state)
    unchecked = hf.hf_dataset(other, read=ReadOptions(batch_size=4), collate=collate, check_fingerprint=False)
    unchecked.load_state_dict(state)
    assert (unchecked.epoch, unchecked.batch) == (0, 1)
    same = hf.hf_dataset(tiny.dataset(50, seed=0), read=ReadOptions(batch_size=4), collate=collate)
    same.load_state_dict(state)  # the same content made again: the same fingerprint
    assert (same.epoch, same.batch) == (0, 1)


def test_evaluation_reads_every_example_once_in_order(on_disk):
    source = hf.hf_dataset(on_disk, read=ReadOptions(batch_size=8), collate=by_index, train=False)
    batches = [features["index"].tolist() for features, _ in source]
    assert batches[-1] == [48, 49] and sum(batches, []) == list(range(50))


def test_tokenize_pads_to_max_length_and_takes_sentence_pairs(tok):
    rows = {"text": ["the red cat", "a dog"], "other": ["runs", "big old tree"], "label": [1, 0]}
    features, labels = hf.Tokenize(tokenizer=tok, max_length=6)(rows)
    assert features["input_ids"].shape == (2, 6) and labels.tolist() == [1, 0]
    assert features["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]
    assert features["input_ids"][0, :3].tolist() == tok.convert_tokens_to_ids(["the", "red", "cat"])
    longest, _ = hf.Tokenize(tokenizer=tok, max_length=6, padding="longest")(rows)
    assert longest["input_ids"].shape == (2, 3)
    pair, _ = hf.Tokenize(tokenizer=tok, text=("text", "other"), max_length=8)(rows)
    assert pair["attention_mask"].sum(1).tolist() == [4, 5]
    assert isinstance(hf.Tokenize(tokenizer=tok, label=None)(rows), dict)
    with pytest.raises(stoker.DataError, match="no text column 'sentence'"):
        hf.Tokenize(tokenizer=tok, text="sentence")(rows)
    with pytest.raises(stoker.ConfigError, match="padding must be"):
        hf.Tokenize(tokenizer=tok, padding="max")


def test_pad_makes_of_pretokenised_columns_what_tokenize_makes_of_text(on_disk, tok):
    tokenised = on_disk.map(lambda batch: tok(batch["text"], truncation=True, max_length=10), batched=True)
    read = ReadOptions(seed=4, batch_size=6)
    padded = iter(hf.hf_dataset(tokenised, read=read, collate=hf.Pad(tokenizer=tok, max_length=10)))
    raw = iter(hf.hf_dataset(on_disk, read=read, collate=hf.Tokenize(tokenizer=tok, max_length=10)))
    for _ in range(10):
        (a, la), (b, lb) = next(padded), next(raw)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) and torch.equal(la, lb)
    with pytest.raises(stoker.DataError, match="more than max_length=2"):
        hf.Pad(tokenizer=tok, max_length=2)(tokenised[:3])


def test_what_is_not_a_dataset_or_a_collate_is_named():
    with pytest.raises(stoker.UserCodeError, match="must be a datasets.Dataset"):
        hf.hf_dataset({"text": ["a"]}, read=ReadOptions(batch_size=1), collate=by_index)
    with pytest.raises(stoker.UserCodeError, match="collate must be callable"):
        hf.hf_dataset(tiny.dataset(4), read=ReadOptions(batch_size=1), collate="text")
