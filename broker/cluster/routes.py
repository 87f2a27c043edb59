"""What a cluster node's HTTP app holds of its own. One port serves the
API, /health, /metrics, the console (broker.node.base, as every node) and
the peers' /_cluster/* calls (broker.cluster.peers).

    request                       on the leader     on a follower
    /camellia/delayQueue/...      served            forwarded to the leader
                                                    (503 while none is known)
    /health, /metrics, console    this node's own view
    /_cluster/*                   needs the cluster secret's proof, not the
                                  client token

Forwarding keeps the method, body and the headers in FORWARDED_HEADERS, and
names the leader in X-Hourglass-Leader; an unreachable leader is a 503 the
client retries, and so is what is still forwarded when this node stops
(`close`: its stop does not wait on the leader's answers). A path with a `.` or `..` segment (`%2e` too) is never
forwarded: HTTP 404 on every node (the URL library would have sent
`/camellia/delayQueue/../../_cluster/snapshot` as `/_cluster/snapshot`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence

import aiohttp

from broker.http.api import answer
from broker.http.commands import Command
from broker.http.http_types import BatchHandler, Handler, Request, Response, StreamResponse
from broker.http.paths import BACKUP_PATH, PREFIX
from broker.http.scrape import disk_series
from broker.observe.metrics import COUNTER, GAUGE, Family, Sample, single_series
from replication import peer_auth
from storage.errors import InvariantError

from .state import NodeState

log = logging.getLogger("hourglass.cluster")

# Headers a forwarded request keeps.
FORWARDED_HEADERS = ("Content-Type", "Authorization", "Accept", "traceparent", "tracestate")


def has_dot_segment(path: str) -> bool:
    """Whether `path` has a `.` or `..` segment, its dots also spelled
    `%2e` (RFC 3986 5.2.4 removes such segments, and the URL library reads
    `%2e` as a dot)."""
    return any(segment.lower().replace("%2e", ".") in (".", "..") for segment in path.split("/"))


class Routes:
    """What a cluster node's HTTP app (broker.node.base.NodeBase.app) holds
    of its own: API calls forwarded, the peer proof, and its view in
    /health, /metrics and the console; all of it read from `state`."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        self._forward_session: aiohttp.ClientSession | None = None  # made at the first forwarded request

    def routed(self, command: Command) -> Command:
        """An API command (under PREFIX) served here while this node leads,
        else forwarded (`_route`); the others, and backupShard (of this
        node's own store), as they are."""
        if not command.path.startswith(PREFIX) or command.path == BACKUP_PATH:  # (a backup: this node's store)
            return command
        if has_dot_segment(command.path):
            # The URL library that forwards would remove the dot segments
            # (/camellia/delayQueue/../../_cluster/snapshot is sent as
            # /_cluster/snapshot): no such path is forwarded. A request's
            # path is its command's exactly, so checking the table's paths
            # checks every request's (any other path is answered 404).
            raise InvariantError(f"{command.path} has a dot segment: forwarding would change it")
        batch = None if command.batch is None else functools.partial(self._route_run, command.batch, command.handler)
        return dataclasses.replace(command, handler=functools.partial(self._route, command.handler), batch=batch)

    def peer_proof(self) -> Callable[[Request], bool] | None:
        """/_cluster/* needs the cluster secret's proof (the client token is
        not enough); an --insecure-cluster's /_cluster/* is the API's,
        behind the token."""
        secret = self.state.cluster.secret
        if secret is None:
            return None

        def is_peer(request: Request) -> bool:
            return peer_auth.is_peer(secret, request.headers.get(peer_auth.HEADER.lower()))
        return is_peer

    async def _route(self, serve: Handler, request: Request) -> Response | StreamResponse:
        """An API call: served here (`serve`) while this node leads, else
        forwarded (its path is its command's: no dot segment, `routed`)."""
        state = self.state
        if state.leads and state.broker is not None and not state.stopping:
            return await serve(request)
        leader = None if state.stopping else state.known_leader()
        if leader is None or leader == state.cluster.node_id:
            return answer(503, "no leader is known yet; retry", leader=None)
        # in a Task of its own: aiohttp's client asks for the current Task,
        # and this may run in the connection's frame (broker.http.httpd)
        return await asyncio.ensure_future(self._forward(request, leader))

    async def _route_run(self, serve_run: BatchHandler, serve: Handler,
                         requests: list[Request]) -> list[Response | Exception]:
        """A pipelined run of an API command: served here as one run
        (`serve_run`) while this node leads, else each request as `_route`."""
        state = self.state
        if state.leads and state.broker is not None and not state.stopping:
            return await serve_run(requests)
        outcomes: list[Response | Exception] = []
        for request in requests:
            try:
                response = await self._route(serve, request)
            except Exception as error:
                outcomes.append(error)
            else:
                outcomes.append(response if isinstance(response, Response) else
                                InvariantError("a forwarded run's answer is streamed"))
        return outcomes

    async def _forward(self, request: Request, leader: str) -> Response:
        url = self.state.cluster.peers[leader].http_url + request.path_qs
        headers = {k: request.headers[k.lower()] for k in FORWARDED_HEADERS if k.lower() in request.headers}
        try:
            async with self.forward_session().request(request.method, url, data=request.body, headers=headers,
                                                   timeout=aiohttp.ClientTimeout(total=None, sock_connect=1.0)) as r:
                data = await r.read()
                return Response(r.status, data, r.headers.get("Content-Type", "application/json"),
                                headers={"X-Hourglass-Leader": leader})
        except (aiohttp.ClientError, OSError) as e:
            if self.state.stopping:  # cut by `close`
                return answer(503, "this node is stopping; retry", leader=None)
            return answer(503, f"the leader {leader} is unreachable ({e.__class__.__name__}); retry", leader=leader)

    def forward_session(self) -> aiohttp.ClientSession:
        """The HTTP client of the API requests a follower forwards to the
        leader: a pool of its own, so requests hung on a leader cut off
        (a long poll waits minutes, and a black-holed connection for ever)
        never hold the connections the peer calls need to elect and fetch
        (broker.cluster.peer_client). No cap of its own: each forward holds
        one client connection, which --max-connections caps."""
        if self._forward_session is None:
            self._forward_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._forward_session

    async def close(self) -> None:
        """Stop forwarding (the node stops): what is forwarded still is
        answered 503 now (the client retries on another node), instead of
        holding this node's stop for as long as the leader takes (a long
        poll waits up to its timeout, 10 s by default: the whole shutdown
        grace, broker.node.server.SHUTDOWN_TIMEOUT_S)."""
        session, self._forward_session = self._forward_session, None
        if session is not None:
            await session.close()

    def topic_list(self) -> list[str]:
        """The console's topics: the broker's while leading, else the store's."""
        broker, store = self.state.broker, self.state.store
        if broker is not None:
            return broker.topic_list()
        return sorted(set(store.topic_names().values()))

    def console_info(self) -> dict[str, object]:
        """The console's node section: role, term, log end, whether the
        cluster runs without a secret (--insecure-cluster) and, on the
        leader, each follower's replicated offset and how far it lags."""
        state = self.state
        role, term = state.shown_role()
        info: dict[str, object] = {"role": role, "node": state.cluster.node_id, "leader": state.known_leader(),
                                   "term": term, "logEndOffset": state.store.log_end_offset,
                                   "insecure": state.cluster.insecure}
        leader_log = state.leader_log
        if leader_log is not None:
            now_s = state.clock.monotonic_s()
            info["followers"] = [{"node": name, "offset": p.offset,
                                  "lagBytes": max(0, leader_log.durable_offset - p.offset),
                                  "seenAgoMs": int((now_s - p.seen_s) * 1000)}
                                 for name, p in sorted(leader_log.followers.items())]
        return info

    def health_fields(self) -> Mapping[str, object]:
        state = self.state
        role, term = state.shown_role()
        return {"role": role, "leader": state.known_leader(), "node": state.cluster.node_id, "term": term,
                "log_end_offset": state.store.log_end_offset, "insecure": state.cluster.insecure}

    def node_series(self) -> Sequence[Family]:
        state = self.state
        node = [single_series("hourglass_commit_log_end_offset", GAUGE, state.store.log_end_offset),
                single_series("hourglass_is_leader", GAUGE, int(state.leads)),
                single_series("hourglass_term", GAUGE, state.shown_role()[1]),
                single_series("hourglass_replicated_records_total", COUNTER, state.follower.fetched_records),
                # 1: --insecure-cluster, no cluster secret (docs/security.md)
                single_series("hourglass_cluster_insecure", GAUGE, int(state.cluster.insecure))]
        leader_log = state.leader_log
        if leader_log is not None:
            node.append(single_series("hourglass_quorum_offset", GAUGE, leader_log.quorum_offset()))
            # each follower's lag behind this leader's durable log, and how
            # long since it last fetched (one series each: the cluster's size)
            durable, now_s = leader_log.durable_offset, state.clock.monotonic_s()
            followers = [((("follower", name),), p) for name, p in sorted(leader_log.followers.items())]
            node += [Family("hourglass_replication_lag_bytes", "", GAUGE,
                            [Sample("hourglass_replication_lag_bytes", labels, max(0, durable - p.offset))
                             for labels, p in followers], ".15g"),
                     Family("hourglass_follower_seen_seconds", "", GAUGE,
                            [Sample("hourglass_follower_seen_seconds", labels, round(now_s - p.seen_s, 3))
                             for labels, p in followers], ".15g")]
        if state.broker is not None:  # (a follower runs no wheel)
            node.append(single_series("hourglass_wheel_lag_seconds", GAUGE,
                                      state.broker.scheduler.lag_ms(state.clock.now_ms()) / 1000))
        return [*node, *disk_series(state.store, state.data_dir)]
