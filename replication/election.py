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

`Election` is the interface the node uses; `RaftElection` implements it
with pysyncobj (public API only), `FakeElection` for tests.

Threads: pysyncobj calls back in its own thread; `RaftElection` hands results
to the event loop (call_soon_threadsafe) and otherwise only reads plain
attributes, which is safe under the GIL.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Protocol

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

from wheel.clock import Clock

from .config import ClusterConfig

# Reads of pysyncobj's status before a change its thread makes meanwhile
# is let through (a read takes microseconds; a change is a peer joining).
STATUS_READS = 5

log = logging.getLogger("hourglass.election")


# pysyncobj has no type hints: SyncObj and its decorator are Any to mypy.
class _RaftFacts(SyncObj):  # type: ignore[misc]
    """The replicated state machine: who claimed the highest term."""

    def __init__(self, me: str, others: list[str], conf: SyncObjConf) -> None:
        super().__init__(me, others, conf)
        self.claimed_term = 0
        self.claimed_by: str | None = None

    @replicated  # type: ignore[untyped-decorator]
    def claim(self, term: int, node_id: str) -> bool:
        if term <= self.claimed_term:
            return False
        self.claimed_term, self.claimed_by = term, node_id
        return True


class Election(Protocol):
    """This node's view of the election, and its one write.

    Raft may call a node leader before it has caught up; only a committed
    `claim(T)` makes it the leader of T. `RaftElection` is the real one,
    `FakeElection` a hand-set one for tests."""

    @property
    def term(self) -> int:
        """The Raft term this node is in (grows by one an election)."""
        ...

    @property
    def is_leader(self) -> bool:
        """Raft thinks this node leads (it may not have claimed yet)."""
        ...

    @property
    def leader_id(self) -> str | None:
        """The node Raft last named leader (None: none known)."""
        ...

    @property
    def claimed(self) -> tuple[int, str | None]:
        """(term, node) of the highest committed claim this node has applied."""
        ...

    async def claim(self, term: int) -> bool:
        """Replicate "I lead `term`"; True once a majority has committed it."""
        ...

    def close(self) -> None:
        """Leave the group (on stopping)."""
        ...


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
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()

        def settle(ok: bool) -> None:
            if not done.done():
                done.set_result(ok)

        def callback(result: object, error: object) -> None:  # on pysyncobj's thread
            loop.call_soon_threadsafe(settle, error == FAIL_REASON.SUCCESS and bool(result))

        self._raft.claim(term, self.config.node_id, callback=callback)
        try:
            return await self.clock.wait_for(done, self.config.write_timeout_ms / 1000)
        except TimeoutError:
            return False

    def close(self) -> None:
        self._raft.destroy()

    def __repr__(self) -> str:
        term, by = self.claimed
        return f"RaftElection(node={self.config.node_id}, term={self.term}, is_leader={self.is_leader}, " \
               f"claimed=({term}, {by}))"


class FakeElection:
    """An `Election` a test sets by hand: the term, whom Raft calls leader,
    and whether claims commit. A claim commits (when `claims_commit`) only
    above the highest claimed term, as the Raft one does.

        election = FakeElection("n1", term=3, leader_id="n1")
        await election.claim(3)       # True: claimed == (3, "n1")
        await election.claim(3)       # False: not above the claimed term
    """

    def __init__(self, node_id: str, term: int = 0, leader_id: str | None = None) -> None:
        self.node_id = node_id
        self.term = term
        self.leader_id = leader_id
        self.claimed: tuple[int, str | None] = (0, None)
        self.claims_commit = True
        self.claims: list[int] = []  # every term claimed, committed or not
        self.closed = False

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.node_id

    async def claim(self, term: int) -> bool:
        self.claims.append(term)
        if not self.claims_commit or term <= self.claimed[0]:
            return False
        self.claimed = (term, self.node_id)
        return True

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"FakeElection(node={self.node_id}, term={self.term}, leader={self.leader_id}, claimed={self.claimed})"
