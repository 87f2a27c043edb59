"""`NodeBase`: what every kind of node serves the same way, written once.

Three kinds of node build on it: `DiskNode` and `RedisNode` run alone
(broker.node.standalone), `ClusterNode` is one node of a cluster (broker.node.cluster).
Each builds its own backend (or, a cluster node, the broker it runs while
it leads) and hands the base what every node has:

    part          what it is
    clock         the one clock (broker.clock.SystemClock; tests: FakeClock)
    metrics       the counters the backend and /metrics share (broker.observe.metrics)
    process       the process-wide families of /metrics (camellia_metrics)
    serving       camellia's online/offline switch over the API's calls
                  (broker.http.health)
    api           camellia's endpoints over the backend serving now, if any
                  (broker.http.api)
    console       the web console, or None (the Redis backend has none: no
                  second tables; broker.console.api)
    features      topic settings and pauses, push, recurring schedules,
                  redriveMsgs jobs, over the records the node's kind keeps
                  (broker.node.features)

and serves from them, the same way on every node:

    app()            the HTTP app: the command table (broker.http.commands) of
                     /health, /metrics, the health switch, the API, the
                     console with its sessions and login, behind the gate
                     (broker.http.gate)
    health()         GET /health: degraded, failed, offline or ok, with the
                     node's role fields
    metrics_text()   GET /metrics: the node's `metrics_families` (broker.http.scrape),
                     with the node's own gauges, as text
    start_monitor()  camellia's monitor interval and the console's sampler
    serve()          listen on --host:--port; SIGTERM and SIGINT set
                     `stop_asked`, as a fatal error does

A node supplies what differs: `failure()`, `health_fields()` and
`node_series()`, and where it has them `degraded()` (Redis unreachable),
`backend_inline` (whether the API's calls may start without a Task of
their own) and a cluster's `add_own_routes()` (its /_cluster/* calls),
`routed()` (API calls forwarded to the leader) and `peer_proof()` (the
cluster secret).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from storage.errors import HourglassError, Unavailable
from wheel.clock import Clock

from .. import build_info
from ..backend import Backend
from ..console.api import Console
from ..console.login import ConsoleLogin
from ..core.redact import client_text
from ..flow.api import FlowApi
from ..http.api import API_ERRORS, Api, answer, console_auth, console_entry
from ..http.commands import HERE, NODE, Auth, Command, CommandTable
from ..http.descriptors import DescriptorBudget
from ..http.gate import Gate
from ..http.health import ServingStatus
from ..http.http_types import Request, Response
from ..http.httpd import HttpServer, NodeConnections
from ..http.paths import PREFIX
from ..http.scrape import Choice, metrics_answer, metrics_families
from ..http.sessions import CONSOLE, ConsoleSessions
from ..jobs.api import JobApi
from ..observe import tracing
from ..observe.camellia_metrics import ProcessStats
from ..observe.metrics import GAUGE, MAX, Family, Metrics, single_series
from ..observe.tracing import Spans
from ..push.api import PushApi
from ..push.rules import PushAllow
from ..schedules.api import ScheduleApi
from .config import ServeConfig
from .features import Features, Records

if TYPE_CHECKING:
    from ..flow.keeper import SharedSettings
    from ..schedules.keeper import ScheduleLimits

log = logging.getLogger("hourglass.server")

OFFLINE_MSG = "offline (/camellia/health/online brings it back)"


async def monitor_every(interval_s: int, metrics: Metrics, process: ProcessStats, clock: Clock,
                        aligned: bool = False) -> None:
    """camellia's monitor interval: every `interval_s`, publish the counts
    of the interval that ended (getMonitorData) and its CPU use.
    `aligned`: the intervals end on multiples of `interval_s` of the wall
    clock, so that the shards of a node count the same intervals."""
    if aligned:
        await _monitor_aligned(interval_s * 1000, metrics, process, clock)
        return
    metrics.roll(clock.now_ms())
    process.roll()
    next_s = clock.monotonic_s()
    while True:
        next_s += interval_s
        await clock.sleep(next_s - clock.monotonic_s())
        metrics.roll(clock.now_ms())
        process.roll()


async def _monitor_aligned(interval_ms: int, metrics: Metrics, process: ProcessStats, clock: Clock) -> None:
    now_ms = clock.now_ms()
    boundary_ms = now_ms - now_ms % interval_ms
    metrics.roll(boundary_ms)
    process.roll()
    while True:
        boundary_ms += interval_ms
        await clock.sleep(max(0.0, (boundary_ms - clock.now_ms()) / 1000))
        metrics.roll(boundary_ms)
        process.roll()


class NodeBase(ABC):
    """The parts every node has, and what it serves from them (see the
    module docstring). A subclass builds its backend first (its metrics
    given here), then calls this constructor; `backend` is None for a node
    that serves no API of its own yet (a cluster follower)."""

    def __init__(self, config: ServeConfig, clock: Clock, metrics: Metrics, backend: Backend | None,
                 console: Console | None, records: Records, *, schedule_limits: ScheduleLimits | None = None,
                 shared_settings: SharedSettings | None = None) -> None:
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self.process = ProcessStats()
        # going offline answers the long polls held, on whichever backend serves then
        self.serving = ServingStatus(config.offline_idle_s, PREFIX, on_offline=lambda: self.api.wake_long_polls())
        # A span of each send and delivery, when the OTEL_* variables ask for
        # them (broker.observe.tracing); None: off, nothing of OpenTelemetry loaded.
        self.spans: Spans | None = tracing.start(config.trace_exporters) if config.trace_exporters else None
        self.api = Api(backend, config.max_msg_bytes, config.bodies, self.serving, config.queues.page_bytes,
                       self.spans)
        self.api.scheduled = self.scheduled  # a send under a schedule's run msgId is refused
        self.console = console
        if console is not None:  # a topic's pause and oldest due age in the topics' table
            console.paused = self.paused
            console.topic_infos = self._topic_infos
        self.api.paused = self.paused
        # The process's file descriptors: client connections (broker.http.httpd),
        # push connections (broker.push.client) and storage share them
        # (broker.http.descriptors).
        self.descriptors = DescriptorBudget(config.http.reserved_fds)
        # Topic settings and pauses, push subscriptions, recurring schedules,
        # redriveMsgs jobs (broker.node.features)
        self.features = Features(config, clock, records, self.descriptors, self.spans,
                                 schedule_limits=schedule_limits, shares=1 if config.shard is None else config.shard[1],
                                 shared=shared_settings, pushes_here=self.pushes_here)
        self.job_api = JobApi(lambda: self.features.jobs, config.bodies, config.max_msg_bytes, clock.now_ms,
                              lambda: self.jobs_absent())
        # A shard's own port beside the node's (broker.http.httpd), once serving; None: one process.
        self.own_port: int | None = None
        # Set by SIGTERM or SIGINT (once serving) or by a fatal error: the
        # process (broker.node.server) then stops the node.
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
    def node_series(self) -> Sequence[Family]:
        """This node's own /metrics series."""

    async def _topic_infos(self, topics: Sequence[str]) -> list[dict[str, object]] | None:
        """getTopicInfo of `topics` from the backend serving (None: none does)."""
        backend = self.api.broker
        if backend is None:
            return None
        try:
            return await backend.topic_infos(topics)
        except Unavailable:  # (a shard or Redis not answering: the table shows no ages)
            return None

    def scraped(self) -> Backend | None:
        """The backend whose topics /metrics shows: the one serving (None:
        none serves here now)."""
        return self.api.broker

    def paused(self, topic: str) -> bool | list[str] | None:
        """getTopicInfo's `paused`."""
        return self.features.flow.paused(topic)

    def pushes_here(self, topic: str) -> bool:
        """Whether this process pushes `topic`'s subscription (a node of
        shards: one shard pushes it for the node)."""
        return True

    async def scheduled(self, topic: str, schedule_ids: Sequence[str]) -> set[str]:
        """Which of `schedule_ids` are schedules of `topic`: the node's own
        (a cluster's leader's, which every API call reaches)."""
        schedules = self.features.schedules
        return set() if schedules is None else schedules.scheduled(topic, schedule_ids)

    def schedules_absent(self) -> HourglassError | None:
        """Why the schedule calls find no `schedules` on this node now, if
        not because this kind of node keeps none (code 403)."""
        return None

    def jobs_absent(self) -> HourglassError | None:
        """Why the job calls find no `jobs` on this node now (None: 503,
        not open yet)."""
        return None

    # Whether the backend's calls ask for no current Task before they first
    # wait (the disk broker's), so that the API's requests may start in the
    # connection's frame (broker.http.commands.Command.inline). redis-py's
    # timeouts ask for it: a Redis node's requests each run in a Task.
    backend_inline = True

    def add_own_routes(self, table: CommandTable) -> None:
        """Add what only this kind of node serves: nothing here (a cluster
        node's: the peers' /_cluster/* calls)."""
        return

    def routed(self, command: Command) -> Command:
        """The command that serves a request of the table (all but the
        peers' calls, when a peer proof guards them): the command itself
        here; a cluster node forwards API calls while it does not lead."""
        return command

    def peer_proof(self) -> Callable[[Request], bool] | None:
        """Whether a /_cluster/* request carries the cluster secret's proof
        (broker.http.gate); None: no peer calls are told apart from the API's."""
        return None

    # == what every node serves the same way =======================================

    def app(self) -> Gate:
        """The node's HTTP app: its command table, behind the gate that
        looks a request's command up on its head (broker.http.gate). With a peer
        proof, the peers' calls (Auth.PEER) are served as they are (the gate
        checks the proof); every other command is as `routed` makes it."""
        table = CommandTable(self.api.single_cap, self.serving)
        table.add("GET", "/health", self.health, where=NODE, inline=True)  # (the shards' links: `degraded`)
        table.add("GET", "/metrics", self.metrics_text, where=NODE, inline=self.backend_inline)
        table.add("GET", PREFIX + "getShardMap", self.shard_map, where=NODE, errors=API_ERRORS)
        self.add_own_routes(table)
        self.serving.add_routes(table)
        self.api.add_routes(table, inline=self.backend_inline)
        features = self.features
        PushApi(lambda: features.pushers, PushAllow.parse(self.config.push_allow), self.config.bodies,
                self.config.max_msg_bytes).add_routes(table)
        FlowApi(features.flow, self.config.bodies, self.config.max_msg_bytes).add_routes(table)
        ScheduleApi(lambda: features.schedules, self.config.defaults, self.config.bodies, self.config.max_msg_bytes,
                    self.clock.now_ms, self.schedules_absent).add_routes(table)
        self.job_api.add_routes(table)
        token = self.config.auth_token
        sessions = None
        if self.console is not None:
            sessions = ConsoleSessions(self.config.console, self.clock)
            table.add("GET", CONSOLE, console_entry(token, sessions, self.console.page), where=HERE)
            self.console.add_routes(table)
            ConsoleLogin(token, sessions, table.call).add_routes(table)
        is_peer = self.peer_proof()
        table.alter(lambda command: command if command.auth is Auth.PEER and is_peer is not None
                    else self.routed(command))
        return Gate(table, token, self.config.host, self.config.allowed_hosts, is_peer=is_peer,
                    console_auth=None if sessions is None else console_auth(sessions))

    async def shard_ports(self) -> list[int]:
        """Where each shard takes requests of its own: the node's port, one process."""
        return [self.config.port]

    async def shard_map(self, request: Request) -> Response:
        """getShardMap: how many shards, each one's own port, and the
        placement (docs/api.md, "Shards"), for a client that sends each
        message to its shard."""
        ports = await self.shard_ports()
        return answer(200, "success", shards=len(ports), ports=ports, placement="crc32")

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
        return metrics_answer(await self.metrics_families())

    async def metrics_families(self, choice: Choice | None = None) -> list[Family]:
        """What GET /metrics shows of this node (broker.http.scrape), the
        topics `choice` names if given (a shard's part of its node's)."""
        queues = self.config.queues
        limits = [single_series("hourglass_inflight_limit", GAUGE, queues.inflight, MAX),  # --max-inflight
                  single_series("hourglass_inflight_total_limit", GAUGE, queues.inflight_total, MAX)]
        families = await metrics_families(self.scraped(), self.metrics, self.process, self.config.metrics_topics,
                                          [*self.node_series(), *limits], choice)
        pushers, schedules = self.features.pushers, self.features.schedules
        if pushers is not None:  # broker.push.pusher's series, at most --metrics-topics topics of them
            from ..push.pusher import push_families
            families += push_families(pushers.stats, self.config.metrics_topics)
        if schedules is not None:  # recurring schedules' series, at most --metrics-topics of them
            from ..schedules.metrics import schedule_families
            families += await schedule_families(schedules, self.config.metrics_topics)
        return families

    def start_monitor(self) -> asyncio.Task[None]:
        """camellia's monitor interval, and the console's throughput sampler."""
        async def monitors() -> None:
            samplers: list[Coroutine[Any, Any, None]] = [
                monitor_every(self.config.monitor_interval_s, self.metrics, self.process, self.clock,
                              aligned=self.config.shard is not None)]
            if self.console is not None:
                samplers.append(self.console.run())
            await asyncio.gather(*samplers)
        return asyncio.create_task(monitors(), name="monitor")

    def node_connections(self) -> NodeConnections | None:
        """The connections of the other processes on this node's port, which
        --max-connections bounds with this one's (a node of shards'); None:
        this process is the node."""
        return None

    async def serve(self, describe: str, app: Gate | None = None) -> HttpServer:
        """Listen on --host:--port; from now on SIGTERM and SIGINT set
        `stop_asked`. `describe` names the node in the log line; `app`, its
        app if built already (a shard builds it before other shards call it)."""
        config = self.config
        server = HttpServer((app or self.app()).admit, config.http, self.descriptors, self.node_connections())
        await server.start(config.host, config.port, reuse_port=config.shard is not None)
        self.own_port = server.own_port
        log.info("serving on http://%s:%d (%s; %s)", config.host, config.port, describe, build_info.describe())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_asked.set)
        return server
