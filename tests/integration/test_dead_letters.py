"""Dead letters and reschedules on a real `hourglass serve` (disk backend):
re-driving 100,000 dead messages works in bounded steps without a RAM spike
(they go back to READY beyond the ready window, on disk) and each comes out
once; a rescheduled message keeps its new time across SIGKILL and a
restart, and is delivered once, never early, never at its old time."""

from __future__ import annotations

import time

import pytest
from harness import memory_mb
from serving import Server

pytestmark = pytest.mark.slow

DEAD = 100_000


def test_redrive_of_100k_dead_messages_without_a_ram_spike(tmp_path):
    server = Server.start(tmp_path / "data", "--ready-window", "1000", "--ready-window-total", "1000")
    try:
        past = int(time.time() * 1000) - 3_600_000
        for start in range(0, DEAD, 1000):  # every one already past its ttl: 5 at once
            status, body = server.post_json("sendMsgBatch", {"topic": "d", "msgs": [
                {"msgId": f"m{i}", "msg": "x" * 50, "triggerTime": past, "ttlMillis": 600_000}
                for i in range(start, start + 1000)]})
            assert status == 200, body
        status, body = server.get("listDeadMsg", topic="d", limit=1000)
        assert status == 200 and len(body["delayMsgList"]) == 1000 and body["cursor"], body
        memory = memory_mb(server.proc.pid)
        before, peak_before = memory["rss_mb"], memory["rss_peak_mb"]
        done, calls = 0, 0
        while True:
            status, body = server.post("redriveMsg", topic="d", all="true", limit=50_000)
            assert status == 200, body
            done, calls = done + body["redriven"], calls + 1
            if not body["more"]:
                break
        assert (done, calls) == (DEAD, 2)
        grown = memory_mb(server.proc.pid)["rss_peak_mb"] - max(before, peak_before)
        assert grown < 60, f"peak RSS grew {grown:.1f} MB re-driving {DEAD} messages"
        status, body = server.get("listDeadMsg", topic="d")
        assert body["delayMsgList"] == [] and body["cursor"] is None
        seen = set()
        while len(seen) < DEAD:
            status, body = server.post("pullMsg", topic="d", batch=1000, ackTimeoutMillis=600_000)
            got = [m["msgId"] for m in body["delayMsgList"]]
            assert got and not seen & set(got)
            seen |= set(got)
            assert server.post("ackMsg", topic="d", msgIds=",".join(got))[0] == 200
        assert len(seen) == DEAD
    finally:
        assert server.stop() == 0


def test_a_rescheduled_message_keeps_its_new_time_across_a_kill(tmp_path):
    server = Server.start(tmp_path / "data")
    try:
        now = int(time.time() * 1000)
        assert server.post("sendMsg", topic="r", msgId="a", msg="x", delayMillis=1_500)[0] == 200
        assert server.post("sendMsg", topic="r", msgId="b", msg="x", delayMillis=60 * 60_000)[0] == 200
        code, body = server.post("rescheduleMsg", topic="r", msgId="a", triggerTime=now + 4_000)
        assert code == 200, body
        code, body = server.post("rescheduleMsg", topic="r", msgId="b", triggerTime=now + 3_000)
        assert code == 200, body
        server.kill()
        server = Server.start(tmp_path / "data")
        got = {}
        while len(got) < 2 and time.time() * 1000 < now + 15_000:
            _, body = server.post("longPollingMsg", topic="r", batch=2, longPollingTimeoutMillis=500,
                                  ackTimeoutMillis=600_000)
            for m in body["delayMsgList"]:
                assert m["msgId"] not in got
                got[m["msgId"]] = int(time.time() * 1000)
        assert set(got) == {"a", "b"}
        assert got["a"] >= now + 4_000 and got["b"] >= now + 3_000  # never early: not at a's old 1.5 s
        _, body = server.post("pullMsg", topic="r", batch=10)
        assert body["delayMsgList"] == []
    finally:
        server.stop()
