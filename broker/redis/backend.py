"""The message lifecycle (docs/api.md) with its state in Redis: `hourglass
serve --backend redis://...`.

`RedisBroker` is a `broker.backend.Backend`, as the disk
`broker.disk_broker.Broker` is (send, pull, long_poll, ack incl. nack, delete,
get, reschedule, dead letters, topic_info, topic_list), so `broker.api.Api`
serves it unchanged, with the same lifecycle (broker.transitions
has the table). Several hourglass processes may share
one Redis: every read and transition is ONE Lua script over one topic's
keys, so Redis runs it atomically and no message is moved, pulled or
retried twice. A bulk call is the exception: its changes are applied in
scripts of bounded size, fenced so that no client sees it half made
(broker.redis.bulk).

Keys, their layout and the URL: broker.redis.keys.

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
retry until it is back. `?cluster=1` in the URL selects Redis Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AuthenticationError, ClusterError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from storage.entry import Message
from storage.errors import HourglassError, Unavailable
from wheel.clock import Clock

from ..backend import topic_cap_error
from ..bulk_params import BulkFilter, DeleteMsgsRequest, ListMsgRequest, RescheduleMsgsRequest
from ..lifecycle import Lifecycle
from ..long_polls import LongPolls
from ..metrics import Metrics, due_ms
from ..params import Defaults
from ..ready import QueueLimits
from .bulk import RedisBulk
from .keys import KEY_TYPES, RedisConfig, TopicKeys, redact, split_cluster_flag
from .link import RedisState
from .requests import RedisRequests
from .scripts import Reply, load_scripts

log = logging.getLogger("hourglass.redis")

# Redis errors that say "not now" rather than "hourglass has a bug": the
# first word of the error Redis answered.
REFUSALS = frozenset({"OOM", "READONLY", "LOADING", "MASTERDOWN", "BUSY", "NOREPLICAS", "MISCONF", "CLUSTERDOWN",
                      "TRYAGAIN"})
# What redis-py raises when Redis fails (its cluster errors are not RedisErrors).
REDIS_ERRORS = (RedisError, RedisClusterException)
# == Lua =======================================================================
# Every script, by name (broker/redis/lua/backend/: common.lua, shared by
# every script, reads a message with load() and writes it with save(); KEYS
# are a topic's eleven keys, TopicKeys.all). RedisBroker registers these (a
# test may wrap them).
SCRIPTS = load_scripts("backend", with_common=("send", "tick", "pull", "give_back", "ack", "delete", "get", "info",
                                               "reschedule", "dead", "redrive", "scan", "bulk_commit", "bulk_apply",
                                               "retry_at"),
                       alone=("register",))  # (register: KEYS is the topic set, not a topic's keys)
# The error a script of a topic answers while a bulk call is applied to it
# (common.lua's fence; broker.redis.bulk).
FENCE = "HGBULK"


class Fenced(HourglassError):
    """A script met the fence of a bulk call being applied (one step of it
    was applied meanwhile); raised only where the caller asked not to wait."""


class RedisBroker(RedisRequests):
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
    """

    def __init__(self, client: aioredis.Redis | RedisCluster, clock: Clock, defaults: Defaults, metrics: Metrics,
                 config: RedisConfig | None = None, *, url: str = "redis",
                 max_topics: int = QueueLimits().topics) -> None:
        self.redis = client
        self.clock = clock
        self.defaults = defaults
        self.metrics = metrics
        self.config = config or RedisConfig()
        self.max_topics = max_topics  # --max-topics: the topic set's size a new topic may not pass
        self.url = redact(url)
        self._state = RedisState()
        self._mover_wake = asyncio.Event()
        self.long_polls = LongPolls(clock)
        self.lifecycle = Lifecycle(self.long_polls, log, "the node stops serving", on_stop=self._mover_wake.set)
        self._next_due_ms = 0
        self._subscribed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._topics_key = f"{self.config.key_prefix}:topics"
        self._channel_prefix = f"{self.config.key_prefix}:wake:"
        self._scripts = {name: client.register_script(source) for name, source in SCRIPTS.items()}
        self._bulk = RedisBulk(client, self.config, metrics, self.lifecycle, self.keys, self._script, self._problem,
                               REDIS_ERRORS, clock.now_ms, self._bulk_moved)
        self.requests: RedisRequests = self  # it answers the message requests itself (broker.backend)

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
                f"topics={len(self._state.topics)}, next_due_ms={self._next_due_ms}, stopping={self.lifecycle.stopping})")

    @property
    def problem(self) -> str | None:
        """What keeps the background tasks from Redis now (None: nothing),
        for a health check to report."""
        return "; ".join(f"{where}: {what}" for where, what in sorted(self._state.problems.items())) or None

    def keys(self, topic: str) -> TopicKeys:
        return TopicKeys.of(self.config.key_prefix, topic)

    # == bulk calls (broker.redis.bulk) ==============================================

    async def list_msgs(self, request: ListMsgRequest) -> tuple[list[Message], str | None]:
        """listMsg: a page of matches in (trigger time, msgId) order, and the next cursor."""
        return await self._bulk.page(request)

    async def count_msgs(self, topic: str, flt: BulkFilter) -> int:
        """listMsg countOnly=true: the exact number of matches."""
        return await self._bulk.count(topic, flt)

    async def delete_msgs(self, request: DeleteMsgsRequest) -> tuple[int, bool]:
        """deleteMsgs: live matches DELETED, whole, in bounded steps; how many, and if more remain."""
        return await self._bulk.delete(request)

    async def reschedule_msgs(self, request: RescheduleMsgsRequest) -> tuple[int, bool]:
        """rescheduleMsgs: waiting and ready matches moved, whole, in bounded steps."""
        return await self._bulk.reschedule(request)

    async def _bulk_moved(self, topic: str, made_ready: list[int], next_waiting: int | None) -> None:
        """After a step of a bulk move: long polls learn of those made READY
        (their trigger times), the mover of one waiting due before it meant
        to wake."""
        now_ms = self.clock.now_ms()
        if made_ready:
            self._made_ready(topic, [due_ms(t, now_ms) for t in made_ready], now_ms)
            await self._publish(topic)
        if next_waiting is not None and next_waiting < self._next_due_ms:
            self._mover_wake.set()

    # == talking to Redis ==========================================================

    async def _script(self, name: str, topic: str, args: Sequence[str], extra_keys: Sequence[str] = (),
                      wait: bool = True) -> Reply:
        """Run script `name` on the topic's keys (and `extra_keys`). If a
        bulk call is being applied to the topic (the fence), apply the rest
        of it first and run the script then; with `wait` False, apply one
        step of it and raise Fenced instead."""
        keys = [*self.keys(topic).all, *extra_keys]
        while True:
            try:
                return await self._scripts[name](keys=keys, args=args)
            except REDIS_ERRORS as e:
                if not (isinstance(e, ResponseError) and str(e).startswith(FENCE)):
                    raise Unavailable(await self._problem(e, keys)) from e
            if not wait:
                await self._bulk.step(topic)
                raise Fenced(topic)
            await self._bulk.finish(topic)

    async def _command(self, name: str, *args: str) -> Reply:
        """A plain command on the topic set."""
        try:
            return await getattr(self.redis, name)(self._topics_key, *args)
        except REDIS_ERRORS as e:
            raise Unavailable(await self._problem(e, [])) from e

    async def _zcards(self, keys: list[str]) -> list[int]:
        """ZCARD of each key, in one pipelined round trip."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.zcard(key)
                return await pipe.execute()
        except REDIS_ERRORS as e:
            raise Unavailable(await self._problem(e, [])) from e

    async def _register(self, topics: set[str]) -> None:
        """Add `topics` to the topic set, or raise LimitReached (429) if
        that would pass --max-topics: one script, so processes sharing the
        Redis cannot pass the cap together."""
        try:
            added, size = await self._scripts["register"](keys=[self._topics_key],
                                                          args=[str(self.max_topics), *topics])
        except REDIS_ERRORS as e:
            raise Unavailable(await self._problem(e, [])) from e
        if not added:
            raise topic_cap_error(size, self.max_topics)

    async def _problem(self, error: Exception, keys: list[str]) -> str:
        """What a failed command says to the client (a 503), or re-raise
        `error` if it looks like a bug here (a 500, logged)."""
        if isinstance(error, AuthenticationError):
            return f"authentication to Redis at {self.url} failed: {error}"
        if isinstance(error, (RedisConnectionError, RedisTimeoutError, ClusterError, RedisClusterException)):
            self._state.registered.clear()
            return f"Redis at {self.url} is unreachable: {error}"
        if isinstance(error, ResponseError) and str(error).startswith("WRONGTYPE"):
            wrong = await self._wrong_types([*keys, self._topics_key])
            if wrong:
                return (f"{'; '.join(wrong)}; every key under {self.config.key_prefix + ':'!r} is hourglass's: "
                        f"remove or rename it")
        if isinstance(error, ResponseError) and str(error).split(" ", 1)[0] in REFUSALS:
            return f"Redis at {self.url} refused the command: {error}"
        raise error

    async def _wrong_types(self, keys: list[str]) -> list[str]:
        wanted = dict(zip(keys, KEY_TYPES.values()))
        wanted[self._topics_key] = "set"
        wrong = []
        for key, kind in wanted.items():
            try:
                found = cast(str, await self.redis.type(key))  # (a str: from_url's client decodes replies)
            except REDIS_ERRORS:
                continue
            if found not in ("none", kind):
                wrong.append(f"Redis key {key!r} holds a {found}, not the {kind} hourglass keeps there")
        return wrong

    def _report(self, where: str, problem: str | None) -> None:
        """Log a lasting problem once, and its end."""
        before = self._state.problems.get(where)
        if problem is None:
            if before is not None:
                del self._state.problems[where]
                log.warning("%s works again", where)
        elif problem != before:
            self._state.problems[where] = problem
            log.error("%s: %s; retrying", where, problem)

    # == lifetime ================================================================

    async def start(self) -> None:
        """Check the connection, then launch the tasks; returns once the wake
        channel is subscribed, so no wake published after start() is missed.
        Raises Unavailable with a sentence if Redis cannot be used."""
        try:
            await self.redis.ping()
        except REDIS_ERRORS as e:
            raise Unavailable(await self._problem(e, [])) from e
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
        """Answer every long poll now (going offline, broker.health)."""
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
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.redis.aclose()

    # == background tasks ==========================================================

    async def _listener(self) -> None:
        """Wake local long polls on other processes' wakes; resubscribe after
        a lost connection (and wake every poll then: a wake may be lost)."""
        while not self.lifecycle.stopping:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.psubscribe(self._channel_prefix + "*")
                self._subscribed.set()
                self._report("wake listener", None)
                self.long_polls.wake_all()
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None and message["type"] == "pmessage":
                        self.long_polls.wake(message["channel"][len(self._channel_prefix):])
            except (*REDIS_ERRORS, OSError) as e:
                self._report("wake listener", f"Redis at {self.url} is unreachable: {e}")
            finally:
                with contextlib.suppress(*REDIS_ERRORS, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # (redis-py leaves PubSub.aclose unannotated)
            await self.clock.sleep(self.config.poll_ms / 1000)

    async def _mover(self) -> None:
        while not self.lifecycle.stopping:
            self._mover_wake.clear()
            self._next_due_ms = 0  # a send during this round wakes the next one
            now_ms = self.clock.now_ms()
            due_ms = now_ms + self.config.poll_ms
            try:
                self._state.topics |= await self._command("smembers")
            except (Unavailable, *REDIS_ERRORS) as e:
                self._report("mover", str(e))
            else:
                self._report("mover", None)
                for topic in sorted(self._state.topics):
                    due_ms = min(due_ms, await self._tick(topic, now_ms))
            self._next_due_ms = due_ms
            await self.clock.sleep_until(due_ms, self._mover_wake)

    async def _tick(self, topic: str, now_ms: int) -> int:
        """One TICK of a topic; when it next needs one."""
        limit = self.config.script_batch
        where = f"topic {topic!r}"
        try:
            triggers, retried, ended, full, *heads = await self._script("tick", topic, [
                str(now_ms), str(limit), str(now_ms + self.config.retention_ms)], wait=False)
        except Fenced:  # a step of the topic's bulk call was applied; the next round ticks it (or applies more)
            return now_ms
        except (Unavailable, *REDIS_ERRORS) as e:  # this topic's trouble must not stop the others
            self._report(where, str(e))
            return now_ms + self.config.poll_ms
        self._report(where, None)
        m = self.metrics.topic(topic)
        m.retries += retried
        m.ended += ended
        self._made_ready(topic, [int(t) for t in triggers], now_ms)
        if triggers or retried:
            await self._publish(topic)
        if full:
            return now_ms
        return min([int(float(h)) for h in heads if h] or [now_ms + self.config.poll_ms])

    def _made_ready(self, topic: str, due_times: list[int], now_ms: int) -> None:
        """Count messages made READY at `now_ms`, each due at its time in
        `due_times` (broker.metrics.due_ms: its trigger time, or when it
        arrived if that was later)."""
        m = self.metrics.topic(topic)
        m.ready += len(due_times)
        for due in due_times:
            m.ready_gap.observe(now_ms - due)
            self.metrics.lateness_seconds.observe(max(0, now_ms - due) / 1000)

    async def _publish(self, topic: str) -> None:
        self.long_polls.wake(topic)  # this process at once; others through Redis
        try:
            await self.redis.publish(self._channel_prefix + topic, "1")
        except REDIS_ERRORS as e:  # the change is made: others see it at their next pull or poll_ms
            self._report("wake publisher", f"Redis at {self.url} is unreachable: {e}")
        else:
            self._report("wake publisher", None)

    # == requests ================================================================
