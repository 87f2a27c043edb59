"""Push delivery against subscribers that misbehave, each a real socket in
this process and the node a real `hourglass serve` (docs/security.md,
"Push delivery"): an answer head whose one header line never ends, on an
idle kept-alive connection and as the answer to a POST; tarpits that
accept and never answer, with a real RLIMIT_NOFILE on the node; and a
subscriber answering `503 Retry-After: 0`."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import threading
import time
from collections.abc import Callable

import pytest
from serving import Server, status, wait_for

pytestmark = pytest.mark.slow

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
ACKED = 4
# What one endless head may cost the test before it counts as gathered by the node.
ENDLESS_CAP_BYTES = 32 * 1024 * 1024
ENDLESS_CAP_S = 20.0


def read_request(conn: socket.socket, buffered: bytearray) -> bool:
    """Read one request (head and Content-Length body) off `conn`; False at EOF."""
    while b"\r\n\r\n" not in buffered:
        data = conn.recv(65536)
        if not data:
            return False
        buffered += data
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        data = conn.recv(65536)
        if not data:
            return False
        rest += data
    buffered[:] = rest[length:]
    return True


class RawSubscriber:
    """A listening socket on loopback; each connection runs `behave(conn,
    self)` in a thread of its own. Counts POSTs (with their times) and
    what an endless sender managed to send before the node closed on it."""

    def __init__(self, behave: Callable[[socket.socket, RawSubscriber], None]) -> None:
        self.behave = behave
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.lock = threading.Lock()
        self.posts: list[float] = []
        self.sent = 0
        self.closed_by_node = threading.Event()
        self.stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            self.behave(conn, self)

    def posted(self) -> None:
        with self.lock:
            self.posts.append(time.monotonic())

    def send_endless_head(self, conn: socket.socket) -> None:
        """A head whose one header line never ends, until the node closes
        the connection (or the test's cap: then the node gathered it)."""
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        chunk = b"a" * 65536
        deadline = time.monotonic() + ENDLESS_CAP_S
        try:
            while self.sent < ENDLESS_CAP_BYTES and time.monotonic() < deadline:
                conn.sendall(chunk)
                self.sent += len(chunk)
        except OSError:  # reset or broken pipe: the node closed it
            self.closed_by_node.set()

    def stop(self) -> None:
        self.stopping = True
        self.listener.close()



def metric(server: Server, name: str, **labels: str) -> float:
    """The sum of a /metrics series' samples whose labels include `labels`."""
    code, text = server.get("/metrics")
    assert isinstance(text, bytes), f"/metrics answered {code}: {text!r}"
    total = 0.0
    for line in text.decode().splitlines():
        match = re.match(rf"^{name}(\{{[^}}]*\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total



def test_an_endless_head_on_an_idle_kept_alive_push_connection_is_closed_at_once(tmp_path):
    def answer_then_endless(conn: socket.socket, sub: RawSubscriber) -> None:
        buffered = bytearray()
        if read_request(conn, buffered):
            sub.posted()
            conn.sendall(OK)  # kept alive; then an answer to no request
            sub.send_endless_head(conn)

    sub = RawSubscriber(answer_then_endless)
    server = Server.start(tmp_path / "data", "--push-allow", "127.0.0.1", log_path=tmp_path / "serve.log")
    try:
        assert server.post("subscribe", topic="idle", url=sub.url)[0] == 200
        server.post("sendMsg", topic="idle", msg="once", msgId="m1")
        wait_for(lambda: status(server, "idle", "m1") == ACKED, 20, "the delivery's ack")
        assert sub.closed_by_node.wait(ENDLESS_CAP_S + 5), f"the node read {sub.sent} bytes and kept reading"
        assert sub.sent < 16 * 1024 * 1024
        assert server.get("/health")[0] == 200
    finally:
        sub.stop()
        server.kill()


def test_an_endless_answer_head_fails_the_delivery_at_the_head_limit(tmp_path):
    def endless_answer(conn: socket.socket, sub: RawSubscriber) -> None:
        buffered = bytearray()
        if read_request(conn, buffered):
            sub.posted()
            sub.send_endless_head(conn)

    sub = RawSubscriber(endless_answer)
    server = Server.start(tmp_path / "data", "--push-allow", "127.0.0.1", log_path=tmp_path / "serve.log")
    try:  # timeoutMillis at its most: only the head limit ends the POST early
        assert server.post("subscribe", topic="endless", url=sub.url, timeoutMillis=300_000)[0] == 200
        server.post("sendMsg", topic="endless", msg="once", msgId="m1")
        wait_for(lambda: sub.posts, 20, "the first POST")
        assert sub.closed_by_node.wait(ENDLESS_CAP_S + 5), f"the node read {sub.sent} bytes and kept reading"
        assert sub.sent < 16 * 1024 * 1024
        wait_for(lambda: metric(server, "hourglass_push_failures_total", topic="endless", reason="head too large"),
                 10, "a failure counted as 'head too large'")
        assert server.get("/health")[0] == 200
    finally:
        sub.stop()
        server.kill()


NOFILE = 400


def node_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_tarpit_subscribers_under_a_real_rlimit_nofile_leave_the_clients_their_descriptors(tmp_path):
    # Three subscribers that take connections (the kernel completes them:
    # a backlog never accepted) and never answer.
    tarpits = [socket.create_server(("127.0.0.1", 0), backlog=1024) for _ in range(3)]

    def limit_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))

    server = Server.start(tmp_path / "data", "--push-allow", "127.0.0.1", log_path=tmp_path / "serve.log",
                          preexec_fn=limit_descriptors)
    try:
        for i, tarpit in enumerate(tarpits):
            url = f"http://127.0.0.1:{tarpit.getsockname()[1]}/hook"
            assert server.post("subscribe", topic=f"tar{i}", url=url, timeoutMillis=300_000, concurrency=256)[0] == 200
        for i in range(len(tarpits)):
            status_code, _ = server.post_json("sendMsgBatch", {"topic": f"tar{i}", "msgs": [
                {"msg": f"m{j}", "msgId": f"m{j}"} for j in range(300)]})
            assert status_code == 200
        # every delivery under way: 768 POSTs wanted, the connections they could get open
        wait_for(lambda: metric(server, "hourglass_push_in_flight") >= 3 * 256, 30, "768 deliveries in flight")
        time.sleep(2)
        for _ in range(20):
            assert server.proc.poll() is None, server.process.log_tail()
            assert server.get("/health")[0] == 200
            assert server.post("sendMsg", topic="clients", msg="still answered")[0] == 200
            time.sleep(0.05)
        # the push connections stay within their pool: storage's reserve is free
        assert node_fds(server.proc.pid) < NOFILE - 128
        clients = [socket.create_connection(("127.0.0.1", int(server.base.rsplit(":", 1)[1]))) for _ in range(50)]
        try:
            assert server.get("/health")[0] == 200  # 50 more client connections fit beside the tarpits
        finally:
            for c in clients:
                c.close()
    finally:
        for tarpit in tarpits:
            tarpit.close()
        server.kill()


def test_retry_after_zero_cannot_switch_the_backoff_off(tmp_path):
    def busy(conn: socket.socket, sub: RawSubscriber) -> None:
        buffered = bytearray()
        while read_request(conn, buffered):
            sub.posted()
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0\r\nContent-Length: 0\r\n\r\n")

    sub = RawSubscriber(busy)
    server = Server.start(tmp_path / "data", "--push-allow", "127.0.0.1", log_path=tmp_path / "serve.log")
    window_s, messages = 4.0, 10
    try:
        assert server.post("subscribe", topic="busy", url=sub.url)[0] == 200
        server.post_json("sendMsgBatch", {"topic": "busy", "msgs": [
            {"msg": f"m{j}", "msgId": f"m{j}", "maxRetry": 10_000} for j in range(messages)]})
        wait_for(lambda: len(sub.posts) >= messages, 20, "each message's first POST")
        first = sub.posts[0]
        time.sleep(max(0.0, first + window_s - time.monotonic()) + 0.5)
        in_window = sum(1 for t in list(sub.posts) if t <= first + window_s)
        # each message: its first POST, then one at most every 500 ms (the
        # backoff's least floor: half of 1 s), whatever Retry-After says
        assert messages <= in_window <= messages * (1 + window_s / 0.5), in_window
        with open(server.log_path, encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if "push busy: delivery of" in line]
        assert 1 <= len(lines) <= 2, len(lines)  # one a minute, with a count of the others
        assert server.get("/health")[0] == 200
    finally:
        sub.stop()
        server.kill()
