"""broker.shard_map: the shard map both clients keep. A getShardMap answer
becomes each shard's base URL; anything else is no map (the node's port);
a map given up is read again SHARD_MAP_RETRY_S later, by the caller's clock."""

from __future__ import annotations

from broker.shard_map import SHARD_MAP_RETRY_S, ShardMap, shard_urls
from broker.shards import placement

NODE = "http://127.0.0.1:8080"
TWO = {"code": 200, "msg": "success", "shards": 2, "ports": [9001, 9002], "placement": "crc32"}


def test_a_map_is_the_nodes_url_with_each_shards_port():
    assert shard_urls(NODE, TWO) == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert shard_urls("https://user@node.example:443/hg/", TWO) == ["https://user@node.example:9001/hg",
                                                                    "https://user@node.example:9002/hg"]
    assert shard_urls("http://[::1]:8080", TWO) == ["http://[::1]:9001", "http://[::1]:9002"]


def test_anything_but_a_map_of_two_or_more_shards_is_none():
    for answer in (None, [], "ports", {**TWO, "placement": "another"}, {**TWO, "ports": [9001]},
                   {**TWO, "ports": [9001, "9002"]}, {**TWO, "ports": [9001, 0]}, {**TWO, "ports": [9001, 65536]},
                   {**TWO, "ports": [9001, True]}, {k: v for k, v in TWO.items() if k != "placement"}):
        assert shard_urls(NODE, answer) == [], answer


def test_a_message_goes_to_its_keys_shard_else_its_msgids():
    shard_map = ShardMap()
    shard_map.read(NODE, TWO)
    urls = shard_urls(NODE, TWO)
    for msg_id, key in (("a", ""), ("b", ""), ("a", "k1"), ("a", "k2"), ("", "k3")):
        assert shard_map.owner(msg_id, key) == urls[placement.message_owner(msg_id, key, 2)]
    assert shard_map.owner("") is None  # nothing to place by: the node's port
    shard_map.read(NODE, None)  # a node without getShardMap
    assert shard_map.owner("a") is None


def test_a_map_is_read_once_a_node_and_again_a_while_after_it_is_given_up():
    shard_map = ShardMap()
    assert shard_map.due(NODE, 0.0)
    shard_map.reading(NODE)
    assert not shard_map.due(NODE, 0.0) and shard_map.owner("a") is None  # while the read runs
    shard_map.read(NODE, TWO)
    assert not shard_map.due(NODE, 1e9) and shard_map.owner("a") is not None  # kept
    assert shard_map.due("http://127.0.0.1:8081", 1e9)  # another node of a cluster: its own map
    shard_map.give_up(100.0)
    assert shard_map.owner("a") is None
    assert not shard_map.due(NODE, 100.0 + SHARD_MAP_RETRY_S - 0.001)
    assert shard_map.due(NODE, 100.0 + SHARD_MAP_RETRY_S)
    assert repr(shard_map) == "ShardMap(of=None, shards=[])"
