"""The Redis backend's link to Redis, which its parts share: the client and
the scripts, called the one way (a bulk call's fence met, Redis's trouble
answered as Unavailable), the wakes (of long polls, here and in every
process sharing the Redis, and of the mover), and `RedisState`, what this
process knows of that Redis.

RedisBroker (broker.redis.backend) builds one `RedisLink` and hands it to
its parts: the requests (broker.redis.requests), the bulk calls
(broker.redis.bulk), and its own mover and wake listener. Nothing here
decides a message's fate: the scripts do (broker/redis/lua/backend/).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AuthenticationError, ClusterError, RedisClusterException, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from storage.errors import HourglassError, Unavailable

from ..backend import topic_cap_error
from ..core.long_polls import LongPolls
from ..observe.metrics import Metrics
from .keys import KEY_TYPES, RedisConfig, TopicKeys, redact
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
# are a topic's eighteen keys, TopicKeys.all). RedisLink registers these (a
# test may wrap them).
SCRIPTS = load_scripts("backend", with_common=("send", "tick", "pull", "give_back", "ack", "delete", "get", "info",
                                               "reschedule", "dead", "redrive", "redrive_slice", "scan", "bulk_commit", "bulk_apply",
                                               "retry_at", "flow_save", "lease"),
                       alone=("register",))  # (register: KEYS is the topic set, not a topic's keys)
# The error a script of a topic answers while a bulk call is applied to it
# (common.lua's fence; broker.redis.bulk).
FENCE = "HGBULK"


class Fenced(HourglassError):
    """A script met the fence of a bulk call being applied (one step of it
    was applied meanwhile); raised only where the caller asked not to wait."""


@dataclass
class RedisState:
    """What this process knows of the Redis it shares with other processes."""

    # Topics this process knows of (its sends, the topic set as last read).
    topics: set[str] = field(default_factory=set)
    # Topics known to be in the topic set (forgotten when Redis was
    # unreachable: it may come back empty).
    registered: set[str] = field(default_factory=set)
    # Last problem reported per place (mover, listener, a topic), so that a
    # lasting outage is logged once, and its end too.
    problems: dict[str, str] = field(default_factory=dict)
    # When the mover wakes by itself next (0 while a round runs: a send
    # meanwhile wakes the next round). Whoever stores a message due before
    # it sets `mover_wake`.
    next_due_ms: int = 0
    mover_wake: asyncio.Event = field(default_factory=asyncio.Event)
    # This process's name in a topic's leases and on its push deliveries
    # (lua/backend/tick.lua): new at each start, so a restarted node's
    # deliveries in flight are handed back as a dead node's are.
    node: str = field(default_factory=lambda: uuid.uuid4().hex)


class Fence(Protocol):
    """What applies a bulk call whose fence a script met (broker.redis.bulk.RedisBulk)."""

    async def step(self, topic: str, call: str = "") -> bool: ...

    async def finish(self, topic: str) -> None: ...


class RedisLink:
    """One Redis database (or Redis Cluster) as the backend's parts call it.
    `script` runs one of SCRIPTS on a topic's keys; `command`, `zcards`
    and `register` are the calls on the topic set and the queue sizes;
    each raises Unavailable (503) with a sentence when Redis fails, and
    `report` logs a background task's lasting problem once. `publish`
    wakes a topic's long polls in every process.

    `fence` is the backend's RedisBulk: it calls scripts through this link,
    and a script that meets its fence has it apply the call first, so the
    backend sets it once both are built."""

    fence: Fence

    def __init__(self, client: aioredis.Redis | RedisCluster, config: RedisConfig, long_polls: LongPolls, *,
                 url: str, max_topics: int) -> None:
        self.redis = client
        self.config = config
        self.long_polls = long_polls  # this process's long polls, woken by `publish`
        self.url = redact(url)
        self.max_topics = max_topics  # --max-topics: the topic set's size a new topic may not pass
        self.state = RedisState()
        self.topics_key = f"{config.key_prefix}:topics"
        self.channel_prefix = f"{config.key_prefix}:wake:"
        self.scripts = {name: client.register_script(source) for name, source in SCRIPTS.items()}

    def __repr__(self) -> str:
        return (f"RedisLink(url={self.url!r}, prefix={self.config.key_prefix!r}, topics={len(self.state.topics)}, "
                f"problems={len(self.state.problems)})")

    def keys(self, topic: str) -> TopicKeys:
        return TopicKeys.of(self.config.key_prefix, topic)

    async def script(self, name: str, topic: str, args: Sequence[str], extra_keys: Sequence[str] = (),
                     wait: bool = True) -> Reply:
        """Run script `name` on the topic's keys (and `extra_keys`). If a
        bulk call is being applied to the topic (the fence), apply the rest
        of it first and run the script then; with `wait` False, apply one
        step of it and raise Fenced instead."""
        keys = [*self.keys(topic).all, *extra_keys]
        while True:
            try:
                return await self.scripts[name](keys=keys, args=args)
            except REDIS_ERRORS as e:
                if not (isinstance(e, ResponseError) and str(e).startswith(FENCE)):
                    raise Unavailable(await self.problem(e, keys)) from e
            if not wait:
                await self.fence.step(topic)
                raise Fenced(topic)
            await self.fence.finish(topic)

    async def command(self, name: str, *args: str) -> Reply:
        """A plain command on the topic set."""
        try:
            return await getattr(self.redis, name)(self.topics_key, *args)
        except REDIS_ERRORS as e:
            raise Unavailable(await self.problem(e, [])) from e

    async def zcards(self, keys: list[str]) -> list[int]:
        """ZCARD of each key, in one pipelined round trip."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.zcard(key)
                return await pipe.execute()
        except REDIS_ERRORS as e:
            raise Unavailable(await self.problem(e, [])) from e

    async def register(self, topics: set[str]) -> None:
        """Add `topics` to the topic set, or raise LimitReached (429) if
        that would pass --max-topics: one script, so processes sharing the
        Redis cannot pass the cap together."""
        try:
            added, size = await self.scripts["register"](keys=[self.topics_key],
                                                         args=[str(self.max_topics), *topics])
        except REDIS_ERRORS as e:
            raise Unavailable(await self.problem(e, [])) from e
        if not added:
            raise topic_cap_error(size, self.max_topics)

    async def publish(self, topic: str) -> None:
        """A message of `topic` became READY: wake its long polls."""
        self.long_polls.wake(topic)  # this process at once; others through Redis
        try:
            await self.redis.publish(self.channel_prefix + topic, "1")
        except REDIS_ERRORS as e:  # the change is made: others see it at their next pull or poll_ms
            self.report("wake publisher", f"Redis at {self.url} is unreachable: {e}")
        else:
            self.report("wake publisher", None)

    async def problem(self, error: Exception, keys: list[str]) -> str:
        """What a failed command says to the client (a 503), or re-raise
        `error` if it looks like a bug here (a 500, logged)."""
        if isinstance(error, AuthenticationError):
            return f"authentication to Redis at {self.url} failed: {error}"
        if isinstance(error, (RedisConnectionError, RedisTimeoutError, ClusterError, RedisClusterException)):
            self.state.registered.clear()
            return f"Redis at {self.url} is unreachable: {error}"
        if isinstance(error, ResponseError) and str(error).startswith("WRONGTYPE"):
            wrong = await self._wrong_types([*keys, self.topics_key])
            if wrong:
                return (f"{'; '.join(wrong)}; every key under {self.config.key_prefix + ':'!r} is hourglass's: "
                        f"remove or rename it")
        if isinstance(error, ResponseError) and str(error).split(" ", 1)[0] in REFUSALS:
            return f"Redis at {self.url} refused the command: {error}"
        raise error

    async def _wrong_types(self, keys: list[str]) -> list[str]:
        wanted = dict(zip(keys, KEY_TYPES.values()))
        wanted[self.topics_key] = "set"
        wrong = []
        for key, kind in wanted.items():
            try:
                found = cast(str, await self.redis.type(key))  # (a str: from_url's client decodes replies)
            except REDIS_ERRORS:
                continue
            if found not in ("none", kind):
                wrong.append(f"Redis key {key!r} holds a {found}, not the {kind} hourglass keeps there")
        return wrong

    def report(self, where: str, problem: str | None) -> None:
        """Log a lasting problem once, and its end."""
        before = self.state.problems.get(where)
        if problem is None:
            if before is not None:
                del self.state.problems[where]
                log.warning("%s works again", where)
        elif problem != before:
            self.state.problems[where] = problem
            log.error("%s: %s; retrying", where, problem)


def made_ready(metrics: Metrics, topic: str, due_times: list[int], now_ms: int) -> None:
    """Count messages made READY at `now_ms`, each due at its time in
    `due_times` (broker.observe.metrics.due_ms: its trigger time, or when it
    arrived if that was later)."""
    m = metrics.topic(topic)
    m.ready += len(due_times)
    for due in due_times:
        m.ready_gap.observe(now_ms - due)
        metrics.load_lateness_seconds.observe(max(0, now_ms - due) / 1000)
