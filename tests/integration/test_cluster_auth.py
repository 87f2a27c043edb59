"""What a stranger who reaches a cluster node's ports cannot do (docs/security.md,
The cluster secret: only a holder of it is a peer). Real 3-node clusters on
127.0.0.1, stopped by PID."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import pickle
import shutil
import socket
import struct
import subprocess
import sys
import time
import zlib

import msgpack
import pytest
from cluster import NODE_IDS, SECRET, Cluster
from pysyncobj.encryptor import getEncryptor
from serving import ROOT, Server, free_port, request

from replication import peer_auth, protocol
from replication.config import parse_cluster
from replication.epochs import Epochs

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # (failover deadlines, rates: not beside another worker)


class _Plant:
    """Unpickling this creates a file (the code-execution probe)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text("client-token-0123456789")
    os.chmod(token_file, 0o600)
    c = Cluster.start(tmp_path_factory.mktemp("auth") / "cluster", "--auth-token-file", str(token_file))
    yield c
    c.stop()


def _post(cluster: Cluster, node: str, path: str, message: dict, headers: dict) -> tuple[int, bytes]:
    return request(cluster.url(node) + path, data=protocol.pack(message),
                   headers={"Content-Type": protocol.CONTENT_TYPE, **headers})


def _raft_probe(cluster: Cluster, node: str, frame: bytes) -> None:
    """Send one pysyncobj frame (native-endian i32 length, then the bytes)
    as the first message of a connection to `node`'s Raft port."""
    peer = parse_cluster(cluster.spec)[node]
    with socket.create_connection((peer.host, peer.raft_port), timeout=2) as s:
        s.sendall(struct.pack("i", len(frame)) + frame)
        s.settimeout(2)
        with contextlib.suppress(TimeoutError, ConnectionError):
            s.recv(1024)  # a node that refuses the frame closes the connection


def _plant_frames(path) -> list[bytes]:
    """The code-execution probe as pysyncobj would frame it: zlib'd pickle,
    plain (as without a password) and encrypted under a wrong password."""
    payload = zlib.compress(pickle.dumps(_Plant(str(path))))
    wrong = getEncryptor("not-the-cluster-secret-0123456789")
    return [payload, wrong.encrypt_at_time(payload, int(time.monotonic()))]


def test_a_crafted_pickle_on_the_raft_port_runs_nothing(cluster, tmp_path):
    planted = tmp_path / "planted"
    for node in NODE_IDS:
        for frame in _plant_frames(planted):
            _raft_probe(cluster, node, frame)
    time.sleep(0.5)
    assert not planted.exists()
    assert all(cluster.health(n) for n in NODE_IDS)  # nobody died of it
    assert cluster.wait_leader(wait_s=10) in NODE_IDS


def _raft_refusals(cluster: Cluster, node: str, source: str) -> list[str]:
    """The lines of `node`'s log refusing something `source` sent to its Raft port."""
    with open(cluster.nodes[node].log_path, encoding="utf-8", errors="replace") as f:
        return [line for line in f if "Raft port" in line and f"from {source}" in line]


def _closed_promptly(s: socket.socket, wait_s: float = 5) -> bool:
    """Whether the node closed `s`: reading meets its end (or a reset)
    within `wait_s`, not a node still waiting for more."""
    s.settimeout(wait_s)
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def _send_oversized_frame(address: tuple[str, int], source: str) -> bool:
    """A frame whose length says 2 GiB, then 32 MiB of it; whether the node
    closed the connection (before all was sent, or after)."""
    with socket.create_connection(address, timeout=5, source_address=(source, 0)) as s:
        try:
            s.sendall(struct.pack("i", 0x7FFFFFFF))
            for _ in range(512):
                s.sendall(bytes(64 * 1024))
        except ConnectionError:
            return True
        return _closed_promptly(s)


def test_an_oversized_frame_or_an_http_request_on_the_leaders_raft_port_is_refused_and_moves_nothing(cluster):
    """pysyncobj alone buffered such a frame (quadratically, 100% CPU for
    seconds) and checked it only once whole: the leader missed its
    heartbeats and another was elected. The node refuses the length before
    it buffers anything, closes the connection and logs the address once a
    minute. Each probe comes from its own loopback address (127.0.0.x), so
    each address's log line is its own."""
    leader = cluster.wait_leader()
    cluster.wait_known(leader)
    term = cluster.health(leader)["term"]
    peer = parse_cluster(cluster.spec)[leader]
    address = (peer.host, peer.raft_port)
    assert _send_oversized_frame(address, "127.0.0.2")
    assert _send_oversized_frame(address, "127.0.0.2")  # the same address again: no second log line
    with socket.create_connection(address, timeout=5, source_address=("127.0.0.3", 0)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: raft\r\n\r\n")  # its first 4 bytes say 542 MB
        assert _closed_promptly(s)
    # Longer than the election timeout (at most 1 s): nobody stood for election.
    watch_until = time.monotonic() + 4
    while time.monotonic() < watch_until:
        for n in NODE_IDS:
            h = cluster.health(n)
            assert h is not None and (h["leader"], h["term"]) == (leader, term), (n, h)
        time.sleep(0.1)
    assert len(_raft_refusals(cluster, leader, "127.0.0.2")) == 1
    assert len(_raft_refusals(cluster, leader, "127.0.0.3")) == 1


def test_the_raft_port_binds_the_nodes_own_host_only(cluster):
    peers = parse_cluster(cluster.spec)
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True).stdout if os.path.exists("/usr/bin/ss") \
        or os.path.exists("/bin/ss") else ""
    if not out:
        pytest.skip("no `ss` to list listening sockets")
    for p in peers.values():
        listening = [line for line in out.splitlines() if line.split()[3].endswith(f":{p.raft_port}")]
        assert listening and all(line.split()[3] == f"127.0.0.1:{p.raft_port}" for line in listening), listening


def _console_header(base: str, token: str) -> str:
    """The text of the console page's header as a headless Chromium shows it."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium)")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom"]
    dom = subprocess.run([browser, *flags, f"{base}/console?token={token}"], capture_output=True, text=True,
                         timeout=120).stdout
    return dom[dom.index('<span id="node">'):dom.index("</header>")]


def test_a_cluster_with_its_secret_says_it_is_not_insecure(cluster):
    token = {"Authorization": "Bearer client-token-0123456789"}
    for node in NODE_IDS:
        assert cluster.health(node)["insecure"] is False
        assert "hourglass_cluster_insecure 0\n" in request(cluster.url(node) + "/metrics", headers=token)[1].decode()
        assert json.loads(request(cluster.url(node) + "/console/api/node", headers=token)[1])["insecure"] is False
    header = _console_header(cluster.url(cluster.wait_leader()), "client-token-0123456789")
    assert "term" in header and "insecure" not in header


def test_cluster_calls_without_the_secret_are_refused_even_with_the_client_token(cluster):
    leader = cluster.wait_leader()
    token = {"Authorization": "Bearer client-token-0123456789"}
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
    status, _ = _post(cluster, leader, protocol.FETCH_PATH,
                      {"node": "x", "epoch": 0, "offset": 0, "last_epoch": 0, "wait_ms": 0}, peer)
    assert status == 403  # not in --cluster: its acknowledgement would count towards a quorum
    status, _ = _post(cluster, leader, protocol.FETCH_PATH,
                      {"node": leader, "epoch": 0, "offset": 0, "last_epoch": 0, "wait_ms": 0}, peer)
    assert status == 403  # nor is the node itself: it would count twice
    for node in NODE_IDS:
        status, _ = _post(cluster, node, protocol.POSITION_PATH, {"node": "x", "epoch": 2**63 - 1}, peer)
        assert status == 403
        member = next(n for n in NODE_IDS if n != node)
        status, body = _post(cluster, node, protocol.POSITION_PATH, {"node": member, "epoch": 2**63 - 1}, peer)
        assert status == 200 and protocol.unpack(body)["status"] == "refused"  # far beyond the Raft term
        assert Epochs.load(Epochs.path(os.path.join(cluster.root, node))).promised < 2**32  # not persisted
    # The promise was not kept: a new leader is still elected after the leader dies.
    term = cluster.health(leader)["term"]
    cluster.kill(leader)  # SIGKILL
    started = time.monotonic()
    new = cluster.wait_leader(leader, term, wait_s=10)
    assert new != leader and time.monotonic() - started < 10
    cluster.restart(leader)


def _serve(tmp_path, *flags: str) -> subprocess.CompletedProcess:
    """Run `hourglass serve` as one node of a one-node cluster, expecting it
    to refuse to start (60 s bound)."""
    spec = f"n1=127.0.0.1:{free_port()}:{free_port()}"
    args = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d"), "--node-id", "n1",
            "--cluster", spec, *flags]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_a_cluster_without_a_secret_refuses_to_start(tmp_path):
    r = _serve(tmp_path)
    assert r.returncode == 2 and "--cluster-secret-file" in r.stderr and "--insecure-cluster" in r.stderr
    assert "run code" in r.stderr and "elections" in r.stderr  # the sentence says why
    short = tmp_path / "short"
    short.write_text("tiny")
    os.chmod(short, 0o600)
    r = _serve(tmp_path, "--cluster-secret-file", str(short))
    assert r.returncode == 2 and "16 characters" in r.stderr
    readable = tmp_path / "readable"
    readable.write_text("x" * 32)
    os.chmod(readable, 0o644)
    r = _serve(tmp_path, "--cluster-secret-file", str(readable))
    assert r.returncode == 2 and "chmod 600" in r.stderr and "--allow-readable-token" in r.stderr
    good = tmp_path / "good"
    good.write_text("x" * 32)
    os.chmod(good, 0o600)
    r = _serve(tmp_path, "--cluster-secret-file", str(good), "--insecure-cluster")
    assert r.returncode == 2 and "exclude each other" in r.stderr
    r = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "s"),
                        "--port", str(free_port()), "--cluster-secret-file", str(good)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "apply to a cluster" in r.stderr


def test_an_insecure_cluster_on_a_network_address_needs_a_second_flag(tmp_path):
    """Without a secret, whoever reaches a node's Raft port runs code on it:
    --insecure-cluster with a --cluster host that is not loopback is
    refused at start, in one line naming the flag that confirms it."""
    spec = f"n1=127.0.0.1:{free_port()}:{free_port()},n2=192.0.2.2:8002:9002,n3=192.0.2.3:8003:9003"
    args = [sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "d"), "--node-id", "n1",
            "--cluster", spec, "--insecure-cluster"]
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert "--insecure-cluster-on-network" in errors[0] and "n2=192.0.2.2, n3=192.0.2.3" in errors[0]
    confirmed = Server.spawn(tmp_path / "d", "--node-id", "n1", "--cluster", spec, "--insecure-cluster",
                             "--insecure-cluster-on-network",
                             base=f"http://127.0.0.1:{parse_cluster(spec)['n1'].http_port}")
    try:
        confirmed.wait_healthy(30)
        status, body = request(confirmed.base + "/health")
        assert status == 200 and json.loads(body)["insecure"] is True
    finally:
        confirmed.stop()
    r = subprocess.run([sys.executable, "-m", "broker.cli", "serve", "--data-dir", str(tmp_path / "s"),
                        "--port", str(free_port()), "--insecure-cluster-on-network"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "apply to a cluster" in r.stderr


@pytest.fixture(scope="module")
def insecure(tmp_path_factory):
    """A cluster with --insecure-cluster (no secret) and a client token."""
    token_file = tmp_path_factory.mktemp("insecure-token") / "token"
    token_file.write_text("client-token-0123456789")
    os.chmod(token_file, 0o600)
    c = Cluster.start(tmp_path_factory.mktemp("insecure") / "cluster", "--insecure-cluster",
                      "--auth-token-file", str(token_file))
    yield c
    c.stop()


def test_an_insecure_cluster_starts_and_is_as_open_as_it_says(insecure, tmp_path):
    c = insecure
    leader = c.wait_leader()
    # it says so: /health, /metrics and the console's node section
    token = {"Authorization": "Bearer client-token-0123456789"}
    for node in NODE_IDS:
        assert c.health(node)["insecure"] is True
        assert "hourglass_cluster_insecure 1\n" in request(c.url(node) + "/metrics", headers=token)[1].decode()
        assert json.loads(request(c.url(node) + "/console/api/node", headers=token)[1])["insecure"] is True
    assert "insecure cluster" in _console_header(c.url(leader), "client-token-0123456789")
    # /_cluster/* falls back to the client token
    status, _ = request(c.url(leader) + protocol.SNAPSHOT_PATH)
    assert status == 401
    status, _ = request(c.url(leader) + protocol.SNAPSHOT_PATH, headers=token)
    assert status == 200
    # the probe above is real: without a secret, the Raft port unpickles it
    planted = tmp_path / "planted"
    follower = next(n for n in NODE_IDS if n != leader)
    _raft_probe(c, follower, _plant_frames(planted)[0])
    deadline = time.monotonic() + 5
    while not planted.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert planted.exists()


# Bodies that are not a fetch's or a position's message: (body, what the 400 names).
MALFORMED = [
    (b"", "body"),
    (b"\xc1", "body"),  # a byte msgpack never uses
    (b"{not msgpack", "body"),
    (protocol.pack({"node": "n2"}) + b"\x00", "body"),  # a map, then more
    (msgpack.packb([1, 2]), "body"),
    (protocol.pack({}), "node"),
    (protocol.pack({"node": 7, "epoch": 1}), "node"),
    (protocol.pack({"node": "n2", "epoch": "1"}), "epoch"),
    (protocol.pack({"node": "n2", "epoch": True}), "epoch"),
    (protocol.pack({"node": "n2", "epoch": -1}), "epoch"),
]
FETCH_MALFORMED = [
    (protocol.pack({"node": "n2", "epoch": 1, "offset": -5, "last_epoch": 0}), "offset"),
    (protocol.pack({"node": "n2", "epoch": 1, "offset": 0}), "last_epoch"),
    (protocol.pack({"node": "n2", "epoch": 1, "offset": 0, "last_epoch": 0, "wait_ms": [1]}), "wait_ms"),
]


def _malformed_bodies_are_400(c: Cluster, headers: dict) -> None:
    for node in NODE_IDS:
        for path, cases in ((protocol.POSITION_PATH, MALFORMED), (protocol.FETCH_PATH, MALFORMED + FETCH_MALFORMED)):
            for body, field in cases:
                status, answer = request(c.url(node) + path, data=body,
                                         headers={"Content-Type": protocol.CONTENT_TYPE, **headers})
                assert status == 400, (node, path, body, status, answer)
                assert json.loads(answer)["msg"].startswith(f"{field}: "), (path, body, answer)
        with open(c.nodes[node].log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        assert "bug while serving" not in log and "Traceback" not in log


def test_malformed_cluster_calls_are_400_not_a_bug_on_an_insecure_cluster(insecure):
    """An empty /_cluster/position answered 500 and logged a traceback as a
    bug; every body that is not the call's message is the caller's 400."""
    _malformed_bodies_are_400(insecure, {"Authorization": "Bearer client-token-0123456789"})


def test_malformed_cluster_calls_are_400_from_a_peer_too(cluster):
    _malformed_bodies_are_400(cluster, peer_auth.headers(SECRET))


TRAVERSALS = ["/camellia/delayQueue/../../_cluster/snapshot", "/camellia/delayQueue/%2e%2e/%2E%2E/_cluster/snapshot",
              "/camellia/delayQueue/.%2e/.%2E/_cluster/snapshot?x=1", "/camellia/delayQueue/./getTopicInfoList",
              "/camellia/delayQueue/x/../../../health"]


def _raw_get(base: str, path: str, headers: dict) -> tuple[int, dict, bytes]:
    """GET `path` as written, no client library normalising it on the way."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def _no_dot_segment_is_forwarded(c: Cluster, headers: dict) -> None:
    leader = c.wait_leader()
    c.wait_known(leader)
    for node in NODE_IDS:
        for path in TRAVERSALS:
            status, answer_headers, body = _raw_get(c.url(node), path, headers)
            assert status == 404 and json.loads(body)["code"] == 404, (node, path, status, body[:200])
            assert "X-Hourglass-Leader" not in answer_headers, (node, path)  # not forwarded
        status, answer_headers, _ = _raw_get(c.url(node), "/camellia/delayQueue/getTopicInfoList", headers)
        assert status == 200 and (node == leader or answer_headers["X-Hourglass-Leader"] == leader)


def test_a_follower_forwards_no_path_with_dot_segments_on_an_insecure_cluster(insecure):
    """/camellia/delayQueue/../../_cluster/snapshot was forwarded to the
    leader as /_cluster/snapshot (the URL library removes dot segments), so
    the client's token fetched every stored message through a follower."""
    _no_dot_segment_is_forwarded(insecure, {"Authorization": "Bearer client-token-0123456789"})


def test_a_follower_forwards_no_path_with_dot_segments(cluster):
    _no_dot_segment_is_forwarded(cluster, {"Authorization": "Bearer client-token-0123456789"})
