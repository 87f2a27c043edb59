"""`NodeBase`: what every kind of node serves the same way, written once.

Three kinds of node build on it: `DiskNode` and `RedisNode` run alone
(broker.nodes), `ClusterNode` is one node of a cluster (broker.cluster).
Each builds its own backend (or, a cluster node, the broker it runs while
it leads) and hands the base what every node has:

    part          what it is
    clock         the one clock (broker.clock.SystemClock; tests: FakeClock)
    metrics       the counters the backend and /metrics share (broker.metrics)
    process       the process-wide families of /metrics (camellia_metrics)
    serving       camellia's online/offline switch over the API's calls
                  (broker.health)
    api           camellia's endpoints over the backend serving now, if any
                  (broker.api)
    console       the web console, or None (the Redis backend has none: no
                  second tables; broker.console)

and serves from them, the same way on every node:

    app()            the HTTP app: /health, /metrics, the health switch, the
                     API, the console with its sessions and login, behind
                     the gate (broker.gate)
    health()         GET /health: degraded, failed, offline or ok, with the
                     node's role fields
    metrics_text()   GET /metrics (broker.scrape), with the node's own gauges
    start_monitor()  camellia's monitor interval and the console's sampler
    serve()          listen on --host:--port; SIGTERM and SIGINT set
                     `stop_asked`, as a fatal error does

A node supplies what differs: `failure()`, `health_fields()` and
`node_series()`, and where it has them `degraded()` (Redis unreachable) and
a cluster's `own_routes()` (its /_cluster/* calls), `routed()` (API calls
forwarded to the leader) and `peer_proof()` (the cluster secret).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from wheel.clock import Clock

from .api import Api, Router, answer, console_auth, console_entry
from .backend import Backend
from .camellia_metrics import ProcessStats
from .config import ServeConfig
from .console import Console
from .console_login import ConsoleLogin
from .console_sessions import ConsoleSessions
from .descriptors import DescriptorBudget
from .gate import CLUSTER_PREFIX, Gate
from .health import ServingStatus
from .httpd import Admit, Dispatch, HttpServer, Request, Response, StreamResponse
from .metrics import Metrics
from .paths import PREFIX
from .push_api import PushApi
from .push_rules import PushAllow
from .redact import client_text
from .scrape import Series, metrics_response

if TYPE_CHECKING:
    from .pusher import Pushers

log = logging.getLogger("hourglass.server")

OFFLINE_MSG = "offline (/camellia/health/online brings it back)"


async def monitor_every(interval_s: int, metrics: Metrics, process: ProcessStats, clock: Clock) -> None:
    """camellia's monitor interval: every `interval_s`, publish the counts
    of the interval that ended (getMonitorData) and its CPU use."""
    metrics.roll(clock.now_ms())
    process.roll()
    next_s = clock.monotonic_s()
    while True:
        next_s += interval_s
        await clock.sleep(next_s - clock.monotonic_s())
        metrics.roll(clock.now_ms())
        process.roll()


class NodeBase(ABC):
    """The parts every node has, and what it serves from them (see the
    module docstring). A subclass builds its backend first (its metrics
    given here), then calls this constructor; `backend` is None for a node
    that serves no API of its own yet (a cluster follower)."""

    def __init__(self, config: ServeConfig, clock: Clock, metrics: Metrics, backend: Backend | None,
                 console: Console | None) -> None:
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self.process = ProcessStats()
        # going offline answers the long polls held, on whichever backend serves then
        self.serving = ServingStatus(config.offline_idle_s, PREFIX, on_offline=lambda: self.api.wake_long_polls())
        self.api = Api(backend, config.max_msg_bytes, config.bodies, self.serving, config.queues.page_bytes)
        self.console = console
        # Push subscriptions (broker.pusher): None while no backend serves here.
        self.pushers: Pushers | None = None
        # The process's file descriptors: client connections (broker.httpd),
        # push connections (broker.push_client) and storage share them
        # (broker.descriptors).
        self.descriptors = DescriptorBudget(config.http.reserved_fds)
        # Set by SIGTERM or SIGINT (once serving) or by a fatal error: the
        # process (broker.server) then stops the node.
        self.stop_asked = asyncio.Event()

    # == what each kind of node supplies ===========================================

    @abstractmethod
    def failure(self) -> BaseException | None:
        """Why this node stopped itself (None: it did not): /health answers
        503 "failed", and the process exits 1."""

    def degraded(self) -> str | None:
        """What keeps the node from serving for now, though it runs (None:
        nothing): /health answers 503 "degraded" with it."""
        return None

    @abstractmethod
    def health_fields(self) -> Mapping[str, object]:
        """/health's fields after `status`: the role, the leader and the
        node, and whatever else this kind of node shows."""

    @abstractmethod
    def node_series(self) -> Sequence[Series]:
        """This node's own /metrics series (name, type, value)."""

    # Why this kind of node takes no push subscription (subscribe answers
    # 403 with it); None: it takes them (broker.pusher).
    push_refusal: str | None = None

    def own_routes(self) -> Sequence[tuple[str, str, Dispatch]]:
        """(method, path, handler) of what only this kind of node serves:
        nothing here (a cluster node's: the peers' /_cluster/* calls)."""
        return ()

    def routed(self, dispatch: Dispatch) -> Dispatch:
        """What runs a request the router serves (the API's, the console's):
        the router itself here; a cluster follower forwards API calls."""
        return dispatch

    def peer_proof(self) -> Callable[[Request], bool] | None:
        """Whether a /_cluster/* request carries the cluster secret's proof
        (broker.gate); None: no peer calls are told apart from the API's."""
        return None

    # == what every node serves the same way =======================================

    def app(self) -> tuple[Dispatch, Admit]:
        """The node's HTTP app: what answers a request, and what decides on
        its head (broker.gate). With a peer proof, /_cluster/* goes to the
        router as it is (the gate checked the proof); everything else is
        the API's, behind the token."""
        router = Router()
        router.add("GET", "/health", self.health)
        router.add("GET", "/metrics", self.metrics_text)
        for method, path, handler in self.own_routes():
            router.add(method, path, handler)
        self.serving.add_routes(router)
        self.api.add_routes(router)
        PushApi(lambda: self.pushers, PushAllow.parse(self.config.push_allow), self.config.bodies,
                self.config.max_msg_bytes, self.push_refusal).add_routes(router)
        api_calls = self.serving.track(self.routed(router.dispatch))
        sessions = None
        if self.console is not None:
            self.console.add_routes(router)
            sessions = ConsoleSessions(self.config.console, self.clock)
            ConsoleLogin(self.config.auth_token, sessions, api_calls).add_routes(router)
        token = self.config.auth_token
        is_peer = self.peer_proof()
        gate = Gate(router, self.api.body_cap, token, self.config.host, self.config.allowed_hosts,
                    is_peer=is_peer, console_auth=None if sessions is None else console_auth(sessions))
        entry = console_entry(token, sessions, api_calls)
        if is_peer is None:
            return entry, gate.admit

        async def peers_or_api(request: Request) -> Response | StreamResponse:
            if request.path.startswith(CLUSTER_PREFIX):
                return await router.dispatch(request)
            return await entry(request)
        return peers_or_api, gate.admit

    async def health(self, request: Request) -> Response:
        """Not ready for a load balancer (503) while degraded, failed or
        taken offline (/camellia/health/offline), though an offline node
        still serves what reaches it."""
        fields = self.health_fields()
        problem = self.degraded()
        if problem is not None:
            return answer(503, problem, status="degraded", **fields)
        failed = self.failure()
        if failed is not None:
            return answer(503, f"failed: {client_text(failed)}", status="failed", **fields)
        if not self.serving.online:
            return answer(503, OFFLINE_MSG, status="offline", **fields)
        return answer(200, "success", status="ok", **fields)

    async def metrics_text(self, request: Request) -> Response:
        response = await metrics_response(self.api.broker, self.metrics, self.process, self.config.metrics_topics,
                                          self.node_series())
        if self.pushers is not None:  # broker.pusher's series, at most --metrics-topics topics of them
            from .pusher import render_metrics
            response.body += render_metrics(self.pushers.stats, self.config.metrics_topics).encode()
        return response

    def start_monitor(self) -> asyncio.Task[None]:
        """camellia's monitor interval, and the console's throughput sampler."""
        async def monitors() -> None:
            samplers: list[Coroutine[Any, Any, None]] = [
                monitor_every(self.config.monitor_interval_s, self.metrics, self.process, self.clock)]
            if self.console is not None:
                samplers.append(self.console.run())
            await asyncio.gather(*samplers)
        return asyncio.create_task(monitors(), name="monitor")

    async def serve(self, describe: str) -> HttpServer:
        """Listen on --host:--port; from now on SIGTERM and SIGINT set
        `stop_asked`. `describe` names the node in the log line."""
        config = self.config
        dispatch, admit = self.app()
        server = HttpServer(dispatch, admit, config.http, self.descriptors)
        await server.start(config.host, config.port)
        log.info("serving on http://%s:%d (%s)", config.host, config.port, describe)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_asked.set)
        return server
