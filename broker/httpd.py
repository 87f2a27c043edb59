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
| connections                | `max_connections`, and the descriptors | the stalled connection    |
|                            | left after `reserved_fds` for storage  | nearest its deadline is   |
|                            | (`broker.descriptors`)                 | closed for it; none: 503  |
| descriptors at accept      | EMFILE                                 | 503 through a spare one   |
| head size                  | `max_head_bytes`                       | 431, closed               |
| time to send a head        | `head_timeout_s` (from its first byte) | closed                    |
| time to send a body        | `body_timeout_s`                       | closed                    |
| idle keep-alive            | `idle_timeout_s`                       | closed                    |
| a body                     | the route's cap (`body_cap`)           | 413 before it is read     |
| bodies read or handled     | `body_budget_bytes` (bodies > 64 KiB), | 429 before it is read     |
|   at once                  | held until the answer is written       |                           |
| pipelined bytes buffered   | one request ahead, reading paused      | (back-pressure)           |

Deadlines are plain numbers checked by one sweep a second, so a request
costs no timer. Handlers are `async def handler(request) -> Response`;
`dispatch` is called with every complete request and routes it.

Accepting is the server's own (not `loop.create_server`): a connection
over the cap is answered 503 and closed on its plain socket at once, so
refusing a flood holds one descriptor at a time; and EMFILE on accept is
answered through a spare descriptor kept for that, where asyncio's
server would log and pause and uvloop's would drop the backlog unanswered.
A stalled connection is one with no request in progress: idle between
requests, silent since it connected, or part way through a head. When
the cap is reached the one nearest its deadline is closed for the newcomer
(a slow-loris client loses its sockets to real ones); connections running a
request, or sending a body, are never taken.
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus

from storage.errors import ConfigError, InvariantError

from .descriptors import DescriptorBudget

log = logging.getLogger("hourglass.httpd")

LARGE_BODY_BYTES = 64 * 1024
# Connections accepted per wake of the listening socket, so a flood of
# connects cannot hold the event loop.
ACCEPTS_PER_WAKE = 32
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


@dataclass(frozen=True)
class Limits:
    # Open client connections. At the cap a new one takes the place of the
    # stalled connection nearest its deadline, or is answered 503 and closed.
    # The cap is lowered further to keep `reserved_fds` descriptors free.
    max_connections: int = 1024
    # File descriptors kept for storage (segments, hour files, checkpoints)
    # below RLIMIT_NOFILE: connections never take them (broker.descriptors).
    reserved_fds: int = 128
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
                raise ConfigError(f"{name} must be at least 1, not {getattr(self, name)}")
        if self.reserved_fds < 0:
            raise ConfigError(f"reserved_fds must be at least 0, not {self.reserved_fds}")
        for name in ("head_timeout_s", "body_timeout_s", "idle_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")


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
        self.adopting = 0  # accepted, not yet made a Connection
        self.descriptors = DescriptorBudget(limits.reserved_fds)
        self.body_bytes = 0
        self.refused = 0  # connections answered 503 at the cap (or at EMFILE)
        self.evicted = 0  # stalled connections closed to make room for a new one
        self.running = 0  # handlers running
        self.stopping = False
        self.idle = asyncio.Event()  # set when no handler is running

    def cap(self) -> int:
        """Connections allowed now: `max_connections`, lowered to keep the
        reserved descriptors free."""
        ceiling = self.descriptors.ceiling()
        return self.limits.max_connections if ceiling is None else min(self.limits.max_connections, ceiling)

    def make_room(self) -> bool:
        """True if one more connection may be taken: under the cap, or a
        stalled connection (the one nearest its deadline) was closed for it."""
        if len(self.connections) + self.adopting < self.cap():
            return True
        return self.shed(1) == 1

    def shed(self, count: int) -> int:
        """Close up to `count` stalled connections, those nearest their
        deadline first; returns how many."""
        stalled = heapq.nsmallest(count, (c for c in self.connections if c.stalled()), key=lambda c: c.deadline)
        for victim in stalled:
            victim.evict()
        self.evicted += len(stalled)
        return len(stalled)


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
        if shared.stopping:  # accepted as the server began to stop
            shared.refused += 1
            self.transport.write(self._encode(plain_answer(503, "stopping, retry on another node"), True))
            self.transport.close()
            self.transport = None
            return
        shared.connections.add(self)
        self.deadline = self.loop.time() + shared.limits.idle_timeout_s

    def stalled(self) -> bool:
        """No request in progress: idle, silent, or part way through a head."""
        return not self.busy and self.pending is None and self.transport is not None

    def evict(self) -> None:
        self.shared.connections.discard(self)  # its slot is free now; its descriptor once closed
        if self.transport is not None:
            self.transport.close()

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
                if self.transport is None:
                    raise InvariantError("a request is read from a connection without a transport")
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
            self._release_budget()  # held while the handler parses and holds the body
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
        self.listeners: list[socket.socket] = []
        self.spare: int | None = None  # a descriptor held to answer 503 at EMFILE
        self.adoptions: set[asyncio.Task] = set()
        self.sweeper: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        shared = self.shared
        return (f"HttpServer(connections={len(shared.connections)}, cap={shared.cap()}, refused={shared.refused}, "
                f"evicted={shared.evicted}, {shared.descriptors!r})")

    @property
    def connections(self) -> int:
        return len(self.shared.connections)

    async def start(self, host: str, port: int) -> None:
        self.loop = loop = asyncio.get_running_loop()
        self.shared.idle.set()
        self.listeners = await _listen(loop, host, port, backlog=1024)
        self.spare = _open_spare()
        self.shared.descriptors.measure(0)
        for listener in self.listeners:
            loop.add_reader(listener.fileno(), self._accept, listener)
        self.sweeper = asyncio.create_task(self._sweep(), name="http-deadlines")
        shared = self.shared
        budget = shared.descriptors
        if budget.ceiling() is not None and budget.ceiling() < shared.limits.max_connections:
            level = logging.WARNING if shared.cap() < 16 else logging.INFO
            log.log(level, "at most %d connections: the descriptor limit is %d, %d are reserved for storage and "
                    "%d are open (raise `ulimit -n` for more)", shared.cap(), budget.limit, budget.reserved,
                    budget.others)

    @property
    def port(self) -> int:
        return self.listeners[0].getsockname()[1]

    # -- accepting ---------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        shared = self.shared
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE):
                    self._answer_without_descriptors(listener)
                else:
                    log.warning("accepting a connection: %s", e)
                return
            if shared.stopping or not shared.make_room():
                shared.refused += 1
                _refuse_socket(sock, "stopping, retry on another node" if shared.stopping
                               else "too many connections, retry later")
                continue
            shared.adopting += 1
            task = self.loop.create_task(self._adopt(sock))  # type: ignore[union-attr]
            self.adoptions.add(task)
            task.add_done_callback(self.adoptions.discard)

    async def _adopt(self, sock: socket.socket) -> None:
        try:  # the loop makes the socket non-blocking
            await self.loop.connect_accepted_socket(lambda: Connection(self.shared), sock)  # type: ignore[union-attr]
        except OSError:  # reset before it could be served
            sock.close()
        finally:
            self.shared.adopting -= 1

    def _answer_without_descriptors(self, listener: socket.socket) -> None:
        """EMFILE: every descriptor is taken (by storage: connections stop
        short of its reserve). Free the spare one, accept with it, answer 503,
        close, take the spare back; and pause accepting for a moment, as the
        listening socket stays readable while connections wait."""
        answered = 0
        while self.spare is not None and answered < ACCEPTS_PER_WAKE:
            os.close(self.spare)
            self.spare = None
            try:
                sock, _ = listener.accept()
            except OSError:
                sock = None
            if sock is not None:
                answered += 1
                self.shared.refused += 1
                _refuse_socket(sock, "out of file descriptors, retry later")
            self.spare = _open_spare()
            if sock is None:
                break
        log.warning("out of file descriptors while accepting (%d answered 503); pausing accepts for %.1f s",
                    answered, EMFILE_PAUSE_S)
        loop = self.loop
        if loop is None:
            raise InvariantError("accepting on a server that was never started")
        loop.remove_reader(listener.fileno())
        loop.call_later(EMFILE_PAUSE_S, self._resume_accepting, listener)

    def _resume_accepting(self, listener: socket.socket) -> None:
        if self.shared.stopping or listener.fileno() < 0:
            return
        if self.spare is None:
            self.spare = _open_spare()
        self.loop.add_reader(listener.fileno(), self._accept, listener)  # type: ignore[union-attr]

    # -- deadlines and stopping --------------------------------------------------------

    async def _sweep(self) -> None:
        """Once a second: close connections past their deadline, recount
        the descriptors in use."""
        loop = asyncio.get_running_loop()
        shared = self.shared
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            for conn in [c for c in shared.connections if not c.busy and c.deadline < now]:
                if conn.transport is not None:
                    conn.transport.close()
            shared.descriptors.measure(len(shared.connections) + shared.adopting)
            excess = len(shared.connections) - shared.cap()
            if excess > 0:  # storage opened files since these came: its reserve first
                shared.shed(excess)
            if self.spare is None:
                self.spare = _open_spare()

    async def close(self, grace_s: float) -> None:
        """Stop accepting, close idle connections, let requests in flight
        finish for up to `grace_s`, then close everything."""
        shared = self.shared
        shared.stopping = True
        for listener in self.listeners:
            if listener.fileno() >= 0:
                self.loop.remove_reader(listener.fileno())  # type: ignore[union-attr]
                listener.close()
        if self.spare is not None:
            os.close(self.spare)
            self.spare = None
        if self.sweeper is not None:
            self.sweeper.cancel()
        if self.adoptions:
            await asyncio.gather(*self.adoptions, return_exceptions=True)
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


# After EMFILE at accept, how long the listening sockets rest.
EMFILE_PAUSE_S = 0.1


async def _listen(loop: asyncio.AbstractEventLoop, host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening, non-blocking sockets on every address `host` resolves to
    (as `loop.create_server` binds them)."""
    infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                raise OSError(e.errno, f"cannot listen on {address[0]} port {address[1]}: {e.strerror}") from None
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None


def _refuse_socket(sock: socket.socket, text: str) -> None:
    """503 on a plain, just accepted socket, then close it at once: no
    transport, so a refused connection holds its descriptor for no time."""
    try:
        sock.setblocking(False)
        sock.send(Connection._encode(plain_answer(503, text), True))
    except OSError:
        pass
    finally:
        sock.close()
