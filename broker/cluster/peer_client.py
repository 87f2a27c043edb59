"""The calls a cluster node makes of its peers (/_cluster/*: the answers
are broker.cluster.peers', the bodies replication.protocol's): one HTTP
client for all of them, each call with the cluster secret's proof
(replication.peer_auth). The follower's fetches, a candidate's positions
and catch-up (`post`) and a snapshot's download (broker.cluster.snapshots,
on `session`) go through it; tests give the node one that answers
in-process instead."""

from __future__ import annotations

from typing import Any

import aiohttp

from replication import peer_auth, protocol
from replication.config import ClusterConfig


class PeerClient:
    """The node's client of its peers' /_cluster/* calls."""

    def __init__(self, cluster: ClusterConfig, auth_token: str | None) -> None:
        self.cluster = cluster
        self.auth_token = auth_token
        self._session: aiohttp.ClientSession | None = None  # made at the first call (session)

    def headers(self) -> dict[str, str]:
        """The proof of the cluster secret every call carries."""
        return peer_auth.headers(self.cluster.secret, self.auth_token)

    def session(self) -> aiohttp.ClientSession:
        """The HTTP client of the calls to peers, made at the first (on the
        event loop, as aiohttp wants); `close` closes it."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def post(self, node_id: str, call: str, message: dict[str, Any],
                   timeout_s: float = 5.0) -> dict[str, Any]:
        """Make a /_cluster/ call to a peer; raise if it fails or refuses."""
        peer = self.cluster.peers[node_id]
        headers = {"Content-Type": protocol.CONTENT_TYPE, **self.headers()}
        async with self.session().post(f"{peer.http_url}/_cluster/{call}", data=protocol.pack(message),
                                       headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            body = await r.read()
            if r.status != 200:
                raise ConnectionError(f"{node_id} answered {r.status} to {call}: {body[:200]!r}")
            return protocol.unpack(body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
