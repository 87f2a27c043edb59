"""broker.http.httpd: a read holding one whole request in the plain shape is
served by `Connection._whole` without llhttp; any request, plain or not,
gets the same request (method, path, query, headers, body, keep-alive)
and the same answer bytes whether it comes in one read or in pieces
(which llhttp parses)."""

from __future__ import annotations

import asyncio
from typing import Any

import hypothesis.strategies as st
from hypothesis import event, given, settings

from broker.http.commands import HERE, Auth, Command
from broker.http.http_types import Request, Response
from broker.http.httpd import Connection, Limits, _Shared


class _Wire(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _serve(raw: bytes, pieces: int) -> tuple[list[tuple[Any, ...]], bytes, bool, bool]:
    """Feed `raw` to a fresh connection in `pieces` reads: what each
    request looked like to its handler, the bytes written, whether the
    connection was closed, and whether `_whole` took every read."""
    async def go() -> tuple[list[tuple[Any, ...]], bytes, bool, bool]:
        seen: list[tuple[Any, ...]] = []

        async def handler(request: Request) -> Response:
            seen.append((request.method, request.path, request.query, dict(request.headers), request.body,
                         request.content_type))
            return Response(200, b'{"ok":1}')

        command = Command("*", "*", handler, HERE, 1000, Auth.OPEN, inline=True)
        connection = Connection(_Shared(lambda request: command, Limits()))
        wire = _Wire()
        connection.connection_made(wire)
        step = max(1, len(raw) // pieces + 1)
        for at in range(0, len(raw), step):
            connection.data_received(raw[at:at + step])
            for _ in range(3):
                await asyncio.sleep(0)
        return seen, bytes(wire.out), wire.closed, connection.whole_reads
    return asyncio.run(go())


TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~", min_size=1,
                max_size=12)
VISIBLE = "".join(map(chr, range(0x20, 0x7f)))
# mostly values `_whole` takes, sometimes what only llhttp does
VALUE = st.from_regex(r"([!-~]([ !-~]{0,18}[!-~])?)?", fullmatch=True) | st.text(VISIBLE + "\t\x80\xe9", max_size=20)
NAMES = st.sampled_from(["Host", "host", "Content-Type", "Accept", "User-Agent", "Connection", "X-Trace",
                         "traceparent", "Cookie", "Expect", "Content-Length", "Proxy-Connection",
                         "Keep-Alive"]) | TOKEN
URI = "abcdefghijklmnopqrstuvwxyz0123456789/-._~:@!$&'()*+,;=%?[]"
PATH = st.text(URI, max_size=30) | st.text(URI + "\"<>{}| ", max_size=30)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "HEAD"]))
    version = draw(st.sampled_from(["1.1", "1.1", "1.1", "1.0"]))
    headers = draw(st.lists(st.tuples(NAMES, st.text(" \t", max_size=2), VALUE), max_size=6))
    body = draw(st.binary(max_size=40))
    lines = [f"{method} /{draw(PATH)} HTTP/{version}"]
    lines += [f"{name}:{space}{value}" for name, space, value in headers
              if name.lower() not in ("content-length", "expect", "transfer-encoding")]
    connection = draw(st.sampled_from([None, None, "close", "Close", "keep-alive", "Keep-Alive", "upgrade", "x"]))
    proxy = draw(st.sampled_from([None] * 6 + ["close", "keep-alive"]))  # (llhttp reads it as Connection)
    for name, value in (("Connection", connection), ("Proxy-Connection", proxy)):
        if value is not None:
            lines.insert(draw(st.integers(1, len(lines))), f"{name}: {value}")
    length = draw(st.sampled_from([str(len(body))] * 6 + ["0" * 3 + str(len(body)), "9" * 19, "9" * 5000]))
    lines.append(f"Content-Length: {length}")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


@settings(max_examples=400, deadline=None)
@given(requests(), st.integers(2, 6))
def test_one_read_or_many_the_request_and_its_answer_are_the_same(raw, pieces):
    whole = _serve(raw, 1)
    split = _serve(raw, pieces)
    assert whole[:3] == split[:3]
    assert not split[3]  # (the pieces went to llhttp)
    event("read whole" if whole[3] else "parsed by llhttp")
    reads_whole.append(whole[3])


reads_whole: list[bool] = []


def test_the_property_reads_many_requests_whole():
    """(The property above compared both readers, not llhttp with itself.)"""
    reads_whole.clear()
    test_one_read_or_many_the_request_and_its_answer_are_the_same()
    assert sum(reads_whole) >= len(reads_whole) // 20, (sum(reads_whole), len(reads_whole))


PLAIN = [
    # curl
    b"POST /api/sendMsg HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n"
    b"Content-Length: 9\r\nContent-Type: application/x-www-form-urlencoded\r\n\r\ntopic=a&b",
    # OkHttp (camellia's SDK)
    b"POST /camellia/delayQueue/sendMsg HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    b"Content-Length: 3\r\nHost: localhost:1\r\nConnection: Keep-Alive\r\nAccept-Encoding: gzip\r\n"
    b"User-Agent: okhttp/3.14.9\r\n\r\nx=1",
    # aiohttp, a GET without a body
    b"GET /health?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
    b"User-Agent: Python/3.11 aiohttp/3.9.5\r\n\r\n",
    b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n",
]


def test_the_requests_clients_send_are_read_whole():
    for raw in PLAIN:
        seen, out, closed, whole = _serve(raw, 1)
        assert whole, raw
        assert len(seen) == 1 and out.startswith(b"HTTP/1.1 200 ")
        assert (seen, out, closed) == _serve(raw, 3)[:3]


def test_what_is_not_one_plain_request_goes_to_llhttp():
    for raw in (PLAIN[0] + PLAIN[2],  # two in one read
                PLAIN[0][:-2],  # part of one
                PLAIN[2].replace(b"HTTP/1.1", b"HTTP/1.0"),
                PLAIN[2].replace(b"Accept: */*", b"Accept: a\r\nAccept: b"),
                PLAIN[2].replace(b"Accept: */*", b"Accept: */* "),
                PLAIN[2].replace(b"Accept: */*", b"Expect: 100-continue"),
                PLAIN[2].replace(b"/health", b"/he\"alth"),
                PLAIN[2].replace(b"Accept: */*", b"Proxy-Connection: close"),  # llhttp's second Connection
                PLAIN[2].replace(b"Accept: */*", b"Content-Length: " + b"9" * 5000)):  # (int() would refuse it)
        assert not _serve(raw, 1)[3], raw


def test_a_bug_behind_the_whole_reader_is_answered_500_and_logged(caplog):
    async def go() -> tuple[bytes, bool]:
        def admit(request: Request) -> Command:
            raise RuntimeError("a bug in the gate")
        connection = Connection(_Shared(admit, Limits()))
        wire = _Wire()
        connection.connection_made(wire)
        connection.data_received(PLAIN[2])
        return bytes(wire.out), wire.closed
    out, closed = asyncio.run(go())
    assert out.startswith(b"HTTP/1.1 500 ") and closed
    assert "bug while reading a request" in caplog.text
