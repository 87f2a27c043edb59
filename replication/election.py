"""Leader election: pysyncobj's Raft, and the one fact it replicates.

pysyncobj runs Raft in a thread of its own on the node's replication port.
Raft guarantees at most one leader per term, and a term's leader has been
voted for by a majority. hourglass uses Raft only for that and for one
small replicated fact, `claimed = (term, node_id)`: "the leader of `term`
is `node_id`, and has caught up". A node that Raft makes leader in term T
  1. gets a promise and the log position of a majority (broker.cluster),
  2. catches its commit log up to the most advanced of them,
  3. replicates `claim(T, me)` through Raft: committed means a majority
     has accepted term T, so no older leader can commit anything more,
and only then answers writes and runs the wheel. The commit log itself does
not go through Raft (it streams by offset, replication.log_stream).

The term is the *epoch* of every record the leader appends (see
replication.epochs).

Threads: pysyncobj calls back in its own thread; `Election` hands results
to the event loop (call_soon_threadsafe) and otherwise only reads plain
attributes, which is safe under the GIL.
"""

from __future__ import annotations

import asyncio
import logging
import os

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from .config import ClusterConfig

log = logging.getLogger("hourglass.election")


class _RaftFacts(SyncObj):
    """The replicated state machine: who claimed the highest term."""

    def __init__(self, me: str, others: list[str], conf: SyncObjConf) -> None:
        super().__init__(me, others, conf)
        self.claimed_term = 0
        self.claimed_by: str | None = None

    @replicated
    def claim(self, term: int, node_id: str) -> bool:
        if term <= self.claimed_term:
            return False
        self.claimed_term, self.claimed_by = term, node_id
        return True


class Election:
    """This node's view of the Raft group. Read-only properties, plus
    `claim()` (a coroutine) and `close()`."""

    def __init__(self, config: ClusterConfig, data_dir: str) -> None:
        self.config = config
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
        self._raft = _RaftFacts(config.me.raft_address, [p.raft_address for p in config.others], conf)
        self._ids = {p.raft_address: p.node_id for p in config.peers.values()}

    @property
    def raft_leader(self) -> bool:
        """Raft thinks this node leads (it may not have claimed yet)."""
        return self._raft._isLeader()

    @property
    def term(self) -> int:
        return self._raft.raftCurrentTerm

    @property
    def raft_leader_id(self) -> str | None:
        leader = self._raft._getLeader()
        return None if leader is None else self._ids.get(leader.address)

    @property
    def claimed(self) -> tuple[int, str | None]:
        """(term, node) of the highest committed claim this node has applied."""
        return self._raft.claimed_term, self._raft.claimed_by

    async def claim(self, term: int) -> bool:
        """Replicate "I lead `term`"; True once a majority has committed it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def callback(result, error) -> None:
            ok = error == FAIL_REASON.SUCCESS and bool(result)
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(ok))

        self._raft.claim(term, self.config.node_id, callback=callback)
        try:
            return await asyncio.wait_for(done, self.config.write_timeout_ms / 1000)
        except TimeoutError:
            return False

    def close(self) -> None:
        self._raft.destroy()

    def __repr__(self) -> str:
        term, by = self.claimed
        return f"Election(node={self.config.node_id}, term={self.term}, raft_leader={self.raft_leader}, " \
               f"claimed=({term}, {by}))"
