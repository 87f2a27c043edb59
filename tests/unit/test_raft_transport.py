"""replication.raft_transport: the Raft port reads a frame's length before
anything else and refuses one above MAX_FRAME_BYTES, refuses a frame that
does not authenticate before unpickling it, closes a connection that sends
no frame, logs each address at most once a minute, and every frame a real
Raft group sends stays far below the bound. Real sockets on loopback and
pysyncobj's own poller; the integration test drives a real cluster
(tests/integration/test_cluster_auth.py)."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import time
import zlib

import pytest
from pysyncobj.encryptor import getEncryptor
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE
from serving import free_port

from broker.clock import SystemClock
from replication.config import ClusterConfig, Peer
from replication.raft import RaftElection
from replication.raft_transport import (
    BATCH_BYTES,
    HEADER,
    MAX_FRAME_BYTES,
    FramedConnection,
    FrameReader,
    FrameStats,
    RefusalLog,
    encode_frame,
)
from storage.errors import InvalidRequest

SECRET = "unit-cluster-secret-0123456789"


# -- FrameReader -------------------------------------------------------------------------


def test_frames_split_over_reads_or_sharing_one_are_each_taken_whole():
    reader = FrameReader(100)
    wire = HEADER.pack(3) + b"abc" + HEADER.pack(0) + HEADER.pack(5) + b"hello"
    for byte in wire[:6]:  # the first frame byte by byte
        reader.feed(bytes([byte]))
        assert reader.next_frame() is None
    reader.feed(wire[6:9])  # its last byte, and half the next length
    assert reader.next_frame() == b"abc"
    assert reader.next_frame() is None
    reader.feed(wire[9:])
    assert reader.next_frame() == b""
    assert reader.next_frame() == b"hello"
    assert reader.next_frame() is None and len(reader._buffer) == 0


def test_a_length_above_the_bound_is_refused_from_its_four_bytes_alone():
    at_bound = FrameReader(100)
    at_bound.feed(HEADER.pack(100) + bytes(100))
    assert at_bound.next_frame() == bytes(100)
    for length in (101, 0x7FFFFFFF, -1, -(2**31)):
        reader = FrameReader(100)
        reader.feed(HEADER.pack(length))  # nothing of the frame itself has arrived
        with pytest.raises(InvalidRequest, match=f"announced as {length} bytes"):
            reader.next_frame()
    http = FrameReader(MAX_FRAME_BYTES)
    http.feed(b"GET / HTTP/1.1\r\n")  # "GET " read as a length: 542 MB
    with pytest.raises(InvalidRequest, match=r"outside 0\.\.65536"):
        http.next_frame()


# -- RefusalLog ------------------------------------------------------------------------------


def test_each_address_is_logged_once_a_minute_with_the_count_left_out():
    refusals = RefusalLog(interval_s=60)
    assert refusals.refused("10.0.0.1", now_s=100.0) == 0
    assert refusals.refused("10.0.0.1", now_s=101.0) is None
    assert refusals.refused("10.0.0.2", now_s=101.0) == 0  # another address: its own line
    assert refusals.refused("10.0.0.1", now_s=159.9) is None
    assert refusals.refused("10.0.0.1", now_s=160.0) == 2  # a minute on: logged, saying 2 were not
    assert refusals.refused("10.0.0.1", now_s=161.0) is None


def test_addresses_not_logged_within_the_interval_are_forgotten_past_the_cap():
    refusals = RefusalLog(interval_s=60, max_addresses=2)
    refusals.refused("a", now_s=0.0)
    refusals.refused("b", now_s=50.0)
    assert refusals.refused("c", now_s=70.0) == 0  # at the cap: "a" (70 s ago) is forgotten
    assert "addresses=2" in repr(refusals)
    assert refusals.refused("b", now_s=71.0) is None  # "b" (21 s ago) is still remembered


# -- FramedConnection on a real socket ---------------------------------------------------------


class _Plant:
    """Unpickling this creates a file (the code-execution probe)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


class _Port:
    """A listening socket on 127.0.0.1 whose accepted connections become
    FramedConnections on a pysyncobj poller, as the Raft port's do."""

    def __init__(self, secret: str | None = SECRET) -> None:
        self.poller = createPoller("auto")
        self.refusals = RefusalLog()
        self.stats = FrameStats()
        self.encryptor = getEncryptor(secret) if secret else None
        self.received: list[object] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.connections: list[FramedConnection] = []
        self.clients: list[socket.socket] = []

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        client = socket.create_connection(self.address, timeout=5, source_address=(source, 0))
        self.clients.append(client)
        sock, _ = self.listener.accept()
        sock.setblocking(False)
        conn = FramedConnection(self.poller, self.refusals, self.stats, time.monotonic, sock=sock)
        conn.encryptor = self.encryptor
        conn.setOnMessageReceivedCallback(self.received.append)
        self.connections.append(conn)
        return client

    def poll_until(self, done, wait_s: float = 5) -> None:
        deadline = time.monotonic() + wait_s
        while not done() and time.monotonic() < deadline:
            self.poller.poll(0.01)
        assert done()

    def close(self) -> None:
        for conn in self.connections:
            conn.disconnect()
        for client in self.clients:
            client.close()
        self.listener.close()


@pytest.fixture
def port():
    p = _Port()
    yield p
    p.close()


def _frame(message, encryptor, now_s: float | None = None) -> bytes:
    data = encode_frame(message, encryptor, time.monotonic() if now_s is None else now_s)
    return HEADER.pack(len(data)) + data


def _closed_by_peer(client: socket.socket) -> bool:
    client.settimeout(0)
    try:
        return client.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def _refusal_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hourglass.raft"]


def test_a_peers_frames_are_taken_whole_whatever_the_reads(port):
    client = port.connect()
    wire = b"".join(_frame({"type": "append_entries", "n": i}, port.encryptor) for i in range(3))
    client.sendall(wire[:7])
    for _ in range(10):
        port.poller.poll(0.01)
    assert port.received == [] and port.connections[0].state == CONNECTION_STATE.CONNECTED
    client.sendall(wire[7:])
    port.poll_until(lambda: len(port.received) == 3)
    assert [m["n"] for m in port.received] == [0, 1, 2]
    assert port.connections[0].state == CONNECTION_STATE.CONNECTED and port.stats.refused == 0


def test_an_oversized_length_closes_the_connection_before_its_frame_arrives(port, caplog):
    caplog.set_level(logging.WARNING, "hourglass.raft")
    first = port.connect()
    first.sendall(HEADER.pack(0x7FFFFFFF))  # the 2 GiB frame itself is never sent
    port.poll_until(lambda: _closed_by_peer(first))
    assert port.connections[0].state == CONNECTION_STATE.DISCONNECTED and port.received == []
    second = port.connect()  # the same address again within the minute: refused, not logged
    second.sendall(b"GET / HTTP/1.1\r\nHost: raft\r\n\r\n")
    port.poll_until(lambda: _closed_by_peer(second))
    other = port.connect(source="127.0.0.5")  # another address: its own line
    other.sendall(HEADER.pack(MAX_FRAME_BYTES + 1))
    port.poll_until(lambda: _closed_by_peer(other))
    lines = _refusal_lines(caplog)
    assert len(lines) == 2 and port.stats.refused == 3, lines
    assert "from 127.0.0.1: a frame announced as 2147483647 bytes" in lines[0] and "once a minute" in lines[0]
    assert "from 127.0.0.5: a frame announced as 65537 bytes" in lines[1]


def test_a_frame_under_another_secret_is_refused_before_it_is_unpickled(port, tmp_path, caplog):
    caplog.set_level(logging.WARNING, "hourglass.raft")
    planted = tmp_path / "planted"
    client = port.connect()
    client.sendall(_frame(_Plant(str(planted)), getEncryptor("not-the-cluster-secret-0123")))
    port.poll_until(lambda: _closed_by_peer(client))
    assert not planted.exists() and port.received == []
    assert "does not authenticate under the cluster secret" in _refusal_lines(caplog)[0]


def test_an_older_frame_after_a_newer_one_is_a_replay_and_refused(port, caplog):
    caplog.set_level(logging.WARNING, "hourglass.raft")
    client = port.connect()
    client.sendall(_frame("new", port.encryptor, now_s=2000) + _frame("old", port.encryptor, now_s=1000))
    port.poll_until(lambda: _closed_by_peer(client))
    assert port.received == ["new"]
    assert "(a replay)" in _refusal_lines(caplog)[0]


def test_without_a_secret_garbage_is_refused_as_no_raft_message(caplog):
    caplog.set_level(logging.WARNING, "hourglass.raft")
    port = _Port(secret=None)
    try:
        client = port.connect()
        client.sendall(HEADER.pack(5) + b"hello" + _frame("never", None))
        port.poll_until(lambda: _closed_by_peer(client))
        assert port.received == [] and "not a Raft message" in _refusal_lines(caplog)[0]
    finally:
        port.close()


# -- the bound against what a Raft group really sends --------------------------------------


def test_a_batch_of_random_commands_makes_a_frame_under_half_the_bound():
    """pysyncobj's append-entries to a lagging peer: commands until their
    sizes reach BATCH_BYTES (the last one crossing it), each as (command,
    index, term); random bytes, the worst for compression and for pickle
    protocol 2, which writes non-ASCII bytes as two."""
    encryptor = getEncryptor(SECRET)
    largest = 0
    for size in (20, 40, 100, 1000, BATCH_BYTES - 1):
        entries, total = [], 0
        while total < BATCH_BYTES:
            entries.append((os.urandom(size), 2**62 + len(entries), 2**62))
            total += size
        message = {"type": "append_entries", "term": 2**62, "commit_index": 2**62, "entries": entries,
                   "prevLogIdx": 2**62, "prevLogTerm": 2**62}
        largest = max(largest, len(encode_frame((os.urandom(32), message), encryptor, 2**31)))
    assert BATCH_BYTES < largest < MAX_FRAME_BYTES / 2


def test_a_node_catching_up_on_a_thousand_claims_gets_frames_far_below_the_bound(tmp_path):
    """A real 3-node Raft group in this process (with the secret): one node
    is closed, the leader commits 1,000 claims, the node comes back and
    catches up through batches; no frame comes near the bound and nothing
    is refused. (Measured: 7.1 KiB at most, against 300 bytes for a
    heartbeat.)"""
    ids = ("n1", "n2", "n3")
    peers = {n: Peer(n, "127.0.0.1", free_port(), free_port()) for n in ids}

    def elect(node: str, data_dir: str) -> RaftElection:
        return RaftElection(ClusterConfig(node, peers, secret=SECRET), str(tmp_path / data_dir), SystemClock())

    async def wait(predicate, wait_s: float = 30) -> None:
        deadline = time.monotonic() + wait_s
        while not predicate() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert predicate()

    async def main():
        elections = {n: elect(n, n) for n in ids}
        try:
            await wait(lambda: any(e.is_leader for e in elections.values()))
            leader = next(n for n, e in elections.items() if e.is_leader)
            lagging = next(n for n in ids if n != leader)
            elections[lagging].close()
            term = elections[leader].term
            # (each claim answers False if not committed within the write timeout, which a busy machine may
            # pass: what counts is that the leader applies all 1,000, in order)
            await asyncio.gather(*(elections[leader].claim(term + i) for i in range(1000)))
            await wait(lambda: elections[leader].claimed[0] == term + 999)
            # (back with an empty Raft log: pysyncobj leaves a file open when it reopens its journal)
            elections[lagging] = elect(lagging, lagging + "-again")
            await wait(lambda: elections[lagging].claimed == elections[leader].claimed)
            stats = [e.transport.stats for e in elections.values()]
            largest = max(s.largest_received_bytes for s in stats)
            assert 1024 < largest < MAX_FRAME_BYTES / 4, stats  # a catch-up batch, not only heartbeats
            assert all(s.refused == 0 for s in stats), stats
        finally:
            for e in elections.values():
                e.close()

    asyncio.run(main())


def test_a_connection_that_sends_no_whole_frame_is_closed(tmp_path, caplog):
    """pysyncobj's own connection checks its timeout only when something
    arrives: one that sent 2 bytes and nothing more stayed open for ever."""
    caplog.set_level(logging.WARNING, "hourglass.raft")
    me = Peer("n1", "127.0.0.1", free_port(), free_port())
    election = RaftElection(ClusterConfig("n1", {"n1": me}, secret=SECRET), str(tmp_path), SystemClock())
    try:
        with socket.create_connection(("127.0.0.1", me.raft_port), timeout=10) as s:
            s.sendall(b"\x01\x00")
            assert s.recv(1) == b""  # closed after the connection timeout (1 s), well within 10 s
        assert any("no whole frame within 1 s" in line for line in _refusal_lines(caplog))
        assert election.transport.stats.refused == 1
    finally:
        election.close()


def test_encode_frame_is_pysyncobjs_body():
    """The wire format is pysyncobj's own: a node still talks to one that
    runs plain pysyncobj."""
    body = encode_frame({"a": 1}, None, 0)
    assert pickle.loads(zlib.decompress(body)) == {"a": 1}
    token = encode_frame({"a": 1}, getEncryptor(SECRET), 1234)
    assert getEncryptor(SECRET).extract_timestamp(token) == 1234
