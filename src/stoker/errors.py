"""Errors stoker raises for things a user can fix. Each message says what to change.

Every error stoker raises for bad input or bad state is a :class:`StokerError`, named after
what went wrong. Where users have caught a built-in exception until now (``ValueError`` for a
bad argument, ``TypeError`` for a bad ``model_fn``), that built-in stays a second base, so
``except ValueError`` keeps working::

    StokerError
      ConfigError (ValueError)        an argument, setting or flag with a value stoker cannot use
        FlagError                       a command-line flag (the command exits 2)
        UnknownNameError (KeyError)     a name not in a registry (model, optimizer, recipe, kind)
      StateError (RuntimeError)       an operation asked of something in the wrong state
      DataError (ValueError)          input data that cannot be used as it is
        ImageDecodeError                bytes that are not a decodable image
          WindowDecodeError               libjpeg refused a crop window
      RequestError (ValueError)       a serving request that does not fit the signature
      DistributedError (RuntimeError) the processes of a run stopped working together
      CheckpointError                 a checkpoint is missing, does not fit or is unreadable
        CheckpointMismatchError (ValueError), CorruptCheckpointError, StorageError
          DamagedCheckpointError (a CorruptCheckpointError)
      UserCodeError (TypeError)       user code took or returned a type stoker cannot use
        ModelFnError                    ``model_fn`` in particular
      NonFiniteError (ValueError)     a loss or a metric that must be finite is not
        NanLossError
      ExportError, ...
"""

from __future__ import annotations


class StokerError(Exception):
    """Base class for stoker's own errors."""


class CheckpointError(StokerError):
    """A checkpoint is missing, does not fit the model, or is unreadable."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A model_dir's checkpoint or record is missing a part, or holds state that does not fit what
    is being restored (other optimizers, another precision, another iteration's candidates)."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is refused, never loaded: its bytes are not the ones written
    (:class:`DamagedCheckpointError`) or its decoder refuses them (data ``weights_only`` rejects)."""


class DamagedCheckpointError(CorruptCheckpointError):
    """A checkpoint's bytes are not the ones written: a file's sha256 differs from its manifest or
    index record, or a file is missing or unreadable. Training resumes from the newest checkpoint
    that verifies instead; ``stoker checkpoint verify`` names every such file."""


class StorageError(CheckpointError):
    """Storage refused or lost a write or read (full disk, read-only directory, a store that
    stopped answering or kept failing); the message names the path and the cause. The
    checkpoint being written is not committed; the previous one stays the latest."""


class NonFiniteError(StokerError, ValueError):
    """A value that must be finite is NaN or infinite (a training loss, a selection metric)."""


class NanLossError(NonFiniteError):
    """Training produced a non-finite (or spiking) loss; the last good checkpoint is kept.
    ``detail`` says more: a spike's threshold, rollbacks already taken."""

    def __init__(self, step: int, value: float, checkpoint: str | None, detail: str = "") -> None:
        kept = f"; the last good checkpoint is {checkpoint!r}" if checkpoint else ""
        why = f" ({detail})" if detail else ""
        super().__init__(f"loss is {value} at step {step}{why}: training stopped{kept}")
        self.step = step
        self.value = value
        self.checkpoint = checkpoint


class UserCodeError(StokerError, TypeError):
    """Code the user hands stoker (a factory, a builder, a metric function, a pipelined model)
    took or returned something of a type stoker cannot use; the message says what was expected."""


class ModelFnError(UserCodeError):
    """``model_fn`` has the wrong signature or returned something stoker cannot use."""


class ExportError(StokerError):
    """A model that cannot be exported as asked (missing packages, a shape torch.export cannot
    keep dynamic, an export directory that holds something else)."""


class ConfigError(StokerError, ValueError):
    """An argument, setting or flag has a value stoker cannot use; the message names it and
    what is allowed."""


class FlagError(ConfigError):
    """A command-line flag value or combination a command cannot use (the command exits 2);
    ``flags`` names the flags involved (``stoker.flags`` declares and checks them)."""

    def __init__(self, flags: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.flags = flags

    def __reduce__(self) -> tuple[type[FlagError], tuple[tuple[str, ...], str]]:
        return (type(self), (self.flags, str(self)))


class UnknownNameError(ConfigError, KeyError):
    """A name that is not in its registry (a model, an optimizer, a recipe, a run_spec kind);
    the message lists the names that are."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class StateError(StokerError, RuntimeError):
    """An operation asked of something in a state where it cannot be done (a run that already
    stopped, a component used before it was built)."""


class DataError(StokerError, ValueError):
    """Input data that cannot be used as it is: a missing folder, a corrupt file, a bad label."""


class ImageDecodeError(DataError):
    """Bytes that are not a decodable image (the caller adds the file name and example index)."""


class RequestError(StokerError, ValueError):
    """A request that does not fit the signature or the protocol; the message says what was expected."""


class DistributedError(StokerError, RuntimeError):
    """The processes of a run stopped working together (a replica that stopped responding:
    ``stoker.distributed.ReplicaLostError``). A layout that cannot work as configured is a
    :class:`ConfigError`, found before any process waits."""
