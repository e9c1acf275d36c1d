"""A Hugging Face ``datasets.Dataset`` as a stoker source, and the collate steps for text.

:class:`HFDatasetSource` is an :class:`~stoker.data.IndexedSource` like every built-in source:
epoch ``e``'s order is a permutation drawn from ``(seed, e)``, replica ``r`` of ``n`` reads
``order[r::n]``, and the position ``(epoch, batch)`` is the whole state, so a resumed run reads
bitwise the batches an uninterrupted one would have read. A batch is one ``dataset[indices]``
read (a gather from the memory-mapped Arrow table: the data is never loaded whole) handed to a
collate function that makes ``(features, labels)`` tensors of it:

- :class:`Tokenize` tokenises raw text as each batch is built (nothing to prepare; the
  tokenizer runs every epoch);
- :class:`Pad` pads columns tokenised once beforehand with ``dataset.map(...)`` (which
  ``datasets`` caches beside the Arrow files).

Both pad to a fixed ``max_length`` by default: every batch has one shape, which a compiled step
and the device loop like best.

The saved state also records the dataset's fingerprint (``datasets``' hash of its content and
the transforms that made it), so a resume into other data is refused instead of misread.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from ..data.base import IndexedSource
from ..data.options import ReadOptions
from ..errors import ConfigError, DataError, UserCodeError

Rows = Mapping[str, Sequence[Any]]
Collate = Callable[[Rows], Any]


class HFDatasetSource(IndexedSource):
    """Batches of a ``datasets.Dataset``, made by ``collate``. See :func:`hf_dataset`."""

    name = "hf_dataset"

    def __init__(
        self,
        dataset: Any,
        *,
        read: ReadOptions,
        collate: Collate,
        train: bool = True,
        check_fingerprint: bool = True,
    ) -> None:
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "column_names") and hasattr(dataset, "num_rows")):
            raise UserCodeError(
                "hf_dataset: dataset must be a datasets.Dataset (one split, such as dataset['train']); "
                f"got {type(dataset).__name__}"
            )
        if not callable(collate):
            raise UserCodeError(f"hf_dataset: collate must be callable (rows -> batch); got {type(collate).__name__}")
        self.dataset = dataset
        self.collate = collate
        self.train = bool(train)
        fingerprint = getattr(dataset, "_fingerprint", None) if check_fingerprint else None
        # 60 bits of the fingerprint: the saved state is JSON integers, and this one is compared, not read
        self._fingerprint = (
            None if fingerprint is None else int(hashlib.sha256(fingerprint.encode()).hexdigest()[:15], 16)
        )
        super().__init__(read.for_mode(self.train))

    @property
    def num_examples(self) -> int:
        return int(self.dataset.num_rows)

    def _identity(self) -> dict[str, int]:
        return {} if self._fingerprint is None else {"fingerprint": self._fingerprint}

    def load_batch(self, indices: torch.Tensor, epoch: int) -> Any:
        rows = self.dataset[indices.tolist()]  # one gather: {column: [values in batch order]}
        return self.collate(rows)


def hf_dataset(
    dataset: Any,
    *,
    read: ReadOptions,
    collate: Collate,
    train: bool = True,
    check_fingerprint: bool = True,
) -> HFDatasetSource:
    """Batches of a ``datasets.Dataset`` (Arrow, memory-mapped), deterministic and checkpointable.

    Args:
        dataset: one split (``load_from_disk(path)``, ``load_dataset(...)["train"]``,
            ``Dataset.from_dict(...)``).
        read: how to read (:class:`~stoker.data.ReadOptions`; in an ``input_fn``,
            ``ReadOptions(...).for_replica(params)``). ``shuffle`` and ``num_epochs`` left
            ``None`` follow ``train``. Worker processes (``num_workers``) each read the
            memory-mapped files themselves.
        collate: ``rows -> batch``: ``rows`` is ``dataset[indices]``, a dict ``column -> list``
            in batch order; the batch is what ``model_fn`` gets, ``(features, labels)`` (see
            :class:`Tokenize` and :class:`Pad`).
        train: training shuffles and repeats forever; else one pass in order (evaluation).
        check_fingerprint: refuse to resume into a dataset whose ``datasets`` fingerprint differs
            from the one the checkpoint was written with. ``datasets`` makes a random fingerprint
            when it cannot hash a ``map`` function (it warns so); pass ``False`` then.
    """
    return HFDatasetSource(dataset, read=read, collate=collate, train=train, check_fingerprint=check_fingerprint)


def _labels(rows: Rows, column: str | None) -> torch.Tensor | None:
    if column is None:
        return None
    if column not in rows:
        raise DataError(f"the label column {column!r} is not in the dataset; its columns are {sorted(rows)}")
    return torch.as_tensor(rows[column])


@dataclass(frozen=True, kw_only=True)
class Tokenize:
    """Collate raw text: tokenise a batch's text column(s) as the batch is built.

    Args:
        tokenizer: a ``transformers`` tokenizer (``AutoTokenizer.from_pretrained(folder)``).
        text: the text column, or two (a sentence pair: ``("premise", "hypothesis")``).
        label: the label column (``None``: features only, for prediction).
        max_length: tokens per example, truncated beyond.
        padding: ``"max_length"`` (every batch ``[batch, max_length]``: one shape for a compiled
            step) or ``"longest"`` (to the batch's longest example: less work, varying shapes).

    Returns ``(features, labels)``: the tokenizer's tensors (``input_ids``, ``attention_mask``,
    ...) and the labels as a tensor; features only when ``label`` is ``None``.
    """

    tokenizer: Any
    text: str | tuple[str, str] = "text"
    label: str | None = "label"
    max_length: int = 128
    padding: Literal["max_length", "longest"] = "max_length"

    def __post_init__(self) -> None:
        if self.padding not in ("max_length", "longest"):
            raise ConfigError(f"Tokenize: padding must be 'max_length' or 'longest'; got {self.padding!r}")
        if not isinstance(self.max_length, int) or self.max_length < 1:
            raise ConfigError(f"Tokenize: max_length must be a positive integer; got {self.max_length!r}")

    def __call__(self, rows: Rows) -> Any:
        columns = (self.text,) if isinstance(self.text, str) else tuple(self.text)
        missing = [c for c in columns if c not in rows]
        if missing:
            raise DataError(f"Tokenize: no text column {missing[0]!r}; the dataset's columns are {sorted(rows)}")
        encoded = self.tokenizer(
            *[list(rows[c]) for c in columns],
            padding=self.padding,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        features = dict(encoded)
        labels = _labels(rows, self.label)
        return features if labels is None else (features, labels)


@dataclass(frozen=True, kw_only=True)
class Pad:
    """Collate text tokenised beforehand (``dataset.map(lambda b: tokenizer(b["text"]), batched=True)``):
    pad the batch's token columns with the tokenizer's padding token.

    Args:
        tokenizer: the tokenizer the columns were made with (its padding token and side).
        columns: the model's input columns (``input_ids``, ``attention_mask``, ...).
        label: the label column (``None``: features only).
        max_length: pad every batch to this many tokens (longer examples are an error: truncate
            when tokenising); ``None`` pads to the batch's longest example.
    """

    tokenizer: Any
    columns: tuple[str, ...] = ("input_ids", "attention_mask")
    label: str | None = "label"
    max_length: int | None = None

    def __call__(self, rows: Rows) -> Any:
        missing = [c for c in self.columns if c not in rows]
        if missing:
            raise DataError(f"Pad: no column {missing[0]!r}; the dataset's columns are {sorted(rows)}")
        longest = max(len(ids) for ids in rows[self.columns[0]])
        if self.max_length is not None and longest > self.max_length:
            raise DataError(
                f"Pad: an example has {longest} tokens, more than max_length={self.max_length}; "
                "truncate when tokenising"
            )
        padded = self.tokenizer.pad(
            {c: list(rows[c]) for c in self.columns},
            padding="max_length" if self.max_length is not None else "longest",
            max_length=self.max_length,
            return_tensors="pt",
        )
        features = dict(padded)
        labels = _labels(rows, self.label)
        return features if labels is None else (features, labels)


__all__ = ["Collate", "HFDatasetSource", "Pad", "Rows", "Tokenize", "hf_dataset"]
