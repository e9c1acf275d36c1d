"""The red-team suite (slow): issue 52's attacks at full size against ``stoker serve`` processes
on loopback, and what held before them. Every loop is bounded (tests/helpers/redteam.py) and
every server is its own process, stopped by its pid. The figures of docs/results/security.md
come from the same functions (``python tests/helpers/redteam.py --out ...``)."""

from __future__ import annotations

import pytest

from helpers import redteam
from helpers.processes import python_env

pytestmark = pytest.mark.slow

BODY_8MIB = ("--max_body_bytes", str(8 * redteam.MiB + 64 * 1024))


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return redteam.export_tiny(tmp_path_factory.mktemp("redteam"))


def serving(export_dir, *flags):
    return redteam.serving(export_dir, *flags, env=python_env())


def test_64_slow_drips_starve_nobody(export_dir):
    with serving(export_dir, *BODY_8MIB) as server:
        got = redteam.slow_drip(server.port, connections=64, seconds=8)
    assert got["good_codes"] == {"200": got["good_requests"]} and got["good_requests"] >= 10, got
    assert got["drippers_answered"] == {"408": 64}, got


def test_64_greedy_8mib_bodies_keep_memory_bounded_and_health_fast(export_dir):
    with serving(export_dir, *BODY_8MIB) as server:
        got = redteam.greedy(server, clients=64, body_mib=8.0)
    # 16 bodies held (--max_buffered_bytes) + one decode (~26x its body) + slack: about 42 bodies
    assert got["rss_growth_mb"] < 48 * 8, got
    assert set(got["codes"]) <= {"400", "503"} and got["codes"].get("400", 0) >= 1, got  # every client answered
    assert got["live_timeouts"] == 0 and got["live_p50_s"] < 1.0, got
    with serving(export_dir) as server:  # the default limit (from the signature) refuses them unread
        got = redteam.greedy(server, clients=64, body_mib=8.0)
    assert got["codes"] == {"413": 64} and got["rss_growth_mb"] < 64, got


def test_idle_and_slowloris_connections_are_closed(export_dir):
    with serving(export_dir, "--header_timeout_s", "3") as server:
        got = redteam.idle_connections(server.port, connections=32, wait_s=8)
    assert got["idle_closed"] == 32 and got["idle_closed_after_s"] < 6, got
    assert got["slowloris_closed_after_s"] is not None and got["slowloris_closed_after_s"] < 6, got


def test_64_mib_of_headers_are_refused_without_being_held(export_dir):
    with serving(export_dir) as server:
        got = redteam.huge_headers(server, mib=64)
    assert got["status"] == 431 and got["json_error"], got
    assert got["rss_peak_mb"] - got["rss_before_mb"] < 32, got


def test_bad_requests_are_json_4xx_and_nothing_private_leaks(export_dir):
    with serving(export_dir) as server:
        got = redteam.bad_requests(server)
        leaks = redteam.private_paths(server, export_dir)
    for name in ("int64_shape_overflow", "int64_shape_overflow_8_values", "int64_shape_overflow_binary"):
        assert got[name] == {"status": 400, "json_error": True}, got
    assert got["nan_inf_input"]["status"] == 400 and got["nan_inf_input"]["json_error"], got
    assert got["nan_inf_input_oip"] == {"status": 400, "answer_is_json": True}, got
    gone = got["disconnect_during_413"]
    assert gone["tracebacks"] == 0 and gone["log_lines"] <= 3 and gone["counted_413"] and not gone["counted_500"], got
    assert all(found == [] for found in leaks.values()), leaks


def test_what_held_before_still_holds(export_dir):
    with serving(export_dir) as server:
        got = redteam.held(server, export_dir, mixed=3000, clients=64)
    tricks = got["path_tricks"]
    assert tricks["file_contents_leaked"] == 0 and set(tricks["codes"]) <= {"400", "404", "405"}, tricks
    assert got["declared_2gb_body"] == 413 and got["smuggling"] == 400 and got["nested_json"] == 400, got
    assert got["absurd_shapes"] == [400, 400, 400, 400] and got["absurd_shapes_rss_growth_mb"] < 16, got
    assert got["mixed"]["wrong"] == 0 and got["mixed"]["requests"] >= 2944, got
    assert got["metrics_private"] == [], got
    with serving(export_dir, "--max_pending", "1") as server:
        got = redteam.saturated(server)
    assert got["refused_503"] >= 1 and got["retry_after"] == ["1"] and got["json_errors"], got
    assert got["other_codes"] == [], got


def test_listening_on_all_interfaces_warns_in_one_line(export_dir):
    import re

    with redteam.serving(export_dir, "--host", "0.0.0.0", env=python_env()) as server:
        pass
    warnings = [line for line in server.lines if "no TLS and no authentication" in line]
    assert len(warnings) == 1 and re.search(r"listening on 0\.0\.0\.0", warnings[0]), server.lines
