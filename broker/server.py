"""`hourglass serve`: the process around the broker.

Start: set the umask to 077; make the data directory ready (made private
if missing; refused if read-only, or open to group or others without
--allow-shared-data-dir: storage.data_dir), open (and recover) it;
rebuild the ready and consuming queues, start the group-commit, wheel
and timer tasks, then listen. Every `checkpoint_interval_ms` the store
is checkpointed.
SIGTERM or SIGINT: stop accepting connections, answer long polls in
flight, finish the requests in flight, stop the wheel (its tick persisted),
commit, take a last checkpoint, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable

from storage import data_dir
from storage.errors import DataDirError
from storage.files import raise_descriptor_limit
from storage.store import Store

from .api import Api, Router, answer, console_auth, console_entry
from .camellia_metrics import ProcessStats
from .clock import SystemClock
from .config import ServeConfig
from .console import Console, standalone_info
from .console_login import ConsoleLogin
from .console_sessions import ConsoleSessions
from .disk_broker import Broker
from .gate import Gate
from .httpd import Admit, Dispatch, HttpServer, Request, Response
from .metrics import Metrics
from .redact import client_text
from .scrape import metrics_response
from .serving import offline_health, serving_status

log = logging.getLogger("hourglass.server")

# How long a stop waits for requests in flight (long polls are answered at once).
SHUTDOWN_TIMEOUT_S = 10
# The serving process's umask: besides the store's own files (made 0600,
# storage.fileutil), what libraries make in the data directory (pysyncobj's
# Raft journal, a snapshot's tar, the leadership log) is its owner's alone.
PRIVATE_UMASK = 0o077


async def checkpoint_every(interval_ms: int, checkpoint: Callable[[], Awaitable[None]],
                           fail: Callable[[BaseException, str], None]) -> None:
    """Run `checkpoint` every interval. A failure stops the loop and is
    fatal (`fail`): the commit log would grow without bound; a restart
    recovers from it."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            await checkpoint()
        except Exception as e:
            fail(e, "a checkpoint")
            return


async def monitor_every(interval_s: int, metrics: Metrics, process: ProcessStats, clock: SystemClock) -> None:
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


def start_monitor(node, config: ServeConfig) -> asyncio.Task:
    """camellia's monitor interval, and the console's throughput sampler."""
    async def monitors() -> None:
        samplers = [monitor_every(config.monitor_interval_s, node.metrics, node.process, node.clock)]
        if getattr(node, "console", None) is not None:
            samplers.append(node.console.run())
        await asyncio.gather(*samplers)
    return asyncio.create_task(monitors(), name="monitor")


class Node:
    """A standalone node: store, broker, HTTP app, checkpoint loop."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.clock = SystemClock()
        started = time.perf_counter()
        self.store = Store.open(config.data_path, config.store, now_ms=self.clock.now_ms())
        self.metrics = Metrics()
        self.broker = Broker(self.store, self.clock, config.defaults, self.metrics,
                             tick_path=os.path.join(config.data_path, "tick"), limits=config.queues)
        self.opened_s = time.perf_counter() - started
        self.process = ProcessStats()
        self.serving = serving_status(config, self.broker.wake_all)
        self.api = Api(self.broker, config.max_msg_bytes, config.bodies, self.serving)
        self.checkpoints = 0
        self.checkpoint_seconds = 0.0
        self.last_checkpoint_ms: int | None = None
        self.console = Console(lambda: self.store, self.metrics, self.broker.topic_list,
                               lambda: standalone_info(self.store, lambda: self.last_checkpoint_ms),
                               self.clock.now_ms)
        log.info("opened %s in %.3f s: %s", config.data_path, self.opened_s, self.store)

    def app(self) -> tuple[Dispatch, Admit]:
        """The node's HTTP app: what answers a request, and what decides on
        its head (broker.gate)."""
        router = Router()
        router.add("GET", "/health", self.health)
        router.add("GET", "/metrics", self.metrics_text)
        self.serving.add_routes(router)
        self.api.add_routes(router)
        sessions = None
        if self.console is not None:  # (the Redis backend has none: no second tables)
            self.console.add_routes(router)
            sessions = ConsoleSessions(self.config.console, self.clock)
            ConsoleLogin(self.config.auth_token, sessions, self.serving.track(router.dispatch)).add_routes(router)
        token = self.config.auth_token
        gate = Gate(router, self.api.body_cap, token, self.config.host, self.config.allowed_hosts,
                    console_auth=None if sessions is None else console_auth(sessions))
        return console_entry(token, sessions, self.serving.track(router.dispatch)), gate.admit

    async def health(self, request: Request) -> Response:
        if self.broker.failed is not None:
            return answer(503, f"failed: {client_text(self.broker.failed)}", status="failed", role="standalone",
                          leader=None, node=None)
        if not self.serving.online:
            return offline_health("standalone", leader=None, node=None)
        return answer(200, "success", status="ok", role="standalone", leader=None, node=None)

    async def metrics_text(self, request: Request) -> Response:
        hours = self.store.hours()
        node = [("hourglass_hours", "gauge", len(hours)),
                ("hourglass_stored_messages", "gauge", sum(h[1] for h in hours)),
                ("hourglass_ended_messages", "gauge", sum(h[2] for h in hours)),
                ("hourglass_commit_log_end_offset", "gauge", self.store.log_end_offset),
                ("hourglass_checkpoints_total", "counter", self.checkpoints),
                ("hourglass_checkpoint_seconds_total", "counter", self.checkpoint_seconds),
                ("hourglass_open_seconds", "gauge", self.opened_s),
                ("hourglass_wheel_released_total", "counter", self.broker.scheduler.stats.released)]
        return await metrics_response(self, node)

    async def checkpoint(self) -> None:
        """The checkpoint is prepared by the group commit at a quiet point
        (everything appended applied, and the wheel told of it), which a busy
        node reaches every commit; its syncfs runs in a worker thread while
        requests go on. Skipped when it would change nothing (an idle node
        rewrites nothing)."""
        if not self.store.checkpoint_due(self.clock.now_ms()):
            return
        started = time.perf_counter()
        prepared = await self.broker.commits.at_quiet_point(
            lambda: self.store.prepare_checkpoint(self.clock.now_ms()))
        await asyncio.to_thread(self.store.sync_checkpoint)  # the slow part, off the event loop
        self.store.finish_checkpoint(prepared)
        self.checkpoints += 1
        self.checkpoint_seconds += time.perf_counter() - started
        self.last_checkpoint_ms = self.clock.now_ms()


class RedisNode:
    """A node whose state lives in Redis (`--backend redis://...`): no data
    dir and no checkpoints; any number of such nodes may share the Redis."""

    def __init__(self, config: ServeConfig) -> None:
        from .redis.backend import RedisBroker  # the redis extra is optional

        self.config = config
        self.clock = SystemClock()
        self.metrics = Metrics()
        self.broker = RedisBroker.from_url(config.backend, self.clock, config.defaults, self.metrics,
                                           max_topics=config.queues.topics)
        self.process = ProcessStats()
        self.serving = serving_status(config, self.broker.wake_all)
        self.api = Api(self.broker, config.max_msg_bytes, config.bodies, self.serving)
        self.console = None

    app = Node.app

    async def health(self, request: Request) -> Response:
        problem = self.broker.problem
        if problem is not None:  # Redis unreachable or refusing: requests answer 503 meanwhile
            return answer(503, problem, status="degraded", role="standalone", leader=None, node=None)
        return await Node.health(self, request)

    async def metrics_text(self, request: Request) -> Response:
        return await metrics_response(self, [])


async def listen(node, config: ServeConfig) -> HttpServer:
    dispatch, admit = node.app()
    server = HttpServer(dispatch, admit, config.http)
    await server.start(config.host, config.port)
    return server


async def _serve_until_stopped(node, config: ServeConfig, describe: str) -> None:
    """Listen, run until SIGTERM/SIGINT or a fatal error, then stop taking
    work: answer long polls and finish the requests in flight."""
    server = await listen(node, config)
    log.info("serving on http://%s:%d (%s)", config.host, config.port, describe)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    node.broker.on_fatal = lambda error: stop.set()
    await stop.wait()
    log.info("stopping: answering long polls, finishing requests")
    node.broker.begin_stop()
    await server.close(SHUTDOWN_TIMEOUT_S)


async def run_redis(config: ServeConfig) -> int:
    node = None
    try:
        node = RedisNode(config)
        await node.broker.start()
    except Exception as e:  # the error names the URL, its password hidden
        log.critical("%s", e)
        if node is not None:
            await node.broker.stop()
        return 1
    monitor = start_monitor(node, config)
    await _serve_until_stopped(node, config, f"state in {node.broker.url}")
    monitor.cancel()
    failed = node.broker.failed
    await node.broker.stop()
    log.info("stopped")
    return 1 if failed is not None else 0


async def run_cluster(config: ServeConfig) -> int:
    """A cluster node: serve HTTP (API, /_cluster/ log stream) at once, follow,
    lead when elected; SIGTERM hands the lead over before stopping."""
    # The cluster's modules, aiohttp's client among them (about 0.3 s of
    # start-up), load on a cluster node only, not on every standalone one.
    import aiohttp

    from .cluster import ClusterNode

    try:
        node = ClusterNode(config, config.cluster, SystemClock())
    except OSError as e:  # as a standalone node's (run)
        log.critical("cannot open the data directory %s: %s", config.data_path, e)
        return 1
    node.session = aiohttp.ClientSession()
    server = await listen(node, config)
    log.info("serving on http://%s:%d (node %s of %s)", config.host, config.port, config.cluster.node_id,
             ",".join(config.cluster.peers))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    node.on_fatal = lambda error: stop.set()
    roles = asyncio.create_task(node.run(), name="roles")
    checkpoints = asyncio.create_task(checkpoint_every(config.checkpoint_interval_ms, node.checkpoint, node.fail),
                                      name="checkpoints")
    monitor = start_monitor(node, config)
    roles.add_done_callback(lambda t: t.cancelled() or t.exception() is None or node.fail(t.exception(), "roles"))
    await stop.wait()
    log.info("stopping: handing over")
    roles.cancel()
    checkpoints.cancel()
    monitor.cancel()
    await asyncio.gather(roles, checkpoints, monitor, return_exceptions=True)
    await node.handover()
    await server.close(SHUTDOWN_TIMEOUT_S)
    await node.close()
    log.info("stopped")
    return 1 if node.failed is not None else 0


async def run(config: ServeConfig) -> int:
    if config.backend != "disk":
        return await run_redis(config)
    if config.cluster is not None:
        return await run_cluster(config)
    try:
        node = Node(config)
    except OSError as e:  # one a check before could not foresee (a file in it this user may not write)
        log.critical("cannot open the data directory %s: %s", config.data_path, e)
        return 1
    node.broker.start()
    checkpoints = asyncio.create_task(checkpoint_every(config.checkpoint_interval_ms, node.checkpoint,
                                                       node.broker.fail))
    monitor = start_monitor(node, config)
    await _serve_until_stopped(node, config, "standalone")
    checkpoints.cancel()
    monitor.cancel()
    if node.broker.failed is not None:  # no last checkpoint over a state RAM and disk disagree on
        log.critical("exiting after a failure; the next start recovers from the commit log")
        return 1
    await node.broker.stop()
    node.store.checkpoint(node.clock.now_ms())  # the tasks are stopped: nothing can append now
    node.store.close()
    log.info("stopped")
    return 0


def check_data_dir(config: ServeConfig) -> None:
    """Make the data directory ready before anything opens it
    (storage.data_dir.prepare), and refuse one group or others have any
    permission on, naming the command that makes it private; with
    --allow-shared-data-dir, warn instead. Raises DataDirError."""
    path = config.data_path
    data_dir.prepare(path)
    shared = data_dir.shared_entries(path)
    if not shared:
        return
    first, mode = shared[0]
    more = f", and {len(shared) - 1} more in it" if len(shared) > 1 else ""
    what = f"the data directory {path} is open to group or others ({first} has mode {mode:04o}{more})"
    if not config.allow_shared_data_dir:
        raise DataDirError(f"{what}: run `{data_dir.private_command(path)}`, or pass --allow-shared-data-dir")
    log.warning("%s; starting all the same (--allow-shared-data-dir)", what)


def serve(config: ServeConfig) -> int:
    os.umask(PRIVATE_UMASK)
    if config.backend == "disk":  # a standalone or cluster node
        try:
            check_data_dir(config)
        except DataDirError as e:
            log.critical("%s", e)
            return 1
        raise_descriptor_limit()  # before its store sizes its cache of open files by it
    try:
        import uvloop  # a faster event loop where it is installed (Linux, macOS)
    except ImportError:
        return asyncio.run(run(config))
    return uvloop.run(run(config))
