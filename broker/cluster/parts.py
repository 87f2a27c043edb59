"""The state every part of a cluster node reads and writes (see
broker.cluster), declared once so each module of the node can be read
alone; the calls one part makes of another, each defined in the module
named; and the small things every part calls. What every kind of node
has (clock, metrics, serving switch, Api, console, the HTTP app) is
broker.node_base's. `ClusterNode.__init__` (node.py) sets every attribute
declared here."""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from typing import Any

import aiohttp

from broker.disk_broker import Broker
from broker.node_base import NodeBase
from replication.config import ClusterConfig
from replication.election import Election
from replication.epochs import Epochs
from replication.log_stream import Follower, LeaderLog
from replication.roles import Role, RoleState
from storage.errors import InvariantError
from storage.store import Store
from wheel.tick_state import TickState, TickStateFile

log = logging.getLogger("hourglass.cluster")


class NodeParts(NodeBase):
    cluster: ClusterConfig
    data_dir: str
    store: Store  # replaced when a snapshot is installed
    opened_s: float
    epochs: Epochs
    tick_path: str
    tick_file: TickStateFile | None  # open while following: the leader's streamed tick
    apply_lock: asyncio.Lock  # held while records are applied to the store
    checkpoint_lock: asyncio.Lock  # held while the store's files are checkpointed or copied
    broker: Broker | None  # set while this node leads, and served by the api
    leader_log: LeaderLog | None  # set while this node leads
    follower: Follower
    election: Election
    roles: RoleState  # the role, the term tried or led, stopping (replication.roles)
    _follow_task: asyncio.Task[None] | None  # the follower loop, while following
    _install_task: asyncio.Task[None] | None  # a snapshot install under way (snapshots.py)
    _session: aiohttp.ClientSession | None  # made at the first call to a peer (peer_session)
    _forward_session: aiohttp.ClientSession | None  # made at the first forwarded request (forward_session)
    failed: BaseException | None
    _deposed: asyncio.Event  # a newer candidate asked this leader for its promise
    _elected_s: float  # when Raft last made this node a candidate (monotonic), for the log

    # == what one part calls of another =========================================

    @abstractmethod
    async def post(self, node_id: str, call: str, message: dict[str, Any],
                   timeout_s: float = 5.0) -> dict[str, Any]:
        """Make a /_cluster/ call to a peer (peers.py)."""

    @abstractmethod
    async def make_snapshot(self) -> str:
        """A tar of the store's files; its path (snapshots.py)."""

    @abstractmethod
    async def take_snapshot(self, source: str) -> None:
        """Replace this node's store with `source`'s snapshot (snapshots.py)."""

    @abstractmethod
    async def finish_install(self) -> None:
        """Wait until no snapshot install runs (snapshots.py)."""

    @abstractmethod
    async def hand_over(self) -> None:
        """SIGTERM on the leader: let the followers fetch it all (handover.py)."""

    # == shared by every part ===================================================

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

    async def stop_schedules(self) -> None:
        """The leader's schedules stop making runs (standing down, handing
        over); what they leave undone the next leader does."""
        schedules, self.schedules = self.schedules, None
        if schedules is not None:
            await schedules.stop()
            schedules.close()

    def set_epochs(self, epochs: Epochs) -> None:
        if epochs != self.epochs:
            epochs.save(Epochs.path(self.data_dir))
            self.epochs = epochs

    def write_tick(self, tick: TickState) -> None:
        """Persist the leader's tick state (a follower's; a leader has no
        tick file: its wheel writes its own)."""
        if self.tick_file is None:
            raise InvariantError("a leader is sent no tick state")
        self.tick_file.write(tick)

    def peer_session(self) -> aiohttp.ClientSession:
        """The HTTP client of the calls to peers, made at the first (on the
        event loop, as aiohttp wants); `close` (handover.py) closes it."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    def forward_session(self) -> aiohttp.ClientSession:
        """The HTTP client of the API requests a follower forwards to the
        leader: a pool of its own, so requests hung on a leader cut off
        (a long poll waits minutes, and a black-holed connection for ever)
        never hold the connections the peer calls need to elect and fetch.
        No cap of its own: each forward holds one client connection, which
        --max-connections caps."""
        if self._forward_session is None:
            self._forward_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._forward_session

    def fail(self, error: BaseException, where: str) -> None:
        """A fatal error: the node stops (stop_asked), and the process exits 1."""
        if self.failed is None:
            log.critical("%s failed: %r; the node stops", where, error)
            self.failed = error
            self.stop_asked.set()
