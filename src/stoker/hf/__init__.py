"""Hugging Face models and data on stoker (the ``hf`` extra: ``pip install 'stoker[hf]'``).

A ``transformers`` model is an ``nn.Module`` like any other, so what this package adds is the
glue a Hugging Face user would otherwise write, and the round trip back to the format every
serving and evaluation tool reads:

- :mod:`stoker.hf.model`: the Estimator's ``model=`` from a local folder
  (:func:`from_pretrained`) or a config (:func:`from_config`), and a ``model_fn``
  (:func:`model_fn`) that trains on the model's own loss and evaluates on its logits;
- :mod:`stoker.hf.data`: a ``datasets.Dataset`` as a checkpointable stoker source
  (:func:`hf_dataset`), with the same order, sharding and exact resume as every other source,
  and the collate steps that make a batch of rows into tensors (:class:`Tokenize`, :class:`Pad`);
- :mod:`stoker.hf.lora`: LoRA (PEFT) adapters on a frozen base whose checkpoints hold only the
  trainable weights (:func:`with_lora`);
- :mod:`stoker.hf.save`: any checkpoint of such a run, sharded ones included, written as a
  ``save_pretrained`` folder (:func:`save_pretrained`), adapters merged or kept apart.

Warm start from such a folder is ``Estimator(warm_start_from="path/to/folder")``. Nothing here
downloads: a model or tokenizer comes from a folder on disk or is built from a config. The guide
is docs/migration/from-huggingface.md.
"""

from __future__ import annotations

try:  # the extra, checked once with the one line that says what to install
    import datasets as _datasets  # noqa: F401
    import transformers as _transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - the extra is installed where the tests run
    raise ImportError(
        f"stoker.hf needs the hf extra (transformers, datasets, peft): pip install 'stoker[hf]' ({e})"
    ) from e

from .data import HFDatasetSource, Pad, Tokenize, hf_dataset
from .lora import adapters_only, with_lora
from .model import from_config, from_pretrained, model_fn
from .save import save_pretrained

__all__ = [
    "HFDatasetSource",
    "Pad",
    "Tokenize",
    "adapters_only",
    "from_config",
    "from_pretrained",
    "hf_dataset",
    "model_fn",
    "save_pretrained",
    "with_lora",
]
