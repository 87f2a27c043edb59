"""listMsg and listDeadMsg pages bounded in bytes (docs/api.md, "Bulk
calls"; docs/security.md, --max-page-bytes), on a real `hourglass serve`.

The abuse: 8 connections each ask for one page of 48 messages of 1 MB
and never read the answer. A page bounded by count only (48 MB each)
grew the node by 365 MiB; bounded by --max-page-bytes (4 MiB) the 8
unread answers hold ~32 MB. The node's RSS is read from /proc, with a
bound well between the two, and /health still answers meanwhile.
"""

from __future__ import annotations

import socket
import time

import pytest
from harness import memory_mb
from serving import PREFIX, Server, request

pytestmark = pytest.mark.slow

MB = 1_000_000
HOUR_MS = 3_600_000


def _send_big(server: Server, topic: str, count: int, size: int) -> None:
    now = int(time.time() * 1000)
    for i in range(count):
        code, body = server.post("sendMsg", topic=topic, msgId=f"m{i:03d}", msg="x" * size,
                                 triggerTime=now + HOUR_MS + i)
        assert code == 200, body


def _unread_page(port: int, query: str) -> socket.socket:
    """A connection that asks for a page and reads nothing of it."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(f"GET {PREFIX}listMsg?{query} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


def test_unread_pages_of_big_messages_hold_little_of_the_node(tmp_path):
    server = Server.start(tmp_path / "data", log_path=tmp_path / "serve.log")
    port = int(server.base.rsplit(":", 1)[1])
    try:
        _send_big(server, "big", 48, MB)
        code, _ = server.get("listMsg", topic="big", limit=48)  # (once: what a page costs to build is warm)
        assert code == 200
        before = memory_mb(server.proc.pid)["rss_mb"]
        socks = [_unread_page(port, "topic=big&limit=48") for _ in range(8)]
        time.sleep(3)  # every page built and handed to its unread socket
        code, _ = server.get("getTopicInfo", topic="big")  # the node still answers
        assert code == 200
        assert request(server.base + "/health", timeout=5)[0] == 200
        grown = memory_mb(server.proc.pid)["rss_mb"] - before
        assert grown < 150, f"the node grew by {grown} MB with 8 unread pages"
        for sock in socks:
            sock.close()
    finally:
        assert server.stop() == 0


def test_a_page_stops_at_the_byte_budget_and_the_cursor_walks_every_message(tmp_path):
    server = Server.start(tmp_path / "data", "--max-page-bytes", "5000", log_path=tmp_path / "serve.log")
    try:
        _send_big(server, "pages", 10, 2000)
        seen: list[str] = []
        cursor = ""
        for _ in range(12):
            code, body = server.get("listMsg", topic="pages", limit=100, cursor=cursor)
            assert code == 200, body
            assert 1 <= len(body["delayMsgList"]) <= 2  # 2,000-byte messages in 5,000 bytes
            seen += [m["msgId"] for m in body["delayMsgList"]]
            cursor = body["cursor"]
            if cursor is None:
                break
        assert seen == [f"m{i:03d}" for i in range(10)]
    finally:
        assert server.stop() == 0


def test_a_dead_letter_page_stops_at_the_byte_budget_too(tmp_path):
    server = Server.start(tmp_path / "data", "--max-page-bytes", "5000", log_path=tmp_path / "serve.log")
    try:
        for i in range(6):  # ENDED: delivered once, nacked, no retry left
            code, body = server.post("sendMsg", topic="dead", msgId=f"d{i}", msg="y" * 2000, maxRetry=0)
            assert code == 200, body
        ended = 0
        for _ in range(50):
            code, body = server.post("pullMsg", topic="dead", batch=10)
            for m in body["delayMsgList"]:
                code, _ = server.post("ackMsg", topic="dead", msgId=m["msgId"], ack="false")
                ended += 1
            if ended == 6:
                break
            time.sleep(0.1)
        seen: list[str] = []
        cursor = ""
        for _ in range(8):
            code, body = server.get("listDeadMsg", topic="dead", limit=100, cursor=cursor)
            assert code == 200, body
            assert 1 <= len(body["delayMsgList"]) <= 2
            seen += [m["msgId"] for m in body["delayMsgList"]]
            cursor = body["cursor"]
            if cursor is None:
                break
        assert sorted(seen) == [f"d{i}" for i in range(6)]
    finally:
        assert server.stop() == 0
