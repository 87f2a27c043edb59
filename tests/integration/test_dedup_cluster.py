"""A topic's dedup window on a real 3-node cluster (bench/cluster.py): set
on the leader (the setting replicated through Raft), ids ended there (the
ends in the replicated commit log), the leader SIGKILLed: the new leader
answers a send of each ended id with the ended message, unchanged, and
stores nothing -- the window is deterministic from replicated state."""

from __future__ import annotations

import time

import pytest
from cluster import Cluster

pytestmark = pytest.mark.slow

IDS = 5


def test_the_window_survives_the_leaders_kill(tmp_path):
    c = Cluster.start(tmp_path / "cluster")
    try:
        leader = c.wait_leader()
        c.wait_known(leader)
        topic = "orders"
        node = c.nodes[leader]
        code, body = node.post("setTopicConfig", topic=topic, dedupWindowMillis=600_000)
        assert code == 200 and body["code"] == 200 and body["data"]["dedupWindowMillis"] == 600_000, body
        ended = {}
        for i in range(IDS):
            code, body = node.post("sendMsg", topic=topic, msgId=f"o{i}", msg="first")
            assert code == 200 and body["code"] == 200, body
        pulled: list[str] = []
        deadline = time.monotonic() + 10
        while len(pulled) < IDS and time.monotonic() < deadline:
            code, body = node.post("pullMsg", topic=topic, batch=IDS, ackTimeoutMillis=600_000)
            assert code == 200 and body["code"] == 200, body
            pulled += [m["msgId"] for m in body["delayMsgList"]]
        assert sorted(pulled) == [f"o{i}" for i in range(IDS)]
        for msg_id in pulled:
            code, body = node.post("ackMsg", topic=topic, msgId=msg_id)
            assert code == 200 and body["code"] == 200, body
            code, body = node.post("getMsg", topic=topic, msgId=msg_id)
            assert code == 200 and body["delayMsg"]["status"] == 4, body
            ended[msg_id] = body["delayMsg"]
        term = c.health(leader)["term"]  # type: ignore[index]
        c.kill(leader)
        new = c.wait_leader(exclude=leader, above_term=term)
        c.wait_known(new)
        for msg_id, message in ended.items():
            assert c.answer("POST", "sendMsg", topic=topic, msgId=msg_id, msg="second")["delayMsg"] == message
        body = c.answer("POST", "pullMsg", topic=topic, batch=IDS)
        assert body["delayMsgList"] == [], body
    finally:
        c.stop()
