"""The state every part of a cluster node reads and writes (see
broker.cluster), declared once so each module of the node can be read
alone, and the three small things every part calls. `ClusterNode.__init__`
(node.py) sets every attribute declared here."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from broker.api import Api
from broker.camellia_metrics import ProcessStats
from broker.config import ServeConfig
from broker.console import Console
from broker.disk_broker import Broker
from broker.health import ServingStatus
from broker.metrics import Metrics
from replication.config import ClusterConfig
from replication.election import Election
from replication.epochs import Epochs
from replication.log_stream import Follower, LeaderLog
from replication.roles import Role, RoleState
from storage.errors import InvariantError
from storage.store import Store
from wheel.clock import Clock
from wheel.tick_state import TickState, TickStateFile

log = logging.getLogger("hourglass.cluster")


class NodeParts:
    config: ServeConfig
    cluster: ClusterConfig
    clock: Clock  # the one clock, built at start-up (broker.clock.SystemClock)
    data_dir: str
    store: Store  # replaced when a snapshot is installed
    opened_s: float
    epochs: Epochs
    tick_path: str
    tick_file: TickStateFile | None  # open while following: the leader's streamed tick
    metrics: Metrics
    process: ProcessStats
    console: Console
    serving: ServingStatus
    api: Api  # its broker is set while this node leads
    apply_lock: asyncio.Lock  # held while records are applied to the store
    checkpoint_lock: asyncio.Lock  # held while the store's files are checkpointed or copied
    broker: Broker | None  # set while this node leads
    leader_log: LeaderLog | None  # set while this node leads
    follower: Follower
    election: Election
    roles: RoleState  # the role, the term tried or led, stopping (replication.roles)
    _follow_task: asyncio.Task[None] | None  # the follower loop, while following
    session: aiohttp.ClientSession | None
    on_fatal: Callable[[BaseException], object] | None
    failed: BaseException | None
    _deposed: asyncio.Event  # a newer candidate asked this leader for its promise

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
        """The role and term /health, /metrics and the console show: SPEC's
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

    def fail(self, error: BaseException, where: str) -> None:
        if self.failed is None:
            log.critical("%s failed: %r; the node stops", where, error)
            self.failed = error
            if self.on_fatal is not None:
                self.on_fatal(error)
