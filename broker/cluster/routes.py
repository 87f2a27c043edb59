"""A cluster node's HTTP app: one port serves the API, /health, /metrics,
the console and the peers' /_cluster/* calls (broker.cluster.peers).

    request                       on the leader     on a follower
    /camellia/delayQueue/...      served            forwarded to the leader
                                                    (503 while none is known)
    /health, /metrics, console    this node's own view
    /_cluster/*                   needs the cluster secret's proof, not the
                                  client token

Forwarding keeps the method, body and the headers in FORWARDED_HEADERS, and
names the leader in X-Hourglass-Leader; an unreachable leader is a 503 the
client retries. A path with a `.` or `..` segment (`%2e` too) is never
forwarded: HTTP 404 on every node (the URL library would have sent
`/camellia/delayQueue/../../_cluster/snapshot` as `/_cluster/snapshot`).
"""

from __future__ import annotations

import logging

import aiohttp
import orjson

from broker.api import Handler, Router, answer, console_auth, console_entry
from broker.console_login import ConsoleLogin
from broker.console_sessions import ConsoleSessions
from broker.gate import Gate
from broker.httpd import Admit, Dispatch, Request, Response, StreamResponse
from broker.paths import PREFIX
from broker.redact import client_text
from broker.scrape import metrics_response
from broker.serving import offline_health
from replication import peer_auth, protocol
from storage.errors import InvalidRequest

from .parts import NodeParts

log = logging.getLogger("hourglass.cluster")

# Headers a forwarded request keeps.
FORWARDED_HEADERS = ("Content-Type", "Authorization", "Accept")
CLUSTER_PREFIX = "/_cluster/"


def has_dot_segment(path: str) -> bool:
    """Whether `path` has a `.` or `..` segment, its dots also spelled
    `%2e` (RFC 3986 5.2.4 removes such segments, and the URL library reads
    `%2e` as a dot)."""
    return any(segment.lower().replace("%2e", ".") in (".", "..") for segment in path.split("/"))


def _malformed_is_400(handler: Handler) -> Handler:
    """A /_cluster/* body that is not its call's message (empty, not
    msgpack, a field missing or of the wrong type: replication.protocol's
    InvalidRequest) is the caller's error, answered HTTP 400, not a bug's
    500 with a traceback."""
    async def run(request: Request) -> Response | StreamResponse:
        try:
            return await handler(request)
        except InvalidRequest as e:
            return Response(400, orjson.dumps({"code": 400, "msg": str(e)}))
    return run


class Routes(NodeParts):
    def app(self) -> tuple[Dispatch, Admit]:
        """What answers a request, and what decides on its head
        (broker.gate): /_cluster/* needs the cluster secret's proof (the
        client token is not enough); everything else, and /_cluster/* of an
        --insecure-cluster, is the API's, behind the token."""
        router = Router()
        router.add("GET", "/health", self.health)
        router.add("GET", "/metrics", self.metrics_text)
        router.add("POST", protocol.FETCH_PATH, _malformed_is_400(self.on_fetch))
        router.add("POST", protocol.POSITION_PATH, _malformed_is_400(self.on_position))
        router.add("GET", protocol.SNAPSHOT_PATH, self.on_snapshot)
        self.serving.add_routes(router)
        self.api.add_routes(router)
        self.console.add_routes(router)

        async def route(request: Request) -> Response | StreamResponse:
            return await self._route(request, router.dispatch)
        sessions = ConsoleSessions(self.config.console, self.clock)
        ConsoleLogin(self.config.auth_token, sessions, self.serving.track(route)).add_routes(router)
        secret = self.cluster.secret

        def is_peer(request: Request) -> bool:
            return peer_auth.is_peer(secret, request.headers.get(peer_auth.HEADER.lower()))
        token = self.config.auth_token
        gate = Gate(router, self.api.body_cap, token, self.config.host, self.config.allowed_hosts,
                    is_peer=None if secret is None else is_peer,
                    console_auth=console_auth(sessions))
        api = console_entry(token, sessions, self.serving.track(route))

        async def peers_or_api(request: Request) -> Response | StreamResponse:
            if secret is not None and request.path.startswith(CLUSTER_PREFIX):
                return await router.dispatch(request)  # the gate checked the peer's proof
            return await api(request)
        return peers_or_api, gate.admit

    async def _route(self, request: Request, handler):
        """API calls: served here while this node leads, else forwarded."""
        if not request.path.startswith(PREFIX):
            return await handler(request)
        if has_dot_segment(request.path):
            # The URL library that forwards would remove the dot segments
            # (/camellia/delayQueue/../../_cluster/snapshot is sent as
            # /_cluster/snapshot): no such path is forwarded, or served.
            return Response(404, orjson.dumps({"code": 404, "msg": "Not Found: a path with a . or .. segment"}))
        if self.leads and self.broker is not None and not self.stopping:
            return await handler(request)
        leader = None if self.stopping else self.known_leader()
        if leader is None or leader == self.cluster.node_id:
            return answer(503, "no leader is known yet; retry", leader=None)
        return await self._forward(request, leader)

    async def _forward(self, request: Request, leader: str) -> Response:
        url = self.cluster.peers[leader].http_url + request.path_qs
        headers = {k: request.headers[k.lower()] for k in FORWARDED_HEADERS if k.lower() in request.headers}
        try:
            async with self.session.request(request.method, url, data=request.body, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=None, sock_connect=1.0)) as r:
                data = await r.read()
                return Response(r.status, data, r.headers.get("Content-Type", "application/json"),
                                headers={"X-Hourglass-Leader": leader})
        except (aiohttp.ClientError, OSError) as e:
            return answer(503, f"the leader {leader} is unreachable ({e.__class__.__name__}); retry", leader=leader)

    def _topic_list(self) -> list[str]:
        if self.broker is not None:
            return self.broker.topic_list()
        return sorted(set(self.store.topic_names().values()))

    def _console_info(self) -> dict:
        """The console's node section: role, term, log end, whether the
        cluster runs without a secret (--insecure-cluster) and, on the
        leader, each follower's replicated offset and how far it lags."""
        role, term = self.shown_role()
        info = {"role": role, "node": self.cluster.node_id, "leader": self.known_leader(), "term": term,
                "logEndOffset": self.store.log_end_offset, "insecure": self.cluster.insecure}
        if self.leader_log is not None:
            now_s = self.clock.monotonic_s()
            info["followers"] = [{"node": name, "offset": p.offset,
                                  "lagBytes": max(0, self.leader_log.durable_offset - p.offset),
                                  "seenAgoMs": int((now_s - p.seen_s) * 1000)}
                                 for name, p in sorted(self.leader_log.followers.items())]
        return info

    async def health(self, request: Request) -> Response:
        role, term = self.shown_role()
        extra = {"role": role, "leader": self.known_leader(), "node": self.cluster.node_id, "term": term,
                 "log_end_offset": self.store.log_end_offset, "insecure": self.cluster.insecure}
        if self.failed is not None:
            return answer(503, f"failed: {client_text(self.failed)}", status="failed", **extra)
        if not self.serving.online:
            return offline_health(**extra)
        return answer(200, "success", status="ok", **extra)

    async def metrics_text(self, request: Request) -> Response:
        node = [("hourglass_commit_log_end_offset", "gauge", self.store.log_end_offset),
                ("hourglass_is_leader", "gauge", int(self.leads)),
                ("hourglass_term", "gauge", self.shown_role()[1]),
                ("hourglass_replicated_records_total", "counter", self.follower.fetched_records),
                # 1: --insecure-cluster, no cluster secret (docs/security.md)
                ("hourglass_cluster_insecure", "gauge", int(self.cluster.insecure))]
        if self.leader_log is not None:
            node.append(("hourglass_quorum_offset", "gauge", self.leader_log.quorum_offset()))
        return await metrics_response(self, node)
