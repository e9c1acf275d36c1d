"""``charlm``: a small Transformer-XL-style character language model trained with stoker.

What makes it Transformer-XL (Dai et al., 2019) is *segment-level recurrence*: the text is
read as ``batch_size`` contiguous streams (``stoker.data.text_chars``), each step sees the next
``seq_len`` bytes of every stream, and every layer attends over its own hidden states of the
previous ``mem_len`` bytes (the *memory*) as well as the current segment. The memory is
computed without gradient (it is a constant to the current step), so training costs one
segment of backward pass while the model sees ``seq_len + mem_len`` bytes of context.
Positions are relative (sinusoidal encodings of the query-key distance, with the two learned
biases ``u`` and ``v`` of the paper), which is what lets a query use keys from the previous
segment whose absolute positions it never saw.

In stoker the memory is the ``EstimatorSpec.cache``: ``model_fn`` returns the new memory, the
engine detaches it, hands it back as ``params["cache"]`` at the next step, saves it in every
checkpoint (so a killed run resumes with the exact memory) and starts it afresh (``None``) at
every ``evaluate`` call. ``mem_len=0`` turns the memory off (then ``cache`` is always ``None``).

Entry points: :func:`train_charlm` (Python), ``stoker train charlm`` (command line; see
:func:`add_arguments`), and :func:`estimator_from_run_spec` and :func:`eval_input_from_run_spec`
(registered for the ``run_spec.json`` kind ``charlm``, for ``stoker export`` and ``stoker
evaluate [--watch]``). They are the shared recipe skeleton (:mod:`stoker.recipes.skeleton`) run
on :data:`RECIPE`; this module fills in the model, the data, the metrics and the flags.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data import ReadOptions, text_chars
from ..errors import ConfigError
from ..estimator import Estimator
from ..hooks import Hook, LoggingHook
from ..metrics import Metric
from ..spec import EstimatorSpec, ModeKeys
from . import corpus
from .corpus import TextCorpusConfig
from .skeleton import (
    ATTENTION_CHOICES,
    ATTENTION_FORMS,
    InputFn,
    Recipe,
    attention_for,
    fused_on_cuda,
    on_changed_optimizer_option,
    option,
)

VOCAB = 256  # bytes
RUN_SPEC_KIND = "charlm"
HELP = "Transformer-XL-style character LM with segment memory carried in EstimatorSpec.cache"
DESCRIPTION = (
    "Train a small Transformer-XL-style byte-level language model on Python's standard-library "
    "sources (or --text files), logging loss, perplexity and bits per character, and evaluating "
    "bpc on a held-out slice. --mem_len 0 turns the segment memory off."
)
Cache = tuple[torch.Tensor, ...]


# ==================================================================== the model
class RelativeAttention(nn.Module):
    """Multi-head causal attention over ``[memory; segment]`` with relative positions.

    Scores are ``(q + u) . k`` (content) plus ``(q + v) . W_r r(i - j)`` (position), where
    ``r(d)`` is the sinusoidal encoding of the distance ``d`` between query ``i`` and key ``j``.

    ``attention="sdpa"``: the content scores, softmax and weighted sum in
    ``F.scaled_dot_product_attention`` with the (masked) position scores as its additive mask
    (the memory-efficient kernel on CUDA, which takes such a mask; the attention weights are not
    stored). ``"math"``: written out, as it was. They agree to fp32 rounding without dropout.
    """

    def __init__(self, d_model: int, n_head: int, d_head: int, dropout: float, attention: str = "sdpa") -> None:
        super().__init__()
        if attention not in ATTENTION_FORMS:
            raise ConfigError(f"charlm: attention={attention!r}; allowed: {', '.join(ATTENTION_FORMS)}")
        self.n_head, self.d_head = n_head, d_head
        self.attention = attention
        self.q = nn.Linear(d_model, n_head * d_head, bias=False)
        self.kv = nn.Linear(d_model, 2 * n_head * d_head, bias=False)
        self.r = nn.Linear(d_model, n_head * d_head, bias=False)
        self.out = nn.Linear(n_head * d_head, d_model, bias=False)
        self.u = nn.Parameter(torch.zeros(n_head, d_head))  # content bias
        self.v = nn.Parameter(torch.zeros(n_head, d_head))  # position bias
        self.drop = nn.Dropout(dropout)
        self.scale = d_head**-0.5

    def forward(self, x: torch.Tensor, context: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` ``[B, T, D]`` (queries), ``context`` ``[B, K, D]`` (memory then ``x``), ``pos``
        ``[K, D]`` encodings of distances ``K-1 .. 0``, ``mask`` ``[T, K]`` True where masked."""
        b, t, _ = x.shape
        k_len = context.shape[1]
        h, dh = self.n_head, self.d_head
        q = self.q(x).view(b, t, h, dh)
        k, v = self.kv(context).view(b, k_len, 2, h, dh).unbind(2)
        r = self.r(pos).view(k_len, h, dh)
        position = _rel_shift(torch.einsum("bthd,khd->bhtk", q + self.v, r))
        if self.attention == "sdpa":
            bias = (position * self.scale).masked_fill(mask, float("-inf"))
            p = self.drop.p if self.training else 0.0
            mixed = F.scaled_dot_product_attention(
                (q + self.u).transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias, p, scale=self.scale
            )
            return self.out(mixed.transpose(1, 2).reshape(b, t, h * dh))
        content = torch.einsum("bthd,bkhd->bhtk", q + self.u, k)
        scores = ((content + position) * self.scale).masked_fill(mask, float("-inf"))
        weights = self.drop(scores.softmax(-1))
        return self.out(torch.einsum("bhtk,bkhd->bthd", weights, v).reshape(b, t, h * dh))


def _rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Turn scores against positions ``K-1 .. 0`` into scores against each query's distances.

    Input ``[B, H, T, K]``: column ``p`` holds the score of distance ``K-1-p``. Output: column
    ``j`` of row ``i`` holds the score of distance ``(K - T) + i - j`` (entries with a negative
    distance are garbage and must be masked). Done with one pad and two views (no gather), as
    in Transformer-XL.
    """
    b, h, t, k = x.shape
    padded = torch.cat([x.new_zeros(b, h, t, 1), x], dim=-1).view(b, h, k + 1, t)
    return padded[:, :, 1:].reshape(b, h, t, k)


class Block(nn.Module):
    """Pre-norm Transformer block: relative attention over memory + segment, then an MLP."""

    def __init__(
        self, d_model: int, n_head: int, d_head: int, d_inner: int, dropout: float, attention: str = "sdpa"
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = RelativeAttention(d_model, n_head, d_head, dropout, attention)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_inner), nn.GELU(), nn.Linear(d_inner, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(
        self, h: torch.Tensor, memory: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        x = self.norm1(h)
        context = x if memory is None else torch.cat([self.norm1(memory), x], dim=1)
        h = h + self.drop(self.attn(x, context, pos, mask))
        return h + self.drop(self.mlp(self.norm2(h)))


class CharTransformerXL(nn.Module):
    """A byte-level Transformer-XL: ``tokens [B, T] int64`` -> ``(logits [B, T, 256], memory)``.

    ``memory`` is a tuple of one ``[B, M, d_model]`` tensor per layer: the hidden states that
    entered that layer over the last ``M <= mem_len`` bytes. Pass it back with the next segment
    of the same streams. It is returned detached, and ``None`` when ``mem_len == 0``.
    """

    inv_freq: torch.Tensor  # a buffer (register_buffer), typed for the checker

    def __init__(
        self,
        *,
        d_model: int = 128,
        n_layer: int = 3,
        n_head: int = 4,
        d_head: int = 32,
        d_inner: int = 512,
        dropout: float = 0.1,
        mem_len: int = 64,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        if d_model % 2:
            raise ConfigError(f"charlm: d_model must be even (sinusoidal encodings); got {d_model}")
        self.mem_len = mem_len
        self.d_model = d_model
        self.embed = nn.Embedding(VOCAB, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, d_head, d_inner, dropout, attention) for _ in range(n_layer))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2, dtype=torch.float32) / d_model))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # derived: not in checkpoints

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> CharTransformerXL:
        """Build from an Estimator's ``params`` (the keys of :data:`MODEL_KEYS` and ``attention``; a
        run spec written before ``attention`` existed trained the written-out form)."""
        return cls(**{k: params[k] for k in MODEL_KEYS}, attention=params.get("attention", "math"))

    def forward(self, tokens: torch.Tensor, memory: Cache | None = None) -> tuple[torch.Tensor, Cache | None]:
        if memory is not None and len(memory) != len(self.blocks):
            raise ConfigError(f"charlm: memory has {len(memory)} layers, the model {len(self.blocks)}")
        t = tokens.shape[1]
        m = 0 if memory is None else memory[0].shape[1]
        k = m + t
        distances = torch.arange(k - 1, -1, -1, device=tokens.device, dtype=self.inv_freq.dtype)
        angles = distances[:, None] * self.inv_freq[None, :]
        pos = torch.cat([angles.sin(), angles.cos()], dim=-1)
        # query i sits at position m + i of the keys and sees keys 0 .. m + i
        mask = torch.ones(t, k, dtype=torch.bool, device=tokens.device).triu(1 + m)
        h = self.drop(self.embed(tokens))
        inputs: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            inputs.append(h)
            h = block(h, None if memory is None else memory[i], pos, mask)
        logits = self.head(self.norm(h))
        return logits, self._next_memory(inputs, memory)

    def _next_memory(self, inputs: list[torch.Tensor], memory: Cache | None) -> Cache | None:
        if self.mem_len == 0:
            return None
        # Detached here (not only by the engine): the next segment must not backpropagate into
        # this one. Detaching the inputs of the cat (rather than a no_grad block, which
        # torch.export records as a node that torch.export.load then rejects) builds no graph.
        if memory is None:
            return tuple(x[:, -self.mem_len :].detach() for x in inputs)
        return tuple(
            torch.cat([old.detach(), x.detach()], dim=1)[:, -self.mem_len :]
            for old, x in zip(memory, inputs, strict=True)
        )


MODEL_KEYS: tuple[str, ...] = ("d_model", "n_layer", "n_head", "d_head", "d_inner", "dropout", "mem_len")


# ==================================================================== model_fn
class BitsPerCharacter(Metric):
    """Mean negative log-likelihood in bits: per-example mean loss (nats) summed, / count / ln 2."""

    def update(self, nats: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"total": nats.detach().to(torch.float64), "count": torch.ones_like(nats, dtype=torch.float64)}

    def compute(self, totals: Mapping[str, float]) -> float:
        return totals["total"] / totals["count"] / math.log(2) if totals["count"] else float("nan")


class Perplexity(BitsPerCharacter):
    """``exp`` of the mean loss over all characters (not the mean of per-row perplexities)."""

    def compute(self, totals: Mapping[str, float]) -> float:
        return math.exp(min(totals["total"] / totals["count"], 700.0)) if totals["count"] else float("nan")


def charlm_model_fn(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor | None, mode: ModeKeys, params: dict[str, Any]
) -> EstimatorSpec:
    """Next-byte cross-entropy with the segment memory carried in ``EstimatorSpec.cache``.

    TRAIN: mean loss over every byte of the batch; the new memory as ``cache``. EVAL:
    per-row mean losses (nats), ``bpc`` and ``ppl``, and the memory as ``cache`` (stoker
    starts it at ``None`` in every ``evaluate`` call). PREDICT is stateless (rows of a
    prediction batch need not continue each other): ``next_byte_logits [B, 256]`` and
    ``next_byte [B]`` for the byte after each row.
    """
    memory = None if mode == ModeKeys.PREDICT else params.get("cache")
    if memory is not None and memory[0].shape[0] != features.shape[0]:
        memory = None  # a batch of other streams (e.g. a different batch size): start afresh
    logits, new_memory = model(features, memory)
    if mode == ModeKeys.PREDICT:
        last = logits[:, -1]
        return EstimatorSpec(predictions={"next_byte_logits": last, "next_byte": last.argmax(-1)})
    assert labels is not None, "charlm: TRAIN and EVAL need target bytes"
    nats = F.cross_entropy(logits.reshape(-1, VOCAB).float(), labels.reshape(-1), reduction="none").view(labels.shape)
    if mode == ModeKeys.TRAIN:
        return EstimatorSpec(loss=nats.mean(), cache=new_memory)
    per_row = nats.mean(1)
    return EstimatorSpec(
        loss=per_row,
        eval_metrics={"bpc": BitsPerCharacter()(per_row), "ppl": Perplexity()(per_row)},
        cache=new_memory,
    )


# ==================================================================== config and data
@dataclass(kw_only=True)
class CharLMConfig(TextCorpusConfig):
    """Everything the ``charlm`` recipe needs; each field is also a ``stoker train charlm`` flag."""

    seq_len: int = option(32, "bytes per segment (one step reads one segment of every stream)")
    mem_len: int = option(64, "bytes of memory each layer attends to; 0 turns the memory off")
    d_model: int = option(128, "model width")
    n_layer: int = option(3, "Transformer blocks")
    n_head: int = option(4, "attention heads")
    d_head: int = option(32, "width of each head")
    d_inner: int = option(512, "hidden width of the MLPs")
    dropout: float = option(0.1, "dropout rate")
    attention: str = option(
        "auto",
        "attention kernel: sdpa (torch's scaled_dot_product_attention, the position scores its additive mask), "
        "math (written out, the attention weights an ordinary saved tensor) or auto (sdpa on CUDA, math on the "
        "CPU, where it measured as fast)",
        choices=ATTENTION_CHOICES,
    )
    batch_size: int = option(16, "global batch: parallel streams of text")
    eval_batch_size: int = option(16, "streams of the held-out text")
    max_steps: int = option(500, "train to this global step")
    lr: float = option(2e-3, "peak Adam learning rate")
    warmup_steps: int = option(50, "linear warm-up steps, then cosine decay to lr/10 at max_steps")
    clip_norm: float = option(0.25, "gradient norm clipping")
    eval_every_n_steps: int = option(
        250,
        "evaluate (and checkpoint) every N steps; 0: no evaluation in the training process "
        "(run `stoker evaluate --watch MODEL_DIR` beside it)",
    )
    eval_steps: int | None = option(None, "batches per evaluation (default: all of the held-out text)")
    save_checkpoints_steps: int = option(100, "checkpoint every N steps")
    keep_checkpoint_max: int = option(3, "newest checkpoints kept (the best by bpc is kept too)")
    iterations_per_loop: int = option(10, "steps per device loop")
    log_every_n_steps: int = option(50, "log loss / ppl / bpc every N steps")
    seed: int = option(0, "seed of the initial weights and dropout")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    on_changed_optimizer: str = on_changed_optimizer_option()

    def model_params(self) -> dict[str, Any]:
        """The ``params`` that define the model and its data shape (saved in ``run_spec.json``)."""
        params = {k: getattr(self, k) for k in (*MODEL_KEYS, "seq_len")}
        return {**params, "attention": attention_for(self.attention, self.device).value}


def split_corpus(config: CharLMConfig) -> tuple[list[Path], list[Path]]:
    """Training and held-out files: ``eval_text`` if given, else the corpus's last whole files
    holding at least ``eval_fraction`` of its bytes (held-out text the model never trained on)."""
    return corpus.split_corpus(config, who="charlm")


def input_fns(config: CharLMConfig) -> tuple[InputFn, InputFn]:
    """``(train_input_fn, eval_input_fn)``: contiguous byte streams, in order (Transformer-XL
    batching: row ``i`` of each batch continues row ``i`` of the previous one)."""
    train_files, eval_files = split_corpus(config)

    def train_input_fn(params: dict[str, Any]) -> Iterable[Any]:
        return text_chars(train_files, seq_len=params["seq_len"], read=ReadOptions().for_replica(params))

    def eval_input_fn(params: dict[str, Any]) -> Iterable[Any]:
        return text_chars(eval_files, seq_len=params["seq_len"], read=ReadOptions(num_epochs=1).for_replica(params))

    return train_input_fn, eval_input_fn


# ==================================================================== the Estimator
class CharLMEstimator(Estimator):
    """An Estimator whose default log line is a language model's: loss, ppl and bpc."""

    def default_hooks(self) -> list[Hook]:
        # Swap the built-in LoggingHook for one with language_model=True (adding a second
        # LoggingHook would print every line twice).
        return [
            LoggingHook(h.every_n_steps, language_model=True) if type(h) is LoggingHook else h
            for h in super().default_hooks()
        ]


def _schedule(params: dict[str, Any], optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    warmup, total = max(int(params["warmup_steps"]), 1), max(int(params["max_steps"]), 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _adam(params: dict[str, Any], parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    parameters = list(parameters)  # fused on CUDA (one launch per step), the default elsewhere
    return torch.optim.Adam(parameters, lr=params["lr"], fused=fused_on_cuda(parameters) or None)


def _check(config: CharLMConfig) -> str | None:
    return f"--mem_len must be >= 0; got {config.mem_len}" if config.mem_len < 0 else None


def _report(config: CharLMConfig, results: Mapping[str, float]) -> str:
    return (
        f"held-out at step {results['global_step']}: bpc = {results['bpc']:.4f}, ppl = {results['ppl']:.3f}, "
        f"loss = {results['loss']:.4f} nats/char (mem_len {config.mem_len}, model_dir {config.model_dir})"
    )


# ==================================================================== the recipe
RECIPE: Recipe[CharLMConfig] = Recipe(
    name=RUN_SPEC_KIND,
    config_class=CharLMConfig,
    help=HELP,
    description=DESCRIPTION,
    model=CharTransformerXL.from_params,
    model_fn=charlm_model_fn,
    input_fns=input_fns,
    optimizer=_adam,
    lr_schedule=_schedule,
    train_params=("lr", "warmup_steps", "max_steps"),
    keep_best=("bpc", "min"),
    estimator_class=CharLMEstimator,
    positive=(
        "seq_len",
        "batch_size",
        "eval_batch_size",
        "max_steps",
        "d_model",
        "n_layer",
        "n_head",
        "d_head",
        "d_inner",
    ),
    check=_check,
    report=_report,
    example_features=lambda config: torch.zeros(2, config.seq_len, dtype=torch.int64),
    older_params={"attention": "math"},  # run specs from before --attention trained the written-out form
)
add_arguments, run, main = RECIPE.add_arguments, RECIPE.run, RECIPE.main
build_estimator, config_error = RECIPE.build_estimator, RECIPE.config_error
estimator_from_run_spec, eval_input_from_run_spec = RECIPE.register()


def train_charlm(
    config: CharLMConfig | None = None, *, hooks: Sequence[Hook] = (), **overrides: Any
) -> dict[str, float]:
    """Train (or resume) the character LM to ``max_steps``, evaluating every
    ``eval_every_n_steps``; return the last evaluation (``loss``, ``bpc``, ``ppl``, ``global_step``).
    With ``eval_every_n_steps=0`` it only trains (a watching evaluator evaluates) and returns
    ``{"global_step": ...}``.

    ``overrides`` replace fields of ``config`` (``train_charlm(model_dir="runs/c", mem_len=0)``).
    Writes ``run_spec.json`` into ``model_dir`` so ``stoker export`` / ``stoker inspect`` know
    how the run was made.
    """
    return RECIPE.train(config, hooks=hooks, **overrides)


__all__ = [
    "RECIPE",
    "BitsPerCharacter",
    "CharLMConfig",
    "CharLMEstimator",
    "CharTransformerXL",
    "Perplexity",
    "add_arguments",
    "build_estimator",
    "charlm_model_fn",
    "config_error",
    "estimator_from_run_spec",
    "eval_input_from_run_spec",
    "input_fns",
    "main",
    "run",
    "split_corpus",
    "train_charlm",
]


if __name__ == "__main__":
    sys.exit(main())
