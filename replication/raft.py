"""`RaftElection`: the `Election` (replication.election) over pysyncobj's
Raft, through its public API only, and the one fact it replicates.

pysyncobj runs Raft in a thread of its own on the node's replication port
(every message authenticated with the cluster secret before it unpickles
it), over `replication.raft_transport.RaftTransport` (a frame above
MAX_FRAME_BYTES is refused before it is buffered). Threads: pysyncobj calls
back in its own thread; `RaftElection` hands results to the event loop
(call_soon_threadsafe) and otherwise only reads its status (`_status`: read
again when its thread changed it meanwhile).

Its own module so that pysyncobj and cryptography (about 6 MB of RSS) load
only on a cluster node, when its election is built.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from wheel.clock import Clock

from .config import ClusterConfig
from .raft_transport import BATCH_BYTES, RaftTransport

# Reads of pysyncobj's status before a change its thread makes meanwhile
# is let through (a read takes microseconds; a change is a peer joining).
STATUS_READS = 5
# How long a leader that leaves waits for a follower to take its lead
# (`transfer_lead`): a follower with all of the log elects itself in a
# round trip; without one, the others elect after their election timeout.
TRANSFER_WAIT_S = 0.5

log = logging.getLogger("hourglass.election")


# pysyncobj has no type hints: SyncObj and its decorator are Any to mypy.
class _RaftFacts(SyncObj):  # type: ignore[misc]  # pysyncobj is untyped: its base is Any
    """The replicated state machine: who claimed the highest term, the
    push subscriptions, the recurring schedules' entries and the topic
    settings' entries."""

    def __init__(self, me: str, others: list[str], conf: SyncObjConf, transport: Callable[..., RaftTransport]) -> None:
        # Set before SyncObj's constructor, so not part of the replicated
        # state it dumps: held while `schedule` changes the entries (on
        # pysyncobj's thread) and while the event loop copies them.
        self.schedules_lock = threading.Lock()
        # Set by the event loop, read on pysyncobj's thread (its tick): ask
        # Raft's transferLeadership there, where its transport runs.
        self.transfer_asked = False
        super().__init__(me, others, conf, transportClass=transport)
        self.claimed_term = 0
        self.claimed_by: str | None = None
        self.subscriptions: dict[str, bytes] = {}
        # changed in place (there may be 100,000: a copy per change would be
        # quadratic), under schedules_lock
        self.schedules: dict[str, bytes] = {}
        # the topic settings' entries (broker.flow.settings), replaced whole
        # on each change: the event loop reads it from another thread
        self.flow: dict[str, bytes] = {}

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj is untyped
    def claim(self, term: int, node_id: str) -> bool:
        if term <= self.claimed_term:
            return False
        self.claimed_term, self.claimed_by = term, node_id
        return True

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj is untyped
    def subscribe(self, topic: str, stored: bytes | None) -> bool:
        subscriptions = dict(self.subscriptions)  # replaced whole: the event loop reads it from another thread
        if stored is None:
            subscriptions.pop(topic, None)
        else:
            subscriptions[topic] = stored
        self.subscriptions = subscriptions
        return True

    @replicated  # type: ignore[untyped-decorator]  # pysyncobj is untyped
    def schedule(self, changes: list[tuple[str, bytes | None]]) -> bool:
        with self.schedules_lock:
            entries = self.schedules
            for key, value in changes:
                if value is None:
                    entries.pop(key, None)
                else:
                    entries[key] = value
        return True


    # Named so that its pysyncobj id ("topic_settings_v0", sorted after
    # "subscribe_v0") comes after the older commands': their ids, which a
    # journal written before it holds, stay what they were.
    @replicated  # type: ignore[untyped-decorator]  # pysyncobj is untyped
    def topic_settings(self, changes: list[tuple[str, bytes | None]]) -> bool:
        entries = dict(self.flow)
        for key, value in changes:
            if value is None:
                entries.pop(key, None)
            else:
                entries[key] = value
        self.flow = entries
        return True


class RaftElection:
    """`Election` over pysyncobj, through its public API only."""

    def __init__(self, config: ClusterConfig, data_dir: str, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        raft_dir = os.path.join(data_dir, "raft")
        os.makedirs(raft_dir, exist_ok=True)
        conf = SyncObjConf(
            autoTick=True,
            # Measured: batching append-entries delays elections and failover.
            appendEntriesUseBatch=False,
            appendEntriesPeriod=config.tick_sync_ms / 1000,
            raftMinTimeout=config.election_min_ms / 1000,
            raftMaxTimeout=config.election_max_ms / 1000,
            # A leader without a majority steps down before anyone else can
            # be elected (see ClusterConfig.lease_ms).
            leaderFallbackTimeout=config.lease_ms / 1000,
            connectionRetryTime=0.2,
            # What one append-entries frame carries: small, so every frame
            # stays far below the bound the transport reads (MAX_FRAME_BYTES).
            appendEntriesBatchSizeBytes=BATCH_BYTES,
            logCompactionBatchSize=BATCH_BYTES,
            connectionTimeout=1.0,
            journalFile=os.path.join(raft_dir, "journal"),
            fullDumpFile=os.path.join(raft_dir, "dump"),
            dynamicMembershipChange=False,
            commandsWaitLeader=False,
            # Only this node's own host and port (pysyncobj would bind every
            # interface), and every message authenticated with the cluster
            # secret before pysyncobj unpickles it (Fernet: AES + HMAC).
            bindAddress=config.me.raft_address,
            password=config.secret,
        )
        self.transport: RaftTransport | None = None  # built by pysyncobj, in _RaftFacts's constructor
        dial = {p.raft_address: p.raft_dial for p in config.others if p.raft_dial != (p.host, p.raft_port)}

        def transport(sync_obj: Any, self_node: Any, other_nodes: Any) -> RaftTransport:
            self.transport = RaftTransport(sync_obj, self_node, other_nodes, clock.monotonic_s, dial=dial)
            return self.transport
        self._raft = _RaftFacts(config.me.raft_address, [p.raft_address for p in config.others], conf, transport)
        self._ids = {p.raft_address: p.node_id for p in config.peers.values()}
        self._raft.addOnTickCallback(self._on_tick)

    def _on_tick(self) -> None:
        """On pysyncobj's thread, each tick: a transfer asked is made here."""
        raft = self._raft
        if raft.transfer_asked:
            raft.transfer_asked = False
            raft.transferLeadership()  # (to the most caught-up follower; refused if none has all of the log)

    def _status(self) -> dict[str, Any]:
        """pysyncobj's getStatus(), read from the event loop while its own
        thread may add or drop a peer's entry: a read that meets such a
        change ("dictionary changed size during iteration") is read again."""
        for _ in range(STATUS_READS - 1):
            try:
                status: dict[str, Any] = self._raft.getStatus()
                return status
            except RuntimeError:
                continue
        status = self._raft.getStatus()
        return status

    @property
    def is_leader(self) -> bool:
        # getStatus()'s "leader" is pysyncobj's own node from the moment it
        # becomes leader until it is follower or candidate again.
        status = self._status()
        return status["leader"] is not None and status["leader"] == status["self"]

    @property
    def term(self) -> int:
        term: int = self._raft.raftCurrentTerm
        return term

    @property
    def leader_id(self) -> str | None:
        leader = self._status()["leader"]
        return None if leader is None else self._ids.get(leader.address)

    @property
    def claimed(self) -> tuple[int, str | None]:
        return self._raft.claimed_term, self._raft.claimed_by

    async def claim(self, term: int) -> bool:
        return await self._committed(self._raft.claim, term, self.config.node_id)

    def subscriptions(self) -> dict[str, bytes]:
        subscriptions: dict[str, bytes] = self._raft.subscriptions
        return subscriptions

    async def set_subscription(self, topic: str, stored: bytes | None) -> bool:
        return await self._committed(self._raft.subscribe, topic, stored)

    def schedules(self) -> dict[str, bytes]:
        with self._raft.schedules_lock:
            return dict(self._raft.schedules)

    async def set_schedules(self, changes: Sequence[tuple[str, bytes | None]]) -> bool:
        return await self._committed(self._raft.schedule, list(changes))

    def topic_settings(self) -> dict[str, bytes]:
        entries: dict[str, bytes] = self._raft.flow
        return dict(entries)

    async def set_topic_settings(self, changes: Sequence[tuple[str, bytes | None]]) -> bool:
        return await self._committed(self._raft.topic_settings, list(changes))

    async def _committed(self, command: Callable[..., object], *args: object) -> bool:
        """Run a replicated command; True once committed (and true), False
        if refused or not committed within write_timeout_ms."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()

        def settle(ok: bool) -> None:
            if not done.done():
                done.set_result(ok)

        def callback(result: object, error: object) -> None:  # on pysyncobj's thread
            loop.call_soon_threadsafe(settle, error == FAIL_REASON.SUCCESS and bool(result))

        command(*args, callback=callback)
        try:
            return await self.clock.wait_for(done, self.config.write_timeout_ms / 1000)
        except TimeoutError:
            return False

    async def transfer_lead(self) -> bool:
        if not self.is_leader:
            return False
        self._raft.transfer_asked = True
        deadline_s = self.clock.monotonic_s() + TRANSFER_WAIT_S
        while self.is_leader and self.clock.monotonic_s() < deadline_s:
            await self.clock.sleep(0.01)
        if self.is_leader:
            return False
        while self.leader_id is None and self.clock.monotonic_s() < deadline_s:  # who took it, for the log
            await self.clock.sleep(0.01)
        return True

    def close(self) -> None:
        self._raft.destroy()

    def __repr__(self) -> str:
        term, by = self.claimed
        return f"RaftElection(node={self.config.node_id}, term={self.term}, is_leader={self.is_leader}, " \
               f"claimed=({term}, {by}))"
