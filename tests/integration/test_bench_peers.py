"""bench/peers.py, the comparison with Redis and beanstalkd: its `--quick`
run goes through every scenario on hourglass (and on redis-server and
beanstalkd when they are installed) and prints one JSON object of the
documented shape; the receipt accounting behind lost/duplicates counts
right."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from array import array

import peer_systems
import peers
import pytest
from harness import ROOT

PEERS = os.path.join(ROOT, "bench", "peers.py")


def consumer_result(indices: list[int], lateness_ms: list[float]) -> dict:
    return {"indices": array("q", indices), "lateness_ms": array("d", lateness_ms),
            "lateness_effective_ms": array("d", lateness_ms), "pulls": 1, "empty_pulls": 0, "ack_requests": 1,
            "acked": len(indices), "first_receive_ms": 1.0, "last_receive_ms": 2.0, "last_ack_ms": 3,
            "min_trigger_ms": 0, "errors": []}


def test_receipts_count_lost_duplicate_unknown_and_early_messages():
    got = peers.receipts([consumer_result([0, 1, 1], [5.0, 1.0, 2.0]), consumer_result([3, 9], [-1.0, 4.0])], n=5)
    assert (got["received"], got["distinct"], got["lost"], got["duplicates"], got["unknown"], got["early"]) == (
        5, 3, 2, 1, 1, 1)
    assert got["lost_examples"] == [2, 4]
    assert got["lateness_ms_max"] == 5.0


def test_payload_names_the_message_and_its_trigger_at_any_size():
    for size in (40, 100, 1000):
        payload = peer_systems.encode_payload(123456, 1_790_000_000_123, 1_790_000_001_000, size)
        assert len(payload) == size
        assert peer_systems.decode_payload(payload) == (123456, 1_790_000_000_123, 1_790_000_001_000)
        assert peer_systems.decode_payload(payload.decode()) == (123456, 1_790_000_000_123, 1_790_000_001_000)


FIGURES = {
    "ingest-batch": ["ingest_batch_msgs_per_s", "ingest_batch_server_cpu_us_per_msg"],
    "ingest-single": ["ingest_single_msgs_per_s", "ingest_single_server_cpu_us_per_msg"],
    "dispatch": ["dispatch_delivered_per_s", "dispatch_lateness_ms_p50", "dispatch_lateness_ms_p99",
                 "dispatch_lateness_ms_max", "dispatch_early", "dispatch_lost", "dispatch_duplicates",
                 "dispatch_server_cpu_us_per_msg", "dispatch_server_cpu_us_per_request"],
    "burst": ["burst_delivered_per_s", "burst_lateness_ms_p99", "burst_batch_ack_delivered_per_s"],
    "lag": ["lag_rss_mb", "lag_restart_s", "lag_drain_msgs_per_s", "lag_drain_server_cpu_us_per_msg",
            "lag_drain_server_cpu_us_per_request"],
    "roundtrip": ["roundtrip_ms_p50", "roundtrip_ms_p99"],
}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_run_prints_one_json_object_with_every_systems_figures(tmp_path):
    systems = ["hourglass"] + [name for name in ("redis", "beanstalkd")
                               if shutil.which("redis-server" if name == "redis" else name)]
    done = subprocess.run([sys.executable, PEERS, "--quick", "--systems", ",".join(systems),
                           "--work-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert done.returncode in (0, 1), done.stderr[-4000:]  # 1: a system got something wrong (see problems)
    out = json.loads(done.stdout)
    names = set(systems) | ({"redis_lua"} if "redis" in systems else set())
    assert set(out["figures"]) == names, done.stderr[-4000:]
    for scenario, figures in FIGURES.items():
        for name in systems:
            detail = out["scenarios"][scenario][name]
            assert "error" not in detail, (scenario, name, detail["error"])
            for figure in figures:
                value = out["figures"][name][figure]
                if figure == "burst_batch_ack_delivered_per_s" and value == "unsupported":
                    continue
                assert isinstance(value, (int, float)) and value >= 0, (name, figure, value)
    if "redis" in systems:
        assert out["figures"]["redis_lua"]["ingest_batch_msgs_per_s"] > 0
        assert out["figures"]["redis"]["dispatch_mover_cpu_us_per_msg"] >= 0
        assert set(out["ratios"]) >= {"hourglass_over_redis", "hourglass_over_redis_lua"}
        assert isinstance(out["ratios"]["hourglass_over_redis"]["roundtrip_ms_p50"], float)
    assert {t["figure"] for t in out["targets"]} >= {"dispatch_delivered_per_s", "lag_restart_s",
                                                     "ingest_batch_msgs_per_s"}
    assert all(set(t) >= {"issue", "target", "value", "limit", "met"} for t in out["targets"])
    assert out["quick"] is True and isinstance(out["problems"], list)
    assert os.listdir(tmp_path) == []  # the data dirs went
