"""The text both text recipes (``charlm``, ``bert``) train on, and its held-out split.

:class:`TextCorpusConfig` holds a text recipe's first flags: ``--model_dir``, then where the
text comes from (``--text`` files or folders, else Python's standard-library sources up to
``--corpus_bytes``) and what is held out (``--eval_text``, else the corpus's last whole files
holding ``--eval_fraction`` of its bytes). A text recipe's config subclasses it and adds its own
flags after these; :func:`split_corpus` gives the training and held-out files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data import stdlib_corpus
from ..data.text import _collect as collect_text_files  # same expansion rule as text_chars
from ..data.text import held_out_split
from .skeleton import PATHS, option


@dataclass(kw_only=True)
class TextCorpusConfig:
    """``--model_dir`` and the text flags, the first fields of a text recipe's config."""

    model_dir: str | None = option(None, "checkpoints, metrics.csv and run_spec.json (required on the command line)")
    text: list[str] | None = option(
        None, "text files or folders to train on (default: Python's standard-library sources)", **PATHS
    )
    eval_text: list[str] | None = option(
        None, "held-out text (default: the last files of the corpus, --eval_fraction of its bytes)", **PATHS
    )
    corpus_bytes: int = option(4 * 2**20, "size of the standard-library corpus (bytes)")
    eval_fraction: float = option(0.05, "fraction of the corpus bytes held out for evaluation (whole files)")


def split_corpus(config: TextCorpusConfig, *, who: str) -> tuple[list[Path], list[Path]]:
    """Training and held-out files: ``eval_text`` if given, else the corpus's last whole files
    holding at least ``eval_fraction`` of its bytes (held-out text the model never trained on).
    ``who`` names the recipe in errors."""
    files = collect_text_files(config.text, None) if config.text else stdlib_corpus(config.corpus_bytes)
    if config.eval_text:
        return files, collect_text_files(config.eval_text, None)
    return held_out_split(files, config.eval_fraction, who=who)


__all__ = ["TextCorpusConfig", "split_corpus"]
