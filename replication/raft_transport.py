"""The Raft port's transport: pysyncobj's TCP transport with connections of
our own that refuse a frame above `MAX_FRAME_BYTES` before buffering it.

A Raft frame on the wire (pysyncobj's own format, unchanged, so a node
talks to one running plain pysyncobj):

    bytes      field
    0..4       length L, i32 in native byte order (pysyncobj's `struct 'i'`)
    4..4+L     with the cluster secret: a Fernet token (AES-CBC + HMAC-SHA256,
               the key derived from the secret) of the body; without one
               (--insecure-cluster): the body itself
    body       zlib(pickle((connection key, message))): the key is the
               32 random bytes the receiver sent when the connection opened
               (the first frame each way carries the bare key)

pysyncobj's own connection appends what arrives to a `bytes` buffer (each
append a copy: quadratic) until the length announced has arrived, and
checks the Fernet token only then: 4 bytes saying 2 GiB followed by 32 MiB
kept its thread at 100% CPU for seconds, so the leader missed its
heartbeats and another was elected; an HTTP request ("GET " is 542 MB as
a length) held a connection waiting for ever. `FramedConnection` reads the
length first and closes the connection on one outside 0..MAX_FRAME_BYTES,
having buffered at most one read (`recvBufferSize`, 64 KiB) past it; checks
each frame's token before it decompresses or unpickles anything; and
`RaftTransport` closes a connection that has sent no whole frame within
pysyncobj's `connectionTimeout` of opening. Each refusal is logged, at most
once a minute for each address (`RefusalLog`).

The bound. hourglass's Raft group replicates small facts (a claim: a
term and a node id, one per election; push subscriptions; the recurring
schedules' entries, in commands of at most 3 KiB each,
broker.cluster.schedules), so its frames are small. Measured
with the cluster secret: a heartbeat or vote is about 300 bytes; the
largest frame seen, a node catching up on 1,000 claims made while it was
down, 7.1 KiB. pysyncobj sends a lagging peer its log in batches of
`BATCH_BYTES` of commands (set here; its default is 64 KiB) plus the
entry that crosses it, and a longer entry or a log compaction's dump in
chunks of BATCH_BYTES; pickled (protocol 2 doubles non-ASCII bytes),
compressed, encrypted and base64'ed, a batch of random commands makes a
frame of at most 3.3 times BATCH_BYTES (27 KiB), under half of
MAX_FRAME_BYTES (64 KiB). tests/unit/test_raft_transport.py checks both:
the live catch-up and the random batches.

How it hooks into pysyncobj: `SyncObj` takes a `transportClass` (its
documented extension point), and `RaftTransport` is pysyncobj's own
`TCPTransport` (handshake, node ids, reconnects) with two of its
construction steps replaced, `_createServer` (the listening socket) and
`addNode` (the outgoing connections), so every connection is a
`FramedConnection`. Those steps, the connection interface `TCPTransport`
uses and the SyncObj attributes read here are listed in PYSYNCOBJ_HOOKS;
tests/unit/test_election.py checks this module uses no other private
pysyncobj name and that each still exists in the installed pysyncobj.

Threads: everything here runs in pysyncobj's thread (its poller calls the
connections, its tick calls `RaftTransport._close_silent`), as its own
transport does.
"""

from __future__ import annotations

import errno
import functools
import logging
import pickle
import socket
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from storage.errors import InvalidRequest

log = logging.getLogger("hourglass.raft")

# The largest Raft frame a node reads (the length field's value, in bytes);
# a larger one closes the connection. Legitimate frames stay under half of
# it (see the module docstring).
MAX_FRAME_BYTES = 64 * 1024
# pysyncobj's appendEntriesBatchSizeBytes and logCompactionBatchSize (its
# default for both is 64 KiB): what one append-entries frame carries.
BATCH_BYTES = 8 * 1024
# A refused address is logged again after this long at the earliest.
REFUSAL_LOG_INTERVAL_S = 60.0
# Addresses `RefusalLog` remembers; past it those not logged within the
# interval are forgotten.
REFUSAL_LOG_ADDRESSES = 1024

HEADER = struct.Struct("=i")
# Pickle protocol of what we send, as pysyncobj's own connection.
PICKLE_PROTOCOL = 2

# The pysyncobj names this module relies on beyond its documented API (a
# test checks each exists, and that no other private one is used here).
PYSYNCOBJ_HOOKS = {
    "TCPTransport": ("_createServer", "_server", "_syncObj", "_connections", "_onNewIncomingConnection",
                     "_onOutgoingConnected", "_onMessageReceived", "_onDisconnected", "addNode"),
    "SyncObj": ("_poller", "conf", "encryptor", "addOnTickCallback"),
}


def encode_frame(message: Any, encryptor: Any, now_s: float) -> bytes:
    """A frame's bytes after its length: zlib(pickle(message)), as a Fernet
    token stamped `now_s` (whole seconds) when there is an encryptor."""
    data = zlib.compress(pickle.dumps(message, PICKLE_PROTOCOL), 3)
    if encryptor is not None:
        token: bytes = encryptor.encrypt_at_time(data, int(now_s))
        return token
    return data


class FrameReader:
    """Splits one connection's bytes into frames, refusing a length field
    outside 0..`max_frame_bytes` as soon as its 4 bytes are in.

        reader = FrameReader(65536)
        reader.feed(HEADER.pack(2) + b"hi" + HEADER.pack(5))
        reader.next_frame()   # b"hi"
        reader.next_frame()   # None: 5 bytes announced, none arrived yet

        reader = FrameReader(65536)
        reader.feed(b"GET ")  # 542,393,671 as a length
        reader.next_frame()   # InvalidRequest, before any of it is read

    A bytearray, so a read appends in place; taking a frame off its front
    moves the bytes behind it: at most one frame and one read (pysyncobj's
    `bytes` buffer copied everything it held on every read)."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_frame(self) -> bytes | None:
        """The next whole frame, or None until it has arrived; InvalidRequest
        for a length out of range (nothing more should be read)."""
        if len(self._buffer) < HEADER.size:
            return None
        length: int = HEADER.unpack_from(self._buffer)[0]
        if not 0 <= length <= self.max_frame_bytes:
            raise InvalidRequest("Raft frame length", f"a frame announced as {length} bytes, outside 0.."
                                 f"{self.max_frame_bytes} (MAX_FRAME_BYTES)")
        end = HEADER.size + length
        if len(self._buffer) < end:
            return None
        frame = bytes(self._buffer[HEADER.size:end])
        del self._buffer[:end]
        return frame

    def __repr__(self) -> str:
        return f"FrameReader(max_frame_bytes={self.max_frame_bytes}, buffered={len(self._buffer)})"


class RefusalLog:
    """Whether a refusal from an address is logged now: the first one, then
    at most one every `interval_s`; the line says how many were not logged
    since. Time is a parameter (`now_s`, monotonic seconds)."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S, max_addresses: int = REFUSAL_LOG_ADDRESSES) -> None:
        self.interval_s = interval_s
        self.max_addresses = max_addresses
        self._last: dict[str, tuple[float, int]] = {}  # address -> (logged at, refusals not logged since)

    def refused(self, address: str, now_s: float) -> int | None:
        """Record a refusal: the number of earlier ones not logged if this
        one is to be logged, else None."""
        last = self._last.get(address)
        if last is not None and now_s - last[0] < self.interval_s:
            self._last[address] = (last[0], last[1] + 1)
            return None
        if last is None and len(self._last) >= self.max_addresses:
            self._last = {a: v for a, v in self._last.items() if now_s - v[0] < self.interval_s}
        self._last[address] = (now_s, 0)
        return 0 if last is None else last[1]

    def __repr__(self) -> str:
        return f"RefusalLog(interval_s={self.interval_s}, addresses={len(self._last)})"


@dataclass
class FrameStats:
    """What a node's Raft connections saw, all of them together."""

    largest_received_bytes: int = 0  # the largest frame received (and taken)
    largest_sent_bytes: int = 0
    refused: int = 0  # connections closed for a frame refused, or for silence


class FramedConnection:
    """One TCP connection of the Raft port, with the interface pysyncobj's
    `TCPTransport` uses of its own `TcpConnection` (connect, send,
    disconnect, state, the three callbacks, the Fernet `encryptor` and the
    connection keys `sendRandKey`/`recvRandKey`), reading through a
    `FrameReader`. Called by pysyncobj's poller in its thread.

    A frame refused (a length out of range, a token that does not
    authenticate, a replayed or undecodable body) closes the connection
    and is logged through `refusals`."""

    def __init__(self, poller: Any, refusals: RefusalLog, stats: FrameStats, monotonic_s: Callable[[], float], *,
                 sock: socket.socket | None = None, timeout_s: float = 1.0, send_buffer_bytes: int = 2**16,
                 recv_buffer_bytes: int = 2**16, keepalive: tuple[int, int, int] | None = None,
                 max_frame_bytes: int = MAX_FRAME_BYTES, dial: tuple[str, int] | None = None) -> None:
        # pysyncobj's TCPTransport sets and reads these three by name.
        self.encryptor: Any = None
        self.sendRandKey: bytes | None = None
        self.recvRandKey: bytes | None = None
        self._recv_timestamp = 0  # the newest token's timestamp: an older one is a replay
        self._poller = poller
        self._refusals = refusals
        self.stats = stats
        self._monotonic_s = monotonic_s
        self._timeout_s = timeout_s
        self._send_buffer_bytes = send_buffer_bytes
        self._recv_buffer_bytes = recv_buffer_bytes
        self._keepalive = keepalive
        self.max_frame_bytes = max_frame_bytes
        # (host, port) that connect() dials instead of the peer's own (--reach-peers)
        self.dial = dial
        self._reader = FrameReader(max_frame_bytes)
        self._write = bytearray()
        self._on_message: Callable[[Any], object] | None = None
        self._on_connected: Callable[[], object] | None = None
        self._on_disconnected: Callable[[], object] | None = None
        self.frames_received = 0
        self.opened_s = monotonic_s()
        self._last_read_s = self.opened_s
        self._sock: socket.socket | None = None
        self._fileno: int | None = None
        self._state: int = CONNECTION_STATE.DISCONNECTED
        self.peer = "?"
        if sock is not None:
            self.peer = _address(sock)
            self._sock, self._fileno = sock, sock.fileno()
            self._state = CONNECTION_STATE.CONNECTED
            self._set_options(sock)
            self._poller.subscribe(self._fileno, self._on_event,
                                   POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)

    # -- the interface pysyncobj's TCPTransport uses --------------------------------------

    @property
    def state(self) -> int:
        return self._state

    def setOnMessageReceivedCallback(self, callback: Callable[[Any], object] | None) -> None:  # pysyncobj's name
        self._on_message = callback

    def setOnConnectedCallback(self, callback: Callable[[], object] | None) -> None:  # pysyncobj's name
        self._on_connected = callback

    def setOnDisconnectedCallback(self, callback: Callable[[], object] | None) -> None:  # pysyncobj's name
        self._on_disconnected = callback

    def fileno(self) -> int | None:
        return self._fileno

    def getSendBufferSize(self) -> int:  # pysyncobj's name
        return len(self._write)

    def connect(self, host: str, port: int) -> bool:
        """Start connecting to a peer (non-blocking), at `dial` if set;
        False if that failed at once."""
        if host is None:
            return False
        if self.dial is not None:
            host, port = self.dial
        self._close_socket()  # (closed already: TCPTransport reconnects a disconnected connection only)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        self._set_options(sock)
        sock.setblocking(False)
        self._reader = FrameReader(self.max_frame_bytes)
        self._write = bytearray()
        self.frames_received = 0
        self.opened_s = self._last_read_s = self._monotonic_s()
        self.peer = host
        error = sock.connect_ex((host, port))
        if error not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            return False
        self._sock, self._fileno = sock, sock.fileno()
        self._state = CONNECTION_STATE.CONNECTING
        self._poller.subscribe(self._fileno, self._on_event,
                               POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR)
        return True

    def send(self, message: Any) -> None:
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = encode_frame(message, self.encryptor, self._monotonic_s())
        self.stats.largest_sent_bytes = max(self.stats.largest_sent_bytes, len(data))
        if len(data) > self.max_frame_bytes:  # the peer will refuse it: a bug (see BATCH_BYTES)
            log.error("a Raft frame of %d bytes to %s is above MAX_FRAME_BYTES (%d): the peer will refuse it",
                      len(data), self.peer, self.max_frame_bytes)
        self._write += HEADER.pack(len(data)) + data
        if self._timed_out():
            self.disconnect()
            return
        self._flush()

    def disconnect(self) -> None:
        was_open = self._state != CONNECTION_STATE.DISCONNECTED
        self.sendRandKey = self.recvRandKey = None
        self._recv_timestamp = 0
        self._close_socket()
        self._write = bytearray()
        self._state = CONNECTION_STATE.DISCONNECTED
        if was_open and self._on_disconnected is not None:
            self._on_disconnected()

    def _close_socket(self) -> None:
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    # -- hourglass's own ------------------------------------------------------------------

    def silent_since(self, now_s: float) -> float | None:
        """Seconds since this connection opened if it has delivered no
        frame yet (None once it has, or once closed)."""
        if self._state == CONNECTION_STATE.DISCONNECTED or self.frames_received:
            return None
        return now_s - self.opened_s

    def refuse(self, reason: str) -> None:
        """Close the connection for `reason`, logged once a minute per address."""
        self.stats.refused += 1
        not_logged = self._refusals.refused(self.peer, self._monotonic_s())
        if not_logged is not None:
            more = f"; {not_logged} more refused since the last line" if not_logged else ""
            log.warning("refused a connection to the Raft port from %s: %s; closed (each address is logged at most "
                        "once a minute%s)", self.peer, reason, more)
        self.disconnect()

    # -- the poller's calls ------------------------------------------------------------------

    def _on_event(self, descr: int, event: int) -> None:
        if descr != self._fileno:
            self._poller.unsubscribe(descr)
            return
        if event & POLL_EVENT_TYPE.ERROR or self._sock is None or self._timed_out():
            self.disconnect()
            return
        if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.disconnect()
            return
        if self._state == CONNECTION_STATE.CONNECTING:
            if self._on_connected is not None:
                self._on_connected()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
            self._state = CONNECTION_STATE.CONNECTED
            self._last_read_s = self._monotonic_s()
            return
        if event & POLL_EVENT_TYPE.WRITE:
            if self._timed_out():
                self.disconnect()
                return
            self._flush()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
            mask = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
            if self._write:
                mask |= POLL_EVENT_TYPE.WRITE
            self._poller.subscribe(descr, self._on_event, mask)
        if event & POLL_EVENT_TYPE.READ:
            self._read()

    def _timed_out(self) -> bool:
        """pysyncobj's connectionTimeout, checked as its own connection
        does (at each event and each send): nothing read for that long."""
        return self._monotonic_s() - self._last_read_s > self._timeout_s

    def _read(self) -> None:
        """Read what has arrived, handing each whole frame on as it completes."""
        while self._sock is not None:
            try:
                chunk = self._sock.recv(self._recv_buffer_bytes)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.disconnect()
                return
            if not chunk:
                self.disconnect()
                return
            self._last_read_s = self._monotonic_s()
            self._reader.feed(chunk)
            if not self._deliver():
                return

    def _deliver(self) -> bool:
        """Hand on every whole frame buffered; False once the connection is closed."""
        while True:
            try:
                frame = self._reader.next_frame()
            except InvalidRequest as e:
                self.refuse(e.reason)
                return False
            if frame is None:
                return True
            message, refused = self._decode(frame)
            if refused is not None:
                self.refuse(refused)
                return False
            self.frames_received += 1
            self.stats.largest_received_bytes = max(self.stats.largest_received_bytes, len(frame))
            if self._on_message is not None:
                self._on_message(message)
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return False

    def _decode(self, frame: bytes) -> tuple[Any, str | None]:
        """(message, None), or (None, why it is refused). Nothing is
        decompressed or unpickled before the token authenticates."""
        data = frame
        if self.encryptor is not None:
            try:
                timestamp = self.encryptor.extract_timestamp(data)  # checks the HMAC
                data = self.encryptor.decrypt(data)
            except Exception:  # cryptography's InvalidToken, or a token too short to parse
                return None, f"a frame of {len(frame)} bytes that does not authenticate under the cluster secret"
            if timestamp < self._recv_timestamp:
                return None, "a frame older than the one before it (a replay)"
            self._recv_timestamp = timestamp
        try:
            message = pickle.loads(zlib.decompress(data))
        except Exception:  # whatever a malformed pickle raises
            return None, f"a frame of {len(frame)} bytes that is not a Raft message"
        if self.recvRandKey:
            if not (isinstance(message, tuple) and len(message) == 2 and message[0] == self.recvRandKey):
                return None, "a frame without this connection's key (a replay)"
            message = message[1]
        return message, None

    def _flush(self) -> None:
        while self._write and self._sock is not None:
            try:
                sent = self._sock.send(self._write)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.disconnect()
                return
            if sent <= 0:
                return
            del self._write[:sent]

    def _set_options(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer_bytes)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._keepalive is not None and hasattr(socket, "TCP_KEEPIDLE"):
            idle_s, interval_s, probes = self._keepalive
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, probes)

    def __repr__(self) -> str:
        return f"FramedConnection(peer={self.peer}, state={self._state}, frames={self.frames_received})"


def _address(sock: socket.socket) -> str:
    """The peer's IP address (the key refusals are logged by)."""
    try:
        name = sock.getpeername()
    except OSError:
        return "?"
    return str(name[0]) if isinstance(name, tuple) else str(name) or "?"


class _Listener:
    """The Raft port's listening socket: what `TCPTransport` expects of its
    server (bind, unbind), handing each accepted socket on as a
    `FramedConnection`."""

    def __init__(self, poller: Any, host: str, port: int, accepted: Callable[[socket.socket], object]) -> None:
        self._poller = poller
        self._host, self._port = host, port
        self._accepted = accepted
        self._sock: socket.socket | None = None

    def bind(self) -> None:
        family, _, _, _, address = socket.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind(address)
            sock.listen(16)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._poller.subscribe(sock.fileno(), self._on_event, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)

    def unbind(self) -> None:
        if self._sock is not None:
            self._poller.unsubscribe(self._sock.fileno())
            self._sock.close()
            self._sock = None

    def _on_event(self, descr: int, event: int) -> None:
        if self._sock is None or not event & POLL_EVENT_TYPE.READ:
            return
        try:
            sock, _ = self._sock.accept()
        except OSError:  # nothing to accept after all, or no descriptor left: the next event retries
            return
        sock.setblocking(False)
        self._accepted(sock)

    def __repr__(self) -> str:
        return f"_Listener({self._host}:{self._port}, bound={self._sock is not None})"


# pysyncobj has no type hints: TCPTransport is Any to mypy.
class RaftTransport(TCPTransport):  # type: ignore[misc]  # pysyncobj is untyped: its base is Any
    """pysyncobj's TCP transport whose connections are `FramedConnection`s
    (see the module docstring), built by SyncObj (its `transportClass`;
    `conf.bindAddress` must be set: the port listens there only)."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any,  # pysyncobj's names
                 monotonic_s: Callable[[], float], max_frame_bytes: int = MAX_FRAME_BYTES,
                 dial: dict[str, tuple[str, int]] | None = None) -> None:
        # Read by _createServer and addNode, which TCPTransport.__init__ calls.
        self.monotonic_s = monotonic_s
        # a peer's Raft address -> where to connect to it instead (--reach-peers)
        self.dial = dict(dial or {})
        self.max_frame_bytes = max_frame_bytes
        self.refusals = RefusalLog()
        self.stats = FrameStats()
        self._incoming: set[FramedConnection] = set()  # accepted, no frame delivered yet
        super().__init__(syncObj, selfNode, otherNodes)
        syncObj.addOnTickCallback(self._close_silent)

    def _connection(self, sock: socket.socket | None = None, dial: tuple[str, int] | None = None) -> FramedConnection:
        conf = self._syncObj.conf
        conn = FramedConnection(self._syncObj._poller, self.refusals, self.stats, self.monotonic_s, sock=sock,
                                timeout_s=conf.connectionTimeout, send_buffer_bytes=conf.sendBufferSize,
                                recv_buffer_bytes=conf.recvBufferSize, keepalive=conf.tcp_keepalive,
                                max_frame_bytes=self.max_frame_bytes, dial=dial)
        conn.encryptor = self._syncObj.encryptor
        return conn

    def _createServer(self) -> None:  # pysyncobj's name
        host, port = self._syncObj.conf.bindAddress.rsplit(":", 1)
        self._server = _Listener(self._syncObj._poller, host, int(port), self._accept)

    def _accept(self, sock: socket.socket) -> None:
        try:
            conn = self._connection(sock)
        except OSError:  # reset before it could be set up
            sock.close()
            return
        self._incoming.add(conn)
        self._onNewIncomingConnection(conn)  # pysyncobj's handshake takes it from here

    def addNode(self, node: Any) -> None:  # pysyncobj's name
        super().addNode(node)
        # TCPTransport has just built a connection (not connected yet) if
        # this node is the one that dials `node`: a FramedConnection with
        # the same callbacks replaces it.
        if node in self._connections:
            conn = self._connection(dial=self.dial.get(node.address))
            conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
            self._connections[node] = conn

    def _close_silent(self) -> None:
        """Close each accepted connection that has delivered no frame within
        connectionTimeout of opening (a peer sends its first at once)."""
        now_s = self.monotonic_s()
        timeout_s = self._syncObj.conf.connectionTimeout
        for conn in list(self._incoming):
            silent_s = conn.silent_since(now_s)
            if silent_s is None:
                self._incoming.discard(conn)
            elif silent_s > timeout_s:
                self._incoming.discard(conn)
                conn.refuse(f"no whole frame within {timeout_s:g} s of connecting")

    def __repr__(self) -> str:
        return f"RaftTransport(max_frame_bytes={self.max_frame_bytes}, {self.stats})"
