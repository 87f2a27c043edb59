"""The message lifecycle (docs/api.md) with its state in Redis: `hourglass
serve --backend redis://...`.

`RedisBroker` is a `broker.backend.Backend`, as the disk
`broker.disk.backend.Broker` is (send, pull, long_poll, ack incl. nack, delete,
get, reschedule, dead letters, topic_info, topic_list), so `broker.http.api.Api`
serves it unchanged, with the same lifecycle (broker.core.transitions
has the table). Several hourglass processes may share
one Redis: every read and transition is ONE Lua script over one topic's
keys, so Redis runs it atomically and no message is moved, pulled or
retried twice. A bulk call is the exception: its changes are applied in
scripts of bounded size, fenced so that no client sees it half made
(broker.redis.bulk).

Keys, their layout and the URL: broker.redis.keys. The client, the
scripts and the wakes, which every part calls: broker.redis.link.

Topics: a send to a topic not in the topic set registers it first (one
script over the set alone), refused with 429 if the set would pass
--max-topics. The set is never pruned (a topic's keys and the set are in
different Cluster slots, so no script can check a topic empty and remove
it atomically): on Redis, a topic counts against the cap from its first
send until it is removed from `<prefix>:topics` by hand.

Tasks: `_mover` runs TICK on every topic (waiting -> ready or expired, ack
timeouts, ready expiry, purge of retired messages), then sleeps until the
earliest score it saw (at most `poll_ms`, to notice other processes'
topics), woken early by a local send due sooner. `_listener` receives the
wake channel (pattern-subscribed) and wakes this process's long polls.
Whoever makes a message READY (send, mover, nack, a give-back) publishes
the wake.

Redis trouble is answered, not hung on: every command has a timeout and a
few quick retries; a Redis that is unreachable, refuses the password, is
out of memory or holds a key of the wrong type under the prefix makes the
request fail with `Unavailable` (HTTP 503) saying which, and the tasks
retry until it is back (broker.redis.link). `?cluster=1` in the URL
selects Redis Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from storage.errors import Unavailable
from wheel.clock import Clock

from ..core.lifecycle import Lifecycle
from ..core.long_polls import LongPolls
from ..core.params import Defaults
from ..disk.ready import QueueLimits
from ..observe.metrics import Metrics
from ..tasks import cancel_and_wait
from .bulk import RedisBulk
from .flow import RedisTopicSettings
from .keys import RedisConfig, split_cluster_flag
from .link import REDIS_ERRORS, Fenced, RedisLink, made_ready
from .requests import RedisRequests

log = logging.getLogger("hourglass.redis")


class RedisBroker:
    """The broker over one Redis database (or Redis Cluster); a
    `broker.backend.Backend`, as the disk broker is. `await start()` checks the
    connection and launches the mover and the wake listener; `await stop()`
    ends them and closes the client.

    Example: a send with delayMillis=5000 runs SEND (meta, body, waiting
    zset) and wakes this process's mover if it was sleeping past the
    trigger; 5 s later the mover's TICK puts it in `ready` and publishes the
    wake; a long poll on any process pulls it with PULL (-> `ack` zset,
    deadline now + ackTimeoutMillis); without an ack, a TICK after the
    deadline makes it READY with retry 1. Each step costs one round trip and
    O(log n) in Redis; the mover costs one TICK per topic per round.

    Its parts, built here in the order they depend on one another:

        long_polls  LongPolls: pulls waiting on their topic (broker.core.long_polls)
        link        RedisLink: the client, the scripts, the wakes, and what
                    this process knows of the Redis (broker.redis.link)
        lifecycle   Lifecycle: serving, stopping, failed (broker.core.lifecycle)
        bulk        RedisBulk: listMsg, deleteMsgs, rescheduleMsgs; applies
                    a bulk call a script met the fence of (broker.redis.bulk)
        requests    RedisRequests: send, pull, long poll, ack, fenced acks and
                    extensions, delete, get, reschedule, dead letters, topic
                    info (broker.redis.requests)

    The Backend's calls are the parts' methods, bound once below: the API
    calls them with no forwarding frame between.
    """

    def __init__(self, client: aioredis.Redis | RedisCluster, clock: Clock, defaults: Defaults, metrics: Metrics,
                 config: RedisConfig | None = None, *, url: str = "redis",
                 max_topics: int = QueueLimits().topics) -> None:
        self.redis = client
        self.clock = clock
        self.defaults = defaults
        self.metrics = metrics
        self.config = config = config or RedisConfig()
        self.long_polls = LongPolls(clock)
        self._link = link = RedisLink(client, config, self.long_polls, url=url, max_topics=max_topics)
        self._state = link.state
        self.url = link.url
        self.lifecycle = Lifecycle(self.long_polls, log, "the node stops serving", on_stop=self._state.mover_wake.set)
        self._bulk = RedisBulk(link, clock, metrics, self.lifecycle)
        link.fence = self._bulk
        self.requests = requests = RedisRequests(link, clock, metrics, self.lifecycle)
        self._subscribed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # == the Backend's calls (broker.backend.Backend) ==========================
        self.send = requests.send
        self.pull = requests.pull
        self.long_poll = requests.long_poll
        self.ack = requests.ack
        self.ack_many = requests.ack_many
        self.fenced = requests.fenced  # (docs/api.md, "Leases": lua/backend/lease.lua)
        self.delete = requests.delete
        self.get = requests.get
        self.reschedule = requests.reschedule
        self.retry_at = requests.retry_at
        self.list_dead = requests.list_dead
        self.redrive = requests.redrive
        self.redrive_all = requests.redrive_all
        self.redrive_slice = requests.redrive_slice  # (a redriveMsgs job's: broker.jobs)
        self.topic_info = requests.topic_info
        self.topic_infos = requests.topic_infos
        self.topic_list = requests.topic_list
        self.topic_backlogs = requests.topic_backlogs
        self.list_msgs = self._bulk.page
        self.export_msgs = self._bulk.export_page
        self.count_msgs = self._bulk.count
        self.delete_msgs = self._bulk.delete
        self.reschedule_msgs = self._bulk.reschedule
        # == the flow keeper's PauseGate (broker.flow.keeper; broker.redis.flow) ==
        self.expire_paused = self._bulk.expire_paused
        self.set_dedup_window = requests.set_dedup_window
        # the topic settings and pauses, in Redis (RedisNode's TopicFlow saves them there)
        self.topic_settings = RedisTopicSettings(link, clock)

    @classmethod
    def from_url(cls, url: str, clock: Clock, defaults: Defaults, metrics: Metrics,
                 config: RedisConfig | None = None, *, max_topics: int = QueueLimits().topics) -> RedisBroker:
        """`url` as redis-py takes it (redis://[:password@]HOST:PORT/DB,
        rediss:// for TLS), plus `?cluster=1` for a Redis Cluster (any of its
        nodes; database 0). Connects lazily: `start()` says if it cannot."""
        config = config or RedisConfig()
        target, cluster = split_cluster_flag(url)
        options: dict[str, Any] = dict(decode_responses=True, socket_connect_timeout=config.connect_timeout_ms / 1000,
                       socket_timeout=config.command_timeout_ms / 1000,
                       retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), config.retries))
        client = RedisCluster.from_url(target, **options) if cluster else aioredis.Redis.from_url(target, **options)
        return cls(client, clock, defaults, metrics, config, url=url, max_topics=max_topics)

    def __repr__(self) -> str:
        return (f"RedisBroker(url={self.url!r}, prefix={self.config.key_prefix!r}, "
                f"topics={len(self._state.topics)}, next_due_ms={self._state.next_due_ms}, "
                f"stopping={self.lifecycle.stopping})")

    @property
    def problem(self) -> str | None:
        """What keeps the background tasks from Redis now (None: nothing),
        for a health check to report."""
        return "; ".join(f"{where}: {what}" for where, what in sorted(self._state.problems.items())) or None

    # == pauses: carried out in Redis by the scripts (broker.redis.flow) ===========

    def pause(self, topic: str, key: str | None) -> None:
        """Nothing to do here: pull.lua refuses a paused topic, and a paused
        key's messages are parked, once the keeper saved the pause."""

    def resume(self, topic: str, key: str | None) -> None:
        """This node's long polls of the topic pull again (the save that
        resumed it published the wake to every node)."""
        self.long_polls.wake(topic)

    def set_flow(self, topic: str, fair: bool, release_per_s: float, max_due_age_ms: int) -> None:
        """The topic's release rate (this node's bucket) and due-age cap on
        this node's pulls. (Fairness is carried out by the scripts, from the
        topic's `flow` hash: broker.redis.flow.)"""
        self.requests.set_flow(topic, release_per_s, max_due_age_ms)

    # == lifetime ================================================================

    async def start(self) -> None:
        """Check the connection, then launch the tasks; returns once the wake
        channel is subscribed, so no wake published after start() is missed.
        Raises Unavailable with a sentence if Redis cannot be used."""
        try:
            await self.redis.ping()
        except REDIS_ERRORS as e:
            raise Unavailable(await self._link.problem(e, [])) from e
        self._tasks = [asyncio.create_task(self._listener(), name="redis-wake-listener"),
                       asyncio.create_task(self._mover(), name="redis-mover")]
        for task in self._tasks:
            task.add_done_callback(self.lifecycle.task_ended)
        wait_s = 2 * (self.config.connect_timeout_ms + self.config.command_timeout_ms) / 1000
        try:
            await self.clock.wait_for(self._subscribed.wait(), wait_s)
        except TimeoutError:
            raise Unavailable(f"cannot subscribe to the wake channel on Redis at {self.url}: "
                              f"{self._state.problems.get('wake listener', 'no answer')}") from None

    def begin_stop(self) -> None:
        """Refuse new work (503), answer every long poll now, wake the mover to end."""
        self.lifecycle.begin_stop()

    def fail(self, error: BaseException, where: str) -> None:
        self.lifecycle.fail(error, where)

    def wake_all(self) -> None:
        """Answer every long poll now (going offline, broker.http.health)."""
        self.long_polls.wake_all()

    @property
    def failed(self) -> BaseException | None:
        """Why the backend stopped itself (None: it did not)."""
        return self.lifecycle.failed

    @property
    def on_fatal(self) -> Callable[[BaseException], None] | None:
        return self.lifecycle.on_fatal

    @on_fatal.setter
    def on_fatal(self, callback: Callable[[BaseException], None] | None) -> None:
        self.lifecycle.on_fatal = callback

    async def stop(self) -> None:
        self.begin_stop()
        await cancel_and_wait(self._tasks)
        await self.redis.aclose()

    # == background tasks ==========================================================

    async def _listener(self) -> None:
        """Wake local long polls on other processes' wakes; resubscribe after
        a lost connection (and wake every poll then: a wake may be lost)."""
        while not self.lifecycle.stopping:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(self._link.channel_prefix + "*")
                self._subscribed.set()
                self._link.report("wake listener", None)
                self.long_polls.wake_all()
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None and message["type"] == "pmessage":
                        self.long_polls.wake(message["channel"][len(self._link.channel_prefix):])
            except (*REDIS_ERRORS, OSError) as e:
                self._link.report("wake listener", f"Redis at {self.url} is unreachable: {e}")
            finally:
                with contextlib.suppress(*REDIS_ERRORS, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # (redis-py leaves PubSub.aclose unannotated)
            await self.clock.sleep(self.config.poll_ms / 1000)

    async def _mover(self) -> None:
        while not self.lifecycle.stopping:
            self._state.mover_wake.clear()
            self._state.next_due_ms = 0  # a send during this round wakes the next one
            now_ms = self.clock.now_ms()
            due_ms = now_ms + self.config.poll_ms
            try:
                self._state.topics |= await self._link.command("smembers")
            except (Unavailable, *REDIS_ERRORS) as e:
                self._link.report("mover", str(e))
            else:
                self._link.report("mover", None)
                for topic in sorted(self._state.topics):
                    due_ms = min(due_ms, await self._tick(topic, now_ms))
            self._state.next_due_ms = due_ms
            await self.clock.sleep_until(due_ms, self._state.mover_wake)

    async def _tick(self, topic: str, now_ms: int) -> int:
        """One TICK of a topic; when it next needs one."""
        limit = self.config.script_batch
        where = f"topic {topic!r}"
        try:
            triggers, retried, ended, full, woke, *heads = await self._link.script("tick", topic, [
                str(now_ms), str(limit), str(now_ms + self.config.retention_ms), self._state.node,
                str(now_ms + self.config.lease_ms)], wait=False)
        except Fenced:  # a step of the topic's bulk call was applied; the next round ticks it (or applies more)
            return now_ms
        except (Unavailable, *REDIS_ERRORS) as e:  # this topic's trouble must not stop the others
            self._link.report(where, str(e))
            return now_ms + self.config.poll_ms
        self._link.report(where, None)
        m = self.metrics.topic(topic)
        m.retries += retried
        m.ended += ended
        made_ready(self.metrics, topic, [int(t) for t in triggers], now_ms)
        if triggers or retried or woke:  # woke: a parked message of a key freed is pullable
            await self._link.publish(topic)
        if full:
            return now_ms
        return min([int(float(h)) for h in heads if h] or [now_ms + self.config.poll_ms])
