"""``keep_freed_host_memory``: freed memory is reused instead of being faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.paths import ROOT
from helpers.processes import PYTHON, python_env

# After 3 rounds, allocates and frees a 64 MiB tensor 5 times and prints the minor page faults that cost.
# With glibc's defaults each allocation is a fresh mmap (16384 pages faulted in); with the
# setting the heap keeps the memory and the later allocations fault in nothing.
PROBE = """
import resource, sys, torch
import stoker.estimator  # a training process has the engine loaded before it allocates
from stoker.memory.host import host_memory_kept, keep_freed_host_memory
if sys.argv[1] == "keep":
    assert keep_freed_host_memory() and keep_freed_host_memory() and host_memory_kept()
else:
    assert not host_memory_kept()
for _ in range(3):  # the heap settles in the first few rounds (as in a training run's first steps)
    x = torch.ones(16 << 20); del x
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    x = torch.ones(16 << 20); del x
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run(
        [PYTHON, "-c", PROBE, mode], capture_output=True, text=True, cwd=ROOT, env=python_env(), timeout=120, check=True
    ).stdout
    return int(out.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_kept_memory_is_reused_without_page_faults() -> None:
    default, kept = faults("default"), faults("keep")
    assert default > 5 * 16384 * 0.9, default  # every 64 MiB allocation faulted in again
    assert kept < 1000, kept
