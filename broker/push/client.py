"""The pushers' HTTP client: POSTs to one subscription's URL over
keep-alive connections, each response parsed by llhttp (httptools, as the
server's requests are: broker.http.httpd).

    client = PushClient(url, allow, timeout_s=10, max_body_bytes=65536,
                        limits=PushLimits(), descriptors=PushDescriptors(budget, 256))
    status, retry_after = await client.post(body, headers)   # or PostFailed
    await client.close()

One request per connection at a time; a connection goes back to the idle
list when its response is complete and both sides keep it alive, so the
connections number at most the deliveries in flight (the subscription's
concurrency, which the pusher holds). Per POST it does what aiohttp's
client did for the pushers, at a fraction of the CPU (docs/dependencies.md,
"httptools"):

- **where it connects** (docs/api.md, "Push delivery"): a URL whose host
  is an address must be one --push-allow names; a host name is resolved
  at connect time and either is listed itself or every address it
  resolves to must be allowed; the connection goes to the address checked,
  so a name that resolves elsewhere later (DNS rebinding) is refused then;
- https with the system's certificate store and the host name checked;
- a redirect is an answer like any other (not followed); at most
  `max_body_bytes` of a response body is read, the connection dropped if
  more comes; the whole POST (connecting included) within `timeout_s`;
- an answer is bounded as the server bounds a request (`PushLimits`,
  broker.push.rules): its heads (interim ones included) to
  `max_head_bytes` and `max_headers` header lines -- never more of a head
  is handed to the parser, so an endless header line costs no memory --
  the head complete within `head_timeout_ms` of its first byte, the body
  within `body_timeout_ms` of the head;
- a kept-alive connection with no POST on it is closed after
  `idle_timeout_ms`, and at once if the subscriber sends a byte on it (an
  answer to no request);
- a failure is `PostFailed(reason, detail)`, reason one of "connect",
  "timeout", "tls", "not allowed", "protocol", "head too large",
  "too many headers", "head timeout", "body timeout", "no connection".

Each connection holds a descriptor of the node's budget
(`PushDescriptors`, broker.http.descriptors): a POST that finds no descriptor
free for its subscription waits for one, within its `timeout_s` (then a
failure, reason "no connection"); the API's clients and storage keep
theirs.

Header values are sent as UTF-8 with control characters (a msgId may hold
a line feed) percent-encoded, so no value can end the head early.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Sequence

import httptools

from storage.errors import HourglassError

from ..http.descriptors import DescriptorBudget
from .rules import PushAllow, PushLimits, is_address


class PostFailed(HourglassError):
    """Raised by `PushClient.post` when a POST got no answer (no connection,
    no answer in time, TLS, --push-allow, a malformed answer): `reason` for
    the metrics, `detail` for the log."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


_CONTROL = {c: f"%{c:02X}".encode() for c in (*range(0x20), 0x7F)}


def header_value(text: str) -> bytes:
    """`text` as UTF-8, its control characters percent-encoded."""
    raw = text.encode()
    if not any(b < 0x20 or b == 0x7F for b in raw):
        return raw
    return b"".join(_CONTROL.get(b, bytes((b,))) for b in raw)


class PushDescriptors:
    """The push connections' part of the node's descriptor budget (see
    broker.http.descriptors): they hold at most `budget.push_pool()` descriptors
    together, and each client (one a subscription) at most `share()` of
    them. `take` is a descriptor for a new connection, or None: then the
    caller waits (`wait`) for one to be released or for one of its own
    connections to come back idle. A client short of its share when the
    pool is full closes another client's idle connection to get one."""

    def __init__(self, budget: DescriptorBudget, max_fds: int) -> None:
        self.budget = budget
        self.max_fds = max_fds
        self._clients: set[PushClient] = set()
        self._waiters: list[asyncio.Future[None]] = []

    def __repr__(self) -> str:
        return (f"PushDescriptors(open={self.budget.push_open}, pool={self.budget.push_pool()}, "
                f"clients={len(self._clients)}, waiting={len(self._waiters)})")

    def join(self, client: PushClient) -> None:
        self._clients.add(client)
        self.budget.push_max = self.max_fds

    def leave(self, client: PushClient) -> None:
        self._clients.discard(client)
        if not self._clients:
            self.budget.push_max = 0
        self.wake()

    def share(self) -> int:
        """Descriptors one client may hold: an equal part of the pool."""
        return max(1, self.budget.push_pool() // max(1, len(self._clients)))

    def take(self, client: PushClient) -> _Hold | None:
        if client.held >= self.share():
            return None
        if self.budget.push_open >= self.budget.push_pool():
            self._close_an_idle(client)  # released when it is closed; the caller waits for that
            return None
        client.held += 1
        self.budget.push_open += 1
        return _Hold(self, client)

    def release(self, client: PushClient) -> None:
        client.held -= 1
        self.budget.push_open -= 1
        self.wake()

    async def wait(self) -> None:
        """Until a descriptor is released or a connection comes back idle."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _close_an_idle(self, taker: PushClient) -> None:
        """Close an idle connection of another client (one over its share first)."""
        share = self.share()
        others = sorted((c for c in self._clients if c is not taker and c.idle_count()),
                        key=lambda c: c.held <= share)
        if others:
            others[0].close_an_idle()


class _Hold:
    """One descriptor taken from `PushDescriptors`; released once."""

    def __init__(self, owner: PushDescriptors, client: PushClient) -> None:
        self._owner: PushDescriptors | None = owner
        self._client = client

    def release(self) -> None:
        if self._owner is not None:
            owner, self._owner = self._owner, None
            owner.release(self._client)


class _Connection(asyncio.Protocol):
    """One connection to the subscriber: a request written, its response
    parsed (httptools' callbacks below), one at a time, within `PushLimits`."""

    def __init__(self, max_body_bytes: int, limits: PushLimits, hold: _Hold,
                 lost: Callable[[_Connection], None]) -> None:
        self._max_body_bytes = max_body_bytes
        self._limits = limits
        self._hold = hold
        self._lost = lost
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[tuple[int, str | None]] | None = None
        self._status = 0
        self._retry_after: str | None = None
        self._body_bytes = 0
        self._head_bytes = 0  # of this answer's heads, handed to the parser
        self._headers = 0  # header lines of the head being read
        self._head_done = False  # the final head (not an interim 1xx) is complete
        self._timer: asyncio.TimerHandle | None = None  # the head's deadline, then the body's
        self.idle_timer: asyncio.TimerHandle | None = None  # PushClient's, while the connection is idle
        self.received = False  # a byte of the current response came
        self.reusable = False  # the last response was whole and both sides keep the connection

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport: create_connection's

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():  # an answer to no request: not a connection to keep
            self.reusable = False
            self.close()
            return
        if not self.received:
            self.received = True
            self._deadline(self._limits.head_timeout_ms, "head timeout", "no whole answer head")
        limit = self._limits.max_head_bytes
        while data:
            if self._head_done:
                self._feed(data)
                return
            room = limit - self._head_bytes
            if room <= 0:
                self._fail(PostFailed("head too large", f"the answer's head passed {limit} bytes"))
                return
            piece, data = data[:room], data[room:]
            self._head_bytes += len(piece)
            if not self._feed(piece):
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._stop_timer()
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        self._hold.release()
        self._lost(self)
        if self._answer is None or self._answer.done():
            return
        if self._status >= 200:  # a body read until the connection closed: whole
            self._answer.set_result((self._status, self._retry_after))
        else:
            self._answer.set_exception(ConnectionResetError(f"the connection closed before an answer: {exc}"))

    def _feed(self, data: bytes) -> bool:
        """Parse `data`; False once the answer is settled or failed."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(PostFailed("protocol", "the subscriber answered with a protocol upgrade"))
        except httptools.HttpParserError as e:
            if self._answer is not None and not self._answer.done():
                self._fail(PostFailed("protocol", f"a malformed response: {e}"))
        return self._answer is not None and not self._answer.done()

    # -- httptools' callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._answer is None or self._answer.done():  # bytes after the answer: an answer to no request
            self.reusable = False
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        if self._headers > self._limits.max_headers:
            self._fail(PostFailed("too many headers", f"the answer has more than {self._limits.max_headers} "
                                                      f"header lines"))
        elif name.lower() == b"retry-after":
            self._retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._headers = 0
        if self._status >= 200 and not self._head_done:
            self._head_done = True
            self._deadline(self._limits.body_timeout_ms, "body timeout", "no whole answer body")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._max_body_bytes:  # read no more of it: the answer is the status
            self._settle(keep=False)

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:  # an interim answer: the final one follows
            self._status = 0
            return
        self._settle(keep=self._parser.should_keep_alive())

    # -- the client's side ---------------------------------------------------------------

    async def exchange(self, request: bytes) -> tuple[int, str | None]:
        """Write `request`; (status, Retry-After) of its response."""
        self.received = self.reusable = False
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        self._answer = asyncio.get_running_loop().create_future()
        self._status, self._retry_after, self._body_bytes = 0, None, 0
        self._head_bytes, self._headers, self._head_done = 0, 0, False
        self.transport.write(request)
        try:
            return await self._answer
        finally:
            self._stop_timer()

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _deadline(self, ms: int, reason: str, what: str) -> None:
        self._stop_timer()
        self._timer = asyncio.get_running_loop().call_later(
            ms / 1000, self._fail, PostFailed(reason, f"{what} within {ms} ms"))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _settle(self, keep: bool) -> None:
        if self._answer is None or self._answer.done():  # (settled already: a body cut short)
            return
        self._stop_timer()
        self._answer.set_result((self._status, self._retry_after))
        self.reusable = keep
        if not keep:
            self.close()

    def _fail(self, error: Exception) -> None:
        self._stop_timer()
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)
        self.reusable = False
        self.close()


class PushClient:
    """POSTs to one URL (see the module docstring). Runs on the event loop."""

    def __init__(self, url: str, allow: PushAllow, timeout_s: float, max_body_bytes: int,
                 limits: PushLimits | None = None, descriptors: PushDescriptors | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        self._host = parts.hostname or ""
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        netloc = parts.netloc.rpartition("@")[2]  # no credentials in Host
        self._head = f"POST {target} HTTP/1.1\r\nHost: {netloc}\r\n".encode()
        self._allow = allow
        self._timeout_s = timeout_s
        self._max_body_bytes = max_body_bytes
        self._limits = limits or PushLimits()
        self._descriptors = descriptors or PushDescriptors(DescriptorBudget(0), self._limits.max_fds)
        self._descriptors.join(self)
        self._ssl = ssl.create_default_context() if self._tls else None
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self.held = 0  # descriptors this client's connections hold (PushDescriptors')

    def __repr__(self) -> str:
        return f"PushClient({self._host}:{self._port}, open={len(self._open)}, idle={len(self._idle)})"

    async def post(self, body: bytes, headers: Sequence[tuple[str, str]]) -> tuple[int, str | None]:
        """(status, Retry-After) of the answer; PostFailed if none came."""
        request = b"".join((self._head, b"Content-Length: ", str(len(body)).encode(), b"\r\n",
                            *(b"%s: %s\r\n" % (name.encode(), header_value(value)) for name, value in headers),
                            b"\r\n", body))
        got: _Connection | _Hold | None = None
        waited = False  # the timeout came while waiting for a connection
        try:
            async with asyncio.timeout(self._timeout_s):
                while True:
                    waited = True
                    got = await self._acquire()
                    waited = False
                    if isinstance(got, _Connection):  # a kept one the subscriber closed meanwhile fails before any answer
                        connection, got = got, None
                        try:
                            return await self._exchange(connection, request)
                        except ConnectionError:
                            if connection.received:
                                raise
                        continue
                    hold, got = got, None
                    return await self._exchange(await self._connect(hold), request)
        except TimeoutError:
            if waited:
                raise PostFailed("no connection", f"no connection free within {round(self._timeout_s * 1000)} ms "
                                                  f"(this subscription's share of --push-max-fds is in use)") from None
            raise PostFailed("timeout", f"no answer within {round(self._timeout_s * 1000)} ms") from None
        except ssl.SSLError as e:
            raise PostFailed("tls", f"TLS: {e}") from None
        except OSError as e:
            raise PostFailed("connect", f"{type(e).__name__}: {e}") from None
        finally:
            if isinstance(got, _Hold):  # (cancelled before it was used)
                got.release()
            elif isinstance(got, _Connection):
                self._keep(got)

    async def _acquire(self) -> _Connection | _Hold:
        """A kept connection, or a descriptor for a new one: waits while
        neither is free (this subscription's share taken, or the pool)."""
        while True:
            while self._idle:
                connection = self._idle.pop()
                if connection.idle_timer is not None:
                    connection.idle_timer.cancel()
                    connection.idle_timer = None
                if connection.open:
                    return connection
                self._open.discard(connection)
            hold = self._descriptors.take(self)
            if hold is not None:
                return hold
            await self._descriptors.wait()

    async def _exchange(self, connection: _Connection, request: bytes) -> tuple[int, str | None]:
        try:
            answer = await connection.exchange(request)
        except BaseException:
            connection.close()
            self._open.discard(connection)
            raise
        if connection.reusable and self.held <= self._descriptors.share():
            self._keep(connection)
        else:  # (over this subscription's share: more subscriptions since it opened)
            connection.close()
            self._open.discard(connection)
        return answer

    def _keep(self, connection: _Connection) -> None:
        """Back to the idle list, closed after idle_timeout_ms unless a POST takes it."""
        if not connection.open:
            self._open.discard(connection)
            return
        connection.idle_timer = asyncio.get_running_loop().call_later(
            self._limits.idle_timeout_ms / 1000, self._idle_over, connection)
        self._idle.append(connection)
        self._descriptors.wake()

    def _idle_over(self, connection: _Connection) -> None:
        connection.idle_timer = None
        if connection in self._idle:
            self._idle.remove(connection)
        connection.close()

    def _lost(self, connection: _Connection) -> None:
        """A connection closed (by either side): forgotten."""
        self._open.discard(connection)
        if connection in self._idle:
            self._idle.remove(connection)

    def idle_count(self) -> int:
        return len(self._idle)

    def close_an_idle(self) -> None:
        """Close the connection idle longest (another subscription needs its descriptor)."""
        if self._idle:
            connection = self._idle.pop(0)
            if connection.idle_timer is not None:
                connection.idle_timer.cancel()
                connection.idle_timer = None
            connection.close()

    async def _connect(self, hold: _Hold) -> _Connection:
        """A new connection to an address --push-allow lets through; it
        holds `hold` until it closes (released here if none is made)."""
        try:
            connection = await self._open_connection(hold)
        except BaseException:
            hold.release()
            raise
        self._open.add(connection)
        return connection

    async def _open_connection(self, hold: _Hold) -> _Connection:
        loop = asyncio.get_running_loop()
        host, port = self._host, self._port
        if is_address(host):
            if not self._allow.allows_address(host, port):
                raise PostFailed("not allowed", f"{host} is not in --push-allow")
            addresses = [host]
        else:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as e:
                raise PostFailed("connect", f"cannot resolve {host}: {e}") from None
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
            if not addresses:
                raise PostFailed("connect", f"cannot resolve {host}")
            if not self._allow.allows_name(host, port) and \
                    not all(self._allow.allows_address(a, port) for a in addresses):
                raise PostFailed("not allowed", f"{host} resolves to an address --push-allow does not name")
        error: OSError | None = None
        for address in addresses:
            try:
                _, connection = await loop.create_connection(
                    lambda: _Connection(self._max_body_bytes, self._limits, hold, self._lost), address, port,
                    ssl=self._ssl, server_hostname=host if self._ssl is not None else None)
            except ssl.SSLError:
                raise
            except OSError as e:
                error = e
                continue
            return connection
        raise error or OSError(f"cannot connect to {host}:{port}")

    async def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        for connection in self._idle:
            if connection.idle_timer is not None:
                connection.idle_timer.cancel()
        self._open.clear()
        self._idle.clear()
        self._descriptors.leave(self)
