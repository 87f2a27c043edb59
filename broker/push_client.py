"""The pushers' HTTP client: POSTs to one subscription's URL over
keep-alive connections, each response parsed by llhttp (httptools, as the
server's requests are: broker.httpd).

    client = PushClient(url, allow, timeout_s=10, max_body_bytes=65536)
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
- a failure is `PostFailed(reason, detail)`, reason one of "connect",
  "timeout", "tls", "not allowed", "protocol".

Header values are sent as UTF-8 with control characters (a msgId may hold
a line feed) percent-encoded, so no value can end the head early.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.parse
from collections.abc import Sequence

import httptools

from storage.errors import HourglassError

from .push_rules import PushAllow, is_address


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


class _Connection(asyncio.Protocol):
    """One connection to the subscriber: a request written, its response
    parsed (httptools' callbacks below), one at a time."""

    def __init__(self, max_body_bytes: int) -> None:
        self._max_body_bytes = max_body_bytes
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[tuple[int, str | None]] | None = None
        self._status = 0
        self._retry_after: str | None = None
        self._body_bytes = 0
        self.received = False  # a byte of the current response came
        self.reusable = False  # the last response was whole and both sides keep the connection

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport: create_connection's

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(PostFailed("protocol", "the subscriber answered with a protocol upgrade"))
        except httptools.HttpParserError as e:
            if self._answer is not None and not self._answer.done():
                self._fail(PostFailed("protocol", f"a malformed response: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self._answer is None or self._answer.done():
            return
        if self._status >= 200:  # a body read until the connection closed: whole
            self._answer.set_result((self._status, self._retry_after))
        else:
            self._answer.set_exception(ConnectionResetError(f"the connection closed before an answer: {exc}"))

    # -- httptools' callbacks ------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self._retry_after = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

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
        self.transport.write(request)
        return await self._answer

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _settle(self, keep: bool) -> None:
        if self._answer is None or self._answer.done():  # (settled already: a body cut short)
            return
        self._answer.set_result((self._status, self._retry_after))
        self.reusable = keep
        if not keep:
            self.close()

    def _fail(self, error: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)
        self.reusable = False
        self.close()


class PushClient:
    """POSTs to one URL (see the module docstring). Runs on the event loop."""

    def __init__(self, url: str, allow: PushAllow, timeout_s: float, max_body_bytes: int) -> None:
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
        self._ssl = ssl.create_default_context() if self._tls else None
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    def __repr__(self) -> str:
        return f"PushClient({self._host}:{self._port}, open={len(self._open)}, idle={len(self._idle)})"

    async def post(self, body: bytes, headers: Sequence[tuple[str, str]]) -> tuple[int, str | None]:
        """(status, Retry-After) of the answer; PostFailed if none came."""
        request = b"".join((self._head, b"Content-Length: ", str(len(body)).encode(), b"\r\n",
                            *(b"%s: %s\r\n" % (name.encode(), header_value(value)) for name, value in headers),
                            b"\r\n", body))
        try:
            async with asyncio.timeout(self._timeout_s):
                while self._idle:  # a kept connection the subscriber closed meanwhile fails before any answer
                    connection = self._idle.pop()
                    if not connection.open:
                        self._open.discard(connection)
                        continue
                    try:
                        return await self._exchange(connection, request)
                    except ConnectionError:
                        if connection.received:
                            raise
                return await self._exchange(await self._connect(), request)
        except TimeoutError:
            raise PostFailed("timeout", f"no answer within {round(self._timeout_s * 1000)} ms") from None
        except ssl.SSLError as e:
            raise PostFailed("tls", f"TLS: {e}") from None
        except OSError as e:
            raise PostFailed("connect", f"{type(e).__name__}: {e}") from None

    async def _exchange(self, connection: _Connection, request: bytes) -> tuple[int, str | None]:
        try:
            answer = await connection.exchange(request)
        except BaseException:
            connection.close()
            self._open.discard(connection)
            raise
        if connection.reusable:
            self._idle.append(connection)
        else:
            self._open.discard(connection)
        return answer

    async def _connect(self) -> _Connection:
        """A new connection to an address --push-allow lets through."""
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
                    lambda: _Connection(self._max_body_bytes), address, port, ssl=self._ssl,
                    server_hostname=host if self._ssl is not None else None)
            except ssl.SSLError:
                raise
            except OSError as e:
                error = e
                continue
            self._open.add(connection)
            return connection
        raise error or OSError(f"cannot connect to {host}:{port}")

    async def close(self) -> None:
        for connection in self._open:
            connection.close()
        self._open.clear()
        self._idle.clear()
