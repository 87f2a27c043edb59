"""replication.config: --insecure-cluster is refused when a --cluster host
is not loopback, unless --insecure-cluster-on-network confirms it (an
insecure node's Raft port runs whatever it is sent); --reach-peers changes
where a peer is dialled, never its name."""

from __future__ import annotations

import pytest

from replication.config import ClusterConfig, Peer, is_loopback, parse_cluster, reach_peers
from storage.errors import ConfigError

LOCAL = "n1=127.0.0.1:8001:9001,n2=127.0.0.2:8002:9002,n3=[::1]:8003:9003"
NETWORK = "n1=127.0.0.1:8001:9001,n2=10.0.0.2:8002:9002,n3=node3.internal:8003:9003"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.2", "0.0.0.0", "::", "192.0.2.1", "node3.internal", "localhost.example"])
def test_hosts_on_a_network(host):
    assert not is_loopback(host)  # a name other than localhost is not resolved: it counts as on a network


def test_an_insecure_cluster_on_loopback_starts():
    config = ClusterConfig("n1", parse_cluster(LOCAL), insecure=True)
    assert config.insecure and not config.insecure_on_network


def test_an_insecure_cluster_with_a_host_on_a_network_needs_the_second_flag():
    with pytest.raises(ConfigError, match=r"not loopback \(n2=10\.0\.0\.2, n3=node3\.internal\).*"
                                          r"pass --insecure-cluster-on-network"):
        ClusterConfig("n1", parse_cluster(NETWORK), insecure=True)
    assert ClusterConfig("n1", parse_cluster(NETWORK), insecure=True, insecure_on_network=True).insecure
    assert ClusterConfig("n1", parse_cluster(NETWORK), secret="s" * 16).secret  # with a secret: no question


def test_the_second_flag_goes_with_the_first():
    peers = {"n1": Peer("n1", "127.0.0.1", 8001, 9001)}
    with pytest.raises(ConfigError, match="--insecure-cluster-on-network goes with --insecure-cluster"):
        ClusterConfig("n1", peers, secret="s" * 16, insecure_on_network=True)


def test_reach_peers_changes_where_a_peer_is_dialled_not_its_name():
    peers = reach_peers(parse_cluster(LOCAL), "n2=127.0.0.1:18002:19002")
    config = ClusterConfig("n1", peers, secret="s" * 16)
    n2, n3 = config.peers["n2"], config.peers["n3"]
    assert n2.raft_address == "127.0.0.2:9002"  # Raft still knows it by its --cluster address
    assert (n2.http_url, n2.raft_dial) == ("http://127.0.0.1:18002", ("127.0.0.1", 19002))
    assert (n3.http_url, n3.raft_dial) == ("http://[::1]:8003", ("[::1]", 9003))  # not named: its own address
    assert reach_peers(parse_cluster(LOCAL), " ") == parse_cluster(LOCAL)


def test_reach_peers_refuses_an_unknown_peer_and_the_node_itself():
    with pytest.raises(ConfigError, match=r"--reach-peers names 'n9', which is not in --cluster \(n1, n2, n3\)"):
        reach_peers(parse_cluster(LOCAL), "n9=127.0.0.1:1:2")
    with pytest.raises(ConfigError, match=r"--reach-peers names this node \(n1\)"):
        ClusterConfig("n1", reach_peers(parse_cluster(LOCAL), "n1=127.0.0.1:1:2"), secret="s" * 16)


def test_an_insecure_cluster_reaching_a_peer_on_a_network_needs_the_second_flag():
    peers = reach_peers(parse_cluster(LOCAL), "n2=10.0.0.9:1:2")
    with pytest.raises(ConfigError, match=r"not loopback \(n2=10\.0\.0\.9\)"):
        ClusterConfig("n1", peers, insecure=True)
