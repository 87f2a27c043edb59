"""`NodeState`: what the parts of a cluster node (see broker.cluster)
share, each field written by one of them, in one object each part is
given: the store, the epochs, the tick file, the role, the broker and
LeaderLog while leading, the follower, failure. It holds no part: a part that calls another is given that part.
Beside the state, the small things every part asks of it: whether this
node leads, the known leader, persisting epochs and the leader's tick,
failing. What every kind of node has (clock, metrics, serving switch, Api,
console, the HTTP app) is broker.node.base's."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from broker.core.params import Defaults
from broker.disk.backend import Broker
from broker.disk.ready import QueueLimits
from replication.config import ClusterConfig
from replication.election import Election
from replication.epochs import Epochs
from replication.log_stream import Follower, LeaderLog
from replication.roles import Role, RoleState
from storage.config import StoreConfig
from storage.errors import InvariantError
from storage.store import Store
from wheel.clock import Clock
from wheel.tick_state import TickState, TickStateFile

from .peer_client import PeerClient

log = logging.getLogger("hourglass.cluster")


class NodeSettings(Protocol):
    """What the parts read of the node's settings (its `ServeConfig`,
    broker.node.config): where its store is, how it is opened, and what the
    leader's broker is built with."""

    @property
    def data_path(self) -> str: ...
    @property
    def store(self) -> StoreConfig: ...
    @property
    def defaults(self) -> Defaults: ...
    @property
    def queues(self) -> QueueLimits: ...


class NodeState:
    """A cluster node's state (see the module docstring). `ClusterNode`
    (node.py) opens the store, the epochs and the tick file and builds it.
    It is also the node the `Follower` keeps in step
    (replication.log_stream.Replica), whose fetches it makes through
    `peers`.

    Each field that changes has one writer; the other parts read it, or
    ask its writer to change it:

        field                what it is                 written by
        store                the store                  Snapshots (a snapshot
                                                        installed replaces it)
        epochs               promises, epoch history    `set_epochs` (saved
                                                        first), asked by the
                                                        role loop, the lead,
                                                        peers, the follower,
                                                        snapshots
        tick_file            the leader's streamed      Lead (closed while
                             tick, while following      leading)
        broker, leader_log   while leading              Lead
        roles                replication.roles' state   RoleLoop (its `step`)
        deposed              a newer candidate asked    RoleLoop (a new one
                             this leader's promise      at its start and at
                                                        each lead's); peers
                                                        set it
        elected_s            when Raft last elected it  RoleLoop
        failed               why the node stops         `fail`, asked by any

    The rest is fixed once built; the follower's fields are its own.
    tests/unit/test_cluster_state_owners.py checks the one writer."""

    def __init__(self, config: NodeSettings, cluster: ClusterConfig, clock: Clock, store: Store, epochs: Epochs,
                 tick_file: TickStateFile, election: Election, peers: PeerClient, stop_asked: asyncio.Event) -> None:
        self.config = config
        self.cluster = cluster
        self.clock = clock
        self.data_dir = config.data_path
        self.store = store
        self.epochs = epochs
        self.tick_path = tick_file.path
        self.tick_file: TickStateFile | None = tick_file  # open while following: the leader's streamed tick
        self.apply_lock = asyncio.Lock()  # held while records are applied to the store
        self.checkpoint_lock = asyncio.Lock()  # held while the store's files are checkpointed or copied
        self.broker: Broker | None = None  # set while this node leads, and served by the api
        self.leader_log: LeaderLog | None = None  # set while this node leads
        self.election = election
        self.roles = RoleState(cluster.node_id, cluster.quorum, len(cluster.peers))  # (replication.roles)
        self._peers = peers
        self.follower = Follower(self, cluster, clock)
        self.deposed = asyncio.Event()  # a newer candidate asked this leader for its promise
        self.elected_s = 0.0  # when Raft last made this node a candidate (monotonic), for the log
        self.failed: BaseException | None = None
        self.stop_asked = stop_asked  # NodeBase's: set by SIGTERM or SIGINT, and by `fail`

    def __repr__(self) -> str:
        role, term = self.shown_role()
        return f"NodeState({self.cluster.node_id}, {role} of term {term}, {self.store}, {self.epochs})"

    @property
    def leads(self) -> bool:
        return self.roles.role is Role.LEADER

    @property
    def leading_term(self) -> int:
        """The term this node leads (while it leads)."""
        return self.roles.term

    @property
    def stopping(self) -> bool:
        return self.roles.stopping

    def shown_role(self) -> tuple[str, int]:
        """The role and term /health, /metrics and the console show: their
        roles are leader and follower, so a candidate is shown following."""
        if self.leads:
            return Role.LEADER.value, self.roles.term
        return Role.FOLLOWER.value, self.election.claimed[0]

    def known_leader(self) -> str | None:
        """The node API calls are forwarded to (None: none is known yet)."""
        if self.leads:
            return self.cluster.node_id
        term, leader = self.election.claimed
        if leader is None or leader == self.cluster.node_id or term < self.epochs.promised:
            return None
        return leader

    def set_epochs(self, epochs: Epochs, *, saved: bool = False) -> None:
        """Persist, then hold, new epochs (a promise, an epoch begun, a
        history followed). `saved`: on disk already (a snapshot's swap
        wrote them with its store files)."""
        if epochs != self.epochs:
            if not saved:
                epochs.save(Epochs.path(self.data_dir))
            self.epochs = epochs

    def write_tick(self, tick: TickState) -> None:
        """Persist the leader's tick state (a follower's; a leader has no
        tick file: its wheel writes its own)."""
        if self.tick_file is None:
            raise InvariantError("a leader is sent no tick state")
        self.tick_file.write(tick)

    async def post(self, node_id: str, call: str, message: dict[str, Any],
                   timeout_s: float = 5.0) -> dict[str, Any]:
        """The follower's /_cluster/ calls to the leader (PeerClient.post)."""
        return await self._peers.post(node_id, call, message, timeout_s)

    def fail(self, error: BaseException, where: str) -> None:
        """A fatal error: the node stops (stop_asked), and the process exits 1."""
        if self.failed is None:
            log.critical("%s failed: %r; the node stops", where, error)
            self.failed = error
            self.stop_asked.set()
