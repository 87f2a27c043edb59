"""The fault drills (bench/drills.py) as CI runs them: short and seeded, a
few faults of each kind under load (the slow disk: bench/drill_slow_disk.py,
also tested here on a node of its own), on a 3-node cluster and on a
standalone node; any lost, early, after-ack, after-delete, serial-key or
answer-mismatch count fails, as does a term led by two nodes or a cluster
that does not converge. Real processes, stopped by PID; the full disk only
as root (it mounts a tmpfs), reported as skipped otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from drill_nodes import SLOW_DISK_LAUNCHER
from drill_slow_disk import set_delay
from harness import ROOT, Server, child_env

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # (failover deadlines, rates: not beside another worker)

ZEROS = ("lost", "early", "after_ack", "after_delete", "key_violations", "answer_mismatch")


def drill(*flags: str) -> dict:
    env = child_env(os.path.join(ROOT, "bench"))  # the drill's client is the broker its servers run
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "drills.py"), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=420)
    assert done.stdout.strip(), done.stderr[-4000:]
    report: dict = json.loads(done.stdout)
    assert done.returncode == (1 if report["failed"] else 0)
    report["stderr"] = done.stderr[-3000:]  # the faults as they came, for a failure's message
    return report


def check_zeros(report: dict) -> None:
    figures = {name: report[name] for name in ZEROS}
    # on a failure, the whole history is in the test's tmp_path (history.json); the message is a
    # string, so pytest shows it whole (a tuple's repr it cuts at 240 characters)
    assert figures == dict.fromkeys(ZEROS, 0), "\n".join((
        json.dumps(figures), json.dumps(report["examples"], indent=1), json.dumps(report.get("lost_status")),
        json.dumps(report.get("replay")), report["stderr"]))
    assert report["failed"] == [], report
    assert not [kind for kind in report["faults_skipped"] if "and later" in kind], report["faults_skipped"]  # in budget
    assert report["sends_ok"] > 500 and report["deliveries"] >= report["sends_ok"] * 0.9


def test_a_short_seeded_drill_on_a_cluster_loses_nothing(tmp_path):
    report = drill("--history", str(tmp_path / "history.json"), "--seed", "29", "--kills", "3", "--pauses", "2",
                   "--partitions", "3", "--full-disks", "1", "--slow-disks", "2",
                   "--small-disk-mb", "128", "--rate", "150", "--max-delay-s", "8", "--budget-s", "180")
    check_zeros(report)
    faults = report["faults"]
    assert faults.get("kill") == 3 and faults.get("pause") == 2 and faults.get("slow_disk") == 2
    assert sum(n for kind, n in faults.items() if kind.startswith("partition_")) == 3
    if os.geteuid() == 0:
        assert faults.get("full_disk") == 1
    else:
        assert "full_disk" in report["faults_skipped"]
    assert report["faults_on_leader"] >= 2  # the pauses hit the leader
    assert report["double_leader_terms"] == [] and report["converged"]
    assert "--seed 29" in report["replay"]


def test_a_short_seeded_drill_on_a_standalone_node_loses_nothing(tmp_path):
    report = drill("--history", str(tmp_path / "history.json"), "--standalone", "--seed", "29", "--kills", "4",
                   "--slow-disks", "2", "--rate", "150", "--max-delay-s", "8",
                   "--budget-s", "60")
    check_zeros(report)
    assert report["faults"] == {"kill": 4, "slow_disk": 2} and report["mode"] == "standalone"


def test_a_node_under_the_launcher_answers_a_send_after_its_slowed_fsync(tmp_path):
    control = str(tmp_path / "delay")
    server = Server.start(tmp_path / "data", log_path=tmp_path / "serve.log", launcher=(*SLOW_DISK_LAUNCHER, control))
    try:
        set_delay(control, 600)
        started = time.monotonic()
        code, answer = server.post("sendMsg", topic="t", msg="slow", msgId="a")
        assert code == 200, answer
        assert time.monotonic() - started >= 0.6  # answered only once the fsync, 600 ms late, returned
        set_delay(control, 0)
        code, answer = server.post("sendMsg", topic="t", msg="fast", msgId="b")
        assert code == 200, answer
        code, answer = server.post("getMsg", topic="t", msgId="a")
        assert code == 200 and answer["delayMsg"]["msg"] == "slow", answer
    finally:
        server.stop()
