"""Pauses and topic settings on two real `hourglass serve --backend
redis://` processes sharing one real redis-server (docs/redis.md, "Flow"):
a pause answered by one node holds on the other at once (the scripts
carry it out in Redis), a resume on the other hands the messages out on
both, each node's getTopicConfig and getTopicInfo read what Redis keeps,
and a release rate set on one node reaches the other's pulls within its
poll_ms, the lateness it adds counted apart in that node's /metrics. (A pause across kill -9 of the node: test_flow_kill9.)"""

from __future__ import annotations

import time
import uuid

import pytest
from serving import Server

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

pytestmark = pytest.mark.slow

MESSAGES = 10


def _data(server: Server, method: str, path: str, **params: object) -> dict:
    code, body = server.post(path, **params) if method == "POST" else server.get(path, **params)
    assert code == 200 and body["code"] == 200, body
    return body["data"]


def test_a_pause_on_one_node_holds_on_the_other_and_a_resume_there_releases_both(redis_url, tmp_path):
    nodes = [Server.start(tmp_path / f"node{i}", "--backend", redis_url, log_path=tmp_path / f"node{i}.log")
             for i in range(2)]
    a, b = nodes
    topic = "flow-" + uuid.uuid4().hex[:8]
    try:
        for i in range(MESSAGES):
            code, body = a.post("sendMsg", topic=topic, msgId=f"m{i}", msg="x")
            assert code == 200, body
        paused = _data(a, "POST", "pauseTopic", topic=topic)
        assert paused["paused"] is True
        # at once on the other node: no pull, no long poll hands anything out
        code, body = b.post("pullMsg", topic=topic, batch=MESSAGES)
        assert code == 200 and body["delayMsgList"] == [], body
        code, body = b.post("longPollingMsg", topic=topic, batch=MESSAGES, longPollingTimeoutMillis=300)
        assert code == 200 and body["delayMsgList"] == [], body
        assert _data(b, "GET", "getTopicConfig", topic=topic)["pause"] == paused["pause"]
        info = _data(b, "GET", "getTopicInfo", topic=topic)
        assert info["paused"] is True and info["dueUndelivered"] == MESSAGES, info
        # a key paused on b parks that key's messages on a too
        _data(b, "POST", "pauseTopic", topic=topic, key="k")
        code, body = a.post("sendMsg", topic=topic, msgId="keyed", msg="x", key="k")
        assert code == 200, body
        assert _data(a, "GET", "getTopicInfo", topic=topic)["paused"] is True
        # resumed on b: both hand the topic out, the key's message still held
        resumed = _data(b, "POST", "resumeTopic", topic=topic)
        assert resumed["paused"] == ["k"], resumed
        got = []
        for node in (a, b, a, b):
            code, body = node.post("pullMsg", topic=topic, batch=MESSAGES // 2 + 1)
            assert code == 200, body
            got += [m["msgId"] for m in body["delayMsgList"]]
        assert sorted(got) == sorted(f"m{i}" for i in range(MESSAGES)), got
        _data(a, "POST", "resumeTopic", topic=topic, key="k")
        code, body = b.post("pullMsg", topic=topic, batch=MESSAGES)
        assert code == 200 and [m["msgId"] for m in body["delayMsgList"]] == ["keyed"], body
        assert _data(a, "GET", "getTopicInfo", topic=topic)["paused"] is False
    finally:
        for node in nodes:
            node.stop()


def test_a_release_rate_set_on_one_node_limits_the_other_s_pulls(redis_url, tmp_path):
    """releaseRate=5 set on a (burst 1): b's pulls of 50 due messages take
    one at a time once b has read the setting again (poll_ms: 1 s)."""
    nodes = [Server.start(tmp_path / f"node{i}", "--backend", redis_url, log_path=tmp_path / f"node{i}.log")
             for i in range(2)]
    a, b = nodes
    topic = "rate-" + uuid.uuid4().hex[:8]
    try:
        code, body = a.post_json("sendMsgBatch", {"topic": topic, "msgs": [{"msg": "m"} for _ in range(50)]})
        assert code == 200, body
        assert _data(a, "POST", "setTopicConfig", topic=topic, releaseRate=5)["releaseRate"] == 5
        assert _data(b, "GET", "getTopicConfig", topic=topic)["releaseRate"] == 5  # read from Redis
        time.sleep(2.5)  # b read the settings again (every poll_ms)
        sizes = []
        for _ in range(3):
            code, body = b.post("pullMsg", topic=topic, batch=50)
            assert code == 200, body
            sizes.append(len(body["delayMsgList"]))
        assert sum(sizes) <= 3 and max(sizes) <= 1, sizes  # a token at a time, not the 50 due
        code, text = b.get("/metrics")  # each message the rate let out counted apart (cause="smoothing")
        assert code == 200 and isinstance(text, bytes), text
        assert f'hourglass_release_lateness_seconds_count{{cause="smoothing"}} {sum(sizes)}' in text.decode()
    finally:
        for node in nodes:
            node.stop()
