"""What a stranger can do to a real `hourglass serve` through its HTTP
front, over raw sockets (docs/security.md, Limits and "Decided on the
head"): ambiguous heads, answers nobody reads, bodies refused
on their head, slow bodies, the 503 at the connection cap, and browsers
(Host, Origin, Sec-Fetch-Site) on a node without a token."""

from __future__ import annotations

import json
import os
import select
import socket
import time

import pytest
from harness import memory_mb
from serving import Server, request

pytestmark = pytest.mark.slow

SEND = "/camellia/delayQueue/sendMsg"
TOKEN = "front-test-token-0123456789"


@pytest.fixture(scope="module")
def open_node(tmp_path_factory):
    """A node without a token."""
    server = Server.start(tmp_path_factory.mktemp("open") / "data")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def token_node(tmp_path_factory):
    directory = tmp_path_factory.mktemp("token")
    token_file = directory / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    server = Server.start(directory / "data", "--auth-token-file", str(token_file), "--body-budget-bytes",
                          str(1024 * 1024), token=TOKEN)
    yield server
    server.stop()


def connect(server: Server, timeout: float = 10) -> socket.socket:
    host, port = server.base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_answer(s: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One answer (status, headers, body) read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split(" ")[1]), headers, rest[:length]


def closed_after(s: socket.socket, wait_s: float = 5) -> bool:
    """The server closed the connection (EOF or a reset) within `wait_s`."""
    s.settimeout(wait_s)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def head(method: str, path: str, *lines: str, length: int | None = None) -> bytes:
    extra = "".join(line + "\r\n" for line in lines)
    if length is not None:
        extra += f"Content-Length: {length}\r\n"
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n".encode()


# -- ambiguous heads --------------------------------------------------------------------

AMBIGUOUS = {
    "two different Content-Lengths": b"POST " + SEND.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                     b"Content-Length: 5\r\nContent-Length: 6\r\n\r\ntopic=",
    "a signed Content-Length": b"POST " + SEND.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Content-Length: +5\r\n\r\ntopic",
    "an underscore in Content-Length": b"POST " + SEND.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                       b"Content-Length: 0_5\r\n\r\ntopic",
    "a space before the colon": b"GET /health HTTP/1.1\r\nHost : 127.0.0.1\r\n\r\n",
    "a folded line": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: b\r\n X-B: c\r\n\r\n",
    "a bare LF in a value": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: b\nc\r\n\r\n",
    "NUL in a name": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-\x00A: b\r\n\r\n",
    "NUL in a value": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: b\x00c\r\n\r\n",
    "NUL in the path": b"GET /hea\x00lth HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "two Host headers": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(AMBIGUOUS))
def test_an_ambiguous_head_is_answered_400_and_closed(open_node, case):
    """Before: every one of these was accepted (the first Content-Length
    won, `int()` took +5 and 0_5, the folded line became a header)."""
    with connect(open_node) as s:
        s.sendall(AMBIGUOUS[case])
        status, headers, _ = read_answer(s)
        assert status == 400, case
        assert headers.get("connection") == "close" and closed_after(s)
    assert open_node.get("/health")[0] == 200


# -- answers nobody reads ----------------------------------------------------------------

def test_pipelined_requests_whose_answers_are_never_read_hold_bounded_memory(open_node):
    """Before: 15.5 MB of pipelined `GET /x` with the answers never read
    took the node's RSS from 46 to 611 MiB. Here each request (44 bytes)
    asks for the console's page (about 10 KB)."""
    before = memory_mb(open_node.proc.pid)["rss_mb"]
    with connect(open_node) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        pending = head("GET", "/console") * 8000
        deadline = time.monotonic() + 20
        while pending and time.monotonic() < deadline:
            try:
                pending = pending[s.send(pending):]
            except BlockingIOError:  # the node stopped reading: it holds no more
                time.sleep(0.05)
        time.sleep(1.0)
        grown = memory_mb(open_node.proc.pid)["rss_mb"] - before
        assert open_node.get("/health")[0] == 200  # and it serves others meanwhile
    assert grown < 40, f"RSS grew {grown:.0f} MiB"


def test_pipelined_reads_of_a_large_message_wait_for_the_client(token_node):
    """Before: 300 pipelined getMsg of one 1 MiB message (65 KB sent)
    added 300 MiB."""
    status, body = token_node.post("sendMsg", topic="big", msgId="m", msg="x" * (1024 * 1024 - 100),
                                   delayMillis=3_600_000)
    assert status == 200, body
    before = memory_mb(token_node.proc.pid)["rss_mb"]
    form = b"topic=big&msgId=m"
    one = head("POST", "/camellia/delayQueue/getMsg", f"Authorization: Bearer {TOKEN}",
               "Content-Type: application/x-www-form-urlencoded", length=len(form)) + form
    with connect(token_node) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(one * 300)
        time.sleep(1.0)
        grown = memory_mb(token_node.proc.pid)["rss_mb"] - before
        s.settimeout(10)
        status, _, answer = read_answer(s)  # the answers are all there for a client that reads
        assert status == 200 and json.loads(answer)["delayMsg"]["msgId"] == "m"
    assert grown < 40, f"RSS grew {grown:.0f} MiB"


# -- decided on the head -------------------------------------------------------------------

def test_a_refused_request_is_answered_without_its_body_and_closed(open_node):
    """Before: `POST /nope` with Content-Length 1000 and one byte held its
    connection for --body-timeout (40 of them held every slot)."""
    held = []
    try:
        for _ in range(40):
            s = connect(open_node)
            s.sendall(head("POST", "/nope", length=1000) + b"x")
            held.append(s)
        for s in held:
            status, headers, _ = read_answer(s)
            assert status == 404 and headers.get("connection") == "close"
            assert closed_after(s)
    finally:
        for s in held:
            s.close()


def test_the_token_is_checked_before_100_continue_and_the_body_budget(token_node):
    """Before: `Expect: 100-continue` was answered 100 without a token, and
    unauthenticated heads with a large Content-Length reserved the body
    budget, so an authenticated 100 KB send got 429."""
    with connect(token_node) as s:
        s.sendall(head("POST", SEND, "Expect: 100-continue", length=100_000))
        status, _, _ = read_answer(s)
        assert status == 401 and closed_after(s)
    held = []
    try:
        for _ in range(8):  # each would reserve 512 KiB of the 1 MiB budget
            s = connect(token_node)
            s.sendall(head("POST", SEND, "Content-Type: application/x-www-form-urlencoded",
                           length=512 * 1024) + b"topic=")
            held.append(s)
        time.sleep(0.3)
        status, body = token_node.post("sendMsg", topic="budget", msg="y" * 100_000)
        assert status == 200, body
    finally:
        for s in held:
            s.close()


def test_unknown_paths_and_wrong_methods_are_refused_on_the_head(token_node):
    with connect(token_node) as s:
        s.sendall(head("POST", "/nope", f"Authorization: Bearer {TOKEN}", "Expect: 100-continue", length=10))
        status, _, _ = read_answer(s)
        assert status == 404 and closed_after(s)
    with connect(token_node) as s:
        s.sendall(head("GET", SEND, f"Authorization: Bearer {TOKEN}"))
        status, headers, body = read_answer(s)
        assert status == 405 and headers.get("allow") == "POST" and json.loads(body)["code"] == 405


def test_a_body_slower_than_the_minimum_rate_is_closed(tmp_path):
    server = Server.start(tmp_path / "data", "--min-body-rate", "1000", "--max-connections", "4")
    held = []
    try:
        slow = connect(server)
        held.append(slow)
        slow.sendall(head("POST", SEND, "Content-Type: application/x-www-form-urlencoded", length=100_000))
        started = time.monotonic()
        for _ in range(5):
            try:
                slow.sendall(b"a")
            except OSError:
                break
            time.sleep(1)
        assert closed_after(slow, 10) and time.monotonic() - started < 12
        # slow bodies at the cap do not keep others out for --body-timeout
        for _ in range(4):
            s = connect(server)
            held.append(s)
            s.sendall(head("POST", SEND, length=100_000) + b"a")
        time.sleep(3.5)  # past the 2 s grace: each is below the minimum rate
        assert server.get("/health")[0] == 200
        assert all(closed_after(s, 5) for s in held[1:])
    finally:
        for s in held:
            s.close()
        server.stop()


def test_the_503_at_the_connection_cap_reaches_the_client(tmp_path):
    """Before: the node closed a refused socket at once, so the rest of a
    client's request met a reset and the client failed sending it, never
    reading the 503."""
    server = Server.start(tmp_path / "data", "--max-connections", "2")
    busy: list[socket.socket] = []

    def hold_both() -> None:  # two long polls of a topic nothing is sent to: running, never stalled
        for s in busy:
            s.close()
        busy.clear()
        for _ in range(2):
            s = connect(server)
            form = b"topic=idle&longPollingTimeoutMillis=60000"
            s.sendall(head("POST", "/camellia/delayQueue/longPollingMsg",
                           "Content-Type: application/x-www-form-urlencoded", length=len(form)) + form)
            busy.append(s)

    def answered(s: socket.socket) -> bool:  # (refused at the cap, or done: it holds no place)
        return bool(select.select([s], [], [], 0)[0])

    try:
        hold_both()

        def send() -> tuple[int, bytes]:
            return request(server.base + SEND, data=b"topic=t&msg=" + b"z" * (2 * 1024 * 1024),
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
        # A loaded machine may take a moment to accept the two: until then a send finds room,
        # and a long poll accepted while a send holds a place is refused (503): then both again.
        deadline = time.monotonic() + 30
        while (answer := send())[0] != 503 and time.monotonic() < deadline:
            if any(answered(s) for s in busy):
                hold_both()
            time.sleep(0.2)
        for status, body in (answer, send(), send()):
            assert status == 503 and "too many connections" in json.loads(body)["msg"]
    finally:
        for s in busy:
            s.close()
        server.stop()


# -- browsers ----------------------------------------------------------------------------------

def test_without_a_token_only_local_host_names_are_served(open_node):
    """DNS rebinding: a page under the attacker's name resolving to
    127.0.0.1 would read everything."""
    for host, expected in (("127.0.0.1", 200), ("localhost:8080", 200), ("[::1]:1", 200),
                           ("evil.example", 403), ("evil.example:8080", 403), ("127.0.0.1.evil.example", 403)):
        status, _ = request(open_node.base + "/camellia/delayQueue/getTopicInfoList", headers={"Host": host})
        assert status == expected, host


def test_without_a_token_cross_site_state_changes_are_refused(open_node):
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    data = b"topic=csrf&msg=x"
    port = open_node.base.rpartition(":")[2]
    for extra in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
                  {"Sec-Fetch-Site": "same-site"}, {"Origin": "http://localhost:1"}):
        status, _ = request(open_node.base + SEND, data=data, headers={**form, **extra})
        assert status == 403, extra
    assert open_node.get("getTopicInfo", topic="csrf")[1]["data"]["readyQueueSize"] == 0
    status, _ = request(open_node.base + SEND, data=data, headers={
        **form, "Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"})
    assert status == 200  # the console's own page
    status, _ = request(open_node.base + "/camellia/health/offline")
    assert status == 405  # an <img> cannot take the node out of its load balancer
    assert open_node.get("/health")[0] == 200


def test_allowed_hosts_and_a_token_serve_other_names(tmp_path, token_node):
    server = Server.start(tmp_path / "data", "--allowed-hosts", "broker.internal")
    try:
        assert request(server.base + "/health", headers={"Host": "broker.internal:80"})[0] == 200
        assert request(server.base + "/health", headers={"Host": "other.internal"})[0] == 403
    finally:
        server.stop()
    status, _ = request(token_node.base + "/camellia/delayQueue/getTopicInfoList",
                        headers={"Host": "anything.example", "Authorization": f"Bearer {TOKEN}",
                                 "Origin": "http://anything.example"})
    assert status == 200


def test_a_short_token_is_refused_at_start(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("x" * 15)
    token_file.chmod(0o600)
    with pytest.raises(AssertionError, match="at least 16"):
        Server.start(tmp_path / "data", "--auth-token-file", str(token_file), wait_s=10)
    assert not os.path.exists(tmp_path / "data" / "ids")
