"""What an outsider can make a real `hourglass serve` spend over HTTP is
bounded, and a limit hit is an answer, never a crash (SPEC 3 "Bounded
resources"): connections and descriptors, request parsing, durations,
metric labels, the token."""

from __future__ import annotations

import json
import re
import resource
import socket
import time

import pytest
from serving import Server, request

pytestmark = pytest.mark.slow

SEND = "/camellia/delayQueue/sendMsg"


def half_open(server: Server, count: int) -> list[socket.socket]:
    """`count` connections that each send part of a request head and hold."""
    host, port = server.base.removeprefix("http://").split(":")
    held = []
    for _ in range(count):
        s = socket.create_connection((host, int(port)))
        s.sendall(f"POST {SEND} HTTP/1.1\r\nHost: x\r\nContent-Le".encode())
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
    finally:
        for s in held:
            s.close()
    assert server.proc.poll() is None
    assert server.stop() == 0  # the last checkpoint too
    with open(server.log_path, encoding="utf-8") as f:
        log = f.read()
    assert "Too many open files" not in log and "Traceback" not in log
