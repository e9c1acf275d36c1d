"""``bert``: a small BERT masked-language-model pretraining on byte-level text.

The model (:class:`BertMLM`) is BERT's encoder (Devlin et al., 2019) at a small size: learned
token and position embeddings, ``num_layers`` post-norm Transformer layers, and an MLM head.
Tokens are bytes (``0..255``) plus one ``[MASK]`` id, so no vocabulary has to be built and the
standard-library corpus needs no preprocessing.

Pretraining data (:class:`MaskedTextWindows`): the corpus is cut into non-overlapping windows of
``seq_len`` bytes (one example each), shuffled every epoch. In every window exactly
``round(mask_prob * seq_len)`` positions are chosen as prediction targets; each chosen byte is
replaced by ``[MASK]`` (80%), a random byte (10%) or left as it is (10%). Every random number
comes from :func:`stoker.data.example_uniforms` keyed by ``(seed, epoch, window)``, so a resumed
run, any number of replicas or workers, and every evaluation see exactly the same masks.

The model is laid out for splitting (pipeline stages, activation recompute): its children are
``embeddings``, ``layers.0 .. layers.N-1`` (an ``nn.ModuleList``) and ``head``, each taking and
giving one tensor, and the loss is its own function (:func:`mlm_loss`) of ``(logits,
labels)``. Because every row has the same number of targets, the mean over all targets of a
batch equals the mean of its micro-batches' means: splitting a batch changes nothing.

Entry points: :func:`train_bert` (Python), ``stoker train bert`` (command line; see
:func:`add_arguments`), and :func:`estimator_from_run_spec` (``run_spec.json`` kind ``bert``,
for ``stoker export``). They are the shared recipe skeleton (:mod:`stoker.recipes.skeleton`)
run on :data:`RECIPE`; this module fills in the model, the data, the metrics and the flags.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..config import RunConfig
from ..data import IndexedSource, ReadOptions, example_uniforms
from ..data.base import DataError
from ..data.text import _collect as collect_text_files  # same expansion rule as text_chars
from ..distributed import PipelineConfig
from ..errors import ConfigError
from ..hooks import Hook
from ..kernels.linear import FAST_LINEAR_MODES
from ..memory.recompute import select_modules
from ..metrics import Mean
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
    standard_run_config,
)

MASK_ID = 256  # bytes are 0..255
VOCAB = 257
IGNORE = -100  # label of a position that is not a prediction target (F.cross_entropy's ignore_index)
RUN_SPEC_KIND = "bert"
HELP = "small BERT masked-LM pretraining on byte-level text (recompute, bf16-sr)"
DESCRIPTION = (
    "Pretrain a small byte-level BERT with the masked-language-model objective on Python's "
    "standard-library sources (or --text files); evaluation reports MLM loss and accuracy on "
    "held-out text."
)


# ==================================================================== the model
class BertEmbeddings(nn.Module):
    """``tokens [B, T] int64`` -> ``LayerNorm(token + position embeddings)`` ``[B, T, H]``."""

    def __init__(self, hidden_size: int, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.token = nn.Embedding(VOCAB, hidden_size)
        self.position = nn.Embedding(max_positions, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.position.num_embeddings:
            raise DataError(
                f"bert: sequences of {t} tokens, longer than the model's {self.position.num_embeddings} positions"
            )
        positions = torch.arange(t, device=tokens.device)
        return self.drop(self.norm(self.token(tokens) + self.position(positions)))


class SelfAttention(nn.Module):
    """Bidirectional multi-head self-attention (no mask: every window is full).

    ``attention="sdpa"``: ``F.scaled_dot_product_attention``, which runs flash or memory-efficient
    kernels on CUDA and the fastest kernel torch has on CPU; the attention weights are never
    stored. ``"math"``: the same function written out, so the attention weights are an ordinary
    saved tensor: what recompute saves is then plain to see and to measure (docs/memory.md).
    The two agree to fp32 rounding without dropout; with dropout they draw different masks.
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float, attention: str = "sdpa") -> None:
        super().__init__()
        if hidden_size % num_heads:
            raise ConfigError(f"bert: hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
        if attention not in ATTENTION_FORMS:
            raise ConfigError(f"bert: attention={attention!r}; allowed: {', '.join(ATTENTION_FORMS)}")
        self.num_heads = num_heads
        self.attention = attention
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        heads = self.num_heads
        q, k, v = self.qkv(x).view(b, t, 3, heads, h // heads).permute(2, 0, 3, 1, 4)  # 3 x [B, heads, T, d]
        if self.attention == "sdpa":  # scale: 1/sqrt(d), the default
            p = self.drop.p if self.training else 0.0
            mixed = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        else:
            mixed = self.drop((q @ k.transpose(-1, -2) * (h // heads) ** -0.5).softmax(-1)) @ v
        return self.out(mixed.transpose(1, 2).reshape(b, t, h))


class BertLayer(nn.Module):
    """One post-norm encoder layer: ``x = LN(x + attn(x))``, ``x = LN(x + FFN(x))``."""

    def __init__(
        self, hidden_size: int, num_heads: int, intermediate_size: int, dropout: float, attention: str = "sdpa"
    ) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden_size, num_heads, dropout, attention)
        self.norm1 = nn.LayerNorm(hidden_size, eps=1e-12)
        self.ffn = nn.Sequential(
            nn.Linear(hidden_size, intermediate_size), nn.GELU(), nn.Linear(intermediate_size, hidden_size)
        )
        self.norm2 = nn.LayerNorm(hidden_size, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.attention(x)))
        return self.norm2(x + self.drop(self.ffn(x)))


class MLMHead(nn.Module):
    """``[B, T, H]`` -> logits ``[B, T, VOCAB]``: dense + GELU + LayerNorm, then the decoder.

    The decoder is not tied to the token embedding (BERT ties them): tied weights would have
    to live on the first and the last pipeline stage at once.
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=1e-12)
        self.decoder = nn.Linear(hidden_size, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(F.gelu(self.dense(x))))


class BertMLM(nn.Module):
    """Byte-level BERT for masked-LM: ``tokens [B, T] int64`` -> ``logits [B, T, VOCAB]``.

    Children, in order: ``embeddings``, ``layers`` (``layers.0`` ...) and ``head``; the forward
    pass is exactly their composition, so a split into consecutive pieces (pipeline stages) or a
    wrapper around any of them (activation recompute) computes the same function.
    """

    def __init__(
        self,
        *,
        hidden_size: int = 128,
        num_layers: int = 4,
        num_heads: int = 4,
        intermediate_size: int = 512,
        dropout: float = 0.1,
        max_positions: int = 64,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(hidden_size, max_positions, dropout)
        self.layers = nn.ModuleList(
            BertLayer(hidden_size, num_heads, intermediate_size, dropout, attention) for _ in range(num_layers)
        )
        self.head = MLMHead(hidden_size)
        self.apply(_init_weights)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> BertMLM:
        """Build from an Estimator's ``params`` (the keys of :data:`MODEL_KEYS`, ``seq_len`` and
        ``attention``; a run spec written before ``attention`` existed trained the written-out form)."""
        return cls(
            **{k: params[k] for k in MODEL_KEYS},
            max_positions=params["seq_len"],
            attention=params.get("attention", "math"),
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def _init_weights(module: nn.Module) -> None:
    # BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


MODEL_KEYS: tuple[str, ...] = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "dropout")


# ==================================================================== loss and model_fn
def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats) over the prediction targets (labels other than ``-100``).

    Computed in fp32 whatever the logits' dtype. Every row of a batch has the same number of
    targets, so this mean over a batch is the mean of any equal split's means (micro-batches,
    pipeline stages' micro-batches, replicas).
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE)


def _targets_per_row(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-target losses and hits, ``[B, k]`` each (every row has the same ``k`` targets)."""
    targets = labels != IGNORE
    b, k = labels.shape[0], int(targets[0].sum())
    nats = F.cross_entropy(logits[targets].float(), labels[targets], reduction="none").view(b, k)
    hits = (logits[targets].argmax(-1) == labels[targets]).view(b, k)
    return nats, hits


def bert_model_fn(
    model: nn.Module, features: torch.Tensor, labels: torch.Tensor | None, mode: ModeKeys, params: dict[str, Any]
) -> EstimatorSpec:
    """Masked-LM: TRAIN returns :func:`mlm_loss`; EVAL per-row MLM losses with ``mlm_accuracy``
    (over every target of the held-out text) and ``mlm_loss``; PREDICT the most likely byte at
    every position (``token_ids [B, T]``)."""
    logits = model(features)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(predictions={"token_ids": logits.argmax(-1)})
    assert labels is not None, "bert: TRAIN and EVAL need the masked-LM labels"
    if mode == ModeKeys.TRAIN:
        return EstimatorSpec(loss=mlm_loss(logits, labels))
    nats, hits = _targets_per_row(logits, labels)
    return EstimatorSpec(
        loss=nats.mean(1),
        eval_metrics={"mlm_accuracy": Mean()(hits.float()), "mlm_loss": Mean()(nats)},
        predictions={"token_ids": logits.argmax(-1)},
    )


# ==================================================================== data
class MaskedTextWindows(IndexedSource):
    """``(inputs, labels)`` int64 ``[batch_size, seq_len]``: masked byte windows and their targets.

    Example ``i`` is bytes ``[i * seq_len, (i + 1) * seq_len)`` of the files concatenated.
    ``labels`` holds the original byte at the ``round(mask_prob * seq_len)`` (at least 1) target
    positions and ``-100`` elsewhere; ``inputs`` has each target replaced by ``[MASK]`` (256) with
    probability 0.8, by a uniformly random byte with 0.1, and kept with 0.1. The randomness is
    :func:`example_uniforms` of ``(seed, epoch, i)``: the position is the whole state.
    """

    name = "masked_text"
    prefers_inline_fetch = True  # a batch is an index into a tensor in memory

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        seq_len: int,
        read: ReadOptions,
        mask_prob: float = 0.15,
    ) -> None:
        if not isinstance(seq_len, int) or seq_len < 2:
            raise ConfigError(f"masked_text: seq_len must be an integer >= 2; got {seq_len!r}")
        if not 0.0 < mask_prob < 1.0:
            raise ConfigError(f"masked_text: mask_prob must be in (0, 1); got {mask_prob!r}")
        self.files = collect_text_files(paths, None)
        data = (
            np.concatenate([np.fromfile(f, dtype=np.uint8) for f in self.files])
            if self.files
            else np.zeros(0, np.uint8)
        )
        self.seq_len = seq_len
        self.num_targets = max(1, round(mask_prob * seq_len))
        count = data.size // seq_len
        if count < 1:
            raise DataError(
                f"masked_text: {data.size} bytes in {len(self.files)} file(s) do not fill one window of {seq_len}"
            )
        self.windows = torch.from_numpy(data[: count * seq_len].reshape(count, seq_len).copy())
        super().__init__(read)

    @property
    def num_examples(self) -> int:
        return int(self.windows.shape[0])

    def _identity(self) -> dict[str, int]:
        return {"seq_len": self.seq_len, "num_targets": self.num_targets}

    def load_batch(self, indices: torch.Tensor, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        t, k = self.seq_len, self.num_targets
        tokens = self.windows[indices].long()
        u = torch.from_numpy(example_uniforms(self.seed, epoch, indices, t + 2 * k))
        positions = u[:, :t].argsort(1)[:, :k]  # k distinct positions, every k-subset equally likely
        choice, random_byte = u[:, t : t + k], (u[:, t + k :] * 256).long()
        original = tokens.gather(1, positions)
        replaced = torch.where(
            choice < 0.8, torch.full_like(original, MASK_ID), torch.where(choice < 0.9, random_byte, original)
        )
        labels = torch.full_like(tokens, IGNORE).scatter_(1, positions, original)
        return tokens.scatter(1, positions, replaced), labels


# ==================================================================== config
PRECISION_CHOICES: tuple[str, ...] = ("fp32", "bf16", "bf16-sr")


@dataclass(kw_only=True)
class BertConfig(TextCorpusConfig):
    """Everything the ``bert`` recipe needs; each field is also a ``stoker train bert`` flag."""

    seq_len: int = option(64, "bytes per example (window); also the model's positions")
    mask_prob: float = option(0.15, "fraction of each window's bytes that are prediction targets")
    hidden_size: int = option(128, "model width")
    num_layers: int = option(4, "encoder layers")
    num_heads: int = option(4, "attention heads")
    intermediate_size: int = option(512, "hidden width of the feed-forward blocks")
    dropout: float = option(0.1, "dropout rate")
    attention: str = option(
        "auto",
        "attention kernel: sdpa (torch's scaled_dot_product_attention: flash / memory-efficient on CUDA), math "
        "(written out, the attention weights an ordinary saved tensor, as docs/memory.md measures) or auto "
        "(sdpa on CUDA, math on the CPU, where it measured as fast or faster; docs/results/transformer.md)",
        choices=ATTENTION_CHOICES,
    )
    compile: str = option(
        "none",
        "torch.compile: none, module (the model) or step (forward, backward and update; docs/device_loop.md)",
        choices=("none", "module", "step"),
    )
    batch_size: int = option(32, "global batch (windows per step)")
    eval_batch_size: int = option(64, "windows per evaluation batch")
    max_steps: int = option(500, "train to this global step")
    lr: float = option(1e-3, "peak AdamW learning rate")
    weight_decay: float = option(0.01, "AdamW weight decay")
    warmup_steps: int = option(50, "linear warm-up steps, then linear decay to 0 at max_steps")
    clip_norm: float = option(1.0, "gradient norm clipping (0: none)")
    precision: str = option(
        "fp32",
        f"numeric precision: {', '.join(PRECISION_CHOICES)} "
        "(bf16-sr: bf16 weights and AdamW state, stochastic rounding)",
        choices=PRECISION_CHOICES,
    )
    fast_linear: str = option(
        "auto",
        "CPU: nn.Linear on oneDNN's inner product: auto (each layer shape where it measured at least 5 percent "
        "faster than the BLAS on this machine; cached), on, or off (docs/bench-reference.md)",
        choices=FAST_LINEAR_MODES,
    )
    recompute: list[str] | None = option(
        None,
        "recompute activations in backward: 'all', or module-name patterns such as 'layers.*' (docs/memory.md)",
        nargs="+",
        metavar="MODULES",
    )
    hidden_layers_per_stage: int = option(
        0,
        "pipeline parallelism: encoder layers per stage (embeddings go with the first, the head with the last); "
        "0: no pipeline. Under torchrun the processes are --replicas x stages (docs/model_parallel.md)",
    )
    replicas: int = option(
        0,
        "data-parallel replicas; with --hidden_layers_per_stage, torchrun must start replicas x stages processes "
        "(0: WORLD_SIZE / stages)",
    )
    pipeline_microbatches: int = option(4, "micro-batches per replica batch in a pipelined run")
    pipeline_schedule: str = option("1f1b", "pipeline schedule: gpipe or 1f1b", choices=("gpipe", "1f1b"))
    eval_every_n_steps: int = option(250, "evaluate (and checkpoint) every N steps")
    eval_steps: int | None = option(None, "batches per evaluation (default: all of the held-out text)")
    save_checkpoints_steps: int = option(100, "checkpoint every N steps")
    keep_checkpoint_max: int = option(3, "newest checkpoints kept (the best by MLM accuracy is kept too)")
    iterations_per_loop: int = option(10, "steps per device loop")
    log_every_n_steps: int = option(50, "log the loss every N steps")
    seed: int = option(0, "seed of the initial weights, data order, masks and dropout")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    on_changed_optimizer: str = on_changed_optimizer_option()

    def model_params(self) -> dict[str, Any]:
        """The ``params`` that define the model and its data shape (saved in ``run_spec.json``)."""
        params = {k: getattr(self, k) for k in (*MODEL_KEYS, "seq_len", "mask_prob")}
        return {**params, "attention": attention_for(self.attention, self.device).value}

    def recompute_spec(self) -> str | tuple[str, ...] | None:
        """``recompute`` as ``RunConfig.recompute`` takes it (``["all"]`` is ``"all"``)."""
        if not self.recompute:
            return None
        return "all" if list(self.recompute) == ["all"] else tuple(self.recompute)

    def pipeline_split(self) -> tuple[str, ...] | None:
        """``PipelineConfig.split`` for ``hidden_layers_per_stage`` (``None``: one stage)."""
        k = self.hidden_layers_per_stage
        if k < 1 or k >= self.num_layers:
            return None
        return tuple(f"layers.{i}" for i in range(k, self.num_layers, k))

    def pipeline(self) -> PipelineConfig | None:
        """``RunConfig.pipeline`` for ``hidden_layers_per_stage`` (``None``: one stage)."""
        split = self.pipeline_split()
        if split is None:
            return None
        return PipelineConfig(split=split, microbatches=self.pipeline_microbatches, schedule=self.pipeline_schedule)

    def run_config(self) -> RunConfig:
        """The ``RunConfig`` of the run (checkpoints every ``save_checkpoints_steps``, best kept by accuracy)."""
        return standard_run_config(
            self,
            keep_best=("mlm_accuracy", "max"),
            precision=self.precision,
            fast_linear=self.fast_linear,
            recompute=self.recompute_spec(),
            pipeline=self.pipeline(),
            compile=self.compile,
        )


def split_corpus(config: BertConfig) -> tuple[list[Path], list[Path]]:
    """Training and held-out files: ``eval_text`` if given, else the corpus's last whole files
    holding at least ``eval_fraction`` of its bytes."""
    return corpus.split_corpus(config, who="bert")


def input_fns(config: BertConfig) -> tuple[InputFn, InputFn]:
    """``(train_input_fn, eval_input_fn)``: shuffled masked windows of the training files, and
    one pass over the held-out windows with masks that are the same at every evaluation."""
    train_files, eval_files = split_corpus(config)

    def train_input_fn(params: dict[str, Any]) -> Iterable[Any]:
        return MaskedTextWindows(
            train_files,
            seq_len=params["seq_len"],
            read=ReadOptions(seed=config.seed).for_replica(params),
            mask_prob=params["mask_prob"],
        )

    def eval_input_fn(params: dict[str, Any]) -> Iterable[Any]:
        return MaskedTextWindows(
            eval_files,
            seq_len=params["seq_len"],
            read=ReadOptions(shuffle=False, seed=0, num_epochs=1).for_replica(params),
            mask_prob=params["mask_prob"],
        )

    return train_input_fn, eval_input_fn


# ==================================================================== optimizer and schedule
def _schedule(params: dict[str, Any], optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    warmup, total = max(int(params["warmup_steps"]), 1), max(int(params["max_steps"]), 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(total - warmup, 1))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_optimizer(params: dict[str, Any], parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW; biases and LayerNorm weights (1-dim parameters) get no weight decay, as in BERT.
    On CUDA it is torch's fused AdamW (:func:`fused_on_cuda`)."""
    parameters = list(parameters)
    decay = [p for p in parameters if p.dim() > 1]
    no_decay = [p for p in parameters if p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": params["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=params["lr"], fused=fused_on_cuda(parameters) or None)


# ==================================================================== flag checks and the report
def _check(config: BertConfig) -> str | None:
    """The bert checks after the sizes: window, heads, mask, layout and recompute flags."""
    if config.seq_len < 2:
        return f"--seq_len must be >= 2; got {config.seq_len}"
    if config.hidden_size % config.num_heads:
        return f"--hidden_size ({config.hidden_size}) must be divisible by --num_heads ({config.num_heads})"
    if not 0.0 < config.mask_prob < 1.0:
        return f"--mask_prob must be in (0, 1); got {config.mask_prob}"
    problem = pipeline_error(config, int(os.environ.get("WORLD_SIZE", "1") or 1))
    if problem is not None:
        return problem
    if config.recompute_spec() is not None:
        with torch.device("meta"):  # names only: no memory, no initialisation
            model = BertMLM(**{k: getattr(config, k) for k in MODEL_KEYS}, max_positions=config.seq_len)
        try:
            select_modules(model, config.recompute_spec())  # type: ignore[arg-type]
        except ValueError as e:
            return f"--recompute: {str(e).removeprefix('RunConfig.recompute: ')}"
    return None


def pipeline_error(config: BertConfig, world_size: int) -> str | None:
    """What is wrong with the layout flags for ``world_size`` processes (``None``: nothing)."""
    for name in ("hidden_layers_per_stage", "replicas"):
        if getattr(config, name) < 0:
            return f"--{name} must be >= 0; got {getattr(config, name)}"
    if config.pipeline_microbatches < 1:
        return f"--pipeline_microbatches must be >= 1; got {config.pipeline_microbatches}"
    k = config.hidden_layers_per_stage
    if k > config.num_layers:
        return f"--hidden_layers_per_stage ({k}) is more than --num_layers ({config.num_layers})"
    split = config.pipeline_split()
    stages = 1 if split is None else len(split) + 1
    if world_size > 1 and config.replicas and config.replicas * stages != world_size:
        return (
            f"--replicas {config.replicas} x {stages} stage(s) (--hidden_layers_per_stage {k} of {config.num_layers} "
            f"layers) needs {config.replicas * stages} processes; torchrun started {world_size}"
        )
    if world_size == 1 and config.replicas > 1:
        return (
            f"--replicas {config.replicas} needs torchrun: torchrun --nproc_per_node={config.replicas * stages} "
            "-m stoker train bert ..."
        )
    if world_size == 1:
        return None  # one process trains the unsplit model
    if world_size % stages:
        return f"{stages} pipeline stages need a multiple of {stages} processes; torchrun started {world_size}"
    replicas = world_size // stages
    for flag, batch in (("--batch_size", config.batch_size), ("--eval_batch_size", config.eval_batch_size)):
        if batch % replicas:
            return f"{flag} ({batch}) is not divisible by the {replicas} replicas"
    if split is not None and (config.batch_size // replicas) % config.pipeline_microbatches:
        return (
            f"--pipeline_microbatches ({config.pipeline_microbatches}) must divide the per-replica batch "
            f"(--batch_size {config.batch_size} / {replicas} replicas)"
        )
    return None


def training_flops_per_example(config: BertConfig) -> float:
    """Training FLOPs of one window (forward and backward, 3x the forward), as MFU counts them:
    6 x the matmul weights x ``seq_len`` (the encoder's four attention projections and two
    feed-forward matrices per layer, the head's dense layer and decoder), plus the attention's
    12 x layers x ``seq_len``^2 x hidden (``QK^T`` and the weighted sum). Recompute's second
    forward is not counted: MFU counts the model's FLOPs, not the work done."""
    h, t, layers = config.hidden_size, config.seq_len, config.num_layers
    weights = layers * (4 * h * h + 2 * h * config.intermediate_size) + h * h + h * VOCAB
    return 6.0 * weights * t + 12.0 * layers * t * t * h


def _stages_note(config: BertConfig) -> str:
    stages = 1 + len(config.pipeline_split() or ())
    alone = int(os.environ.get("WORLD_SIZE", "1") or 1) == 1
    return f"{stages} (one process: unsplit)" if stages > 1 and alone else str(stages)


def _report(config: BertConfig, results: Mapping[str, float]) -> str:
    return (
        f"held-out at step {results['global_step']}: mlm_accuracy = {results['mlm_accuracy']:.4f}, "
        f"mlm_loss = {results['mlm_loss']:.4f} nats (ppl {math.exp(min(results['mlm_loss'], 700.0)):.3f}), "
        f"precision {config.precision}, recompute {' '.join(config.recompute or ['none'])}, "
        f"attention {config.model_params()['attention']}, compile {config.compile}, "
        f"stages {_stages_note(config)}, model_dir {config.model_dir}"
    )


# ==================================================================== the recipe
RECIPE: Recipe[BertConfig] = Recipe(
    name=RUN_SPEC_KIND,
    config_class=BertConfig,
    help=HELP,
    description=DESCRIPTION,
    model=BertMLM.from_params,
    model_fn=bert_model_fn,
    input_fns=input_fns,
    optimizer=make_optimizer,
    lr_schedule=_schedule,
    train_params=("lr", "weight_decay", "warmup_steps", "max_steps"),
    run_config=BertConfig.run_config,
    positive=(
        "seq_len",
        "batch_size",
        "eval_batch_size",
        "max_steps",
        "hidden_size",
        "num_layers",
        "num_heads",
        "intermediate_size",
    ),
    check=_check,
    report=_report,
    example_features=lambda config: torch.zeros(2, config.seq_len, dtype=torch.int64),
    flops_per_example=training_flops_per_example,
    older_params={"attention": "math"},  # run specs from before --attention trained the written-out form
)
add_arguments, run, main = RECIPE.add_arguments, RECIPE.run, RECIPE.main
build_estimator, config_error = RECIPE.build_estimator, RECIPE.config_error
estimator_from_run_spec, eval_input_from_run_spec = RECIPE.register()


def train_bert(config: BertConfig | None = None, *, hooks: Sequence[Hook] = (), **overrides: Any) -> dict[str, float]:
    """Train (or resume) to ``max_steps``, evaluating every ``eval_every_n_steps``; return the last
    evaluation (``loss``, ``mlm_loss``, ``mlm_accuracy``, ``global_step``).

    ``overrides`` replace fields of ``config`` (``train_bert(model_dir="runs/b", max_steps=100)``).
    Writes ``run_spec.json`` into ``model_dir`` for ``stoker export`` / ``stoker inspect``.
    """
    return RECIPE.train(config, hooks=hooks, **overrides)


__all__ = [
    "IGNORE",
    "ATTENTION_CHOICES",
    "MASK_ID",
    "RECIPE",
    "VOCAB",
    "BertConfig",
    "BertLayer",
    "BertMLM",
    "MaskedTextWindows",
    "add_arguments",
    "bert_model_fn",
    "build_estimator",
    "config_error",
    "estimator_from_run_spec",
    "eval_input_from_run_spec",
    "fused_on_cuda",
    "input_fns",
    "main",
    "make_optimizer",
    "mlm_loss",
    "pipeline_error",
    "run",
    "split_corpus",
    "train_bert",
    "training_flops_per_example",
]


if __name__ == "__main__":
    sys.exit(main())
