"""`ClusterNode`: one node of a cluster, put together from its parts (see
broker.cluster for the roles and the module of each concern).

Built once at start-up by broker.node.server.run_cluster: it opens (and
recovers) the data directory, its epochs and tick file, joins the Raft
group, builds its state and parts, and starts as a follower; `run` (the
role loop) then moves it between roles until `handover` and `close` stop
it. `close` releases the HTTP clients, the tick file and the store, with a
last checkpoint unless the node failed (the next start replays the commit
log from the one before); a last checkpoint the disk refuses is such a
failure (exit 1, logged, no traceback).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence

from broker.cluster.lead import Lead
from broker.cluster.peer_client import PeerClient
from broker.cluster.peers import PeerCalls
from broker.cluster.records import RaftRecords
from broker.cluster.role_loop import RoleLoop
from broker.cluster.routes import Routes
from broker.cluster.snapshots import Snapshots
from broker.cluster.state import NodeState
from broker.console.api import Console
from broker.disk.backups import Backups, clear_staging
from broker.http.commands import Command, CommandTable
from broker.http.http_types import Request
from broker.node.base import NodeBase
from broker.node.config import ServeConfig
from broker.node.standalone import add_backup_routes
from broker.observe.metrics import Family, Metrics
from replication import snapshot
from replication.config import ClusterConfig
from replication.election import Election
from replication.epochs import Epochs
from storage.errors import HourglassError, Unavailable
from storage.store import Store
from wheel.clock import Clock
from wheel.tick_state import TickStateFile

log = logging.getLogger("hourglass.cluster")


class ClusterNode(NodeBase):
    """One node of a cluster: store, election, follower loop or broker.

    Its state is one `NodeState`; each concern is a part it holds, given
    the state and the parts it calls:

        part         given                             module (broker.cluster)
        routes       state                             routes.py
        snapshots    state, peers                      snapshots.py
        peer_calls   state, snapshots                  peers.py
        lead         state, api, features, metrics     lead.py
        role_loop    state, peers, snapshots, lead     role_loop.py

    (`peers` is the PeerClient, peer_client.py; the lead serves the
    broker through NodeBase's api and runs the node's features on it,
    their records in the Raft group's state: broker.cluster.records.) What
    NodeBase asks of a node, and what broker.node.server calls, the node
    hands to the part that does it."""

    def __init__(self, config: ServeConfig, cluster: ClusterConfig, clock: Clock,
                 election: Election | None = None, peers: PeerClient | None = None) -> None:
        """`election` is Raft's (RaftElection, joined here) unless one is
        given: tests pass a FakeElection (tests/fakes.py); `peers` makes
        the calls to peers over HTTP unless one is given (tests answer them
        in-process)."""
        data_dir = config.data_path
        os.makedirs(data_dir, exist_ok=True)
        Epochs.refuse_if_newer(Epochs.path(data_dir))  # a newer hourglass's: refused before anything is written
        snapshot.recover(data_dir)  # a snapshot install a crash cut short
        started_s = clock.monotonic_s()
        store = Store.open(data_dir, config.store, now_ms=clock.now_ms())
        opened_s = clock.monotonic_s() - started_s
        epochs = Epochs.load(Epochs.path(data_dir))
        tick_file = TickStateFile(os.path.join(data_dir, "tick"), fsync=True)
        metrics = Metrics()
        # (the console reads the state and the routes, built below once Raft is joined)
        console = Console(lambda: self.state.store, metrics, lambda: self.routes.topic_list(),
                          lambda: self.routes.console_info(), clock.now_ms,
                          schedules=lambda: self.features.schedules)  # the leader's (broker.cluster.lead)
        if election is None:
            # pysyncobj and cryptography (about 6 MB) load here, on a cluster
            # node only, not wherever broker.node.server is imported.
            from replication.raft import RaftElection
            election = RaftElection(cluster, data_dir, clock)
        # no broker until this node leads; the features' records are in the Raft group's state
        super().__init__(config, clock, metrics, None, console, RaftRecords(election))
        self.peers = peers if peers is not None else PeerClient(cluster, config.auth_token)
        self.state = state = NodeState(config, cluster, clock, store, epochs, tick_file, election, self.peers,
                                       self.stop_asked)
        self.routes = Routes(state)
        self.snapshots = Snapshots(state, self.peers)
        # online backups of this node's store (backupShard), without stopping the group
        clear_staging(data_dir)
        self.backups = Backups(lambda: self.state.store, data_dir, self.snapshots.quiet_point,
                               self.snapshots.checkpoint, (0, 1), lock=state.checkpoint_lock)
        self.peer_calls = PeerCalls(state, self.snapshots)
        self.lead = Lead(state, self.api, self.features, metrics)
        self.role_loop = RoleLoop(state, self.peers, self.snapshots, self.lead)
        log.info("node %s opened %s in %.3f s: %s, %s", cluster.node_id, data_dir, opened_s, store, epochs)
        if cluster.secret is None:
            log.warning("--insecure-cluster: no cluster secret, so anyone who reaches the Raft port %s can run code "
                        "on this node and anyone who reaches /_cluster/* is taken for a peer", cluster.me.raft_address)

    # == what broker.node.server calls =================================================

    async def run(self) -> None:
        """Follow, and lead whenever Raft elects this node; until stopped."""
        await self.role_loop.run()

    async def handover(self) -> None:
        """SIGTERM: if leading, hand the lead over; then leave the group, and
        answer what this node forwarded (routes.close)."""
        await self.role_loop.handover()
        await self.routes.close()

    async def checkpoint(self) -> None:
        await self.snapshots.checkpoint()

    def fail(self, error: BaseException, where: str) -> None:
        """A fatal error: the node stops (stop_asked), and the process exits 1."""
        self.state.fail(error, where)

    async def close(self) -> None:
        state = self.state
        await self.peers.close()
        await self.routes.close()
        if state.tick_file is not None:
            state.tick_file.close()
        try:
            if state.failed is None:  # as a standalone node: no last checkpoint after a failure
                state.store.checkpoint(state.clock.now_ms())
        except OSError as e:  # a full disk: the next start replays the commit log instead
            state.fail(e, "the last checkpoint")
        finally:
            state.store.close()

    # == what NodeBase asks of a node ==============================================

    def failure(self) -> BaseException | None:
        return self.state.failed

    def jobs_absent(self) -> HourglassError | None:
        return Unavailable("no broker serves on this node now (not the leader yet); retry")

    def health_fields(self) -> Mapping[str, object]:
        return self.routes.health_fields()

    def node_series(self) -> Sequence[Family]:
        return self.routes.node_series()

    def add_own_routes(self, table: CommandTable) -> None:
        self.peer_calls.add_own_routes(table)
        add_backup_routes(table, self.backups)

    def routed(self, command: Command) -> Command:
        return self.routes.routed(command)

    def peer_proof(self) -> Callable[[Request], bool] | None:
        return self.routes.peer_proof()
