"""Built-in input sources: deterministic given a seed, checkpointable with ``state_dict``."""

from .arrays import ArraySource, arrays, epoch_generator

__all__ = ["ArraySource", "arrays", "epoch_generator"]
