"""What a stranger who reaches a cluster node's ports cannot do (SPEC 1, 3:
only a holder of the cluster secret is a peer). Real 3-node clusters on
127.0.0.1, stopped by PID."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import subprocess
import sys
import time
import zlib

import pytest
from cluster import NODE_IDS, SECRET, Cluster
from serving import ROOT, free_port, request

from replication import peer_auth, protocol
from replication.config import parse_cluster

pytestmark = pytest.mark.slow


class _Plant:
    """Unpickling this creates a file (the code-execution probe)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text("client-token")
    os.chmod(token_file, 0o600)
    c = Cluster.start(tmp_path_factory.mktemp("auth") / "cluster", "--auth-token-file", str(token_file))
    yield c
    c.stop()


def _post(cluster: Cluster, node: str, path: str, message: dict, headers: dict) -> tuple[int, bytes]:
    return request(cluster.url(node) + path, data=protocol.pack(message),
                   headers={"Content-Type": protocol.CONTENT_TYPE, **headers})


def test_a_crafted_pickle_on_the_raft_port_runs_nothing(cluster, tmp_path):
    planted = tmp_path / "planted"
    payload = zlib.compress(pickle.dumps(_Plant(str(planted))))
    peers = parse_cluster(cluster.spec)
    for node in NODE_IDS:
        with socket.create_connection((peers[node].host, peers[node].raft_port), timeout=2) as s:
            s.sendall(struct.pack("i", len(payload)) + payload)  # pysyncobj's framing, unencrypted
            s.settimeout(2)
            try:
                s.recv(1024)
            except (TimeoutError, ConnectionError):
                pass
    time.sleep(0.5)
    assert not planted.exists()
    assert all(cluster.health(n) for n in NODE_IDS)  # nobody died of it


def test_the_raft_port_binds_the_nodes_own_host_only(cluster):
    peers = parse_cluster(cluster.spec)
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout if os.path.exists("/usr/bin/ss") \
        or os.path.exists("/bin/ss") else ""
    if not out:
        pytest.skip("no `ss` to list listening sockets")
    for p in peers.values():
        listening = [line for line in out.splitlines() if line.split()[3].endswith(f":{p.raft_port}")]
        assert listening and all(line.split()[3] == f"127.0.0.1:{p.raft_port}" for line in listening), listening


def test_cluster_calls_without_the_secret_are_refused_even_with_the_client_token(cluster):
    leader = cluster.wait_leader()
    token = {"Authorization": "Bearer client-token"}
    for headers in ({}, token):
        status, _ = request(cluster.url(leader) + protocol.SNAPSHOT_PATH, headers=headers)
        assert status == 403
        status, _ = _post(cluster, leader, protocol.FETCH_PATH, {"node": "n2", "epoch": 0, "offset": 0}, headers)
        assert status == 403
        status, _ = _post(cluster, leader, protocol.POSITION_PATH, {"node": "n2", "epoch": 2**63}, headers)
        assert status == 403


def test_a_non_members_fetch_and_a_poisoned_promise_are_refused_and_elections_go_on(cluster):
    peer = peer_auth.headers(SECRET)
    leader = cluster.wait_leader()
    follower = next(n for n in NODE_IDS if n != leader)
    status, _ = _post(cluster, leader, protocol.FETCH_PATH, {"node": "x", "epoch": 0, "offset": 0}, peer)
    assert status == 403  # not in --cluster: its acknowledgement would count towards a quorum
    status, _ = _post(cluster, follower, protocol.POSITION_PATH, {"node": "x", "epoch": 2**63}, peer)
    assert status == 403
    status, body = _post(cluster, follower, protocol.POSITION_PATH, {"node": leader, "epoch": 2**63}, peer)
    assert status == 200 and protocol.unpack(body)["status"] == "refused"  # far beyond the Raft term
    # The promise was not persisted: a new leader is still elected after the leader dies.
    term = cluster.health(leader)["term"]
    cluster.kill(leader)
    started = time.monotonic()
    new = cluster.wait_leader(leader, term)
    assert new != leader and time.monotonic() - started < 10
    cluster.restart(leader)


def test_a_cluster_without_a_secret_refuses_to_start_unless_insecure(tmp_path):
    spec = f"n1=127.0.0.1:{free_port()}:{free_port()}"

    def serve(*flags: str, wait: bool = False):
        args = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d"), "--node-id", "n1",
                "--cluster", spec, *flags]
        return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)

    r = serve()
    assert r.returncode == 2 and "--cluster-secret-file" in r.stderr and "--insecure-cluster" in r.stderr
    short = tmp_path / "short"
    short.write_text("tiny")
    os.chmod(short, 0o600)
    r = serve("--cluster-secret-file", str(short))
    assert r.returncode == 2 and "16 characters" in r.stderr
    readable = tmp_path / "readable"
    readable.write_text("x" * 32)
    os.chmod(readable, 0o644)
    r = serve("--cluster-secret-file", str(readable))
    assert r.returncode == 2 and "chmod 600" in r.stderr
    c = Cluster.start(tmp_path / "insecure", "--insecure-cluster")  # it starts, with a warning in the README
    try:
        assert c.wait_leader() in NODE_IDS
    finally:
        c.stop()
