"""Made-up machine facts for the rules of ``stoker.resolve``: nothing that uses them depends on this
machine's cores, load or decoders."""

from __future__ import annotations

from stoker.resolve import MachineFacts


def facts(cores: int = 2, *, busy: float | None = 0.0, local: int = 1, threads: int | None = None) -> MachineFacts:
    return MachineFacts(
        usable_cores=cores,
        cpu_count=cores,
        default_threads=cores if threads is None else threads,
        busy_cores=busy,
        local_world_size=local,
    )
