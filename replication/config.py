"""Cluster settings: who the nodes are, how writes are acknowledged, and
the timings of election, lease and tick-state sync."""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
from dataclasses import dataclass, field

from storage.errors import ConfigError


class Acks(enum.Enum):
    """When a write is answered 200.

    QUORUM (default): once a majority of the nodes (the leader counted) has
    its commit-log record on disk. A leader that has lost its majority can
    answer no write, and no pull, so two nodes never hand out the same
    message in one term.
    LEADER: once the leader alone has it on disk. Faster, weaker: a leader
    crash loses what no follower fetched yet, and a deposed leader may go on
    answering until it notices (at most `lease_ms`)."""

    QUORUM = "quorum"
    LEADER = "leader"


@dataclass(frozen=True)
class Peer:
    node_id: str
    host: str
    http_port: int  # the API, and the log stream at /_cluster/ (see replication.protocol)
    raft_port: int  # the election (pysyncobj's Raft): the replication port of docs/cluster.md
    # --reach-peers: (host, http_port, raft_port) where this node dials the
    # peer when that is not its own address (a proxy or tunnel in between);
    # None: at host, http_port and raft_port. The peer is still known by
    # its own address (Raft names nodes by it), only the dialling changes.
    via: tuple[str, int, int] | None = None

    @property
    def http_url(self) -> str:
        """Where this node calls the peer's HTTP port (via it if set)."""
        host, port = (self.via[0], self.via[1]) if self.via else (self.host, self.http_port)
        return f"http://{host}:{port}"

    @property
    def raft_address(self) -> str:
        """The peer's name in the Raft group: its own host and Raft port."""
        return f"{self.host}:{self.raft_port}"

    @property
    def raft_dial(self) -> tuple[str, int]:
        """Where this node connects to the peer's Raft port (via it if set)."""
        return (self.via[0], self.via[2]) if self.via else (self.host, self.raft_port)


@dataclass(frozen=True)
class ClusterConfig:
    # This node's id; must be one of `peers`.
    node_id: str
    # Every node of the cluster, this one included, by id.
    peers: dict[str, Peer] = field(default_factory=dict)
    # When a write is answered (see Acks).
    acks: Acks = Acks.QUORUM
    # The leader sends its tick state (and any new records) to followers at
    # least this often; a crash re-delivers at most what it released since.
    tick_sync_ms: int = 50
    # Raft election timeout range (pysyncobj raftMinTimeout/raftMaxTimeout):
    # a follower that hears nothing from the leader for a random time in
    # this range stands for election.
    election_min_ms: int = 400
    election_max_ms: int = 1000
    # A leader that has not heard from a majority for this long stops
    # answering writes and stands down; below election_min_ms, so it has
    # stopped before anyone else can be elected.
    lease_ms: int = 300
    # A write waiting for its quorum longer than this is answered 503 (the
    # client retries it with the same msgId, on whichever node leads then).
    write_timeout_ms: int = 3000
    # The leader keeps commit-log segments back to the slowest follower's
    # offset, but never more than this many bytes behind its end; a follower
    # further behind gets a snapshot.
    retain_log_bytes: int = 256 * 1024 * 1024
    # The cluster secret (--cluster-secret-file): peers prove it to each
    # other on the Raft port (pysyncobj's authenticated encryption) and on
    # /_cluster/* (see replication.peer_auth). None only with --insecure-cluster.
    secret: str | None = None
    # --insecure-cluster: run without a secret (anyone who reaches the Raft
    # port or /_cluster/* is then a peer).
    insecure: bool = False
    # --insecure-cluster-on-network: let --insecure-cluster list a host that
    # is not loopback (refused without it: whoever reaches that host's Raft
    # port could run code on the node).
    insecure_on_network: bool = False

    def __post_init__(self) -> None:
        if self.node_id not in self.peers:
            raise ConfigError(f"--node-id {self.node_id!r} is not in --cluster ({', '.join(self.peers)})")
        if len(self.peers) < 1:
            raise ConfigError("--cluster names no node")
        if not 0 < self.tick_sync_ms <= 1000:
            raise ConfigError(f"tick_sync_ms must be in 1..1000, got {self.tick_sync_ms}")
        if not 0 < self.election_min_ms < self.election_max_ms:
            raise ConfigError("election_min_ms must be positive and below election_max_ms")
        if not self.tick_sync_ms < self.lease_ms < self.election_min_ms:
            raise ConfigError("lease_ms must lie between tick_sync_ms and election_min_ms: a deposed leader "
                             "must have stopped before another can be elected")
        if self.retain_log_bytes < 0:
            raise ConfigError(f"--retain-log-bytes must be >= 0, got {self.retain_log_bytes}")
        addresses = [(p.host, p.http_port) for p in self.peers.values()] + \
                    [(p.host, p.raft_port) for p in self.peers.values()]
        if len(set(addresses)) != len(addresses):
            raise ConfigError("--cluster: two entries share an address (each node needs its own two ports)")
        if self.secret is None and not self.insecure:
            raise ConfigError("a cluster needs --cluster-secret-file: without a secret, anyone who reaches a node's "
                             "Raft port can run code on it (pysyncobj unpickles what it receives) and anyone who "
                             "reaches /_cluster/* can read every message or stop elections for good; "
                             "--insecure-cluster runs without one anyway")
        if self.secret is not None and self.insecure:
            raise ConfigError("--insecure-cluster and --cluster-secret-file exclude each other")
        if self.insecure_on_network and not self.insecure:
            raise ConfigError("--insecure-cluster-on-network goes with --insecure-cluster")
        if self.me.via is not None:
            raise ConfigError(f"--reach-peers names this node ({self.node_id}): a node does not dial itself")
        exposed = [f"{p.node_id}={host}" for p in self.peers.values()
                   for host in [p.host] + ([p.via[0]] if p.via else []) if not is_loopback(host)]
        if self.insecure and exposed and not self.insecure_on_network:
            raise ConfigError(f"--insecure-cluster on a host that is not loopback ({', '.join(exposed)}): anyone who "
                              f"reaches its Raft port could run code on the node; pass --insecure-cluster-on-network "
                              f"to run it anyway")
        if self.secret is not None and len(self.secret) < 16:
            raise ConfigError("the cluster secret must be at least 16 characters")

    @property
    def me(self) -> Peer:
        return self.peers[self.node_id]

    @property
    def others(self) -> list[Peer]:
        return [p for p in self.peers.values() if p.node_id != self.node_id]

    @property
    def quorum(self) -> int:
        """Nodes that must hold a record (the leader counted) for acks=quorum."""
        return len(self.peers) // 2 + 1


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (127.0.0.0/8, ::1) or
    "localhost"; any other name counts as on a network (it is not resolved
    here)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_cluster(text: str) -> dict[str, Peer]:
    """`n1=127.0.0.1:8001:9001,n2=...` -> peers by id; ValueError with a
    sentence naming the bad entry."""
    peers: dict[str, Peer] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        node_id, eq, address = entry.partition("=")
        parts = address.rsplit(":", 2)
        if not eq or not node_id or len(parts) != 3:
            raise ConfigError(f"--cluster entry {entry!r} is not id=host:http_port:replication_port")
        host, http_port, raft_port = parts
        try:
            ports = int(http_port), int(raft_port)
        except ValueError:
            raise ConfigError(f"--cluster entry {entry!r}: ports must be integers") from None
        if not all(0 < p <= 65535 for p in ports):
            raise ConfigError(f"--cluster entry {entry!r}: ports must be in 1..65535")
        if node_id in peers:
            raise ConfigError(f"--cluster names node {node_id!r} twice")
        peers[node_id] = Peer(node_id, host, *ports)
    if not peers:
        raise ConfigError("--cluster names no node")
    return peers


def reach_peers(peers: dict[str, Peer], text: str) -> dict[str, Peer]:
    """`peers` with the addresses of --reach-peers (`n2=127.0.0.1:18002:19002,...`,
    the format of --cluster) as where each named peer is dialled; ConfigError
    naming an entry whose id is not in --cluster."""
    if not text.strip():
        return peers
    found = dict(peers)
    for node_id, at in parse_cluster(text).items():
        if node_id not in peers:
            raise ConfigError(f"--reach-peers names {node_id!r}, which is not in --cluster ({', '.join(peers)})")
        found[node_id] = dataclasses.replace(peers[node_id], via=(at.host, at.http_port, at.raft_port))
    return found
