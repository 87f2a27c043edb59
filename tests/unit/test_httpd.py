"""broker.http.httpd: the HTTP/1.1 protocol and its limits, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import resource
import socket

import pytest

from broker.http.commands import HERE, Auth, Command
from broker.http.http_types import Request, Response, StreamResponse
from broker.http.httpd import EMFILE_PAUSE_S, LINGER_S, HttpServer, Limits


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


async def _serve(limits: Limits | None = None, cap: int = 1024, slow: asyncio.Event | None = None,
                 inline: bool = True):
    """A server whose one command (every path) answers with the request it
    got; `inline`: the command starts in the connection's frame."""
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
        if request.path == "/cancelled":  # what it awaits is cancelled under it
            shared = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(shared.cancel)
            await shared
        return Response(200, json.dumps({"path": request.path, "query": request.query.decode(),
                                         "body": request.body.decode()}).encode())

    command = Command("*", "*", dispatch, HERE, cap, Auth.OPEN, inline=inline)
    server = HttpServer(lambda request: command, limits or Limits())
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


def test_a_refused_socket_held_open_past_its_linger_ends_cleanly_on_uvloop():
    """uvloop's remove_reader answers None (asyncio's is typed bool): the
    compiled build raised TypeError in the callback that ends a linger."""
    uvloop = pytest.importorskip("uvloop")

    async def main():
        errors: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
        release = asyncio.Event()
        server, _ = await _serve(Limits(max_connections=1), slow=release)
        _, writer = await _connect(server.port)
        writer.write(b"GET /slow HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.05)
        reader, _ = await _connect(server.port)  # refused, and held open past LINGER_S
        status, _, _ = await _read_response(reader)
        await asyncio.sleep(LINGER_S + 0.3)
        lingering = len(server.lingering)
        release.set()
        await _stop(server)
        return status, lingering, errors

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == (503, 0, [])


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


def test_below_a_ceiling_lowered_under_what_is_open_a_stalled_connection_still_makes_room():
    """Storage opened files since the connections came: the cap fell under
    what is open. A new connection takes a stalled one's place (the sweep
    sheds the rest), as at the cap."""
    async def main():
        server, _ = await _serve(Limits(reserved_fds=10))
        for _ in range(3):
            await _connect(server.port)  # silent: stalled
        await asyncio.sleep(0.05)
        budget = server.shared.descriptors
        budget.limit = budget.others + 10 + 1  # room for one connection: three are open
        reader, writer = await _connect(server.port)
        writer.write(b"GET /new HTTP/1.1\r\n\r\n")
        status = (await _read_response(reader))[0]
        evicted = server.shared.evicted
        await _stop(server)
        return status, evicted >= 1
    assert asyncio.run(main()) == (200, True)


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


def test_a_handler_whose_wait_is_cancelled_under_it_is_answered_503():
    """A handler that ends with CancelledError because what it awaited was
    cancelled (a commit future a cancelled task shared with it) still gets
    its client an answer, 503 (retry), inline or in a Task; without one,
    the client waited on the open connection for ever (a follower that had
    forwarded the request did, and its own stop then waited out its
    shutdown grace). The connection goes on serving."""
    async def main(inline):
        server, _ = await _serve(inline=inline)
        reader, writer = await _connect(server.port)
        writer.write(b"GET /cancelled HTTP/1.1\r\n\r\nGET /after HTTP/1.1\r\n\r\n")
        answers = [await asyncio.wait_for(_read_response(reader), 5) for _ in range(2)]
        await _stop(server)
        return [(status, json.loads(body)["code"] if status != 200 else json.loads(body)["path"])
                for status, _, body in answers]
    for inline in (True, False):
        assert asyncio.run(main(inline)) == [(503, 503), (200, "/after")]


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


def _tasks_seen() -> tuple[dict[str, list[object]], Command, Command]:
    """An inline and a Task command, each noting the current Task of its
    handler before and after its wait (`seen[path]`)."""
    seen: dict[str, list[object]] = {}

    async def handler(request: Request) -> Response:
        noted = seen.setdefault(request.path, [])
        noted.append(asyncio.current_task())
        if request.path == "/future":  # waits on a future set at a later turn of the loop
            future = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_later(0.01, future.set_result, b"later")
            body = await future
        elif request.path == "/yield":  # a bare yield
            await asyncio.sleep(0)
            body = b"yielded"
        elif request.path == "/fail-later":
            await asyncio.sleep(0)
            raise RuntimeError("a bug after a wait")
        elif request.path == "/timeout":  # asks for the current Task before it waits
            async with asyncio.timeout(5):
                await asyncio.sleep(0)
            body = b"in time"
        else:
            body = b"now"
        noted.append(asyncio.current_task())
        return Response(200, body)
    return (seen, Command("*", "*", handler, HERE, 1024, Auth.OPEN, inline=True),
            Command("*", "*", handler, HERE, 1024, Auth.OPEN, inline=False))


def test_an_inline_command_answers_in_the_connections_frame_and_goes_on_there_until_it_yields_bare():
    async def main():
        seen, inline, _ = _tasks_seen()
        server = HttpServer(lambda request: inline)
        await server.start("127.0.0.1", 0)
        reader, writer = await _connect(server.port)
        paths = ["/now", "/future", "/yield", "/fail-later", "/timeout", "/now"]
        writer.write(b"".join(f"GET {path} HTTP/1.1\r\n\r\n".encode() for path in paths))  # pipelined
        answers = [await _read_response(reader) for _ in paths]
        await _stop(server)
        return seen, answers
    seen, answers = asyncio.run(main())
    assert [(status, body) for status, _, body in answers[:3]] == [(200, b"now"), (200, b"later"), (200, b"yielded")]
    assert [status for status, _, _ in answers[3:]] == [500, 500, 200]  # the timeout needs a Task from the start
    assert seen["/now"] == [None, None, None, None]  # answered without a Task, twice
    assert seen["/future"] == [None, None]  # resumed by its future's callback: still no Task
    before, after = seen["/yield"]
    assert before is None and isinstance(after, asyncio.Task)  # a bare yield: the frame itself, continued by a Task
    assert seen["/timeout"] == [None]


def test_a_command_not_inline_runs_in_a_task_from_the_start():
    async def main():
        seen, _, in_task = _tasks_seen()
        server = HttpServer(lambda request: in_task)
        await server.start("127.0.0.1", 0)
        reader, writer = await _connect(server.port)
        writer.write(b"GET /now HTTP/1.1\r\n\r\nGET /timeout HTTP/1.1\r\n\r\n")
        answers = [await _read_response(reader) for _ in range(2)]
        await _stop(server)
        return seen, answers
    seen, answers = asyncio.run(main())
    assert [(status, body) for status, _, body in answers] == [(200, b"now"), (200, b"in time")]
    assert all(isinstance(task, asyncio.Task) for path in ("/now", "/timeout") for task in seen[path])


def test_pipelined_inline_requests_past_a_parsing_slice_are_all_answered_in_order():
    async def main():
        server, seen = await _serve()
        reader, writer = await _connect(server.port)
        count = 400  # about 10 KiB of heads: several of the parser's slices
        writer.write(b"".join(b"GET /p%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(count)))
        answers = [await _read_response(reader) for _ in range(count)]
        await _stop(server)
        return answers, seen
    answers, seen = asyncio.run(main())
    assert [json.loads(body)["path"] for _, _, body in answers] == [f"/p{i}" for i in range(400)]
    assert len(seen) == 400


def test_the_clocks_timed_wait_works_in_an_inline_commands_frame():
    """SystemClock.wait_for (asyncio.timeout inside) reached before the
    frame first waits: it yields first, so the frame is a Task's when the
    timeout starts (a cluster leader's ack that changes nothing waits so)."""
    from broker.clock import SystemClock

    async def handler(request: Request) -> Response:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, future.set_result, b"quorum")
        return Response(200, await SystemClock().wait_for(future, 5))

    async def main():
        server = HttpServer(lambda request: Command("*", "*", handler, HERE, 1024, Auth.OPEN, inline=True))
        await server.start("127.0.0.1", 0)
        reader, writer = await _connect(server.port)
        writer.write(b"GET /ack HTTP/1.1\r\n\r\n")
        answer = await _read_response(reader)
        await _stop(server)
        return answer
    status, _, body = asyncio.run(main())
    assert (status, body) == (200, b"quorum")
