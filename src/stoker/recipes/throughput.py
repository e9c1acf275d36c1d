"""The training speed of a recipe run: examples/sec and MFU, printed after its result line.

:class:`Throughput` is a hook that sums the wall time and the examples of the device loops. The
first loop of a process is left out where there are later ones: it pays for compilation
(``--compile``), the allocator's and the kernels' warm-up. Evaluations run between loops, so
they are not counted. MFU is the model's training FLOPs per example (the recipe's count) times
examples/sec over the peak of :func:`stoker.kernels.peak.device_peak`: the data sheet's on an
NVIDIA GPU in bf16, this machine's measured peak on a CPU.
"""

from __future__ import annotations

import torch

from ..hooks import Hook, LoopResult, RunContext


class Throughput(Hook):
    """Examples/sec of the training loops after the first, and MFU where ``flops_per_example``
    (training FLOPs of one example: forward and backward) is given."""

    phase = "timing"  # first at a loop boundary: nothing else's work is timed (the loop's time is its own)

    def __init__(self, flops_per_example: float | None = None) -> None:
        self.flops_per_example = flops_per_example
        self.loops = 0
        self.seconds = 0.0
        self.examples = 0
        self.first: tuple[float, int] = (0.0, 0)
        self.steps: tuple[int, int] | None = None  # the global steps counted: (first, last)
        self._first_steps = (0, 0)  # those of the first loop
        self.device: torch.device | None = None
        self.precision = "fp32"
        self.devices = 1  # processes training together: the examples are all of theirs, the peak one's

    def begin(self, run: RunContext) -> None:
        self.device = next(iter(run.model.parameters()), torch.zeros(())).device
        self.precision = run.info.precision
        self.devices = max(1, run.world_size)

    def after_loop(self, run: RunContext, result: LoopResult) -> None:
        if result.steps == 0:
            return
        self.loops += 1
        if self.loops == 1:  # compilation and warm-up: counted only if no other loop runs
            self.first = (result.seconds, result.examples)
            self._first_steps = (result.first_step + 1, result.global_step)
            return
        self.seconds += result.seconds
        self.examples += result.examples
        start = result.first_step + 1 if self.steps is None else self.steps[0]
        self.steps = (start, result.global_step)

    @property
    def examples_per_sec(self) -> float | None:
        """Examples/sec of the counted loops (``None`` before any loop ran)."""
        seconds, examples = (self.seconds, self.examples) if self.loops > 1 else self.first
        return examples / seconds if seconds > 0 else None

    def mfu(self) -> tuple[float, float, str] | None:
        """``(MFU, peak GFLOP/s, the peak's source)``, or ``None`` without a FLOP count or a speed."""
        speed = self.examples_per_sec
        if speed is None or not self.flops_per_example or self.device is None:
            return None
        from ..kernels.peak import device_peak

        gflops, source = device_peak(self.device, self.precision)
        if self.devices > 1:
            gflops, source = gflops * self.devices, f"{source}, x {self.devices} devices"
        return speed * self.flops_per_example / 1e9 / gflops, gflops, source

    def line(self) -> str | None:
        """``training: 174.7 examples/sec (steps 11-40), MFU 27.8 % of 989 TFLOP/s (...)``, or
        ``None`` if no loop ran."""
        speed = self.examples_per_sec
        if speed is None:
            return None
        first, last = self.steps if self.loops > 1 and self.steps else self._first_steps
        note = "" if self.loops > 1 else ", the first loop only (compilation and warm-up included)"
        text = f"training: {speed:.1f} examples/sec (steps {first}-{last}{note})"
        mfu = self.mfu()
        if mfu is not None:
            value, gflops, source = mfu
            text += f", MFU {100 * value:.1f} % of {gflops / 1000:.4g} TFLOP/s ({source})"
        return text


__all__ = ["Throughput"]
