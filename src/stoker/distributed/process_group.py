"""Strategies over a ``torch.distributed`` process group launched by torchrun.

torchrun (or any launcher that sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
and ``MASTER_PORT``) starts one process per replica; these strategies join them into a
process group (gloo on CPU, nccl on CUDA) with ``RunConfig.distributed_timeout``.

Each replica also writes a heartbeat into the group's key-value store every second. When a
collective fails or times out because a replica died, the survivors read the heartbeats and
raise an error that names the replica that went silent, instead of hanging or printing a
transport error that names only a socket. With the heartbeat goes the replica's progress
(step, phase, collectives entered: ``watchdog.py``), so that during training a replica that
is alive but stuck is named too, within ``RunConfig.stuck_replica``'s limit.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..errors import ConfigError, DistributedError, StokerError
from .base import Strategy, device_choice
from .watchdog import ANNOUNCE_WAIT, STUCK_KEY, Progress, check_and_exit, stop_as_named

log = logging.getLogger("stoker")

_HEARTBEAT_EVERY = 1.0
_TEARDOWN_WAIT = 30.0  # seconds teardown waits for the other replicas


class ReplicaLostError(DistributedError):
    """A replica stopped responding; the survivors stop instead of hanging."""


class ProcessGroupStrategy(Strategy):
    """Common set-up of the multi-process strategies: process group, collectives, heartbeats."""

    progress: Progress

    def __init__(self, device: str = "auto", timeout: float = 1800.0) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device_choice = device_choice(device)  # cuda: this replica's, by LOCAL_RANK
        self.device = self.device_choice.value
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
            if missing:
                raise ConfigError(
                    f"WORLD_SIZE={self.world_size} but {', '.join(missing)} is not set: launch with "
                    "torchrun --nproc_per_node=N (or set the torch.distributed environment variables)"
                )
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        self.timeout = timeout
        self._stop = threading.Event()
        self._store = _group_store()
        self.progress = Progress()
        self._heartbeat = threading.Thread(target=self._beat, name="stoker-heartbeat", daemon=True)
        self._heartbeat.start()
        if self._owns_group:
            # Gloo's worker threads must be joined while the interpreter is alive: a process that
            # ends without destroying its group can abort at exit ("terminate called without an
            # active exception"). Scripts that never call teardown() get it here.
            # No barrier there: the process may be ending on an error its peers never see.
            atexit.register(self.teardown, wait_for_peers=False)

    # ----------------------------------------------------------------- collectives
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.detach().clone()
        self._guard(dist.all_reduce, out)
        return out

    def any_replica(self, flag: bool) -> bool:
        t = torch.tensor([1.0 if flag else 0.0], device=self._collective_device())
        self._guard(dist.all_reduce, t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        self._guard(dist.all_gather_object, out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        self._guard(dist.broadcast_object_list, box, src=src)
        return box[0]

    def barrier(self) -> None:
        self._guard(dist.barrier)

    def teardown(self, wait_for_peers: bool = True) -> None:
        """Stop the heartbeat and destroy the process group this strategy created (idempotent).

        ``wait_for_peers``: first wait (bounded) until every replica has reached its teardown.
        """
        self._stop.set()
        if self._heartbeat.is_alive() and self._heartbeat is not threading.current_thread():
            self._heartbeat.join(timeout=5)  # never destroy the store under a beat in flight
        if self._owns_group and dist.is_initialized() and wait_for_peers:
            # Every replica reaches this point before any destroys the group: rank 0 hosts the
            # store, and tearing it down under a peer still talking to it aborts that peer.
            # Bounded, so a replica that is already gone cannot hold the survivors here.
            try:
                if dist.get_backend() == "gloo":
                    dist.monitored_barrier(timeout=datetime.timedelta(seconds=_TEARDOWN_WAIT))
                else:
                    dist.barrier()
            except Exception as error:  # a lost replica: nothing left to wait for
                log.debug("teardown barrier: %s", error)
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    def _collective_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    # ----------------------------------------------------------------- lost replicas
    def _guard(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        progress = self.progress
        progress.enter(f"a collective ({fn.__name__})")
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # a transport error or a timeout: find out who is gone
            raise self.lost_replica_error(e) from e
        finally:
            progress.leave()

    def explain_failure(self, error: BaseException) -> BaseException:
        # Transport failures and collective timeouts surface as RuntimeErrors (DistBackendError
        # is one); stoker's own errors and the user's are reported as they are.
        if isinstance(error, RuntimeError) and not isinstance(error, StokerError):
            return self.lost_replica_error(error)
        return error

    def lost_replica_error(self, cause: BaseException) -> BaseException:
        """An error naming the replicas whose heartbeat stopped (or ``cause`` if all are alive)."""
        silent = self.silent_replicas()
        if not silent:
            return cause
        names = ", ".join(f"{self.process_name(r)} (silent for {age:.0f} s)" for r, age in silent)
        return ReplicaLostError(
            f"{names} stopped responding; {self.process_name(self.rank)} stops too. Rerun the same "
            f"command to resume from the last complete checkpoint ({type(cause).__name__}: {cause})"
        )

    def process_name(self, rank: int) -> str:
        """How errors name the process of global rank ``rank``."""
        return f"replica {rank}"

    def silent_replicas(self, grace: float = 3 * _HEARTBEAT_EVERY) -> list[tuple[int, float]]:
        time.sleep(grace)  # let a slow-but-alive replica beat once more
        now = time.time()
        silent = []
        for r in range(self.world_size):
            if r == self.rank:
                continue
            try:
                beat = float(self._store.get(f"stoker/heartbeat/{r}").decode())
            except Exception:  # noqa: BLE001 - no key (never started) or store gone with rank 0
                silent.append((r, float("inf")))
                continue
            if now - beat > grace:
                silent.append((r, now - beat))
        return silent

    def _beat(self) -> None:
        key, where = f"stoker/heartbeat/{self.rank}", f"stoker/progress/{self.rank}"
        while not self._stop.is_set():
            try:
                self._store.set(key, repr(time.time()))
                self._store.set(where, self.progress.record())
                named = self._store.check([STUCK_KEY])  # another replica named a stuck one: stop too
            except Exception:  # noqa: BLE001 - the store lives in rank 0; if it is gone, stop beating
                return
            # Named when needed, not when the thread starts: a subclass (PipelineStrategy) knows
            # its layout only after this base class has started the heartbeat.
            if named:
                self._stop_as_named(self.process_name(self.rank))
            if self.progress.watch is not None:
                try:
                    me = self.process_name(self.rank)
                    check_and_exit(self.progress, self._others_progress, me, self.process_name, self._announce_stuck)
                except Exception as error:  # noqa: BLE001 - a failed check must not stop the heartbeat
                    log.debug("stuck-replica check: %s", error)
            self._stop.wait(_HEARTBEAT_EVERY)

    def _announce_stuck(self, message: str) -> None:
        """Tell every replica that this one named a stuck one, and wait (bounded) until each has
        read it: the store may live in this process and go with it."""
        self._store.set(STUCK_KEY, message)
        acks = [f"{STUCK_KEY}/seen/{r}" for r in range(self.world_size) if r != self.rank]
        deadline = time.monotonic() + ANNOUNCE_WAIT
        while time.monotonic() < deadline and not self._store.check(acks):
            time.sleep(0.05)

    def _stop_as_named(self, me: str) -> None:
        try:
            message = self._store.get(STUCK_KEY).decode()
            self._store.set(f"{STUCK_KEY}/seen/{self.rank}", "1")
        except Exception:  # noqa: BLE001 - the namer's store went away under us: stop all the same
            message = "its message was lost with the store"
        stop_as_named(me, message)

    def _others_progress(self) -> dict[int, str]:
        """The other replicas' published progress (those that published any)."""
        out = {}
        for r in range(self.world_size):
            key = f"stoker/progress/{r}"
            if r != self.rank and self._store.check([key]):  # check: get would wait for a missing key
                out[r] = self._store.get(key).decode()
        return out


class Replicated(ProcessGroupStrategy):
    """Data parallel: every replica holds the whole model; gradients are averaged (DDP).

    ``bucket_cap_mb`` sets DDP's gradient bucket size (``None``: DDP's default)."""

    bucket_cap_mb: float | None = None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        # DDP broadcasts rank 0's weights and buffers at construction, so every replica
        # starts from the same weights (also after a warm start on rank 0).
        ids = [self.device.index] if self.device.type == "cuda" else None
        if self.bucket_cap_mb is None:
            return DistributedDataParallel(model, device_ids=ids)
        return DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=self.bucket_cap_mb)


class Independent(ProcessGroupStrategy):
    """Replicas train independently (no gradient sync): for benchmarking the step alone."""

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model


def _group_store() -> Any:
    """The key-value store behind the default process group (torchrun's, or our own)."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()
