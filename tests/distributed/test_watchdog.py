"""The stuck-replica watchdog's rule, without processes (the real 2-process run is in
test_distributed.py): who counts as missing, when a replica may accuse, and what it says."""

from __future__ import annotations

import pytest

import stoker
from stoker.distributed.watchdog import MIN_STEP_SAMPLES, Progress, Seen, StuckReplica, missing_replicas, stuck_message


def waiting(entered: int, since: float, exempt: bool = False) -> Progress:
    p = Progress()
    p.watch = StuckReplica(factor=10.0, min_seconds=2.0)
    for _ in range(MIN_STEP_SAMPLES):
        p.loop_timed(1.0, 10)  # a median step of 0.1 s: the limit is max(2, 10 x 0.1) = 2 s
    p.mark("the input and model_fn", 7, exempt=exempt)
    for _ in range(entered):
        p.enter("the backward pass")
    p.since = since
    return p


def test_only_a_replica_waiting_past_the_limit_accuses():
    assert waiting(5, since=100.0).overdue(now=101.9) is None
    assert waiting(5, since=100.0).overdue(now=102.1) == 2.0
    # waiting between loops (exempt) still counts: a replica stuck in its step is named from there
    assert waiting(5, since=100.0, exempt=True).overdue(now=102.1) == 2.0
    idle = waiting(5, since=100.0)
    idle.leave()
    assert idle.overdue(now=200.0) is None  # not in a collective: nobody to wait for
    fresh = waiting(5, since=100.0)
    fresh.start_watch(StuckReplica())  # a new training run times its first loops afresh
    fresh.enter("the backward pass")
    fresh.since = 0.0
    assert fresh.overdue(now=1e9) is None  # no steps timed yet: start-up is left to distributed_timeout
    watched_off = waiting(5, since=100.0)
    watched_off.watch = None
    assert watched_off.overdue(now=200.0) is None


def test_the_missing_are_those_behind_in_collectives_and_not_exempt():
    mine = waiting(5, since=100.0)
    others = {
        1: Seen.parse(waiting(4, since=90.0).record()),  # behind: missing
        2: Seen.parse(waiting(5, since=99.0).record()),  # in the same collective
        3: Seen.parse(waiting(4, since=90.0, exempt=True).record()),  # between loops: a hook, a checkpoint write
    }
    missing = missing_replicas(mine, others)
    assert list(missing) == [1]
    text = stuck_message("replica 0", mine, missing, 2.0, lambda r: f"replica {r}", now=103.0)
    assert text.startswith("stuck replica: replica 1 last seen at step 7, in the backward pass, 13 s ago. ")
    assert "replica 0 has waited 3 s in the backward pass of step 7 (the limit: 2 s" in text


def test_the_setting_is_checked():
    config = stoker.RunConfig(stuck_replica=stoker.distributed.StuckReplica(factor=5.0, min_seconds=1.0))
    assert config.stuck_replica == StuckReplica(factor=5.0, min_seconds=1.0)
    assert config.to_dict()["stuck_replica"] == {"factor": 5.0, "min_seconds": 1.0}
    assert stoker.RunConfig(stuck_replica=None).stuck_replica is None
    with pytest.raises(stoker.ConfigError, match="RunConfig.stuck_replica must be"):
        stoker.RunConfig(stuck_replica=30)  # type: ignore[arg-type]
    with pytest.raises(stoker.ConfigError, match="StuckReplica.min_seconds must be a number > 0; got 0"):
        StuckReplica(min_seconds=0)
