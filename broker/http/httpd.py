"""A small HTTP/1.1 server for the broker's API, on asyncio's Protocol.

Why not aiohttp's server: measured on this project's 2-core machine with
uvloop, aiohttp spends 85-95 µs of server CPU on a request whose handler
does nothing (routing, middleware, a Task, StreamReader, multidicts);
this protocol spends about 20 µs on the same request, which is what lets
a pull or an ack cost less than 100 µs in all. aiohttp stays the client
(`broker.client`, the cluster's peer calls).

Heads are parsed by llhttp (through `httptools`, as uvicorn does) in its
strict mode: two Content-Lengths, a length that is not plain digits,
whitespace before a colon, a folded line, a bare CR or LF, NUL or another
control byte in a head: 400, and the connection is closed. The server
decides on the head (`Admit`, broker.http.gate): token, route and method are
checked and the request's command looked up (broker.http.commands) when the
head is complete, and its body cap applied, before `100 Continue`, before
any body budget is reserved and before a byte of body is read; a refused
request with a body is answered and its connection closed.

The usual read is one whole request from a client that waits for each
answer: `Connection._whole` reads it in one pass (a regular expression
and a split, no callback a header) when it has the plain shape every
client of this API sends, a shape llhttp's strict mode accepts as it is
(tests/property/test_whole_reads.py: one read or many, the same request
and answer). Anything else -- part of a request, two, another shape --
goes to llhttp, which parses that connection from then on.

A request then runs in one frame, `Connection._run`: the API's tracking
around the command's handler, its error table on what the handler raises,
the answer written. A command marked `inline` starts in the callback that
completed its body (`_next`): a handler that does not wait answers there,
without a Task; one that waits on a future is resumed from where it
stopped by that future's callback (`_step`), still without a Task,
until it yields bare (then a Task goes on with the frame itself).

What it speaks: HTTP/1.1 and 1.0, keep-alive, pipelined requests (answered
in order; one at a time per connection, but for a run of one command that
has a `batch` procedure, which runs as one batch: `_run_batch`), bodies with `Content-Length`
(`Expect: 100-continue` honoured). A chunked request body is answered 411:
every client of this API (camellia's SDK on OkHttp, curl, aiohttp, the
Spark sink) sends a length. Responses have a length, or are streamed in
chunks (`StreamResponse`, for the cluster's snapshot).

What a stranger can make it spend, each bounded by `Limits`:

| resource                   | bound                                  | when hit                  |
|----------------------------|----------------------------------------|---------------------------|
| connections                | `max_connections`, and the descriptors | the stalled connection    |
|                            | left after `reserved_fds` for storage  | nearest its deadline is   |
|                            | and the push connections' pool         | closed for it; none: 503  |
|                            | (`broker.http.descriptors`); on a node |                           |
|                            | of shards, all its shards' together    |                           |
|                            | (`NodeConnections`)                    |                           |
| descriptors at accept      | EMFILE                                 | 503 through a spare one   |
| head size                  | `max_head_bytes`                       | 431, closed               |
| time to send a head        | `head_timeout_s` (from its first byte) | closed                    |
| time to send a body        | `body_timeout_s`                       | closed                    |
| pace of a body             | `min_body_rate_bps` (after 2 s)        | closed; evictable as a    |
|                            |                                        | stalled connection        |
| idle keep-alive            | `idle_timeout_s`                       | closed                    |
| a body                     | the route's cap (`Admit`)              | 413 before it is read     |
| bodies read or handled     | `body_budget_bytes` (bodies > 64 KiB), | 429 before it is read     |
|   at once                  | held until the answer is written       |                           |
| answers the client does    | `write_buffer_bytes`                   | reading and parsing stop  |
|   not read                 |                                        | until it reads            |
| pipelined requests parsed  | PIPELINE_DEPTH (128) queued, and no    | parsing waits; reading    |
|   ahead                    | more than one read holds               | stops while any is queued |
| a pipelined run's answers  | written a write buffer at a time, each | the run waits for the     |
|                            | once the last was taken                | client to read            |

Deadlines are plain numbers checked by one sweep a second, so a request
costs no timer.

Accepting is the server's own (not `loop.create_server`): a connection
over the cap is answered 503 on its plain socket, which is then shut for
writing and drained for a moment so the client reads the 503 rather than a
reset (at most LINGERING_MAX at once; beyond, closed at once); and EMFILE
on accept is answered through a spare descriptor kept for that, where
asyncio's server would log and pause and uvloop's would drop the backlog
unanswered. A stalled connection is one with no request in progress: idle
between requests, silent since it connected, part way through a head, or
sending a body slower than `min_body_rate_bps`. When the cap is reached
the one nearest its deadline is closed for the newcomer (a slow-loris
client loses its sockets to real ones); connections running a request
are never taken.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import heapq
import logging
import os
import re
import socket
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

import httptools

from storage.errors import ConfigError, HourglassError, InvariantError

from .commands import Command
from .descriptors import DescriptorBudget
from .http_types import Request, Response, StreamResponse, plain_answer

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
    # below RLIMIT_NOFILE: connections never take them (broker.http.descriptors).
    reserved_fds: int = 128
    # Request line and headers, in bytes.
    max_head_bytes: int = 16 * 1024
    # From a request's first byte until its head is complete.
    head_timeout_s: float = 10.0
    # From a head until its body is complete.
    body_timeout_s: float = 30.0
    # A body arriving slower than this (bytes a second, averaged from its
    # head on, after BODY_RATE_GRACE_S) is closed; 0: no minimum.
    min_body_rate_bps: int = 4096
    # A keep-alive connection with no request in progress.
    idle_timeout_s: float = 120.0
    # Bytes of large bodies (> 64 KiB) being received at once, all
    # connections together.
    body_budget_bytes: int = 256 * 1024 * 1024
    # Answers queued on one connection and not yet taken by the client:
    # above it the connection is neither read nor parsed until the client
    # reads (one answer may be larger; the next waits).
    write_buffer_bytes: int = 256 * 1024

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_head_bytes", "body_budget_bytes", "write_buffer_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("reserved_fds", "min_body_rate_bps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be at least 0, not {getattr(self, name)}")
        for name in ("head_timeout_s", "body_timeout_s", "idle_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")


# A body is measured against `min_body_rate_bps` only after this long.
BODY_RATE_GRACE_S = 2.0
# Bytes handed to the parser at once outside a body.
HEAD_SLICE_BYTES = 4096
# Requests of one connection parsed ahead of the one running (a client
# pipelining them): those of one command with a `batch` procedure run as
# one batch (`Connection._next`). Reading waits while any is queued, so
# what they hold is at most what one read brought.
PIPELINE_DEPTH = 128
# A streamed answer (a snapshot, a backup) whose reader takes nothing for this long is cut: it
# holds what the stream holds (a backup: the store's checkpoints) no longer.
STREAM_STALL_S = 60.0


# Called with a request whose head is complete (body still empty): a
# refusal to answer at once, without reading the body, or the command that
# serves it (broker.http.gate; the command's body cap is checked here).
Admit = Callable[[Request], "Response | Command"]


class NodeConnections(Protocol):
    """The node's connections when other processes accept on its port too
    (a node of shards: broker.shards.connections): `max_connections` holds
    for all of them together."""

    def take(self, here: int, cap: int) -> bool:
        """True, and this process counted at `here` + 1, if the node holds
        fewer than `cap` with this process's `here`."""

    def publish(self, here: int) -> None:
        """This process holds `here` connections now."""

    def close(self) -> None: ...


def _head(status: int, content_type: str, length: int | None, headers: dict[str, str] | None,
          close: bool) -> bytes:
    start = _STARTS.get((status, content_type))
    if start is None:
        start = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n" % (status, _REASONS.get(status, b"Unknown"),
                                                              content_type.encode())
        if len(_STARTS) < 256:  # (the node answers a handful of kinds)
            _STARTS[(status, content_type)] = start
    if length is not None and not close and not headers:  # most answers
        return b"%sContent-Length: %d\r\n\r\n" % (start, length)
    lines = [start, b"Transfer-Encoding: chunked\r\n" if length is None else b"Content-Length: %d\r\n" % length]
    if close:
        lines.append(b"Connection: close\r\n")
    if headers:
        for k, v in headers.items():
            lines.append(f"{k}: {v}\r\n".encode("latin-1"))
    lines.append(b"\r\n")
    return b"".join(lines)


# (status, content type) -> the answer's first two lines, made once
_STARTS: dict[tuple[int, str], bytes] = {}


class _Shared:
    """State every connection of one server shares."""

    def __init__(self, admit: Admit, limits: Limits, descriptors: DescriptorBudget | None = None,
                 node: NodeConnections | None = None) -> None:
        self.admit = admit
        self.limits = limits
        self.node = node  # the other processes' connections on the same port, if any
        self.published = 0  # this process's connections as `node` last heard
        self.connections: set[Connection] = set()
        self.adopting = 0  # accepted, not yet made a Connection
        # The node's (its push connections are in it too: broker.http.descriptors)
        self.descriptors = descriptors or DescriptorBudget(limits.reserved_fds)
        self.body_bytes = 0
        self.refused = 0  # connections answered 503 at the cap (or at EMFILE)
        self.evicted = 0  # stalled connections closed to make room for a new one
        self.slow_bodies = 0  # connections closed for sending a body below min_body_rate_bps
        self.running = 0  # requests running (their handler, or writing their answer)
        self.stopping = False
        self.idle: asyncio.Future[None] | None = None  # made by close() to wait until none runs

    def cap(self) -> int:
        """Connections allowed now: `max_connections`, lowered to keep the
        reserved descriptors free."""
        ceiling = self.descriptors.ceiling()
        return self.limits.max_connections if ceiling is None else min(self.limits.max_connections, ceiling)

    def make_room(self, now: float) -> bool:
        """True if one more connection may be taken (and then counted):
        under this process's cap and the node's, or a stalled connection of
        this process (the one nearest its deadline) was closed for it. (A
        cap the descriptors lowered under what is open: the sweep sheds the
        rest.)"""
        if len(self.connections) + self.adopting < self.cap() and self._node_takes():
            return True
        return self.shed(1, now) == 1 and self._node_takes()

    def _node_takes(self) -> bool:
        """With other processes on the port: the node under its cap with
        this one more, then counted."""
        if self.node is None:
            return True
        here = len(self.connections) + self.adopting
        if not self.node.take(here, self.limits.max_connections):
            return False
        self.published = here + 1
        return True

    def recount(self) -> None:
        """Tell the other processes of a connection gone (or one taken that
        did not become a connection)."""
        if self.node is not None:
            here = len(self.connections) + self.adopting
            if here != self.published:
                self.published = here
                self.node.publish(here)

    def shed(self, count: int, now: float) -> int:
        """Close up to `count` stalled connections, those nearest their
        deadline first; returns how many."""
        stalled = heapq.nsmallest(count, [c for c in self.connections if c.stalled(now)], key=lambda c: c.deadline)
        for victim in stalled:
            victim.evict()
        self.evicted += len(stalled)
        return len(stalled)


class _Refused(HourglassError):
    """Raised inside a parser callback to stop parsing: the request was
    refused on its head, or the head grew past its bound."""


# A queued entry: a request and its command, or an answer decided on the
# head (request and command None); keep-alive; bytes of body budget held.
_Queued = tuple[Command | None, Request | None, Response | None, bool, int]


class Connection(asyncio.Protocol):
    """One client connection: llhttp (httptools) parses, `admit` decides on
    each head and gives the request's command, which answers it (`_run`),
    in order, one request at a time -- or a run of one command's pipelined
    requests at once (`_run_batch`).

    Reading stops while a request waits behind the one running (parsing
    goes on through what was read, up to PIPELINE_DEPTH requests), and while the transport holds more than
    `write_buffer_bytes` of answers the client has not read
    (`pause_writing`); both resume as soon as the cause is gone, with no
    polling."""

    def __init__(self, shared: _Shared) -> None:
        self.shared = shared
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        # Every read so far held whole requests, read by `_whole` (llhttp has seen nothing).
        self.whole_reads = True
        self.unparsed = b""           # received, not yet given to the parser
        self.deadline = 0.0
        self.busy = False             # a handler runs, or an answer is being written
        self.inline = False           # `_next` runs a request's frame: `_next` goes on after it
        self.going_on = False         # `_go_on` is to run at the loop's next turn
        self.reading = True
        self.writing_paused = False
        self.drained: asyncio.Future[None] | None = None  # a stream waiting for resume_writing
        self.queue: deque[_Queued] = deque()
        self.done = False             # refused or closing: nothing more is parsed
        # the message being parsed
        self.in_head = False
        self.head_bytes = 0
        self.url = b""
        self.headers: dict[str, str] = {}
        self.request: Request | None = None
        self.command: Command | None = None
        self.keep_alive = True
        self.budget = 0
        self.body: list[bytes] = []   # the body's parts as they came
        self.body_received = 0
        self.body_expected = 0        # Content-Length of the body being received (0: none)
        self.body_started = 0.0

    # -- asyncio.Protocol --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        shared = self.shared
        if shared.stopping:  # accepted as the server began to stop
            shared.refused += 1
            stream.write(_encode(plain_answer(503, "stopping, retry on another node"), True))
            stream.close()
            return
        self.transport = stream
        stream.set_write_buffer_limits(high=shared.limits.write_buffer_bytes)
        shared.connections.add(self)
        self.deadline = self.loop.time() + shared.limits.idle_timeout_s

    def stalled(self, now: float) -> bool:
        """No request in progress (idle, silent, or part way through a
        head), or a body arriving below the minimum rate."""
        if self.busy or self.queue or self.transport is None:
            return False
        return not self.body_expected or self.slow_body(now)

    def slow_body(self, now: float) -> bool:
        rate = self.shared.limits.min_body_rate_bps
        elapsed = now - self.body_started
        return (bool(self.body_expected) and rate > 0 and elapsed > BODY_RATE_GRACE_S
                and self.body_received < rate * (elapsed - BODY_RATE_GRACE_S))

    def evict(self) -> None:
        self.shared.connections.discard(self)  # its slot is free now; its descriptor once closed
        if self.transport is not None:
            self.transport.close()
        self.shared.recount()

    def connection_lost(self, exc: Exception | None) -> None:
        self.shared.connections.discard(self)
        self.done = True
        self._release(self.budget)
        self.budget = 0
        for _, _, _, _, budgeted in self.queue:
            self._release(budgeted)
        self.queue.clear()
        self.unparsed = b""
        self.body = []
        self._wake_writer()
        self.shared.recount()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_writer()
        self._next()
        self._feed()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.done:
            return
        if self.whole_reads and not self.queue and not self.busy and not self.writing_paused and self._whole(data):
            return
        self.whole_reads = False  # llhttp parses from here on: it may hold part of a request
        if self.unparsed:  # parsing waits (reading is paused): at most one read's worth more
            self.unparsed += data
        else:  # (a new head's deadline is set when its first byte is parsed: on_message_begin)
            self.unparsed = data
        self._feed()

    # -- parsing ---------------------------------------------------------------------

    def _blocked(self) -> bool:
        """Parsing waits: a request is queued behind the one running, or the
        client is not reading its answers."""
        return self.writing_paused or bool(self.queue)

    def _feed(self) -> None:
        """Give the parser what was received, a slice at a time, until it
        is all parsed or parsing must wait; reading follows."""
        data = self.unparsed
        end = len(data)
        pos = 0
        while pos < end and not self.done and not self.writing_paused and len(self.queue) < PIPELINE_DEPTH:
            size = max(self.body_expected - self.body_received, HEAD_SLICE_BYTES) if self.body_expected \
                else HEAD_SLICE_BYTES
            piece = data if pos == 0 and end <= size else data[pos:pos + size]
            pos += len(piece)
            if not self.body_expected:
                self.head_bytes += len(piece)
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserCallbackError as e:
                if not isinstance(e.__context__, _Refused):
                    log.error("bug while parsing a request", exc_info=e.__context__)
                    self._refusal(500, "internal error (logged)")
                break
            except httptools.HttpParserUpgrade as e:  # an Upgrade header: ignored, parsing goes on
                self.parser = httptools.HttpRequestParser(self)
                pos -= len(piece) - e.args[0]
            except httptools.HttpParserError as e:
                text = str(e) or "malformed request"
                self._refusal(505 if "version" in text.lower() else 400, f"malformed request: {text}")
                break
            if self.in_head and self.head_bytes > self.shared.limits.max_head_bytes:
                self._refusal(431, "request head too large")
                break
        self.unparsed = data[pos:] if pos < end and not self.done else b""
        if self.queue:
            self._next()
        want = not self.done and not self.writing_paused and not self.queue  # (not `_blocked()`)
        if want != self.reading:
            self._read(want)

    def _read(self, want: bool) -> None:
        transport = self.transport
        if want == self.reading or transport is None or transport.is_closing():
            return
        self.reading = want
        if want:
            transport.resume_reading()
        else:
            transport.pause_reading()

    def _whole(self, data: bytes) -> bool:
        """Serve a read that holds exactly one whole request in the plain
        shape every client of this API sends (`_PLAIN_HEAD`: HTTP/1.1, a
        path, token names, visible values, each header once, a length in
        digits, no Transfer-Encoding, Expect or Upgrade), without llhttp.
        False, having done nothing: anything else (part of a request, two,
        any other shape), which llhttp then parses -- the strict parser
        stays the judge of every head this reader does not take."""
        end = data.find(b"\r\n\r\n", 0, self.shared.limits.max_head_bytes + 4)
        if end < 0 or end >= self.shared.limits.max_head_bytes:
            return False
        head = _PLAIN_HEAD.fullmatch(data, 0, end + 2)
        if head is None:
            return False
        headers: dict[str, str] = {}
        for line in head[3].split(b"\r\n")[:-1]:
            raw, _, value = line.partition(b":")
            name = _HEADER_NAMES.get(raw)
            if name is None:
                name = raw.decode("latin-1").lower()
            if name in headers or name in _LLHTTP_ONLY:
                return False
            headers[name] = value.lstrip(b" \t").decode("latin-1")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or len(length) > 18):  # (llhttp: the overflow's 400)
            return False
        if end + 4 + (int(length) if length else 0) != len(data):
            return False
        connection = headers.get("connection")
        if connection is None:
            keep_alive = True
        else:
            keep_alive = connection.lower() != "close"
            if keep_alive and connection.lower() != "keep-alive":
                return False
        try:
            self._begin(head[1].decode("ascii"), head[2], headers, keep_alive)
        except _Refused:
            pass
        except Exception:  # (as `_feed` answers a bug in a parser callback)
            log.exception("bug while reading a request")
            self._refusal(500, "internal error (logged)")
        else:
            if self.request is not None:  # admitted: its body is the rest of the read
                self.request.body = data[end + 4:]
                self.queue.append((self.command, self.request, None, self.keep_alive, self.budget))
                self.request, self.command, self.budget = None, None, 0
                self.body_expected = 0
        self._next()
        return True

    # httptools callbacks (on the loop, inside feed_data)

    def on_url(self, url: bytes) -> None:
        """The first callback of a message (the request target, maybe in
        parts): a head begins (no on_message_begin: one call less a request)."""
        if self.in_head:
            self.url += url
            return
        self.in_head = True
        self.url = url
        self.headers = {}
        if not self.busy and not self.queue:
            self.deadline = self.loop.time() + self.shared.limits.head_timeout_s

    def on_header(self, name: bytes, value: bytes) -> None:
        key = _HEADER_NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        seen = self.headers.get(key)
        if seen is None:
            self.headers[key] = text
        elif key in _SINGLE:
            raise self._refusal(400, f"two {key} headers")
        else:
            self.headers[key] = seen + ("; " if key == "cookie" else ", ") + text

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_bytes = 0
        if self.parser.get_http_version() not in ("1.1", "1.0"):
            raise self._refusal(505, "HTTP/1.1 only")
        headers = self.headers
        if "transfer-encoding" in headers:
            raise self._refusal(411, "send the body with a Content-Length")
        method = self.parser.get_method()
        self._begin(_METHODS.get(method) or method.decode("ascii"), self.url, headers,
                    self.parser.should_keep_alive())

    def _begin(self, method: str, url: bytes, headers: dict[str, str], keep_alive: bool) -> None:
        """A complete head: admitted (its command kept, its body awaited)
        or answered at once; raises `_Refused` when the answer ends the
        connection."""
        path_b, _, query = url.partition(b"?")
        path = path_b.decode("latin-1")
        if not path.startswith("/"):
            raise self._refusal(400, "the request target must be a path")
        length = int(headers.get("content-length", "0"))
        request = Request(method, path, query, headers, b"", self.transport)
        shared = self.shared
        verdict = shared.admit(request)
        if isinstance(verdict, Response):
            # decided on the head: its body is never read, so a request with one ends the connection
            self._queue_answer(verdict, keep_alive and not length)
            if length or not keep_alive:
                raise _Refused
            return
        if length > verdict.body_cap:
            raise self._refusal(413, f"request body is {length} bytes, more than {verdict.body_cap}")
        if length > LARGE_BODY_BYTES:
            if shared.body_bytes + length > shared.limits.body_budget_bytes:
                raise self._refusal(429, "too many large bodies at once, retry later")
            shared.body_bytes += length
            self.budget = length
        self.request, self.command, self.keep_alive = request, verdict, keep_alive
        if length:
            self.body_expected = length
            self.body_started = self.loop.time()
            self.deadline = self.body_started + shared.limits.body_timeout_s
            if (headers.get("expect", "").lower() == "100-continue" and not self.busy and not self.queue
                    and self.transport is not None):
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.body_received += len(body)

    def on_message_complete(self) -> None:
        request = self.request
        if request is None:  # refused on its head (an answer without a body stays queued)
            return
        request.body = b"".join(self.body)  # (one part, the usual case: that part itself)
        self.body = []
        self.body_received = 0
        self.body_expected = 0
        self.queue.append((self.command, request, None, self.keep_alive, self.budget))
        self.request, self.command, self.budget = None, None, 0

    def _queue_answer(self, response: Response, keep_alive: bool) -> None:
        """Answer a request on its head, after those ahead of it (`_feed`
        starts the queue once the parser returns). Without keep-alive
        nothing after it is parsed."""
        self.queue.append((None, None, response, keep_alive, 0))
        self.request = self.command = None
        if not keep_alive:
            self.done = True
            self._read(False)

    def _refusal(self, status: int, text: str) -> _Refused:
        """Queue an answer that ends the connection (what follows is not
        read); a parser callback raises what it returns, to stop parsing."""
        self._release(self.budget)
        self.budget = 0
        self.body_expected = 0
        self._queue_answer(plain_answer(status, text), False)
        return _Refused(status)

    def _release(self, budgeted: int) -> None:
        if budgeted:
            self.shared.body_bytes -= budgeted

    # -- answering ---------------------------------------------------------------------

    def _next(self) -> None:
        """Write the queued answers and start the first queued request, when
        none is running, none is about to (`going_on`) and the client reads
        its answers. A request that answers without waiting (`_next`) has
        the next one start at the loop's next turn, as a Task's would: one
        client's pipelined requests do not hold the loop between them.

        Called from the loop's callbacks only (the protocol's, `_go_on`),
        never inside a Task's step, where an inline handler would take
        that Task for its own (`asyncio.timeout` would bind to it)."""
        shared = self.shared
        while self.queue and not self.busy and not self.writing_paused and not self.going_on:
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            command, request, response, keep_alive, budgeted = self.queue.popleft()
            if command is None or request is None:
                if response is None:
                    raise InvariantError("a queued entry holds neither a request nor an answer")
                transport.write(_encode(response, not keep_alive or shared.stopping))
                if not keep_alive or shared.stopping:
                    self.done = True
                    transport.close()
                    return
                self.deadline = self.loop.time() + shared.limits.idle_timeout_s
                continue
            self.busy = True
            shared.running += 1
            frame: Coroutine[Any, Any, None]
            if command.batch is not None and keep_alive and self._joins(command):
                frame = self._run_batch(command, self._pipelined(command, request, budgeted))
            else:
                frame = self._run(command, request, keep_alive, budgeted)
            if not command.inline:
                self.loop.create_task(frame)
                return
            # An inline command's frame starts here, until it first waits
            # (ended: it answered without waiting, and no Task was made).
            self.inline = True
            try:
                ended = self._step(frame)
            finally:
                self.inline = False
            if ended and (self.queue or self.unparsed):
                self._go_on_soon()
            return

    def _step(self, frame: Coroutine[Any, Any, None], _done: object = None) -> bool:
        """Run the frame until it waits (True: it ended). What it waits on
        resumes it here again once done (its done-callback, `_done` the
        future), as a Task's step
        would, without a Task: the frame is its own Task until it asks for
        one. A bare yield (asyncio.sleep(0); what broker.clock's wait_for
        makes before an asyncio.timeout, which needs the current Task)
        hands the frame to a Task that goes on from where it stopped."""
        try:
            waiting = frame.send(None)
            while waiting is not None and not getattr(waiting, "_asyncio_future_blocking", False):
                # what a Task answers to a yield that is neither a future nor a bare yield
                waiting = frame.throw(RuntimeError(f"a handler yielded {waiting!r}, not a future"))
        except StopIteration:
            return True
        except asyncio.CancelledError:  # what it waited on was cancelled (a stop): the frame ended, as its Task would
            return True
        if waiting is None:  # a bare yield: go on at the loop's next turn, in a Task
            self.loop.create_task(frame)
        else:  # `await future`: resumed here by its callback, and the future's result taken then
            waiting._asyncio_future_blocking = False  # (the handshake a Task makes with `Future.__await__`)
            waiting.add_done_callback(functools.partial(self._step, frame))
        return False

    def _joins(self, command: Command) -> bool:
        """The next queued request is `command`'s too, on a kept-alive connection."""
        queue = self.queue
        return bool(queue) and queue[0][0] is command and queue[0][1] is not None and queue[0][3]

    def _pipelined(self, command: Command, request: Request, budgeted: int) -> list[tuple[Request, int]]:
        """`request` and the queued requests of `command` right after it:
        one batch (each kept alive; the first of another command, or one
        that ends the connection, waits for its own turn)."""
        run = [(request, budgeted)]
        queue = self.queue
        while self._joins(command):
            _, more, _, _, more_budgeted = queue.popleft()
            run.append((more, more_budgeted))  # type: ignore[arg-type]  # (`_joins`: a request)
        return run

    async def _run_batch(self, command: Command, run: list[tuple[Request, int]]) -> None:
        """A pipelined run of one command's requests in one frame, as `_run`
        runs one: its `batch` procedure gives each request its answer, or
        what that request raised (answered by the error table), in order;
        the answers written with one write. Each answer is as the request
        alone would have had (broker.http.commands.Command.batch)."""
        shared = self.shared
        tracker = command.tracker
        batch = command.batch
        requests = [request for request, _ in run]
        try:
            if tracker is not None:
                tracker.in_flight += len(requests)
            try:
                if batch is None:
                    raise InvariantError(f"{command!r} has no batch procedure")
                outcomes: list[Response | Exception] = await batch(requests)
                if len(outcomes) != len(requests):
                    raise InvariantError(f"{len(outcomes)} answers to a batch of {len(requests)}")
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                log.warning("a batch of %d %s: what it waited for was cancelled; answered 503", len(requests),
                            command.path)
                outcomes = [plain_answer(503, "the request was cancelled on this node; retry")] * len(requests)
            except Exception as error:
                outcomes = [error] * len(requests)
            finally:
                if tracker is not None:
                    tracker.in_flight -= len(requests)
                    tracker.last_used_s = tracker.now_s()
            answers = []
            for request, outcome in zip(requests, outcomes):
                if isinstance(outcome, Exception):
                    answer = command.error_answer(outcome)
                    if answer is None:
                        log.error("bug while serving %s %s", request.method, request.path, exc_info=outcome)
                        answer = plain_answer(500, "internal error (logged)")
                    outcome = answer
                answers.append(outcome)
            transport = self.transport
            if transport is None or transport.is_closing():
                return
            close = shared.stopping
            last = len(answers) - 1
            limit = shared.limits.write_buffer_bytes
            chunk: list[bytes] = []
            size = 0
            for at, answer in enumerate(answers):  # in writes of about the buffer's limit, each when it drained
                encoded = _encode(answer, close and at == last)
                chunk.append(encoded)
                size += len(encoded)
                if size < limit and at < last:
                    continue
                transport.write(b"".join(chunk))
                chunk, size = [], 0
                if self.writing_paused and at < last:
                    self.drained = self.loop.create_future()
                    await self.drained
                    if transport.is_closing():
                        return
            if close:
                self.done = True
                transport.close()
                return
        finally:
            self._ran(sum(budgeted for _, budgeted in run))
        self._after_answer()

    async def _run(self, command: Command, request: Request, keep_alive: bool, budgeted: int) -> None:
        """The one frame a request runs in: its command's handler, counted
        as an API call while it runs (`command.tracker`), what it raises
        answered by the command's error table (anything else is a bug: 500,
        logged), then the answer written. Started by `_next` (an inline
        command) or as a Task."""
        shared = self.shared
        tracker = command.tracker
        try:
            if tracker is not None:
                tracker.in_flight += 1
            try:
                response = await command.handler(request)
            except Exception as error:
                answer = command.error_answer(error)
                if answer is None:
                    log.exception("bug while serving %s %s", request.method, request.path)
                    answer = plain_answer(500, "internal error (logged)")
                response = answer
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this frame's own Task is cancelled (the loop ends): the connection closes
                # What it awaited was cancelled under it (a future it shared
                # with a task that was cancelled): the client is answered all
                # the same, or it would wait on this connection for ever (a
                # follower that forwarded the request did).
                log.warning("%s %s: what it waited for was cancelled; answered 503", request.method, request.path)
                response = plain_answer(503, "the request was cancelled on this node; retry")
            finally:
                if tracker is not None:
                    tracker.in_flight -= 1
                    tracker.last_used_s = tracker.now_s()
            transport = self.transport
            if transport is None or transport.is_closing():
                if isinstance(response, StreamResponse):
                    await response.chunks.aclose()  # its finally blocks run
                return
            close = not keep_alive or shared.stopping
            if isinstance(response, StreamResponse):
                await self._stream(transport, response, close)
            else:
                transport.write(_encode(response, close))
            if close:
                self.done = True
                transport.close()
                return
        finally:
            self._ran(budgeted)
        self._after_answer()

    def _ran(self, budgeted: int) -> None:
        """A frame's request (or run) is done: its body budget (held while
        the handler parses and holds the body) given back, the connection
        free for the next."""
        shared = self.shared
        if budgeted:
            shared.body_bytes -= budgeted
        self.busy = False
        shared.running -= 1
        if not shared.running and shared.idle is not None and not shared.idle.done():
            shared.idle.set_result(None)

    def _after_answer(self) -> None:
        if not self.body_expected and not self.in_head:
            self.deadline = self.loop.time() + self.shared.limits.idle_timeout_s
        if not self.inline and (self.queue or self.unparsed or not self.reading):  # (inline, `_next` goes on)
            self._go_on_soon()  # not in this Task's step: the next request may start inline

    def _go_on_soon(self) -> None:
        self.going_on = True
        self.loop.call_soon(self._go_on)

    def _go_on(self) -> None:
        """After an answer: the next queued request, then what is still
        unparsed; reading resumes once nothing waits."""
        self.going_on = False
        if self.queue:
            self._next()
        if self.unparsed:
            self._feed()
        elif not self.reading:
            self._read(not self.done and not self._blocked())

    async def _stream(self, transport: asyncio.Transport, response: StreamResponse, close: bool) -> None:
        transport.write(_head(response.status, response.content_type, None, response.headers, close))
        try:
            async for chunk in response.chunks:
                if transport.is_closing():
                    return
                if chunk:
                    transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                if self.writing_paused:  # let the socket drain: bounded RAM per stream
                    self.drained = self.loop.create_future()
                    try:
                        await asyncio.wait_for(self.drained, STREAM_STALL_S)
                    except TimeoutError:  # a reader that stopped reading holds nothing longer (a backup's lock)
                        log.warning("a streamed answer's reader read nothing for %.0f s: connection closed",
                                    STREAM_STALL_S)
                        transport.abort()
                        return
        finally:
            await response.chunks.aclose()
        transport.write(b"0\r\n\r\n")

    def _wake_writer(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None


# The spellings clients send of common header names, and of methods,
# decoded once.
_HEADER_NAMES = {spelling.encode(): spelling.lower() for name in (
    "Host", "Content-Type", "Content-Length", "Connection", "Accept", "Accept-Encoding", "User-Agent",
    "Authorization", "Expect", "Cookie", "Origin", "Sec-Fetch-Site", "Transfer-Encoding")
    for spelling in (name, name.lower())}
_METHODS = {m.encode(): m for m in ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH")}
# Headers a request may carry once: a second copy is ambiguous (which one
# would a proxy in front have read?), answered 400. Others are joined.
# A whole request's head as `Connection._whole` takes it (without llhttp): a
# method, a path of URI characters, HTTP/1.1, then header lines of a token,
# a colon and a value of visible characters (spaces inside), no folding.
_PLAIN_HEAD = re.compile(
    rb"(GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) (/[A-Za-z0-9\-._~:/?\[\]@!$&'()*+,;=%]*) HTTP/1\.1\r\n"
    rb"((?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[ \t]*(?:[!-~](?:[ \t!-~]*[!-~])?)?\r\n)*)")
# Headers `_whole` leaves to llhttp and the general path (llhttp reads
# Proxy-Connection as Connection).
_LLHTTP_ONLY = frozenset(("transfer-encoding", "expect", "upgrade", "proxy-connection"))
_SINGLE = frozenset(("host", "authorization", "content-type", "content-length", "transfer-encoding", "expect",
                     "origin", "sec-fetch-site", "connection"))


def _encode(response: Response, close: bool) -> bytes:
    return _head(response.status, response.content_type, len(response.body), response.headers,
                 close) + response.body


class HttpServer:
    """Listens on host:port, serves the commands `admit` gives each request
    (broker.http.gate); `close()` stops gracefully."""

    def __init__(self, admit: Admit, limits: Limits | None = None,
                 descriptors: DescriptorBudget | None = None, node: NodeConnections | None = None) -> None:
        self.shared = _Shared(admit, limits or Limits(), descriptors, node)
        self.listeners: list[socket.socket] = []
        self.spare: int | None = None  # a descriptor held to answer 503 at EMFILE
        self.own_port: int | None = None  # a shard's own port beside the node's (`start`)
        self.adoptions: set[asyncio.Task[None]] = set()
        self.sweeper: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lingering: set[socket.socket] = set()  # refused sockets drained before their close

    def __repr__(self) -> str:
        shared = self.shared
        return (f"HttpServer(connections={len(shared.connections)}, cap={shared.cap()}, refused={shared.refused}, "
                f"evicted={shared.evicted}, {shared.descriptors!r})")

    @property
    def connections(self) -> int:
        return len(self.shared.connections)

    async def start(self, host: str, port: int, reuse_port: bool = False) -> None:
        """Listen on host:port; `reuse_port`: beside the other shards of the
        node, each with its own socket (broker.shards.supervisor), and on a
        port of this shard's own as well (`own_port`: a client that knows
        the shard map sends a message to its shard there)."""
        self.loop = loop = asyncio.get_running_loop()
        self.listeners = await _listen(loop, host, port, backlog=1024, reuse_port=reuse_port)
        if reuse_port:
            own = await _listen(loop, self.listeners[0].getsockname()[0], 0, backlog=1024)
            self.own_port = own[0].getsockname()[1]
            self.listeners += own
        self.spare = _open_spare()
        self.shared.descriptors.measure(0)
        for listener in self.listeners:
            loop.add_reader(listener.fileno(), self._accept, listener)
        self.sweeper = asyncio.create_task(self._sweep(), name="http-deadlines")
        shared = self.shared
        budget = shared.descriptors
        ceiling = budget.ceiling()
        if ceiling is not None and ceiling < shared.limits.max_connections:
            level = logging.WARNING if shared.cap() < 16 else logging.INFO
            log.log(level, "at most %d connections: the descriptor limit is %d, %d are reserved for storage and "
                    "%d are open (raise `ulimit -n` for more)", shared.cap(), budget.limit, budget.reserved,
                    budget.others)

    @property
    def port(self) -> int:
        port: int = self.listeners[0].getsockname()[1]
        return port

    # -- accepting ---------------------------------------------------------------------

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The loop `start` ran on (listeners exist only after it)."""
        if self.loop is None:
            raise InvariantError("accepting on a server that was never started")
        return self.loop

    def _accept(self, listener: socket.socket) -> None:
        shared, loop = self.shared, self._loop()
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
            if shared.stopping or not shared.make_room(loop.time()):
                shared.refused += 1
                self._refuse_socket(sock, "stopping, retry on another node" if shared.stopping
                                    else "too many connections, retry later")
                continue
            shared.adopting += 1
            task = loop.create_task(self._adopt(sock))
            self.adoptions.add(task)
            task.add_done_callback(self.adoptions.discard)

    async def _adopt(self, sock: socket.socket) -> None:
        try:  # the loop makes the socket non-blocking
            await self._loop().connect_accepted_socket(lambda: Connection(self.shared), sock)
        except OSError:  # reset before it could be served
            sock.close()
        finally:
            self.shared.adopting -= 1
            self.shared.recount()

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
                _send_refusal(sock, "out of file descriptors, retry later")
                sock.close()
            self.spare = _open_spare()
            if sock is None:
                break
        log.warning("out of file descriptors while accepting (%d answered 503); pausing accepts for %.1f s",
                    answered, EMFILE_PAUSE_S)
        loop = self._loop()
        _stop_reading(loop, listener.fileno())
        loop.call_later(EMFILE_PAUSE_S, self._resume_accepting, listener)

    def _resume_accepting(self, listener: socket.socket) -> None:
        if self.shared.stopping or listener.fileno() < 0:
            return
        if self.spare is None:
            self.spare = _open_spare()
        self._loop().add_reader(listener.fileno(), self._accept, listener)

    def _refuse_socket(self, sock: socket.socket, text: str) -> None:
        """503 on a plain, just accepted socket, without a transport. Closed
        at once, a socket whose request is still unread would send a reset,
        which can destroy the 503 before the client reads it: so it is shut
        for writing and drained until the client closes, for at most
        LINGER_S (at most LINGERING_MAX such sockets; beyond, closed at
        once)."""
        _send_refusal(sock, text)
        loop = self.loop
        if loop is None or len(self.lingering) >= LINGERING_MAX:
            sock.close()
            return
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        self.lingering.add(sock)
        loop.add_reader(sock.fileno(), self._drain_lingering, sock)
        loop.call_later(LINGER_S, self._end_lingering, sock)

    def _drain_lingering(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._end_lingering(sock)

    def _end_lingering(self, sock: socket.socket) -> None:
        if sock not in self.lingering:
            return
        self.lingering.discard(sock)
        if self.loop is not None and sock.fileno() >= 0:
            _stop_reading(self.loop, sock.fileno())
        sock.close()

    # -- deadlines and stopping --------------------------------------------------------

    async def _sweep(self) -> None:
        """Once a second: close connections past their deadline, recount
        the descriptors in use."""
        loop = asyncio.get_running_loop()
        shared = self.shared
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            for conn in list(shared.connections):
                if conn.busy or conn.transport is None:
                    continue
                if conn.slow_body(now):
                    shared.slow_bodies += 1
                    conn.transport.close()
                elif conn.deadline < now:
                    conn.transport.close()
            shared.descriptors.measure(len(shared.connections) + shared.adopting + len(self.lingering))
            excess = len(shared.connections) - shared.cap()
            if excess > 0:  # storage opened files since these came: its reserve first
                shared.shed(excess, now)
            if self.spare is None:
                self.spare = _open_spare()

    async def close(self, grace_s: float) -> None:
        """Stop accepting, close idle connections, let requests in flight
        finish for up to `grace_s`, then close everything."""
        shared = self.shared
        shared.stopping = True
        for listener in self.listeners:
            if listener.fileno() >= 0:
                _stop_reading(self._loop(), listener.fileno())
                listener.close()
        if self.spare is not None:
            os.close(self.spare)
            self.spare = None
        for sock in list(self.lingering):
            self._end_lingering(sock)
        if self.sweeper is not None:
            self.sweeper.cancel()
        if self.adoptions:
            await asyncio.gather(*self.adoptions, return_exceptions=True)
        for conn in list(shared.connections):
            if not conn.busy and conn.transport is not None:
                conn.transport.close()
        if shared.running:
            shared.idle = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(shared.idle, grace_s)
            except TimeoutError:
                log.warning("%d requests still running after %.0f s; closing", shared.running, grace_s)
        for conn in list(shared.connections):
            if conn.transport is not None:
                conn.transport.close()
        if shared.node is not None:  # (the connections' ends counted no more)
            node, shared.node = shared.node, None
            node.close()


# After EMFILE at accept, how long the listening sockets rest.
EMFILE_PAUSE_S = 0.1
# A socket refused at the cap is drained (so its 503 is read, not reset)
# for at most this long; at most this many at once.
LINGER_S = 1.0
LINGERING_MAX = 64


async def _listen(loop: asyncio.AbstractEventLoop, host: str, port: int, backlog: int,
                  reuse_port: bool = False) -> list[socket.socket]:
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
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                ip, ip_port = str(address[0]), str(address[1])  # (typed as maybe bytes, never for an IP family)
                raise OSError(e.errno, f"cannot listen on {ip} port {ip_port}: {e.strerror}") from None
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


def _stop_reading(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """`loop.remove_reader(fd)`, its answer not read: uvloop's answers None
    where asyncio's is typed bool, which the compiled build would check
    (TypeError)."""
    remove: Callable[[int], object] = loop.remove_reader
    remove(fd)


def _send_refusal(sock: socket.socket, text: str) -> None:
    """503 on a plain, just accepted socket."""
    try:
        sock.setblocking(False)
        sock.send(_encode(plain_answer(503, text), True))
    except OSError:
        pass
