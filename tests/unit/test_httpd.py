"""broker.httpd: the HTTP/1.1 protocol and its limits, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import resource
import socket

from broker.httpd import (
    EMFILE_PAUSE_S,
    HttpServer,
    Limits,
    Request,
    Response,
    StreamResponse,
)


@contextlib.contextmanager
def _nofile_limit(soft: int):
    """This process's RLIMIT_NOFILE soft limit lowered for a while."""
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = max(soft, len(os.listdir("/proc/self/fd")) + soft)  # (the same room whatever the suite holds open)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)


async def _serve(limits: Limits | None = None, cap: int = 1024, slow: asyncio.Event | None = None):
    seen: list[Request] = []

    async def dispatch(request: Request):
        seen.append(request)
        if request.path == "/slow" and slow is not None:
            await slow.wait()
        if request.path == "/stream":
            async def chunks():
                for part in (b"ab", b"", b"cde"):
                    yield part
            return StreamResponse(chunks())
        if request.path == "/boom":
            raise RuntimeError("a bug")
        return Response(200, json.dumps({"path": request.path, "query": request.query.decode(),
                                         "body": request.body.decode()}).encode())

    server = HttpServer(dispatch, lambda request: cap, limits or Limits())
    await server.start("127.0.0.1", 0)
    return server, seen


_writers: list[asyncio.StreamWriter] = []


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    _writers.append(writer)
    return reader, writer


async def _stop(server: HttpServer) -> None:
    """Close the test's client connections, then the server."""
    while _writers:
        writer = _writers.pop()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    await server.close(1)


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return status, headers, body
            body += chunk[:-2]
    return status, headers, await reader.readexactly(int(headers["content-length"]))


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def test_keep_alive_and_pipelining_answer_in_order():
    async def main():
        server, _ = await _serve()
        reader, writer = await _connect(server.port)
        writer.write(_post("/a?x=1", b"one") + _post("/b", b"two") + b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = [await _read_response(reader) for _ in range(3)]
        await _stop(server)
        return answers
    answers = asyncio.run(main())
    assert [json.loads(b) for _, _, b in answers] == [
        {"path": "/a", "query": "x=1", "body": "one"}, {"path": "/b", "query": "", "body": "two"},
        {"path": "/c", "query": "", "body": ""}]
    assert all(status == 200 for status, _, _ in answers)


def test_body_over_its_cap_is_refused_before_it_is_read():
    async def main():
        server, seen = await _serve(cap=10)
        reader, writer = await _connect(server.port)
        writer.write(b"POST /x HTTP/1.1\r\nContent-Length: 11\r\n\r\n")  # no body sent
        status, headers, body = await _read_response(reader)
        closed = await reader.read() == b""
        await _stop(server)
        return status, headers, body, closed, seen
    status, headers, body, closed, seen = asyncio.run(main())
    assert status == 413 and json.loads(body)["code"] == 413
    assert headers["connection"] == "close" and closed and seen == []


def test_expect_100_continue_and_split_packets():
    async def main():
        server, _ = await _serve()
        reader, writer = await _connect(server.port)
        writer.write(b"POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        interim = await reader.readuntil(b"\r\n\r\n")
        for byte in b"body":
            writer.write(bytes([byte]))
            await asyncio.sleep(0.01)
        answer = await _read_response(reader)
        await _stop(server)
        return interim, answer
    interim, (status, _, body) = asyncio.run(main())
    assert interim.startswith(b"HTTP/1.1 100")
    assert status == 200 and json.loads(body)["body"] == "body"


def test_malformed_requests_get_an_answer_and_a_close():
    async def one(raw: bytes) -> int:
        server, _ = await _serve(Limits(max_head_bytes=256))
        reader, writer = await _connect(server.port)
        writer.write(raw)
        status, _, _ = await _read_response(reader)
        await _stop(server)
        return status

    assert asyncio.run(one(b"NONSENSE\r\n\r\n")) == 400
    assert asyncio.run(one(b"GET / HTTP/2.0\r\n\r\n")) == 505
    assert asyncio.run(one(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")) == 411
    assert asyncio.run(one(b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n")) == 400
    assert asyncio.run(one(b"GET / HTTP/1.1\r\nX: " + b"a" * 400)) == 431


def test_connection_cap_answers_503_when_every_connection_is_running_a_request():
    async def main():
        release = asyncio.Event()
        server, _ = await _serve(Limits(max_connections=2), slow=release)
        for _ in range(2):
            _, writer = await _connect(server.port)
            writer.write(b"GET /slow HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.05)
        reader, _ = await _connect(server.port)
        status, headers, _ = await _read_response(reader)
        refused = server.shared.refused
        release.set()
        await _stop(server)
        return status, headers["connection"], refused
    assert asyncio.run(main()) == (503, "close", 1)


def test_at_the_cap_a_stalled_connection_makes_room_for_a_new_one():
    async def main():
        server, _ = await _serve(Limits(max_connections=2))
        await _connect(server.port)  # silent: its idle deadline is far
        slow_reader, slow_writer = await _connect(server.port)
        slow_writer.write(b"GET / HTTP/1.1\r\nHost:")  # a head started: nearer deadline, closed first
        await asyncio.sleep(0.05)
        reader, writer = await _connect(server.port)
        writer.write(b"GET /new HTTP/1.1\r\n\r\n")
        status, _, body = await _read_response(reader)
        slow_got = await asyncio.wait_for(slow_reader.read(), 5)
        evicted, connections = server.shared.evicted, server.connections
        await _stop(server)
        return status, json.loads(body)["path"], slow_got, evicted, connections
    assert asyncio.run(main()) == (200, "/new", b"", 1, 2)


def test_emfile_at_accept_is_answered_503_through_the_spare_descriptor():
    async def main():
        server, _ = await _serve()
        client = socket.socket()
        client.setblocking(False)
        gc.collect()  # what earlier tests left for the collector must not be finalized with no descriptor free
        hogs = []
        try:
            while True:  # take every descriptor the process may open
                hogs.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        try:
            with contextlib.suppress(BlockingIOError):
                client.connect(("127.0.0.1", server.port))
            answer = b""
            for _ in range(200):
                await asyncio.sleep(0.01)
                try:
                    answer += client.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    break
                if b"\r\n\r\n" in answer:
                    break
            client.close()
        finally:
            for fd in hogs:
                os.close(fd)
        await asyncio.sleep(EMFILE_PAUSE_S * 2)  # accepting again after its pause
        reader, writer = await _connect(server.port)
        writer.write(b"GET /after HTTP/1.1\r\n\r\n")
        status, _, _ = await _read_response(reader)
        await _stop(server)
        return answer, status
    with _nofile_limit(256):
        first, after = asyncio.run(main())
    assert first.startswith(b"HTTP/1.1 503 Service Unavailable") and b"out of file descriptors" in first
    assert after == 200


def test_connections_stop_short_of_the_reserved_descriptors():
    async def main():
        release = asyncio.Event()
        server, _ = await _serve(Limits(reserved_fds=10), slow=release)
        budget = server.shared.descriptors
        budget.limit = budget.others + 10 + 2  # room for two connections beside what is open
        statuses = []
        for _ in range(2):
            _, writer = await _connect(server.port)
            writer.write(b"GET /slow HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.05)
        reader, _ = await _connect(server.port)
        statuses.append((await _read_response(reader))[0])
        release.set()
        cap = server.shared.cap()
        await _stop(server)
        return cap, statuses
    assert asyncio.run(main()) == (2, [503])


def test_a_silent_or_slow_head_is_closed_at_its_deadline():
    async def main():
        server, _ = await _serve(Limits(head_timeout_s=0.2, idle_timeout_s=0.2))
        reader, writer = await _connect(server.port)
        writer.write(b"GET / HTTP/1.1\r\n")  # never finished
        got = await asyncio.wait_for(reader.read(), 5)
        idle_reader, _ = await _connect(server.port)
        idle_got = await asyncio.wait_for(idle_reader.read(), 5)
        left = server.connections
        await _stop(server)
        return got, idle_got, left
    assert asyncio.run(main()) == (b"", b"", 0)


def test_large_body_budget_answers_429():
    async def main():
        server, _ = await _serve(Limits(body_budget_bytes=100_000), cap=1 << 20)
        r1, w1 = await _connect(server.port)
        w1.write(b"POST /big HTTP/1.1\r\nContent-Length: 70000\r\n\r\n" + b"a" * 10)  # holds 70,000
        await asyncio.sleep(0.05)
        r2, w2 = await _connect(server.port)
        w2.write(b"POST /big HTTP/1.1\r\nContent-Length: 70000\r\n\r\n")
        second, _, _ = await _read_response(r2)
        w1.write(b"a" * 69_990)
        first, _, _ = await _read_response(r1)
        budget_after = server.shared.body_bytes
        await _stop(server)
        return first, second, budget_after
    assert asyncio.run(main()) == (200, 429, 0)


def test_stream_response_is_chunked_and_bugs_are_500():
    async def main():
        server, _ = await _serve()
        reader, writer = await _connect(server.port)
        writer.write(b"GET /stream HTTP/1.1\r\n\r\nGET /boom HTTP/1.1\r\n\r\n")
        streamed = await _read_response(reader)
        bug = await _read_response(reader)
        await _stop(server)
        return streamed, bug
    (status, headers, body), (bug_status, _, bug_body) = asyncio.run(main())
    assert status == 200 and headers["transfer-encoding"] == "chunked" and body == b"abcde"
    assert bug_status == 500 and json.loads(bug_body)["code"] == 500


def test_close_finishes_requests_in_flight_and_refuses_new_ones():
    async def main():
        release = asyncio.Event()
        server, _ = await _serve(slow=release)
        port = server.port
        reader, writer = await _connect(port)
        writer.write(b"GET /slow HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.05)
        closing = asyncio.create_task(server.close(5))
        await asyncio.sleep(0.05)
        release.set()
        status, headers, _ = await _read_response(reader)
        await closing
        await _stop(server)
        try:
            await _connect(port)
            refused = False
        except OSError:
            refused = True
        return status, headers.get("connection"), refused
    assert asyncio.run(main()) == (200, "close", True)


def test_http_1_0_closes_after_the_answer():
    async def main():
        server, _ = await _serve()
        reader, writer = await _connect(server.port)
        writer.write(b"GET /old HTTP/1.0\r\n\r\n")
        status, headers, _ = await _read_response(reader)
        rest = await reader.read()
        await _stop(server)
        return status, headers.get("connection"), rest
    assert asyncio.run(main()) == (200, "close", b"")
