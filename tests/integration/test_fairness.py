"""Fairness between tenants (docs/api.md) on a real `hourglass serve` with
fairness `fairKey` (setTopicConfig): tenant A's 20,000 messages come due at once, against a
window of 512 (A's share: 32 places; 1,024 places remembered over all
topics, the rest of A's found again by a scan); tenant B sends one message
due now every 0.2 s, and a consumer pulls 10 and acks each: every B
message is in the very next pull (a round: one of A's, then B's). The
same on a topic without fairness, for contrast: B's message waits behind
A's backlog. A restart (SIGKILL) keeps the fairKeys, and the turns start
again."""

from __future__ import annotations

import time

import pytest
from serving import Server

pytestmark = pytest.mark.slow

BACKLOG = 20_000
ROUNDS = 25
FLAGS = ("--ready-window", "512", "--ready-window-total", "1024")


def send_backlog(server: Server, topic: str) -> None:
    for start in range(0, BACKLOG, 1000):
        status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": [
            {"msgId": f"a{i:05d}", "msg": "a", "fairKey": "A"} for i in range(start, start + 1000)]})
        assert status == 200, body
        assert {m["fairKey"] for m in body["delayMsgList"]} == {"A"}


def pull_and_ack(server: Server, topic: str) -> list[dict]:
    status, body = server.post("pullMsg", topic=topic, batch=10, ackTimeoutMillis=60_000)
    assert status == 200, body
    got = body["delayMsgList"]
    if got:
        status, body = server.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in got))
        assert status == 200, body
    return got


def rounds(server: Server, topic: str, prefix: str) -> list[tuple[str, list[str]]]:
    """Each round: B's message sent due now, then one pull of 10 (its ids)."""
    out = []
    for n in range(ROUNDS):
        msg_id = f"{prefix}{n}"
        status, body = server.post("sendMsg", topic=topic, msgId=msg_id, msg="b", fairKey="B")
        assert status == 200 and body["delayMsg"]["status"] == 2, body
        out.append((msg_id, [m["msgId"] for m in pull_and_ack(server, topic)]))
        time.sleep(0.2)
    return out


def test_one_tenants_backlog_holds_anothers_message_a_round_at_most(tmp_path):
    server = Server.start(tmp_path / "data", *FLAGS, log_path=tmp_path / "serve.log")
    try:
        status, body = server.post("setTopicConfig", topic="fair", fairness="fairKey")
        assert status == 200 and body["data"]["fairness"] == "fairKey", body
        send_backlog(server, "fair")
        send_backlog(server, "plain")
        for msg_id, pulled in rounds(server, "fair", "b"):
            assert msg_id in pulled, (msg_id, pulled)
            assert len(pulled) == 10 and pulled.index(msg_id) <= 1, pulled  # (A's first, or B's)
        plain = rounds(server, "plain", "b")
        assert all(msg_id not in pulled for msg_id, pulled in plain), plain
        status, body = server.post("getMsg", topic="fair", msgId="a19999")
        assert status == 200 and body["delayMsg"]["fairKey"] == "A", body
        server.kill()
        server = Server.start(tmp_path / "data", *FLAGS, log_path=tmp_path / "serve2.log")
        for msg_id, pulled in rounds(server, "fair", "c"):
            assert msg_id in pulled, (msg_id, pulled)
        status, body = server.post("getMsg", topic="fair", msgId="a19999")
        assert status == 200 and body["delayMsg"]["fairKey"] == "A", body
    finally:
        server.kill()
