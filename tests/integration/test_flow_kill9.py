"""kill -9 of a real `hourglass serve` in the middle of a topic's pause
(docs/api.md, "Flow"): the pause survives it -- nothing of the topic is
handed out after the restart, by pull or long poll -- and resume then
carries out the pause's policy: `hold` hands every message out, `shift`
moves each one that fell due while paused by the pause's length, `expire`
ends each (status 5, endReason `paused`) and hands none out. No message
is lost, none is handed out before its (shifted) trigger time.
Run on one shard, on a node of two (each shard keeps the pause), and on
the Redis backend (the pause kept in Redis, the node's process killed)."""

from __future__ import annotations

import time
import uuid

import pytest
from serving import Server

MESSAGES = 40
DUE_IN_MS = 800


def _pull_all(server: Server, topic: str, count: int, timeout_s: float = 20) -> list[tuple[int, dict]]:
    """Long-poll until `count` messages came; each with the time it was answered."""
    got: list[tuple[int, dict]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        code, body = server.post("longPollingMsg", topic=topic, batch=count - len(got),
                                 longPollingTimeoutMillis=300)
        assert code == 200, body
        now_ms = int(time.time() * 1000)
        got += [(now_ms, m) for m in body["delayMsgList"]]
    return got


@pytest.mark.parametrize("backend", ["1 shard", "2 shards", "redis"])
@pytest.mark.parametrize("policy", ["hold", "shift", "expire"])
def test_a_pause_survives_kill9_and_resume_carries_its_policy_out(request, tmp_path, policy, backend):
    data = tmp_path / "data"
    if backend == "redis":
        pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")
        flags: tuple[str, ...] = ("--backend", request.getfixturevalue("redis_url"))
    else:
        flags = ("--fsync", "batch", "--shards", backend.split()[0])
    server = Server.start(data, *flags, log_path=tmp_path / "serve.log")
    try:
        topic = "paused-" + uuid.uuid4().hex[:8]  # (a Redis is shared by the session's tests)
        code, body = server.post("pauseTopic", topic=topic, onResume=policy)
        assert code == 200, body
        paused_at = body["data"]["pause"]["pausedAt"]
        sent = {}
        for i in range(MESSAGES):
            code, body = server.post("sendMsg", topic=topic, msgId=f"m{i}", msg="x", delayMillis=DUE_IN_MS)
            assert code == 200, body
            sent[f"m{i}"] = body["delayMsg"]["triggerTime"]
        time.sleep(DUE_IN_MS / 1000 + 0.5)  # all due, none handed out
        code, body = server.post("pullMsg", topic=topic, batch=MESSAGES)
        assert code == 200 and body["delayMsgList"] == [], body
    finally:
        server.kill()

    again = Server.start(data, *flags, log_path=tmp_path / "serve2.log")
    try:
        code, body = again.post("longPollingMsg", topic=topic, batch=MESSAGES, longPollingTimeoutMillis=1000)
        assert code == 200 and body["delayMsgList"] == [], body
        code, body = again.get("getTopicInfo", topic=topic)
        assert code == 200 and body["data"]["paused"] is True, body
        assert body["data"]["dueUndelivered"] == MESSAGES, body
        code, body = again.get("getTopicConfig", topic=topic)
        assert body["data"]["pause"] == {"pausedAt": paused_at, "onResume": policy}, body

        asked_ms = int(time.time() * 1000)
        code, body = again.post("resumeTopic", topic=topic)
        answered_ms = int(time.time() * 1000)
        assert code == 200 and body["data"]["paused"] is False, body
        if policy == "expire":
            for msg_id in sent:
                code, body = again.post("getMsg", topic=topic, msgId=msg_id)
                assert code == 200 and body["delayMsg"]["status"] == 5, body
                assert body["delayMsg"]["endReason"] == "paused", body
            code, body = again.post("longPollingMsg", topic=topic, batch=MESSAGES, longPollingTimeoutMillis=500)
            assert code == 200 and body["delayMsgList"] == [], body
            return
        got = _pull_all(again, topic, MESSAGES)
        assert sorted(m["msgId"] for _, m in got) == sorted(sent), "every message handed out once, none lost"
        for at_ms, m in got:
            assert m["triggerTime"] <= at_ms, f"{m['msgId']} handed out before its trigger time"
            if policy == "hold":
                assert m["triggerTime"] == sent[m["msgId"]]
            else:  # moved by the pause's length: resumedAt (asked..answered) - pausedAt, within a second
                low, high = asked_ms - paused_at, answered_ms - paused_at
                assert sent[m["msgId"]] + low - 1000 <= m["triggerTime"] <= sent[m["msgId"]] + high + 1000, m
    finally:
        again.stop()
