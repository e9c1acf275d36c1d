"""TensorFlow's stateless random stream in pure Python, and the TensorFlow peer for the tests.

Enough of TensorFlow's random machinery to replay ``tf.image.stateless_sample_distorted_bounding_box``
for a seed: Philox-4x32-10, the stateless seed scrambling, the one-at-a-time adapter, and the
float and exact-integer draws of ``SimplePhilox``. Written from the published algorithm
(Salmon et al., "Parallel random numbers: as easy as 1, 2, 3") and TensorFlow's documented
behaviour; the tests compare its boxes with TensorFlow's own.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np

M32 = 0xFFFFFFFF
_MUL_A, _MUL_B = 0xD2511F53, 0xCD9E8D57
_WEYL_A, _WEYL_B = 0x9E3779B9, 0xBB67AE85

TF_PYTHON = Path(os.environ.get("PEERS_DIR", Path.home() / ".cache" / "stoker-peers")) / "tfvenv" / "bin" / "python"


def philox4x32(counter: list[int], key: list[int]) -> list[int]:
    """Ten rounds of Philox-4x32 on ``counter`` (4 words) under ``key`` (2 words)."""
    c = list(counter)
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + _WEYL_A) & M32, (k1 + _WEYL_B) & M32
        p0 = _MUL_A * c[0]
        p1 = _MUL_B * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
    return c


class StatelessPhilox:
    """The 32-bit draws a stateless TensorFlow kernel makes for ``seed = (seed0, seed1)``."""

    def __init__(self, seed0: int, seed1: int) -> None:
        s0, s1 = seed0 % 2**64, seed1 % 2**64
        mix = philox4x32([s0 & M32, s0 >> 32, s1 & M32, s1 >> 32], [0x3EC8F720, 0x02461E29])
        self.key = [mix[0], mix[1]]
        self.counter = [0, 0, mix[2], mix[3]]
        self.buffer: list[int] = []

    def rand32(self) -> int:
        if not self.buffer:
            self.buffer = philox4x32(self.counter, self.key)
            # Increment the 128-bit counter, low word first.
            for i in range(4):
                self.counter[i] = (self.counter[i] + 1) & M32
                if self.counter[i]:
                    break
        return self.buffer.pop(0)

    def rand_float(self) -> np.float32:
        # 23 random mantissa bits under exponent 0: [1, 2), minus one.
        bits = (127 << 23) | (self.rand32() & 0x7FFFFF)
        return np.float32(struct.unpack("<f", struct.pack("<I", bits))[0]) - np.float32(1)

    def uniform(self, n: int) -> int:
        # Exact uniform integer in [0, n): mask for powers of two, else reject the low remainder.
        if n & (n - 1) == 0:
            return self.rand32() & (n - 1)
        rem = (M32 % n) + 1
        while True:
            r = self.rand32()
            if r >= rem:
                return r % n


class PhiloxDraws:
    """:class:`stoker.data.images.crops.CropDraws` consuming TensorFlow's stream in its order."""

    def __init__(self, seed0: int, seed1: int) -> None:
        self.stream = StatelessPhilox(seed0, seed1)

    def rand_float(self, attempt: int) -> np.float32:
        return self.stream.rand_float()

    def uniform(self, attempt: int, slot: int, n: int) -> int:
        return self.stream.uniform(n)


def run_tf(script: str, args: dict, timeout: float = 300) -> object:
    """Run ``script`` (Python source reading ``json.loads(sys.argv[1])`` and printing JSON as
    its last line) in the TensorFlow peer; its parsed output."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    r = subprocess.run(
        [str(TF_PYTHON), "-c", script, json.dumps(args)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])
