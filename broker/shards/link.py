"""The local sockets between a node's shards (docs/internals.md, "Shards").

Each shard listens on a Unix socket in the data directory's `links/`
(private: the directory is made its owner's alone at every start, and
both ends of a connection check the other's peer credentials: a
connection from, or a dial that reached, another user's process is
dropped). A shard dials each other
shard once and pipelines its calls on that connection: every frame is one
msgpack array,

    [CALL, id, op, args]        a call; answered by the one REPLY of its id
    [REPLY, id, True, result]   what the op answered
    [REPLY, id, False, error]   what it raised: [class name, text] (or an
                                InvalidRequest's [name, parameter, reason])
    [NOTICE, 0, op, args]       unasked, from the called shard back to the
                                caller on the caller's connection (so after
                                every reply it wrote before)

Ops are the router's (broker.shards.router); args and results are
msgpack's types (a NamedTuple travels as its fields). A shard that cannot
be reached answers Unavailable (503): its messages wait for it to come
back, the others are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgpack

from storage.errors import (
    BodyTooLarge,
    Conflict,
    Forbidden,
    HourglassError,
    InvalidRequest,
    LimitReached,
    NotFound,
    Unavailable,
)

log = logging.getLogger("hourglass.shards")

CALL, REPLY, NOTICE = 0, 1, 2
# The errors a call's answer carries as themselves; any other is a bug on the called shard (500 here).
ERRORS: dict[str, type[HourglassError]] = {kind.__name__: kind for kind in (
    BodyTooLarge, Conflict, Forbidden, LimitReached, NotFound, Unavailable)}
# A frame larger than this ends the connection (a forwarded batch is at most --max-batch-msgs messages
# of --max-msg-bytes each: the flag's own bound is far below).
MAX_FRAME_BYTES = 1 << 30
UNIX_PATH_MAX = 100

# What serves a call: (op, args, the connection it came on) -> the result.
Serve = Callable[[str, Sequence[Any], "Connection"], Awaitable[Any]]
# What a notice does: (op, args) -> None.
Hear = Callable[[str, Sequence[Any]], None]


def encode_error(error: BaseException) -> list[Any]:
    if isinstance(error, InvalidRequest):
        return ["InvalidRequest", error.parameter, error.reason]
    return [type(error).__name__, str(error)]


def decode_error(fields: Sequence[Any]) -> HourglassError:
    name = fields[0]
    if name == "InvalidRequest":
        return InvalidRequest(fields[1], fields[2])
    kind = ERRORS.get(name)
    return kind(fields[1]) if kind is not None else HourglassError(f"another shard failed: {name}: {fields[1]}")


def socket_path(directory: str, index: int) -> str:
    """The address shard `index` listens on; a long data directory path is
    reached through this process's descriptor of it (AF_UNIX paths are
    short), which `bind` and `connect` resolve alike."""
    path = os.path.join(directory, f"{index}.sock")
    if len(path.encode()) <= UNIX_PATH_MAX:
        return path
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)  # kept open: the path names it
    return f"/proc/self/fd/{fd}/{index}.sock"


def peer_uid(transport: asyncio.BaseTransport) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED:
    the dialler's for a listener, the listener's for a dialler); None where
    the system does not say."""
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class Connection(asyncio.Protocol):
    """One link connection, either end: it reads frames, answers calls
    with `serve`, matches replies to the calls it made, hands notices to
    `hear`."""

    def __init__(self, serve: Serve | None, hear: Hear | None, name: str) -> None:
        self._serve = serve
        self._hear = hear
        self.name = name
        self._transport: asyncio.Transport | None = None
        self._unpacker = msgpack.Unpacker(raw=False, use_list=False, strict_map_key=False,
                                         max_buffer_size=MAX_FRAME_BYTES)  # arrays as tuples: NamedTuples' fields
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 1
        self.on_lost: Callable[[Connection], None] | None = None

    def __repr__(self) -> str:
        return f"Connection({self.name}, pending={len(self._pending)})"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # (uvloop's is no asyncio.Transport subclass)
        assert self._transport is not None
        uid = peer_uid(transport)
        if uid is not None and uid != os.getuid():  # only this user's processes are shards of this node
            log.warning("a link connection %s uid %d refused", "to a process of" if self._serve is None else "from",
                        uid)
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        error = Unavailable(f"shard link {self.name} closed; retry")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        if self.on_lost is not None:
            self.on_lost(self)

    @property
    def open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        unpacker = self._unpacker
        try:
            unpacker.feed(data)
            for frame in unpacker:
                self._frame(frame)
        except Exception:  # a malformed frame: the connection cannot be trusted
            log.exception("a malformed frame on the shard link %s", self.name)
            if self._transport is not None:
                self._transport.abort()

    def _frame(self, frame: list[Any]) -> None:
        kind = frame[0]
        if kind == REPLY:
            future = self._pending.pop(frame[1], None)
            if future is not None and not future.done():
                if frame[2]:
                    future.set_result(frame[3])
                else:
                    future.set_exception(decode_error(frame[3]))
        elif kind == CALL and self._serve is not None:
            call_id = frame[1]
            try:
                waiting = self._serve(frame[2], frame[3], self)
            except Exception as e:
                self._reply_error(call_id, e)
                return
            task = asyncio.ensure_future(waiting)
            task.add_done_callback(lambda done: self._reply(call_id, done))
        elif kind == NOTICE and self._hear is not None:
            self._hear(frame[2], frame[3])

    def _reply(self, call_id: int, done: asyncio.Future[Any]) -> None:
        if done.cancelled():
            self._reply_error(call_id, Unavailable("the shard is stopping; retry"))
            return
        error = done.exception()
        if error is not None:
            self._reply_error(call_id, error)
            return
        self._write([REPLY, call_id, True, done.result()])

    def _reply_error(self, call_id: int, error: BaseException) -> None:
        if not isinstance(error, HourglassError) or isinstance(error, AssertionError):
            log.error("a forwarded call failed", exc_info=error)
        self._write([REPLY, call_id, False, encode_error(error)])

    def _write(self, frame: list[Any]) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(msgpack.packb(frame))

    def call(self, op: str, args: list[Any]) -> asyncio.Future[Any]:
        """Call `op` on the other end; the future answers its reply."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self.open:
            future.set_exception(Unavailable(f"shard link {self.name} is down; retry"))
            return future
        call_id = self._next_id
        self._next_id = call_id + 1
        self._pending[call_id] = future
        self._write([CALL, call_id, op, args])
        return future

    def notify(self, op: str, args: list[Any]) -> None:
        """Tell the other end `op` (no reply)."""
        self._write([NOTICE, 0, op, args])


class Peer:
    """This shard's connection to another shard, dialled when first needed
    and again after it is lost (no sooner than RETRY_S after a failed dial)."""

    RETRY_S = 0.2

    def __init__(self, index: int, path: str, hear: Hear, on_connect: Callable[[int], None]) -> None:
        self.index = index
        self._path = path
        self._hear = hear
        self._on_connect = on_connect
        self._connection: Connection | None = None
        self._dialling: asyncio.Future[Connection] | None = None
        self._failed_at = -1.0

    def __repr__(self) -> str:
        return f"Peer({self.index}, up={self.up})"

    @property
    def up(self) -> bool:
        return self._connection is not None and self._connection.open

    def heard_from(self) -> None:
        """The shard dialled this one (it is up): the next call dials it at
        once, not after what is left of RETRY_S."""
        self._failed_at = -1.0

    def call(self, op: str, args: list[Any]) -> Awaitable[Any]:
        connection = self._connection
        if connection is not None and connection.open:
            return connection.call(op, args)
        return self._dial_and_call(op, args)

    async def _dial_and_call(self, op: str, args: list[Any]) -> Any:
        connection = await self.connect()
        return await connection.call(op, args)

    async def connect(self) -> Connection:
        """The open connection, dialled now if need be; Unavailable if the shard does not answer."""
        if self._connection is not None and self._connection.open:
            return self._connection
        if self._dialling is None:
            self._dialling = asyncio.ensure_future(self._dial())
        dialling = self._dialling
        try:
            return await asyncio.shield(dialling)
        finally:
            if dialling.done() and self._dialling is dialling:
                self._dialling = None

    async def _dial(self) -> Connection:
        loop = asyncio.get_running_loop()
        if loop.time() - self._failed_at < self.RETRY_S:
            raise Unavailable(f"shard {self.index} is not up; retry")
        try:
            _, connection = await loop.create_unix_connection(
                lambda: Connection(None, self._hear, f"to shard {self.index}"), self._path)
        except OSError:
            self._failed_at = loop.time()
            raise Unavailable(f"shard {self.index} is not up; retry") from None
        if not connection.open:  # another user's process listens there (Connection.connection_made)
            self._failed_at = loop.time()
            raise Unavailable(f"shard {self.index}'s socket is another user's; refused")
        self._connection = connection
        self._on_connect(self.index)
        return connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()


async def listen(path: str, serve: Serve, on_lost: Callable[[Connection], None]) -> asyncio.AbstractServer:
    """Listen on `path` (a stale socket file of an earlier run replaced)
    and serve calls on each connection made to it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)

    def made() -> Connection:
        connection = Connection(serve, None, "from a shard")
        connection.on_lost = on_lost
        return connection
    return await asyncio.get_running_loop().create_unix_server(made, path)
