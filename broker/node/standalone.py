"""The nodes that run alone: `DiskNode` (a data directory) and `RedisNode`
(`--backend redis://...`). Both serve through broker.node.base; the
process around them is broker.node.server, and a node of a cluster is
broker.cluster's `ClusterNode`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from storage.config import FsyncPolicy
from storage.errors import ContractError, HourglassError, Unavailable
from storage.store import Store

from ..backend import Backend
from ..clock import SystemClock
from ..console.api import Console, standalone_info
from ..disk.backend import Broker
from ..disk.backups import Backups, clear_staging, parse_have
from ..flow.file import SettingsFile, ShardSettings, resumes_path, settings_path
from ..flow.keeper import TopicFlow
from ..http.api import API_ERRORS
from ..http.commands import HERE
from ..http.http_types import StreamResponse
from ..http.paths import BACKUP_PATH
from ..http.scrape import Choice, disk_series, largest, metrics_answer, topic_ranks
from ..jobs.file import JobFiles, jobs_path
from ..jobs.runner import RedriveJobs
from ..observe.metrics import COUNTER, GAUGE, MAX, Family, Metrics, single_series
from ..schedules.file import ScheduleFile, schedules_path
from ..schedules.keeper import Schedules
from ..tasks import cancel_and_wait
from .base import NodeBase
from .config import ServeConfig

if TYPE_CHECKING:
    from ..http.commands import Command, CommandTable
    from ..http.http_types import Request, Response
    from ..http.httpd import NodeConnections
    from ..jobs.runner import JobStore
    from ..push.pusher import SubscriptionFile
    from ..redis.backend import RedisBroker
    from ..redis.flow import RedisTopicSettings
    from ..schedules.keeper import ScheduleStore
    from ..shards.backend import ShardedBackend
    from ..shards.router import ShardRouter

log = logging.getLogger("hourglass.server")

# getShardMap waits this many times this long for a shard that has no port yet (starting).
PORT_WAITS = 50
PORT_WAIT_S = 0.1


# What a "metrics" call asks of a shard (`DiskNode.metrics_text`): its topics' ranks, or its families of
# the node's choice of topics.
RANKS, FAMILIES = "ranks", "families"

# /health's role fields of a node that runs alone
STANDALONE: Mapping[str, object] = MappingProxyType({"role": "standalone", "leader": None, "node": None})


def add_backup_routes(table: CommandTable, backups: Backups) -> None:
    """GET and POST backupShard: an online backup of the store of the node
    it reaches, as a stream (broker.disk.backups); on a node of shards
    each shard's own port (getShardMap) answers for its own, on a cluster
    any node for its own."""
    async def backup_shard(request: Request) -> StreamResponse:
        have = parse_have(request.body) if request.method == "POST" else None
        return StreamResponse(backups.stream(have), content_type="application/octet-stream")

    for method in ("GET", "POST"):
        table.add(method, BACKUP_PATH, backup_shard, where=HERE, errors=API_ERRORS)


class DiskRecords:
    """A standalone node's features' records (broker.node.features): files
    in its data directory; on a node of shards, the topic settings are
    shard 0's (the others keep only their resumes' progress)."""

    def __init__(self, config: ServeConfig) -> None:
        self._path = config.data_path
        self._fsync = config.store.fsync is not FsyncPolicy.NEVER
        self._shard, self._node_path = config.shard, config.node_path

    def __repr__(self) -> str:
        return f"DiskRecords({self._path!r})"

    def settings(self) -> SettingsFile | ShardSettings:
        shard = self._shard
        if shard is None or shard[0] == 0:
            return SettingsFile(settings_path(self._path))
        from ..shards.layout import shard_path
        return ShardSettings(settings_path(shard_path(self._node_path, 0, shard[1])), resumes_path(self._path))

    def subscriptions(self) -> SubscriptionFile:
        from ..push.pusher import SubscriptionFile, subscription_path
        return SubscriptionFile(subscription_path(self._path))

    def schedules(self) -> ScheduleFile:
        return ScheduleFile(schedules_path(self._path), self._fsync)

    def jobs(self) -> JobFiles:
        return JobFiles(jobs_path(self._path), self._fsync)


class DiskNode(NodeBase):
    """A standalone node: store, broker, HTTP app, checkpoints."""

    def __init__(self, config: ServeConfig) -> None:
        clock = SystemClock()
        started = time.perf_counter()
        store_config, queues, schedule_limits = config.store, config.queues, config.schedules
        if config.shard is not None:  # the node's budgets, this shard's share (broker.shards.budgets)
            from ..shards.budgets import shard_queues, shard_schedules, shard_store
            queues, schedule_limits = shard_queues(queues, *config.shard), shard_schedules(schedule_limits, *config.shard)
            store_config = shard_store(store_config, *config.shard)
        self.store = Store.open(config.data_path, store_config, now_ms=clock.now_ms())
        metrics = Metrics()
        self.broker = Broker(self.store, clock, config.defaults, metrics,
                             tick_path=os.path.join(config.data_path, "tick"), limits=queues)
        self.broker.on_fatal = lambda error: self.stop_asked.set()
        opened_s = time.perf_counter() - started
        self.checkpoints = 0
        self.checkpoint_seconds = 0.0
        # online backups of the store (GET backupShard), which hold checkpoints off while they run
        clear_staging(config.data_path)
        self.backups = Backups(lambda: self.store, config.data_path, self.broker.commits.at_quiet_point,
                               self._backup_checkpoint, config.shard or (0, 1))
        self.last_checkpoint_ms: int | None = None
        # Shard i of a node of many (broker.shards): the API serves the node through its router.
        self.router: ShardRouter | None = None
        self.served: ShardedBackend | None = None  # a shard's node-wide backend (its API's, its pushers')
        served: Broker | ShardedBackend = self.broker
        if config.shard is not None:
            from ..shards.backend import ShardedBackend
            from ..shards.layout import links_path
            from ..shards.router import ShardRouter
            self.router = ShardRouter(*config.shard, links_path(config.node_path), config.bodies,
                                      config.max_msg_bytes)
            self.router.attach(self.broker, self.broker.long_polls)
            served = ShardedBackend(self.router, self.broker)
            self.served = served
        console = Console(lambda: self.store, metrics, self.broker.topic_list,
                          lambda: standalone_info(self.store, lambda: self.last_checkpoint_ms), clock.now_ms,
                          lambda: [] if self.features.pushers is None else self.features.pushers.public(),
                          lambda: self.features.schedules)
        super().__init__(config, clock, metrics, served, console, DiskRecords(config),
                         schedule_limits=schedule_limits)
        # the schedules read and told of the broker's releases, the pauses carried out before anything is
        # handed out, the jobs read (broker.node.features): with the store, the node's opening
        started = time.perf_counter()
        self.features.attach(self.broker)
        self.opened_s = opened_s + time.perf_counter() - started
        if self.router is not None:
            self._serve_shards(self.router, served)
        log.info("opened %s in %.3f s: %s", config.data_path, self.opened_s, self.store)
        if self.store.ends is not None and self.store.ends.rebuilt is not None:
            log.warning("the end index was made again, empty (%s): ids that ended before the last checkpoint "
                        "under a dedupWindowMillis are stored anew if sent again", self.store.ends.rebuilt)

    def add_own_routes(self, table: CommandTable) -> None:
        add_backup_routes(table, self.backups)

    def scraped(self) -> Backend | None:
        """A shard's own broker: each shard shows its part of the node's
        topics, which `metrics_text` merges, not the node's merged views."""
        return None if self.api.broker is None else self.broker

    def __repr__(self) -> str:
        return f"DiskNode({self.config.data_path!r}, checkpoints={self.checkpoints}, {self.store!r})"

    def pushes_here(self, topic: str) -> bool:
        """One shard pushes a topic's subscription for the node, through the
        node's backend (`pushed_through`): the shard its name places it on."""
        if self.router is None:
            return True
        from ..shards.placement import owner
        return owner(topic, self.router.count) == self.router.index

    @property
    def pushed_through(self) -> Backend:
        """What the pushers pull from and ack through: the node's messages
        (a node of shards: every shard's, by the router), as the API's are."""
        return self.broker if self.served is None else self.served

    def node_connections(self) -> NodeConnections | None:
        if self.config.shard is None:
            return None
        from ..shards.connections import ConnectionBoard
        from ..shards.layout import links_path
        return ConnectionBoard(links_path(self.config.node_path), *self.config.shard)

    def _serve_shards(self, router: ShardRouter, served: object) -> None:
        """The API's hooks of a shard: new msgIds it owns, the node's views,
        a run msgId's schedule asked of its owner; the calls other shards make."""
        from ..shards.backend import ShardedBackend, scheduled_on_owners
        from ..shards.jobs import JOB_OPS, ShardJobs
        assert isinstance(served, ShardedBackend)
        here = NodeBase.scheduled.__get__(self)
        self.api.make_id = router.owns_new
        self.api.views = served
        self.api.scheduled = lambda topic, ids: scheduled_on_owners(router, here, topic, ids)
        self.job_api.calls = ShardJobs(router)  # a job on every shard (broker.shards.jobs)
        router.jobs_here = lambda: self.features.jobs
        # the calls this shard's features answer for the others
        router.ops["scheduled"] = lambda args: self._scheduled_here(here, args)
        router.ops["metrics"] = self._metrics_here
        router.ops["port"] = lambda args: self._own_port()
        for op in JOB_OPS:
            router.ops[op] = functools.partial(self._job_call, router, op)
        console = self.console
        if console is not None:  # its topics and schedules tables: the node's
            async def counts(names: list[str]) -> list[list[int]]:
                parts = await router.everywhere("console_counts", [names], lambda: console.counts_here(names))
                return [[sum(c) for c in zip(*rows)] for rows in zip(*parts)]

            async def schedule_rows(topic: str | None, first: int) -> tuple[int, list[dict[str, object]]]:
                parts = await router.everywhere("console_schedules", [topic, first],
                                                lambda: console.schedule_rows_here(topic, first))
                rows = sorted((row for _, got in parts for row in got),
                              key=lambda row: (str(row["topic"]), str(row["scheduleId"])))
                return sum(total for total, _ in parts), rows[:first]

            console.node_topics = served.all_topics
            console.node_counts = counts
            console.node_schedule_rows = schedule_rows
            router.ops["console_counts"] = lambda args: console.counts_here(list(args[0]))
            router.ops["console_schedules"] = lambda args: console.schedule_rows_here(args[0], int(args[1]))

    @staticmethod
    async def _scheduled_here(here: Callable[[str, Sequence[str]], Awaitable[set[str]]], args: Sequence[Any]) -> Any:
        return sorted(await here(str(args[0]), list(args[1])))

    async def _job_call(self, router: ShardRouter, op: str, args: Sequence[Any]) -> Any:
        from ..shards.jobs import serve_shard_call
        return await serve_shard_call(self.features.jobs, op, args, router.index, router.count)

    async def metrics_text(self, request: Request) -> Response:
        """/metrics: a shard answers for the node. Every shard's topics'
        ranks summed choose the node's --metrics-topics topics, as a node
        alone chooses its own (broker.http.scrape); every shard's families
        of exactly those topics, merged by their labels (broker.shards.views),
        are the answer."""
        router = self.router
        if router is None:
            return await super().metrics_text(request)
        from ..shards.views import families_of, merge_families, merge_ranks, node_topics
        ranks = merge_ranks(await router.everywhere("metrics", [RANKS], lambda: self._metrics_here([RANKS])))
        asked = [FAMILIES, await largest(ranks, self.config.metrics_topics), node_topics(ranks)]
        parts = await router.everywhere("metrics", asked, lambda: self._metrics_here(asked))
        return metrics_answer(merge_families([families_of(part) for part in parts]))

    async def _metrics_here(self, args: Sequence[Any]) -> Any:
        """This shard's answer to a "metrics" call (`metrics_text`), as it travels."""
        if args[0] == RANKS:
            ranks = await topic_ranks(self.metrics, await self.broker.topic_backlogs())
            return {topic: list(rank) for topic, rank in ranks.items()}
        from ..shards.views import family_fields
        families = await self.metrics_families(Choice(list(args[1]), int(args[2])))
        return [family_fields(family) for family in families]

    async def shard_ports(self) -> list[int]:
        router = self.router
        if router is None:
            return await super().shard_ports()
        for _ in range(PORT_WAITS):  # a shard that is starting has no port yet: wait for it a little
            try:
                ports = await router.everywhere("port", [], self._own_port)
            except Unavailable:
                await asyncio.sleep(PORT_WAIT_S)
                continue
            return [int(p) for p in ports]
        raise Unavailable("a shard of the node is starting; retry")

    async def _own_port(self) -> int:
        if self.own_port is None:
            raise Unavailable("the shard is starting; retry")
        return self.own_port

    def routed(self, command: Command) -> Command:
        """A shard's commands as the node's (broker.shards.router.ShardRouter.route)."""
        return command if self.router is None else self.router.route(command)

    def failure(self) -> BaseException | None:
        return self.broker.failed

    def degraded(self) -> str | None:
        router = self.router
        if router is not None:
            down = router.down()
            if down:
                return f"shard{'s' if len(down) > 1 else ''} {', '.join(map(str, down))} of this node not up"
        return None

    def health_fields(self) -> Mapping[str, object]:
        if self.router is not None:  # which shard answered, of how many
            return {**STANDALONE, "shard": self.router.index, "shards": self.router.count}
        return STANDALONE

    def node_series(self) -> Sequence[Family]:
        hours = self.store.hours()
        return [single_series("hourglass_hours", GAUGE, len(hours)),
                single_series("hourglass_stored_messages", GAUGE, sum(h[1] for h in hours)),
                single_series("hourglass_ended_messages", GAUGE, sum(h[2] for h in hours)),
                single_series("hourglass_commit_log_end_offset", GAUGE, self.store.log_end_offset),
                single_series("hourglass_checkpoints_total", COUNTER, self.checkpoints),
                single_series("hourglass_checkpoint_seconds_total", COUNTER, self.checkpoint_seconds),
                single_series("hourglass_open_seconds", GAUGE, self.opened_s, MAX),
                single_series("hourglass_wheel_released_total", COUNTER, self.broker.scheduler.stats.released),
                single_series("hourglass_wheel_lag_seconds", GAUGE,
                              self.broker.scheduler.lag_ms(self.clock.now_ms()) / 1000, MAX),
                *disk_series(self.store, self.config.data_path),
                *(() if self.router is None else (
                    # calls this shard made of the others, and they of it (docs/operations.md, "Shards")
                    single_series("hourglass_shard_forwards_total", COUNTER, self.router.forwarded),
                    single_series("hourglass_shard_calls_served_total", COUNTER, self.router.served)))]

    async def _backup_checkpoint(self) -> None:
        """A backup's first checkpoint: one that fails fails the node, as in the checkpoint loop (broker.node.server)."""
        try:
            await self.checkpoint()
        except Exception as e:
            self.broker.fail(e, "a checkpoint")
            raise

    async def checkpoint(self) -> None:
        """The checkpoint is prepared by the group commit at a quiet point
        (everything appended applied, and the wheel told of it), which a busy
        node reaches every commit; its syncfs runs in a worker thread while
        requests go on. Skipped when it would change nothing (an idle node
        rewrites nothing)."""
        async with self.backups.lock:  # (a backup running keeps the files its first step reads)
            if not self.store.checkpoint_due(self.clock.now_ms()):
                return
            started = time.perf_counter()
            prepared = await self.broker.prepared_at_quiet_point(lambda: self.store.prepare_checkpoint(self.clock.now_ms()))
            await asyncio.to_thread(self.store.sync_checkpoint)  # the slow part, off the event loop
            self.store.finish_checkpoint(prepared)
        self.checkpoints += 1
        self.checkpoint_seconds += time.perf_counter() - started
        self.last_checkpoint_ms = self.clock.now_ms()


class RedisRecords:
    """A Redis node's features' records (broker.node.features): topic
    settings in Redis, shared by every node on it (broker.redis.flow); push
    subscriptions in the node's own --data-dir (docs/api.md, "Push
    delivery"). The schedules and the jobs are not attached: the node that
    holds their lease runs them (broker.redis.schedules, broker.redis.jobs)."""

    def __init__(self, broker: RedisBroker, data_path: str) -> None:
        self._broker = broker
        self._path = data_path

    def __repr__(self) -> str:
        return f"RedisRecords({self._broker!r}, {self._path!r})"

    def settings(self) -> RedisTopicSettings:
        return self._broker.topic_settings

    def subscriptions(self) -> SubscriptionFile:
        from ..push.pusher import SubscriptionFile, subscription_path
        os.makedirs(self._path, mode=0o700, exist_ok=True)
        return SubscriptionFile(subscription_path(self._path))

    def schedules(self) -> ScheduleStore:
        raise ContractError("a Redis node's schedules are run by the holder of their lease, not attached")

    def jobs(self) -> JobStore:
        raise ContractError("a Redis node's jobs are run by the holder of their lease, not attached")


class RedisNode(NodeBase):
    """A node whose state lives in Redis (`--backend redis://...`): no data
    dir and no checkpoints; any number of such nodes may share the Redis."""

    backend_inline = False  # redis-py's timeouts ask for the current Task (broker.node.base)

    def __init__(self, config: ServeConfig) -> None:
        from ..redis.backend import RedisBroker  # the redis extra is optional
        from ..redis.keys import RedisConfig

        clock = SystemClock()
        metrics = Metrics()
        self.broker: RedisBroker = RedisBroker.from_url(config.backend, clock, config.defaults, metrics,
                                                        RedisConfig(bulk_batch=config.redis_bulk_batch),
                                                        max_topics=config.queues.topics)
        self.broker.on_fatal = lambda error: self.stop_asked.set()
        super().__init__(config, clock, metrics, self.broker, None, RedisRecords(self.broker, config.data_path),
                         shared_settings=self.broker.topic_settings)
        # topic settings and pauses in Redis, read again every poll_ms (broker.redis.flow): `open_flow`
        self._flow_reload: asyncio.Task[None] | None = None
        # this node's id in Redis, kept in --data-dir across restarts (its lock's descriptor held while it
        # runs): a restarted node takes its own leases back at once (broker.redis.identity)
        from ..redis.identity import node_identity
        self.node_id, self._node_id_lock = node_identity(config.data_path)
        # recurring schedules, served by every node, their runs made by the one holding their lease in Redis
        # (broker.redis.schedules); redriveMsgs jobs, their records in Redis, served by every node, run by the
        # one holding their lease (broker.redis.jobs)
        from ..redis.jobs import JobWork
        from ..redis.lease import RedisLease
        from ..redis.schedules import ScheduleWork
        redis, prefix, lease_ms = self.broker.redis, self.broker.config.key_prefix, self.broker.config.lease_ms
        self.schedule_lease = RedisLease(redis, ScheduleWork(redis, prefix, self.broker, clock, config.schedules,
                                                             self._hold_schedules, lease_ms=lease_ms),
                                         clock, lease_ms=lease_ms, node=self.node_id)
        self.job_lease = RedisLease(redis, JobWork(redis, prefix, self.broker, clock, config.jobs, self._hold_jobs),
                                    clock, lease_ms=lease_ms, node=self.node_id)

    def __repr__(self) -> str:
        return f"RedisNode({self.broker!r}, {self.schedule_lease!r}, {self.job_lease!r})"

    async def open_flow(self) -> None:
        """Read the topic settings and pauses from Redis and carry them out
        (before the node listens), then read them again every poll_ms, so
        that another node's change takes effect here within it."""
        await self.broker.topic_settings.read()
        flow = self.features.flow
        flow.start(self.broker)
        self._flow_reload = asyncio.create_task(self._reload_flow(flow), name="flow-reload")

    async def _reload_flow(self, flow: TopicFlow) -> None:
        problem = None
        while True:
            await self.clock.sleep(self.broker.config.poll_ms / 1000)
            try:
                await flow.reload()
            except HourglassError as e:  # Redis away, or an entry no node wrote: the last settings stay
                if str(e) != problem:
                    log.error("reading the topic settings from Redis: %s; retrying", e)
                problem = str(e)
            else:
                problem = None

    async def close_flow(self) -> None:
        task, self._flow_reload = self._flow_reload, None
        if task is not None:
            await cancel_and_wait((task,))

    def paused(self, topic: str) -> bool | list[str] | None:
        """None: getTopicInfo's `paused` is the backend's, read from Redis
        with the sizes (whichever node paused it)."""
        return None

    def _hold_schedules(self, schedules: Schedules | None) -> None:
        self.features.schedules = schedules

    def _hold_jobs(self, jobs: RedriveJobs) -> None:
        self.features.jobs = jobs

    def jobs_absent(self) -> HourglassError | None:
        return Unavailable("the node is reading the redriveMsgs jobs from Redis (starting); retry")

    async def scheduled(self, topic: str, schedule_ids: Sequence[str]) -> set[str]:
        """As Redis holds the schedules: any node takes sends."""
        from ..redis.schedules import scheduled
        return await scheduled(self.broker.redis, self.broker.config.key_prefix, topic, schedule_ids)

    def schedules_absent(self) -> HourglassError | None:
        return Unavailable("the node is reading the recurring schedules from Redis (starting); retry")

    def failure(self) -> BaseException | None:
        return self.broker.failed

    def degraded(self) -> str | None:
        return self.broker.problem  # Redis unreachable or refusing: requests answer 503 meanwhile

    def health_fields(self) -> Mapping[str, object]:
        return STANDALONE

    def node_series(self) -> Sequence[Family]:
        # 1 on the node that holds the schedules lease (makes the runs), 0 on the others; the same of the jobs'
        return [single_series("hourglass_schedules_lease", GAUGE, float(self.schedule_lease.holding)),
                single_series("hourglass_jobs_lease", GAUGE, float(self.job_lease.holding))]
