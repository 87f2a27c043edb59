"""What a client knows of a node's shards: which port to send a message
to (docs/api.md, "Shards"). Both clients keep one, `broker.client` (asyncio)
and `broker.spark` (a Spark task's blocking sender); each reads the map
over its own transport, and this module holds the rules they share.

A node of N > 1 shards answers `GET getShardMap` with each shard's own
port; a message sent on its owner's port (`broker.shards.placement`: its
key's shard, else its msgId's) is stored there, one hop shorter than
through the node's port. The map is read once per node. When it cannot be
read, or a shard's port fails (no connection, a 503), the client sends
through the node's port, which serves any message, and reads the map
again SHARD_MAP_RETRY_S later: a shard that restarted listens on a new
port, and the map read then names it.

    shard_map = ShardMap()
    if shard_map.due(node, time.monotonic()):
        shard_map.reading(node)
        ... GET node + "/camellia/delayQueue/getShardMap" ...
        shard_map.read(node, answer)         # None: a node without one (404)
        # or, when the read failed:  shard_map.give_up(time.monotonic())
    url = shard_map.owner(msg_id, key)       # a shard's base URL; None: the node's

No I/O and no clock here: the caller reads the map and tells the time.
"""

from __future__ import annotations

import urllib.parse

from .shards.placement import message_owner

# After a shard's port failed, or the node's map could not be read: calls
# go through the node's port, and the map is read again this much later.
SHARD_MAP_RETRY_S = 60.0


def shard_urls(node: str, answer: object) -> list[str]:
    """Each shard's base URL, in shard order: `node` (a base URL, maybe with
    a path) with the port a getShardMap `answer` names for that shard; []
    when the answer is not a map of two or more shards placed by CRC-32
    (one shard, a cluster or Redis node, a server without getShardMap)."""
    if not isinstance(answer, dict) or answer.get("placement") != "crc32":
        return []
    ports = answer.get("ports")
    if not isinstance(ports, list) or len(ports) < 2 or not all(type(p) is int and 0 < p < 65536 for p in ports):
        return []
    parts = urllib.parse.urlsplit(node)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    user, at, _ = parts.netloc.rpartition("@")
    return [urllib.parse.urlunsplit((parts.scheme, f"{user}{at}{host}:{port}", parts.path, "", "")).rstrip("/")
            for port in ports]


class ShardMap:
    """The shards of the node a client uses, as its getShardMap said.

    `shards` is each shard's base URL ([]: send everything to the node's
    port). `due` is true for the first call about a node, and again
    SHARD_MAP_RETRY_S after `give_up`; `reading` marks the map read (empty)
    while the read runs, so that concurrent calls do not read it again;
    `read` keeps the answer. A map once read is kept for that node until
    a shard's port fails. One thread reads the map; `give_up` and `owner`
    may be called from others (the Spark sink's senders): each reads or
    writes what it needs in an order that no call in between can misread.
    """

    def __init__(self) -> None:
        self.shards: list[str] = []
        self._of: str | None = None  # the node `shards` are of; None: none read (or given up)
        self._read_after_s = 0.0  # the caller's clock: no read before this

    def __repr__(self) -> str:
        return f"ShardMap(of={self._of!r}, shards={self.shards})"

    def due(self, node: str, now_s: float) -> bool:
        """Whether to read `node`'s map before the next call."""
        return self._of != node and now_s >= self._read_after_s

    def reading(self, node: str) -> None:
        """The read of `node`'s map has begun: calls go to the node's port meanwhile."""
        self.shards, self._of = [], node

    def read(self, node: str, answer: object) -> None:
        """What `node`'s getShardMap answered (its JSON object; None when
        the node has none): kept until a shard's port fails."""
        self.shards, self._of = shard_urls(node, answer), node

    def give_up(self, now_s: float) -> None:
        """A shard's port failed, or the map could not be read: calls go
        through the node's port, and the map is read again later."""
        self._read_after_s = now_s + SHARD_MAP_RETRY_S  # first: `due` stays false in between
        self._of = None
        self.shards = []

    def owner(self, msg_id: str, key: str = "") -> str | None:
        """The base URL of the shard that owns a message (its key's, else its
        msgId's); None: the node's own port (no map, or no id to place by)."""
        shards = self.shards  # once: another thread may give the map up meanwhile
        if len(shards) < 2 or not (msg_id or key):
            return None
        return shards[message_owner(msg_id, key, len(shards))]
