"""A node elected while it installs a snapshot, on a real 3-node cluster
(bench/cluster.py): it finishes the install, then leads from it.

A follower kept down while the leader's checkpoints delete the log it
would need takes the leader's snapshot when it is back. Its fsyncs are
slowed (bench/drill_slow_disk.py), so the unpack (every file fsync'ed)
lasts seconds; the leader is SIGKILLed meanwhile and the other follower
frozen until the installing node is the candidate. Before the fix the
election cancelled the install at its unpack, whose worker thread went
on in snapshot.new and the tar while the candidate took a second
snapshot into the same files: the attempt to lead failed on a file the
first thread had removed, and a mix of two snapshots could be swapped in.
Every process is stopped by PID; the test is bounded in time."""

from __future__ import annotations

import os
import time

import pytest
from cluster import NODE_IDS, Cluster
from drill_nodes import SLOW_DISK_LAUNCHER
from drill_slow_disk import set_delay
from harness import Server

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # (failover deadlines, rates: not beside another worker)

FSYNC_DELAY_MS = 40  # the unpack fsyncs every file of the snapshot (~150): about 6 s


def _wait(predicate, wait_s: float, what: str):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"{what} not reached within {wait_s} s")


def _log(cluster: Cluster, node: str) -> str:
    with open(cluster.nodes[node].log_path) as f:
        return f.read()


def test_a_node_elected_while_installing_a_snapshot_leads_from_it(tmp_path):
    cluster = Cluster.start(tmp_path / "cluster", "--segment-bytes", "65536", "--retain-log-bytes", "65536")
    try:
        leader = cluster.wait_leader()
        cluster.wait_known(leader)
        behind, other = [n for n in NODE_IDS if n != leader]
        cluster.kill(behind)
        node = cluster.nodes[leader]
        for i in range(12):  # ~12 x 100 KB of records: more than the leader keeps for a follower
            msgs = [{"msgId": f"b{i}-{j}", "msg": "x" * 500, "delayMillis": 3_600_000} for j in range(200)]
            status, body = node.post_json("sendMsgBatch", {"topic": "t", "msgs": msgs})
            assert status == 200, body
        for i in range(20):  # ready ones, pulled, half of them acked: state the new leader must keep
            assert node.post("sendMsg", topic="r", msgId=f"r{i}", msg="ready", delayMillis=0)[0] == 200
        pulled = _wait(lambda: [m["msgId"] for m in node.post("pullMsg", topic="r", batch=20)[1].get("delayMsgList")
                                or []], 10, "a pull")
        acked = pulled[: len(pulled) // 2]
        for msg_id in acked:
            assert node.post("ackMsg", topic="r", msgId=msg_id)[0] == 200
        time.sleep(2.5)  # a checkpoint or two: the old segments deleted
        _wait(lambda: cluster.log_ends()[other] == cluster.log_ends()[leader], 20, "the other follower caught up")

        control = os.path.join(cluster.root, f"{behind}.fsync-delay-ms")
        set_delay(control, FSYNC_DELAY_MS)
        cluster.nodes[behind] = Server.spawn(os.path.join(cluster.root, behind), "--node-id", behind, "--cluster",
                                             cluster.spec, *cluster.flags, base=cluster.url(behind),
                                             launcher=(*SLOW_DISK_LAUNCHER, control))
        unpacking = os.path.join(cluster.root, behind, "snapshot.new")
        _wait(lambda: os.path.isdir(unpacking), 30, "the snapshot unpacking")
        cluster.freeze(other)  # the installing node is the one Raft can elect
        cluster.kill(leader)
        time.sleep(1.5)
        cluster.thaw(other)
        _wait(lambda: "leading term" in _log(cluster, behind), 60, f"{behind} leading")
        set_delay(control, 0)
        assert os.path.isdir(unpacking) or "installed a snapshot" in _log(cluster, behind)
        cluster.restart(leader)

        text = _log(cluster, behind)
        # elected mid-install: the install ended, and the node led from it at its first attempt
        assert text.count("installed a snapshot") == 1, text[-3000:]
        assert text.index("installed a snapshot") < text.index("leading term")
        for bad in ("could not take the lead", "InvariantError", "failed", "Traceback", "CRITICAL"):
            assert bad not in text, text[-3000:]
        assert cluster.health(behind)["role"] == "leader"
        new = cluster.nodes[behind]
        for msg_id in ("b0-0", "b11-199"):
            status, body = new.post("getMsg", topic="t", msgId=msg_id)
            assert status == 200 and body["delayMsg"]["msg"] == "x" * 500, body
        for msg_id in pulled:
            status, body = new.post("getMsg", topic="r", msgId=msg_id)
            assert status == 200 and body["delayMsg"]["status"] == (4 if msg_id in acked else 3), body
        # and it goes on leading: a send, the followers fetching it
        assert new.post("sendMsg", topic="t", msgId="after", msg="after", delayMillis=0)[0] == 200
        _wait(lambda: len(set(cluster.log_ends().values())) == 1, 30, "logs converging")
        assert all(cluster.alive(n) for n in NODE_IDS)
        assert cluster.health(behind)["role"] == "leader"
    finally:
        cluster.stop()
