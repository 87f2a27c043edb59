"""What an outsider can make a real `hourglass serve` spend over HTTP is
bounded, and a limit hit is an answer, never a crash (docs/security.md,
Limits): connections and descriptors, request parsing, durations,
metric labels, the token."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time

import pytest
from harness import memory_mb
from serving import Server, request

pytestmark = pytest.mark.slow

SEND = "/camellia/delayQueue/sendMsg"


def half_open(server: Server, count: int) -> list[socket.socket]:
    """`count` connections that each send part of a request head and hold."""
    host, port = server.base.removeprefix("http://").split(":")
    held = []
    for _ in range(count):
        s = socket.create_connection((host, int(port)))
        s.sendall(f"POST {SEND} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le".encode())
        held.append(s)
    return held


def answered_within(server: Server, seconds: float) -> tuple[int, int]:
    """(status of /health, status of a sendMsg), each with a `seconds` timeout."""
    health, _ = request(server.base + "/health", timeout=seconds)
    sent, body = request(server.base + SEND, data=b"topic=t&msg=hello", timeout=seconds,
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert json.loads(body)["code"] == 200, body
    return health, sent


def metric(server: Server, name: str) -> float:
    status, text = server.get("/metrics")
    assert status == 200
    return float(re.search(rb"^%s (\S+)$" % name.encode(), text, re.MULTILINE).group(1))


def test_half_open_connections_leave_health_and_sends_answered(tmp_path):
    server = Server.start(tmp_path / "data")
    held = half_open(server, 300)
    try:
        assert answered_within(server, 2.0) == (200, 200)
    finally:
        for s in held:
            s.close()
    assert server.stop() == 0


def _low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))


def test_a_low_descriptor_limit_costs_connections_never_a_checkpoint(tmp_path):
    """Under RLIMIT_NOFILE 400, 500 held connections: the node keeps
    descriptors for storage, answers, and checkpoints (before, 258
    half-open sockets made the next checkpoint fail with EMFILE, exit 1)."""
    server = Server.start(tmp_path / "data", "--head-timeout", "60", preexec_fn=_low_descriptor_limit)
    held = half_open(server, 300)
    try:
        assert answered_within(server, 2.0) == (200, 200)
        held += half_open(server, 200)
        checkpoints = metric(server, "hourglass_checkpoints_total")
        for _ in range(3):
            assert answered_within(server, 2.0) == (200, 200)
            time.sleep(0.5)
        deadline = time.monotonic() + 10
        while metric(server, "hourglass_checkpoints_total") < checkpoints + 2:
            assert time.monotonic() < deadline, "no checkpoint while the connections were held"
            time.sleep(0.2)
        closed = 0
        for s in held:  # the server closed stalled ones to make room: it never held 500
            s.setblocking(False)
            try:
                closed += s.recv(1) == b""
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        assert closed >= 500 - 400
    except BaseException:  # (not left running for a later test's collection to find)
        server.kill()
        raise
    finally:
        for s in held:
            s.close()
    assert server.proc.poll() is None
    assert server.stop() == 0  # the last checkpoint too
    with open(server.log_path, encoding="utf-8") as f:
        log = f.read()
    assert "Too many open files" not in log and "Traceback" not in log


def post_raw(server: Server, call: str, body: bytes, content_type: str) -> tuple[int, dict]:
    """POST `body`, reading the answer even when the server answers before
    taking the whole body (a cap) and closes."""
    host, port = server.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(f"POST /camellia/delayQueue/{call} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode())
        with contextlib.suppress(OSError):  # refused unread: the answer is waiting
            s.sendall(body)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:  # closed with our body unread: the answer came first
            pass
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(payload)


def test_bodies_that_decode_to_many_objects_are_refused_before_decoding(tmp_path):
    """Before: a 6 MiB form of empty pairs stalled /health 2 s and added
    117 MB; a 16 MiB batch of `{}` added 338 MB."""
    server = Server.start(tmp_path / "data")  # --max-msg-bytes 1 MiB: bodies up to 6 MiB + 64 KiB
    try:
        answered_within(server, 2.0)
        before = memory_mb(server.proc.pid)["rss_peak_mb"]
        status, answer = post_raw(server, "sendMsg", b"&" * (6 * 1024 * 1024), "application/x-www-form-urlencoded")
        assert status == 413 and "--max-form-pairs" in answer["msg"]
        status, answer = post_raw(server, "sendMsgBatch", b'{"topic":"t","msgs":[' + b"{}," * 3_000_000 + b"{}]}",
                                  "application/json")
        assert status == 413 and "JSON marks" in answer["msg"]  # 9 MiB: under the byte cap, over the marks
        status, answer = post_raw(server, "sendMsgBatch", b'{"topic":"t","msgs":[' + b"{}," * 5_600_000 + b"{}]}",
                                  "application/json")
        assert status == 413 and "more than" in answer["msg"]  # 16 MiB: over the batch's byte cap, unread
        status, answer = post_raw(server, "sendMsg", b'{"topic":"t","msg":"m","x":[' + b"[]," * 2_000_000 + b"[]]}",
                                  "application/json")
        assert status == 413 and "JSON marks" in answer["msg"]  # any call's JSON, not only a batch's
        assert memory_mb(server.proc.pid)["rss_peak_mb"] - before < 100
        assert answered_within(server, 2.0) == (200, 200)
    finally:
        assert server.stop() == 0


def test_an_ack_timeout_above_the_maximum_is_clamped(tmp_path):
    """Before: ackTimeoutMillis=253402300799999 hid a message until a
    restart. With --max-ack-timeout-ms 30000 it is back after 30 s."""
    server = Server.start(tmp_path / "data", "--max-ack-timeout-ms", "30000")
    try:
        server.post("sendMsg", topic="t", msg="m", msgId="a")
        deadline = time.monotonic() + 10
        pulled = []
        while not pulled and time.monotonic() < deadline:
            pulled = server.post("pullMsg", topic="t", ackTimeoutMillis=253_402_300_799_999)[1]["delayMsgList"]
        assert [m["msgId"] for m in pulled] == ["a"]
        again = []
        deadline = time.monotonic() + 45
        while not again and time.monotonic() < deadline:
            again = server.post("longPollingMsg", topic="t", longPollingTimeoutMillis=5000)[1]["delayMsgList"]
        assert [m["msgId"] for m in again] == ["a"] and again[0]["retry"] == pulled[0]["retry"] + 1
    finally:
        assert server.stop() == 0


def _serve_cli(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "data"),
                           "--port", "0", *flags], capture_output=True, text=True, timeout=30, check=False)


def test_a_token_file_others_may_read_is_refused_unless_allowed(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    token_file.chmod(0o644)
    result = _serve_cli(tmp_path, "--auth-token-file", str(token_file))
    assert result.returncode == 2
    assert "mode 0644" in result.stderr and "--allow-readable-token" in result.stderr
    server = Server.start(tmp_path / "data", "--auth-token-file", str(token_file), "--allow-readable-token",
                          token="s3cret-token-0123456789")
    try:
        assert server.get("/metrics")[0] == 200
    finally:
        assert server.stop() == 0
    with open(server.log_path, encoding="utf-8") as f:
        assert "WARNING" in f.read()


def test_the_bearer_scheme_is_case_insensitive(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-0123456789\n")
    token_file.chmod(0o600)
    server = Server.start(tmp_path / "data", "--auth-token-file", str(token_file))
    try:
        token = "s3cret-token-0123456789"
        for header, expected in ((f"bearer {token}", 200), (f"BEARER {token}", 200), (f"Bearer  {token}", 200),
                                 (f"Basic {token}", 401), (f"bearer {token[:-1]}", 401), (token, 401)):
            assert request(server.base + "/metrics", headers={"Authorization": header})[0] == expected, header
    finally:
        assert server.stop() == 0


def _files(directory) -> dict[str, tuple[int, int]]:
    """path -> (mtime_ns, size) of every file under `directory`."""
    out = {}
    for root, _, names in os.walk(directory):
        for name in names:
            st = os.stat(os.path.join(root, name))
            out[os.path.join(root, name)] = (st.st_mtime_ns, st.st_size)
    return out


def test_far_hours_make_bounded_files_and_an_idle_node_rewrites_nothing(tmp_path):
    """One batch of 1,000 messages in 1,000 different hours, spread up to the
    largest triggerTime, made 3,000 files (three per hour) and a checkpoint
    rewritten every second; it now makes a few files per span size, and a
    node left idle writes no file at all."""
    data = tmp_path / "data"
    server = Server.start(data)
    try:
        now_ms = int(time.time() * 1000)
        hour_ms = 3_600_000
        last = 253_402_300_799_999
        step = (last - now_ms) // 1000
        msgs = [{"msgId": f"far{i}", "msg": "x", "triggerTime": now_ms + i * step + 40 * hour_ms}
                for i in range(1000)]
        code, body = server.post_json("/camellia/delayQueue/sendMsgBatch", {"topic": "far", "msgs": msgs})
        assert code == 200, body
        code, body = server.post("/camellia/delayQueue/getMsg", topic="far", msgId="far999")
        assert code == 200 and body["delayMsg"]["triggerTime"] == msgs[999]["triggerTime"], body
        delay = os.listdir(data / "delay")
        assert len(delay) <= 3 * 3 * 23 + 6, len(delay)  # at most three spans of each size (3 files each)
        time.sleep(2.5)  # a checkpoint (every second) has written what the batch changed
        before = _files(data)
        time.sleep(3)
        after = _files(data)
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        assert changed == [], changed
    finally:
        assert server.stop() == 0
