"""``--num_gpus=N``: run the same ``stoker bench`` command as N local replicas.

The replicas are started by torch.distributed's elastic agent (the launcher behind torchrun,
``torch.distributed.launcher.api.elastic_launch``) with a standalone rendezvous on this host,
so ``stoker bench --num_gpus=N ARGS`` is ``torchrun --standalone --nproc_per_node=N -m stoker
bench ARGS``: every process is one replica (CUDA device ``LOCAL_RANK``, or a share of the CPU
cores), ``--batch_size`` is per replica, and rank 0 prints. No process management is written
here: the agent starts, watches and stops the workers; this module only turns a failed worker
into the harness's usual message.

Under torchrun, ``--num_gpus`` is the number of replicas torchrun already started: it must be
1 (not given) or equal ``WORLD_SIZE``.
"""

from __future__ import annotations

import logging
import signal
import sys
import uuid
from collections.abc import Sequence

from ..distributed import ReplicaLostError
from ..errors import FlagError


def check_num_gpus(num_gpus: int, world_size: int, cuda_devices: int | None) -> None:
    """Refuse ``--num_gpus`` values that cannot run (a :class:`FlagError` naming the flag).

    ``world_size`` is torchrun's ``WORLD_SIZE`` (1 without torchrun); ``cuda_devices`` the CUDA
    devices the replicas would use (``None`` on the CPU, where any N splits the cores).
    """
    if num_gpus < 1:
        raise FlagError(("num_gpus",), f"--num_gpus must be an integer >= 1; got {num_gpus}")
    if world_size > 1 and num_gpus not in (1, world_size):
        raise FlagError(
            ("num_gpus",),
            f"--num_gpus={num_gpus} but WORLD_SIZE={world_size}: under torchrun --num_gpus must equal "
            f"WORLD_SIZE ({world_size}) or be 1 (torchrun already started the replicas)",
        )
    if world_size == 1 and cuda_devices is not None and num_gpus > cuda_devices:
        raise FlagError(("num_gpus", "device"), f"--num_gpus={num_gpus} but torch sees {cuda_devices} CUDA device(s)")


def should_launch(num_gpus: int, world_size: int) -> bool:
    """True in the process the user started with ``--num_gpus=N > 1`` (not in the replicas)."""
    return num_gpus > 1 and world_size == 1


def launch_replicas(argv: Sequence[str], num_replicas: int, *, python: str = sys.executable) -> int:
    """Run ``python -m stoker <argv>`` as ``num_replicas`` local replicas; 0 when all succeed.

    A replica that fails or is killed ends the run: the agent stops the others, and this
    prints the :class:`ReplicaLostError` message naming it (exit status 1).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The agent logs every rendezvous and worker start at INFO; the harness prints its own lines.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.WARNING)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=num_replicas,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",  # torchrun --standalone: a TCP store on a free local port
        rdzv_endpoint="localhost:0",
        max_restarts=0,  # a lost replica ends the run; rerunning the command resumes it
        monitor_interval=0.5,
    )
    try:
        elastic_launch(config, python)("-m", "stoker", *argv)
    except ChildFailedError as e:
        print(f"stoker bench: error: {lost_replica_message(e)}", file=sys.stderr, flush=True)
        return 1
    return 0


def lost_replica_message(error: BaseException) -> ReplicaLostError:
    """The harness's :class:`ReplicaLostError` for a failed launch, naming the first replica lost."""
    failures = getattr(error, "failures", {})
    if not failures:
        return ReplicaLostError(f"the replicas failed ({error})")
    # A replica killed by a signal is the cause; survivors that noticed it exit with 1 later.
    rank, failure = min(failures.items(), key=lambda kv: (kv[1].signal_name() == "<N/A>", kv[1].timestamp))
    how = _describe(failure.exitcode)
    return ReplicaLostError(
        f"replica {rank} stopped responding ({how}); the other replicas were stopped. Rerun the same "
        "command to resume from the last complete checkpoint"
    )


def _describe(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


__all__ = ["check_num_gpus", "launch_replicas", "lost_replica_message", "should_launch"]
