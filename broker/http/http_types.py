"""What the HTTP front (broker.http.httpd) and the handlers it calls share: a
request, its answer (whole, or streamed in chunks), and a handler's type.

A `Request` is built when its head is complete, so the gate (broker.http.gate)
decides on it before a byte of body is read; its `body` is set once the
body has arrived, before its handler runs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable


class Request:
    """One request. `headers` keys are lower case; `query` is the raw query
    string (bytes, still %-encoded). Built when its head is complete (the
    admission looks at it then, its body still empty); `body` is set once
    the body has arrived."""

    __slots__ = ("at_ms", "body", "content_type", "headers", "method", "path", "query", "transport")

    def __init__(self, method: str, path: str, query: bytes, headers: dict[str, str], body: bytes,
                 transport: asyncio.Transport | None) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.transport = transport
        # When a call every shard of a node carries out (a pause, a resume)
        # happens: the receiving shard's clock, the same on every shard
        # (broker.shards.router); None: now. Never from the client.
        self.at_ms: int | None = None
        # the media type, lower case, without parameters ("" when none)
        given = headers.get("content-type")
        self.content_type = "" if given is None else given if given in _PLAIN_TYPES \
            else given.partition(";")[0].strip().lower()

    @property
    def path_qs(self) -> str:
        return self.path + ("?" + self.query.decode("latin-1") if self.query else "")

    def gone(self) -> bool:
        """The client closed its connection (a long poll stops waiting)."""
        return self.transport is None or self.transport.is_closing()

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.path} body={len(self.body)}B>"


# Content-Type values taken as they are (no parameters, lower case already).
_PLAIN_TYPES = frozenset(("application/x-www-form-urlencoded", "application/json"))


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

    def __init__(self, chunks: AsyncGenerator[bytes, None], status: int = 200,
                 content_type: str = "application/octet-stream", headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.chunks = chunks
        self.content_type = content_type
        self.headers = headers


# What answers a request (a command's procedure, broker.http.commands).
Handler = Callable[[Request], Awaitable["Response | StreamResponse"]]
# What answers a pipelined run of one command's requests at once: each
# request's answer, or what that request alone raised, in their order.
BatchHandler = Callable[[list[Request]], Awaitable[list["Response | Exception"]]]


def plain_answer(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    """An answer made by the front itself (before any handler, or for a bug)."""
    return Response(status, json.dumps({"code": status, "msg": text}).encode(), headers=headers)
