"""bench/peers.py, the comparison with Redis and beanstalkd: its `--quick`
run goes through every scenario on hourglass (and on redis-server at
appendfsync always and everysec and beanstalkd at -f 0 and at its default
when they are installed) and prints one JSON object of the documented
shape; the receipt accounting behind lost/duplicates counts right, and so
do whose figure is better and the targets held to a peer of the same
run."""

from __future__ import annotations

import importlib.util
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
# The peers' programs, for the tests of the arguments and the arithmetic
# only (nothing is started): they need not be installed.
PROGRAMS = ["--redis-server", "redis-server", "--beanstalkd", "beanstalkd"]


def parse_args(argv: list[str]):
    return peers.parse_args([*argv, *PROGRAMS])


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


def test_better_says_whose_figure_is_better_by_its_kind():
    figures = {"hourglass": {"x_msgs_per_s": 10.0, "x_ms_p99": 5.0, "x_mb": 3.0, "x_lost": 0},
               "redis_always": {"x_msgs_per_s": 20.0, "x_ms_p99": 5.0, "x_mb": 4.0, "x_lost": 0}}
    assert peers.better(figures) == {"redis_always": {"x_msgs_per_s": "redis_always", "x_ms_p99": "same",
                                                      "x_mb": "hourglass"}}
    assert peers.ratios(figures) == {"hourglass_over_redis_always": {"x_msgs_per_s": 0.5, "x_ms_p99": 1.0,
                                                                     "x_mb": 0.75}}


def test_targets_hold_hourglass_to_the_durable_peers_in_the_same_run():
    args = parse_args(["--quick"])
    figures = {"hourglass": {"ingest_single_msgs_per_s": 3000.0, "dispatch_keyed_lateness_ms_p99": 9.0,
                             "lag_drain_msgs_per_s": 100.0},
               "redis_always": {"ingest_single_msgs_per_s": 2500.0, "dispatch_lateness_ms_p99": 8.0},
               "beanstalkd": {"lag_drain_msgs_per_s": 200.0}}
    rows = {t["figure"]: t for t in peers.targets(figures, args)}
    assert (rows["ingest_single_msgs_per_s"]["limit"], rows["ingest_single_msgs_per_s"]["met"]) == (2500.0, True)
    assert rows["ingest_single_msgs_per_s"]["limit_from"] == "redis_always"
    keyed = rows["dispatch_keyed_lateness_ms_p99"]
    assert (keyed["limit"], keyed["met"], keyed["limit_from"]) == (8.0, False, "redis_always.dispatch_lateness_ms_p99")
    assert rows["lag_drain_msgs_per_s"]["met"] is False
    assert rows["ingest_batch_server_cpu_us_per_msg"] == {**rows["ingest_batch_server_cpu_us_per_msg"], "limit": 10,
                                                         "value": None, "met": None}
    assert {"lag_10m_rss_mb", "engine_append_msgs_per_s", "spark_rows_per_s", "roundtrip_ms_p50"} <= set(rows)


def test_one_run_covers_every_system_and_ten_million_adds_its_lag():
    args = parse_args([])
    assert args.systems == ["hourglass", "hourglass_1", "redis_always", "beanstalkd_f0", "redis", "beanstalkd"]
    assert "lag-10m" not in args.scenarios and {"dispatch-keyed", "engine", "spark"} <= set(args.scenarios)
    args = parse_args(["--scenarios", "lag", "--ten-million"])
    assert (args.scenarios, args.ten_million_msgs, args.ten_million_systems) == (["lag", "lag-10m"], 10_000_000,
                                                                                 ["hourglass"])
    bench = peers.Bench(parse_args(["--systems", "hourglass,redis_always,beanstalkd"]), "/nonexistent")
    assert [s.name for s in bench.systems("ingest-batch")] == ["hourglass", "redis_always", "redis_always_lua",
                                                                "beanstalkd"]
    assert [s.name for s in bench.systems("dispatch-keyed")] == ["hourglass"]
    assert bench.systems("dispatch-keyed")[0].keys == 100
    assert [s.name for s in bench.systems("lag-10m")] == ["hourglass"]


def test_report_prints_the_table_of_a_saved_run(tmp_path, capsys):
    figures = {"hourglass": {"roundtrip_ms_p50": 1.0, "lag_rss_mb": 90.0},
               "redis_always": {"roundtrip_ms_p50": 2.0, "lag_rss_mb": 200.0}}
    saved = tmp_path / "peers.json"
    saved.write_text(json.dumps({"figures": figures, "better": peers.better(figures),
                                 "targets": peers.targets(figures, parse_args(["--quick"]))}))
    assert peers.main(["--report", str(saved)]) == 0
    table = capsys.readouterr().out
    roundtrip = next(line for line in table.splitlines() if line.startswith("roundtrip_ms_p50"))
    assert roundtrip.split()[1:] == ["1.000", "2.000", "0.5", "+"]
    assert "met      round trip p50 <= Redis always's: 1.000 <= 2.000 (redis_always)" in table


FIGURES = {
    "ingest-batch": ["ingest_batch_msgs_per_s", "ingest_batch_server_cpu_us_per_msg",
                     "ingest_batch_server_cpu_us_per_request"],
    "ingest-single": ["ingest_single_msgs_per_s", "ingest_single_server_cpu_us_per_msg"],
    "dispatch": ["dispatch_delivered_per_s", "dispatch_lateness_ms_p50", "dispatch_lateness_ms_p99",
                 "dispatch_lateness_ms_max", "dispatch_early", "dispatch_lost", "dispatch_duplicates",
                 "dispatch_server_cpu_us_per_msg", "dispatch_server_cpu_us_per_request"],
    "burst": ["burst_delivered_per_s", "burst_lateness_ms_p99", "burst_batch_ack_delivered_per_s"],
    "lag": ["lag_rss_mb", "lag_restart_s", "lag_drain_msgs_per_s", "lag_drain_server_cpu_us_per_msg",
            "lag_drain_server_cpu_us_per_request"],
    "roundtrip": ["roundtrip_ms_p50", "roundtrip_ms_p99", "roundtrip_server_cpu_us_per_msg"],
}
# hourglass's own scenarios: no peer runs them.
HOURGLASS_FIGURES = {
    "dispatch-keyed": ["dispatch_keyed_delivered_per_s", "dispatch_keyed_lateness_ms_p99", "dispatch_keyed_early",
                       "dispatch_keyed_lost", "dispatch_keyed_server_cpu_us_per_request"],
    "lag-10m": ["lag_10m_rss_mb", "lag_10m_restart_s"],
    "engine": ["engine_append_msgs_per_s"],
    "spark": ["spark_rows_per_s", "spark_server_cpu_us_per_row"],
}


def spark_runs() -> bool:
    return importlib.util.find_spec("pyspark") is not None and shutil.which("java") is not None


@pytest.mark.slow
@pytest.mark.serial  # (a benchmark, and alert rules on a time scale: not beside another worker)
@pytest.mark.timeout(600)
def test_quick_run_prints_one_json_object_with_every_systems_figures(tmp_path):
    systems = ["hourglass"]
    if shutil.which("redis-server"):
        systems += ["redis_always", "redis"]
    if shutil.which("beanstalkd"):
        systems += ["beanstalkd_f0", "beanstalkd"]
    done = subprocess.run([sys.executable, PEERS, "--quick", "--ten-million", "--systems", ",".join(systems),
                           "--work-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert done.returncode in (0, 1), done.stderr[-4000:]  # 1: a system got something wrong (see problems)
    out = json.loads(done.stdout)
    names = set(systems) | {f"{name}_lua" for name in systems if name.startswith("redis")}
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
    for scenario, figures in HOURGLASS_FIGURES.items():
        assert set(out["scenarios"][scenario]) == {"hourglass"}, scenario
        detail = out["scenarios"][scenario]["hourglass"]
        assert "error" not in detail, (scenario, detail["error"])
        if scenario == "spark" and not spark_runs():
            assert "skipped" in detail
            continue
        for figure in figures:
            value = out["figures"]["hourglass"][figure]
            assert isinstance(value, (int, float)) and value >= 0, (figure, value)
    if "redis" in systems:
        assert out["figures"]["redis_always_lua"]["ingest_batch_msgs_per_s"] > 0
        assert out["figures"]["redis_always"]["dispatch_mover_cpu_us_per_msg"] >= 0
        assert out["systems"]["redis_always"]["durability"].endswith("(appendfsync always)")
        assert set(out["ratios"]) >= {"hourglass_over_redis_always", "hourglass_over_redis",
                                      "hourglass_over_redis_lua"}
        assert isinstance(out["ratios"]["hourglass_over_redis_always"]["roundtrip_ms_p50"], float)
        assert out["better"]["redis_always"]["roundtrip_ms_p50"] in ("hourglass", "redis_always", "same")
    if "beanstalkd" in systems:
        assert out["systems"]["beanstalkd_f0"]["args"] == ["-b", "DIR", "-f", "0"]
        assert out["systems"]["beanstalkd"]["args"] == ["-b", "DIR"]
        assert out["durable_peers"][-1] == "beanstalkd_f0" and out["default_peers"][-1] == "beanstalkd"
    rows = {t["figure"]: t for t in out["targets"]}
    assert {"ingest_batch_msgs_per_s", "dispatch_keyed_lateness_ms_p99", "lag_10m_restart_s",
            "engine_append_msgs_per_s"} <= set(rows)
    assert all(set(t) >= {"issue", "target", "value", "limit", "met"} for t in out["targets"])
    assert rows["lag_restart_s"]["met"] is not None
    assert "issue 28's targets:" in done.stderr  # the table at the end
    assert out["quick"] is True and isinstance(out["problems"], list)
    assert os.listdir(tmp_path) == []  # the data dirs went
