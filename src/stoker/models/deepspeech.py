"""DeepSpeech2 (Amodei et al., 2015) as tf_cnn_benchmarks defines it, trained with CTC.

Input: a spectrogram of ``T`` frames x 161 frequency bins. Two convolutions (41x11 stride 2x2
and 21x11 stride 2x1, 32 filters, zero padding 20x5 and 10x5, no bias), each followed by a
ReLU6 and then batch norm (the reference's order); the 32 x 81 output per frame is flattened
into 2,592 features. Then five bidirectional LSTM layers of 800 units per direction, the
concatenated 1,600 outputs batch-normalised before every layer but the first and once more
after the last, and a dense layer to 29 characters (28 letters and symbols, then the CTC
blank). The LSTMs run over the whole padded length, as the reference's ``dynamic_rnn`` does.

The reference's LSTM cell (TensorFlow's ``BasicLSTMCell``) has one bias per gate, not
PyTorch's two, and adds a constant 1 to the forget gate; here each direction owns one bias,
started at 1 on the forget gate (the same function at initialisation, the same gradients),
and the recurrence runs through ``torch.lstm`` with a zero second bias (cuDNN on CUDA).

The loss is the reference's CTC: ``log(softmax + 1e-7)`` of the logits over the output frames,
the output length of each utterance scaled from its input length, labels of its label length,
utterances whose labels cannot fit their frames contributing zero, the mean over the batch.

Synthetic data (``synthetic_utterances``): LibriSpeech-shaped batches padded to the reference's
3,494 frames, with variable lengths: each utterance has between half and all of the frames
(uniform noise, zero after its end) and a transcript of 1 to 576 characters that fits them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .registry import register_model

NUM_FEATURE_BINS = 161
MAX_TIME_STEPS = 3494
MAX_LABEL_LENGTH = 576
CONV_FILTERS = 32
BLANK = 28  # the last of the 29 classes
_BN_MOMENTUM = 1.0 - 0.997  # TensorFlow's decay 0.997
_BN_EPSILON = 1e-5
_LOG_EPSILON = 1e-7  # Keras' backend epsilon, added to the probabilities before the log


def _glorot_uniform_(weight: torch.Tensor, fan_in: int, fan_out: int) -> None:
    """TensorFlow's default kernel initialiser (its layers' and its RNN cells')."""
    if not weight.is_meta:
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        nn.init.uniform_(weight, -bound, bound)


class ConvBNLayer(nn.Sequential):
    """Zero padding, a bias-free convolution, ReLU6, then batch norm."""

    def __init__(self, in_ch: int, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]) -> None:
        conv = nn.Conv2d(in_ch, CONV_FILTERS, kernel, stride, padding=padding, bias=False)
        area = kernel[0] * kernel[1]
        _glorot_uniform_(conv.weight, in_ch * area, CONV_FILTERS * area)
        super().__init__(conv, nn.ReLU6(), nn.BatchNorm2d(CONV_FILTERS, eps=_BN_EPSILON, momentum=_BN_MOMENTUM))


class BiLSTM(nn.Module):
    """A bidirectional LSTM over ``[B, T, input_size]`` with one bias per gate (TensorFlow's cell).

    Returns ``[B, T, 2 * hidden_size]``: the forward outputs, then the backward ones.
    """

    zero_bias: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        gates = 4 * hidden_size
        self.weight_ih = nn.ParameterList([nn.Parameter(torch.empty(gates, input_size)) for _ in range(2)])
        self.weight_hh = nn.ParameterList([nn.Parameter(torch.empty(gates, hidden_size)) for _ in range(2)])
        self.bias = nn.ParameterList([nn.Parameter(torch.zeros(gates)) for _ in range(2)])
        for p in (*self.weight_ih, *self.weight_hh):
            # TensorFlow's cell has one [input + hidden, 4 * hidden] kernel, initialised as a whole.
            _glorot_uniform_(p, input_size + hidden_size, gates)
        with torch.no_grad():
            for b in self.bias:
                if not b.is_meta:
                    b[hidden_size : 2 * hidden_size] = 1.0  # torch's gate order i, f, g, o: the forget gate
        # torch.lstm takes two biases per direction; the second stays zero.
        self.register_buffer("zero_bias", torch.zeros(gates), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        h0 = x.new_zeros(2, b, self.hidden_size)
        weights: list[torch.Tensor] = []
        for d in range(2):
            weights += [self.weight_ih[d], self.weight_hh[d], self.bias[d], self.zero_bias]
        out, _, _ = torch.lstm(x, (h0, h0), weights, True, 1, 0.0, self.training, True, True)
        return out


class SequenceBatchNorm(nn.BatchNorm1d):
    """Batch norm of ``[B, T, C]`` over the ``C`` features (statistics over batch and time)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class DeepSpeech2(nn.Module):
    """Spectrograms ``{"spectrogram": [B, T, 161], "lengths": [B]}`` -> ``(logits [B, T', 29], lengths [B])``."""

    def __init__(self, num_classes: int = 29, num_rnn_layers: int = 5, rnn_hidden_size: int = 800) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.conv = nn.Sequential(
            ConvBNLayer(1, (41, 11), (2, 2), (20, 5)),
            ConvBNLayer(CONV_FILTERS, (21, 11), (2, 1), (10, 5)),
        )
        bins = (NUM_FEATURE_BINS + 2 * 5 - 11) // 2 + 1  # the second convolution keeps the bins
        width = 2 * rnn_hidden_size
        self.rnns = nn.ModuleList()
        self.norms = nn.ModuleList()
        for i in range(num_rnn_layers):
            self.norms.append(SequenceBatchNorm(width, eps=_BN_EPSILON, momentum=_BN_MOMENTUM) if i else nn.Identity())
            self.rnns.append(BiLSTM(CONV_FILTERS * bins if i == 0 else width, rnn_hidden_size))
        self.final_norm = SequenceBatchNorm(width, eps=_BN_EPSILON, momentum=_BN_MOMENTUM)
        self.fc = nn.Linear(width, num_classes)
        _glorot_uniform_(self.fc.weight, width, num_classes)
        if not self.fc.bias.is_meta:
            nn.init.zeros_(self.fc.bias)

    def forward(self, features: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        spectrogram = features["spectrogram"]
        x = self._frames(self.conv(spectrogram.unsqueeze(1)))
        logits = self._recurrent(x)
        # The frames of each utterance that the output keeps, as the reference scales them.
        lengths = torch.div(features["lengths"] * x.shape[1], spectrogram.shape[1], rounding_mode="floor")
        return logits, lengths

    @staticmethod
    def _frames(x: torch.Tensor) -> torch.Tensor:
        """``[B, 32, T', bins]`` -> ``[B, T', 32 * bins]``: per frame, each filter's bins in turn."""
        b, c, t, f = x.shape
        return x.permute(0, 2, 1, 3).reshape(b, t, c * f)

    def _recurrent(self, x: torch.Tensor) -> torch.Tensor:
        for norm, rnn in zip(self.norms, self.rnns, strict=True):
            x = rnn(norm(x))
        return self.fc(self.final_norm(x))

    def count_flops(self, features: dict[str, torch.Tensor]) -> int:
        """Forward FLOPs of ``features`` (``FlopCounterMode``'s count), without running 874 LSTM steps.

        The convolutions are counted on the real input; everything after them costs the same
        per output frame (the LSTM steps, the logits layer), so it is counted on one frame and
        multiplied. That is exact, and takes a second instead of minutes on the meta device,
        where every step of the recurrence is a round of Python dispatch.
        """
        with FlopCounterMode(display=False) as conv_counter:
            x = self._frames(self.conv(features["spectrogram"].unsqueeze(1)))
        with FlopCounterMode(display=False) as frame_counter:
            self._recurrent(x[:, :1])
        return conv_counter.get_total_flops() + frame_counter.get_total_flops() * x.shape[1]


def ctc_loss(outputs: tuple[torch.Tensor, torch.Tensor], labels: dict[str, torch.Tensor]) -> torch.Tensor:
    """The reference's CTC loss: mean over the batch; an utterance whose labels do not fit counts 0."""
    logits, lengths = outputs
    log_probs = torch.log(torch.softmax(logits.float(), dim=-1) + _LOG_EPSILON).transpose(0, 1)  # [T, B, C]
    losses = F.ctc_loss(
        log_probs,
        labels["labels"],
        lengths,
        labels["lengths"],
        blank=logits.shape[-1] - 1,
        reduction="none",
        zero_infinity=True,
    )
    return losses.mean()


def synthetic_utterances(
    batch_size: int, num_classes: int, gen: torch.Generator, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Padded LibriSpeech-shaped utterances of random lengths and transcripts that fit them."""
    frames = torch.randint(MAX_TIME_STEPS // 2, MAX_TIME_STEPS + 1, (batch_size,), generator=gen, device=device)
    spectrogram = torch.rand(batch_size, MAX_TIME_STEPS, NUM_FEATURE_BINS, generator=gen, device=device)
    spectrogram *= (torch.arange(MAX_TIME_STEPS, device=device) < frames[:, None]).unsqueeze(-1)
    # The output keeps about a quarter of the frames; CTC needs at most one frame per character
    # (plus one per repeat), so the transcripts get at most half the output frames.
    fits = torch.clamp(frames // 8, max=MAX_LABEL_LENGTH)
    label_lengths = 1 + (torch.rand(batch_size, generator=gen, device=device) * fits).long().clamp(max=fits - 1)
    labels = torch.randint(0, num_classes - 1, (batch_size, MAX_LABEL_LENGTH), generator=gen, device=device)
    labels *= torch.arange(MAX_LABEL_LENGTH, device=device) < label_lengths[:, None]
    return {"spectrogram": spectrogram, "lengths": frames}, {"labels": labels, "lengths": label_lengths}


@register_model(
    "deepspeech2",
    dataset="librispeech",
    default_image_size=0,
    default_batch_size=128,
    default_learning_rate=0.0005,
    synthetic_batch=synthetic_utterances,
    loss=ctc_loss,
    example="utterances",
)
def deepspeech2(num_classes: int) -> nn.Module:
    """DeepSpeech2: 2 convolutions, 5 bidirectional LSTM layers of 800 units, CTC over 29 characters."""
    return DeepSpeech2(num_classes)
