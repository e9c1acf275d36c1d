"""``BenchFlagError``: a bad ``stoker bench`` flag value or combination (exit status 2)."""

from __future__ import annotations

from ..errors import ConfigError


class BenchFlagError(ConfigError):
    """A bad flag value or combination; ``flags`` names the flags involved."""

    def __init__(self, flags: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.flags = flags


def fail(message: str, *flags: str) -> BenchFlagError:
    """A :class:`BenchFlagError` naming ``flags`` (to ``raise``)."""
    return BenchFlagError(tuple(flags), message)


__all__ = ["BenchFlagError", "fail"]
