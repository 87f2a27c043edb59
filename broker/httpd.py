"""A small HTTP/1.1 server for the broker's API, on asyncio's Protocol.

Why not aiohttp's server: measured on this project's 2-core machine with
uvloop, aiohttp spends 85-95 µs of server CPU on a request whose handler
does nothing (routing, middleware, a Task, StreamReader, multidicts);
this protocol spends about 40 µs on the same request, which is what lets
a pull or an ack cost less than 100 µs in all. aiohttp stays the client
(`broker.client`, the cluster's peer calls).

What it speaks: HTTP/1.1 and 1.0, keep-alive, pipelined requests (answered
in order, one at a time per connection), bodies with `Content-Length`
(`Expect: 100-continue` honoured). A chunked request body is answered 411:
every client of this API (camellia's SDK on OkHttp, curl, aiohttp, the
Spark sink) sends a length. Responses have a length, or are streamed in
chunks (`StreamResponse`, for the cluster's snapshot).

What a stranger can make it spend, each bounded by `Limits`:

| resource                   | bound                                  | when hit                  |
|----------------------------|----------------------------------------|---------------------------|
| connections                | `max_connections`                      | 503, closed at once       |
| head size                  | `max_head_bytes`                       | 431, closed               |
| time to send a head        | `head_timeout_s` (from its first byte) | closed                    |
| time to send a body        | `body_timeout_s`                       | closed                    |
| idle keep-alive            | `idle_timeout_s`                       | closed                    |
| a body                     | the route's cap (`body_cap`)           | 413 before it is read     |
| bodies being read at once  | `body_budget_bytes` (bodies > 64 KiB)  | 429 before it is read     |
| pipelined bytes buffered   | one request ahead, reading paused      | (back-pressure)           |

Deadlines are plain numbers checked by one sweep a second, so a request
costs no timer. Handlers are `async def handler(request) -> Response`;
`dispatch` is called with every complete request and routes it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

log = logging.getLogger("hourglass.httpd")

LARGE_BODY_BYTES = 64 * 1024
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


@dataclass(frozen=True)
class Limits:
    # Open client connections; one more is answered 503 and closed. Keep
    # it well below the descriptor limit: storage needs descriptors too.
    max_connections: int = 1024
    # Request line and headers, in bytes.
    max_head_bytes: int = 16 * 1024
    # From a request's first byte until its head is complete.
    head_timeout_s: float = 10.0
    # From a head until its body is complete.
    body_timeout_s: float = 30.0
    # A keep-alive connection with no request in progress.
    idle_timeout_s: float = 120.0
    # Bytes of large bodies (> 64 KiB) being received at once, all
    # connections together.
    body_budget_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_head_bytes", "body_budget_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("head_timeout_s", "body_timeout_s", "idle_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")


class Request:
    """One request, read whole. `headers` keys are lower case; `query` is
    the raw query string (bytes, still %-encoded)."""

    __slots__ = ("body", "headers", "method", "path", "query", "transport")

    def __init__(self, method: str, path: str, query: bytes, headers: dict[str, str], body: bytes,
                 transport: asyncio.Transport | None) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.transport = transport

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    @property
    def path_qs(self) -> str:
        return self.path + ("?" + self.query.decode("latin-1") if self.query else "")

    def gone(self) -> bool:
        """The client closed its connection (a long poll stops waiting)."""
        return self.transport is None or self.transport.is_closing()

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.path} body={len(self.body)}B>"


class Response:
    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(self, status: int = 200, body: bytes = b"", content_type: str = "application/json",
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


class StreamResponse:
    """A response whose body is produced as it is sent (chunked)."""

    __slots__ = ("chunks", "content_type", "headers", "status")

    def __init__(self, chunks: AsyncIterator[bytes], status: int = 200,
                 content_type: str = "application/octet-stream", headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.chunks = chunks
        self.content_type = content_type
        self.headers = headers


Dispatch = Callable[[Request], Awaitable["Response | StreamResponse"]]
BodyCap = Callable[[str, str], int]


def plain_answer(status: int, text: str) -> Response:
    """An answer made by the protocol itself (before any handler)."""
    return Response(status, json.dumps({"code": status, "msg": text}).encode())


def _head(status: int, content_type: str, length: int | None, headers: dict[str, str] | None,
          close: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n" % (status, _REASONS.get(status, b"Unknown"),
                                                            content_type.encode())]
    lines.append(b"Transfer-Encoding: chunked\r\n" if length is None else b"Content-Length: %d\r\n" % length)
    if close:
        lines.append(b"Connection: close\r\n")
    if headers:
        for k, v in headers.items():
            lines.append(f"{k}: {v}\r\n".encode("latin-1"))
    lines.append(b"\r\n")
    return b"".join(lines)


class _Shared:
    """State every connection of one server shares."""

    def __init__(self, dispatch: Dispatch, body_cap: BodyCap, limits: Limits) -> None:
        self.dispatch = dispatch
        self.body_cap = body_cap
        self.limits = limits
        self.connections: set[Connection] = set()
        self.body_bytes = 0
        self.refused = 0  # connections refused at the cap
        self.running = 0  # handlers running
        self.stopping = False
        self.idle = asyncio.Event()  # set when no handler is running


class Connection(asyncio.Protocol):
    """One client connection: parse, call the dispatcher, write, repeat."""

    def __init__(self, shared: _Shared) -> None:
        self.shared = shared
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.deadline = 0.0
        self.busy = False          # a handler is running
        self.paused = False
        self.budgeted = 0          # bytes of the body budget this connection holds
        self.pending: tuple | None = None  # a parsed head waiting for its body

    # -- asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        shared = self.shared
        if shared.stopping or len(shared.connections) >= shared.limits.max_connections:
            shared.refused += 1
            self.transport.write(self._encode(plain_answer(503, "too many connections, retry later"), True))
            self.transport.close()
            self.transport = None
            return
        shared.connections.add(self)
        self.deadline = self.loop.time() + shared.limits.idle_timeout_s

    def connection_lost(self, exc: Exception | None) -> None:
        self.shared.connections.discard(self)
        self._release_budget()
        self.pending = None
        self.buffer.clear()

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        if not self.buffer and self.pending is None and not self.busy:
            self.deadline = self.loop.time() + self.shared.limits.head_timeout_s
        self.buffer += data
        if not self.busy:
            self._process()
        elif len(self.buffer) > self.shared.limits.max_head_bytes and not self.paused:
            self.paused = True  # the next pipelined request waits for this one
            self.transport.pause_reading()

    # -- parsing ---------------------------------------------------------------------

    def _process(self) -> None:
        """Parse as much of the buffer as forms one request and start it."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        limits = self.shared.limits
        if self.pending is None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > limits.max_head_bytes:
                    self._refuse(431, "request head too large")
                return
            if end > limits.max_head_bytes:
                self._refuse(431, "request head too large")
                return
            head = bytes(self.buffer[:end])
            del self.buffer[:end + 4]
            if not self._parse_head(head):
                return
        method, target, headers, length, keep_alive = self.pending  # type: ignore[misc]
        if len(self.buffer) < length:
            return
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        self.pending = None
        self._release_budget()
        path, _, query = target.partition("?")
        request = Request(method, path, query.encode("latin-1"), headers, body, transport)
        self.busy = True
        self.shared.running += 1
        self.shared.idle.clear()
        self.loop.create_task(self._run(request, keep_alive))

    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        try:
            method_b, target_b, version = lines[0].split(b" ")
            method, target = method_b.decode("ascii"), target_b.decode("latin-1")
        except (ValueError, UnicodeDecodeError):
            self._refuse(400, "malformed request line")
            return False
        if version not in (b"HTTP/1.1", b"HTTP/1.0"):
            self._refuse(505, "HTTP/1.1 only")
            return False
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                self._refuse(400, "malformed header line")
                return False
            key = name.strip().lower().decode("latin-1")
            headers.setdefault(key, value.strip().decode("latin-1"))
        if "transfer-encoding" in headers:
            self._refuse(411, "send the body with a Content-Length")
            return False
        try:
            length = int(headers.get("content-length", "0"))
            if length < 0:
                raise ValueError
        except ValueError:
            self._refuse(400, "bad Content-Length")
            return False
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection and (version == b"HTTP/1.1" or "keep-alive" in connection)
        shared = self.shared
        if length:
            cap = shared.body_cap(method, target.partition("?")[0])
            if length > cap:
                self._refuse(413, f"request body is {length} bytes, more than {cap}")
                return False
            if length > LARGE_BODY_BYTES:
                if shared.body_bytes + length > shared.limits.body_budget_bytes:
                    self._refuse(429, "too many large bodies at once, retry later")
                    return False
                shared.body_bytes += length
                self.budgeted = length
            if headers.get("expect", "").lower() == "100-continue" and len(self.buffer) < length:
                assert self.transport is not None
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.deadline = self.loop.time() + shared.limits.body_timeout_s
        self.pending = (method, target, headers, length, keep_alive)
        return True

    def _release_budget(self) -> None:
        if self.budgeted:
            self.shared.body_bytes -= self.budgeted
            self.budgeted = 0

    def _refuse(self, status: int, text: str) -> None:
        """An answer that ends the connection: what follows is not read."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self._encode(plain_answer(status, text), True))
            self.transport.close()

    # -- answering ---------------------------------------------------------------------

    @staticmethod
    def _encode(response: Response, close: bool) -> bytes:
        return _head(response.status, response.content_type, len(response.body), response.headers,
                     close) + response.body

    async def _run(self, request: Request, keep_alive: bool) -> None:
        shared = self.shared
        try:
            try:
                response = await shared.dispatch(request)
            except Exception:
                log.exception("bug while serving %s %s", request.method, request.path)
                response = plain_answer(500, "internal error (logged)")
            transport = self.transport
            if transport is None or transport.is_closing():
                if isinstance(response, StreamResponse):
                    await response.chunks.aclose()  # type: ignore[attr-defined]  # its finally blocks run
                return
            close = not keep_alive or shared.stopping
            if isinstance(response, StreamResponse):
                await self._stream(transport, response, close)
            else:
                transport.write(self._encode(response, close))
            if close:
                transport.close()
                return
        finally:
            self.busy = False
            shared.running -= 1
            if not shared.running:
                shared.idle.set()
        self.deadline = self.loop.time() + shared.limits.idle_timeout_s
        if self.paused:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        if self.buffer:
            self.deadline = self.loop.time() + shared.limits.head_timeout_s
            self._process()

    async def _stream(self, transport: asyncio.Transport, response: StreamResponse, close: bool) -> None:
        transport.write(_head(response.status, response.content_type, None, response.headers, close))
        try:
            async for chunk in response.chunks:
                if transport.is_closing():
                    return
                if chunk:
                    transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                while transport.get_write_buffer_size() > 4 * 1024 * 1024 and not transport.is_closing():
                    await asyncio.sleep(0.01)  # let the socket drain: bounded RAM per stream
        finally:
            await response.chunks.aclose()  # type: ignore[attr-defined]
        transport.write(b"0\r\n\r\n")


class HttpServer:
    """Listens on host:port, serves `dispatch`; `close()` stops gracefully."""

    def __init__(self, dispatch: Dispatch, body_cap: BodyCap, limits: Limits | None = None) -> None:
        self.shared = _Shared(dispatch, body_cap, limits or Limits())
        self.server: asyncio.AbstractServer | None = None
        self.sweeper: asyncio.Task | None = None

    @property
    def connections(self) -> int:
        return len(self.shared.connections)

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self.shared.idle.set()
        self.server = await loop.create_server(lambda: Connection(self.shared), host, port, backlog=1024,
                                               reuse_address=True)
        self.sweeper = asyncio.create_task(self._sweep(), name="http-deadlines")

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.sockets[0].getsockname()[1]

    async def _sweep(self) -> None:
        """Close connections past their deadline, once a second."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            for conn in [c for c in self.shared.connections if not c.busy and c.deadline < now]:
                if conn.transport is not None:
                    conn.transport.close()

    async def close(self, grace_s: float) -> None:
        """Stop accepting, close idle connections, let requests in flight
        finish for up to `grace_s`, then close everything."""
        shared = self.shared
        shared.stopping = True
        if self.server is not None:
            self.server.close()
        if self.sweeper is not None:
            self.sweeper.cancel()
        for conn in list(shared.connections):
            if not conn.busy and conn.transport is not None:
                conn.transport.close()
        try:
            await asyncio.wait_for(shared.idle.wait(), grace_s)
        except TimeoutError:
            log.warning("%d requests still running after %.0f s; closing", shared.running, grace_s)
        for conn in list(shared.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self.server is not None:
            await self.server.wait_closed()
