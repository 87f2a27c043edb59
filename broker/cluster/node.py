"""`ClusterNode`: one node of a cluster, put together from its parts (see
broker.cluster for the roles and the module of each concern).

Built once at start-up by broker.server.run_cluster: it opens (and
recovers) the data directory, its epochs and tick file, joins the Raft
group, and starts as a follower; `run` (role_loop) then moves it between
roles until `handover` and `close` (handover) stop it.
"""

from __future__ import annotations

import asyncio
import logging
import os

from broker.config import ServeConfig
from broker.console import Console
from broker.metrics import Metrics
from broker.push_rules import PushAllow
from replication import snapshot
from replication.config import ClusterConfig
from replication.election import Election
from replication.epochs import Epochs
from replication.log_stream import Follower
from replication.roles import RoleState
from storage.store import Store
from wheel.clock import Clock
from wheel.tick_state import TickStateFile

from .handover import Handover
from .peers import PeerCalls
from .role_loop import RoleLoop
from .routes import Routes
from .snapshots import Snapshots

log = logging.getLogger("hourglass.cluster")


class ClusterNode(Routes, PeerCalls, RoleLoop, Snapshots, Handover):
    """One node of a cluster: store, election, follower loop or broker."""

    def __init__(self, config: ServeConfig, cluster: ClusterConfig, clock: Clock,
                 election: Election | None = None) -> None:
        """`election` is Raft's (RaftElection, joined here) unless one is
        given: tests pass a FakeElection (tests/fakes.py)."""
        self.cluster = cluster
        self.data_dir = config.data_path
        os.makedirs(self.data_dir, exist_ok=True)
        snapshot.recover(self.data_dir)  # a snapshot install a crash cut short
        started_s = clock.monotonic_s()
        self.store = Store.open(self.data_dir, config.store, now_ms=clock.now_ms())
        self.opened_s = clock.monotonic_s() - started_s
        self.epochs = Epochs.load(Epochs.path(self.data_dir))
        self.tick_path = os.path.join(self.data_dir, "tick")
        self.tick_file = TickStateFile(self.tick_path, fsync=True)
        metrics = Metrics()
        console = Console(lambda: self.store, metrics, self._topic_list, self._console_info, clock.now_ms,
                          schedules=lambda: self.schedules)  # the leader's (broker.cluster.schedules)
        super().__init__(config, clock, metrics, None, console)  # no broker until this node leads
        self.apply_lock = asyncio.Lock()
        self.checkpoint_lock = asyncio.Lock()
        self.broker = None
        self.leader_log = None
        self.follower = Follower(self, cluster, clock)
        if election is None:
            # pysyncobj and cryptography (about 6 MB) load here, on a cluster
            # node only, not wherever broker.server is imported.
            from replication.raft import RaftElection
            election = RaftElection(cluster, self.data_dir, clock)
        self.election = election
        if config.push_allow:  # pushers load aiohttp's client: only on a node that pushes
            from broker.pusher import Pushers

            from .push import RaftSubscriptions
            self.pushers = Pushers(clock, PushAllow.parse(config.push_allow), RaftSubscriptions(election),
                                   config.max_subscriptions, limits=config.push, descriptors=self.descriptors,
                                   spans=self.spans)
        self.roles = RoleState(cluster.node_id, cluster.quorum, len(cluster.peers))
        self._session = None
        self._forward_session = None
        self._follow_task = None
        self._install_task = None
        self._elected_s = 0.0
        self.failed = None
        log.info("node %s opened %s in %.3f s: %s, %s", cluster.node_id, self.data_dir, self.opened_s,
                 self.store, self.epochs)
        if cluster.secret is None:
            log.warning("--insecure-cluster: no cluster secret, so anyone who reaches the Raft port %s can run code "
                        "on this node and anyone who reaches /_cluster/* is taken for a peer", cluster.me.raft_address)
