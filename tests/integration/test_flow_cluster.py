"""A topic's pause on a real 3-node cluster (bench/cluster.py): paused on
the leader (replicated through Raft), the leader SIGKILLed, the new leader
keeps it paused -- nothing of the topic handed out through any node --
until resumed, and then hands every message out once."""

from __future__ import annotations

import time

import pytest
from cluster import NODE_IDS, Cluster

pytestmark = pytest.mark.slow

MESSAGES = 10


def test_a_pause_survives_the_leaders_kill(tmp_path):
    c = Cluster.start(tmp_path / "cluster")
    try:
        leader = c.wait_leader()
        c.wait_known(leader)
        topic = "paused"
        code, body = c.nodes[leader].post("pauseTopic", topic=topic)
        assert code == 200 and body["code"] == 200 and body["data"]["paused"] is True, body
        for i in range(MESSAGES):
            code, body = c.nodes[leader].post("sendMsg", topic=topic, msgId=f"m{i}", msg="x")
            assert code == 200 and body["code"] == 200, body
        term = c.health(leader)["term"]  # type: ignore[index]
        c.kill(leader)
        new = c.wait_leader(exclude=leader, above_term=term)
        c.wait_known(new)
        assert c.answer("GET", "getTopicConfig", topic=topic)["data"]["paused"] is True
        for n in NODE_IDS:
            if c.alive(n):
                code, body = c.nodes[n].post("pullMsg", topic=topic, batch=MESSAGES)
                assert code == 200 and body["code"] == 200 and body["delayMsgList"] == [], (n, body)
        info = c.answer("GET", "getTopicInfo", topic=topic)["data"]
        assert info["paused"] is True and info["dueUndelivered"] == MESSAGES, info
        assert c.answer("POST", "resumeTopic", topic=topic)["data"]["paused"] is False
        got: set[str] = set()
        deadline = time.monotonic() + 20
        while len(got) < MESSAGES and time.monotonic() < deadline:
            body = c.answer("POST", "longPollingMsg", topic=topic, batch=MESSAGES, longPollingTimeoutMillis=300)
            got |= {m["msgId"] for m in body["delayMsgList"]}
        assert got == {f"m{i}" for i in range(MESSAGES)}
    finally:
        c.stop()
