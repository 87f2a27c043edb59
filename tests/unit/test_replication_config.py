"""replication.config: --insecure-cluster is refused when a --cluster host
is not loopback, unless --insecure-cluster-on-network confirms it (an
insecure node's Raft port runs whatever it is sent)."""

from __future__ import annotations

import pytest

from replication.config import ClusterConfig, Peer, is_loopback, parse_cluster
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
