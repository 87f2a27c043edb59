"""Netflix Dyno-queues' interface (seeds 000, 001) on Redis, with redis.asyncio.

A queue of N shards. `push` spreads messages over the shards round-robin
(Dyno's RoundRobinStrategy); `pop` takes due messages from the shards
round-robin, moving each id from its shard's queue zset to the shard's
unack zset, scored by its ack deadline; `ack` forgets it; without an ack,
`process_unacks` (Dyno's unack sweep; call it periodically or run
`sweep_unacks_forever`) puts it back in the queue. Every transition is ONE
Lua script on ONE shard, so two consumers never pop the same id and a
crash never leaves a message half-moved.

Keys of shard i of queue Q (P = "<key_prefix>:dyno:{Q':i}:", Q' = Q with
% { } : percent-escaped by `broker.redis.keys.escape_topic`; the braces
are the Redis Cluster hash tag, so a shard's four keys share one slot, and
the escaping keeps a name from forging another queue's or shard's keys):

    | key      | type | member -> value                                     |
    |----------|------|-----------------------------------------------------|
    | P queue  | zset | id -> due_ms + (99 - priority) / 100  (see below)   |
    | P unack  | zset | id -> ack deadline ms (popped, not yet acked)       |
    | P msg    | hash | id -> payload                                       |
    | P prio   | hash | id -> priority, "0".."99"                           |

A message is in exactly one of `queue` and `unack` and has both hash
fields while it lives; `ack` and `remove` delete all three. Every script
is given its shard's four keys in KEYS and builds no key name itself, so
Redis Cluster accepts it (tests run the scripts on a cluster node with the
"#!lua" flag that makes Redis refuse any cross-slot access).

Score encoding (priority folded into the due time, as Dyno-queues does).
Dyno-queues scores `clock.millis() + timeout + priority / 100.0`, so
within one millisecond its priority 0 pops first, although its Message
Javadoc says "higher priority message is retrieved ahead". Here priority
is 0..99 and a HIGHER number pops first within the same millisecond:

    score = due_ms + (99 - priority) / 100,  due_ms = now_ms + delay_ms

e.g. due 1000, priority 99 -> 1000.00; priority 0 -> 1000.99; due 1001,
priority 99 -> 1001.00. The score is written by the scripts as the decimal
string "<due_ms>.<99 - priority, two digits>", which Redis parses to the
nearest double: for due times below 2^43 ms (year 2248) a double's step is
at most 2^-10, far below 0.01, so distinct (due_ms, priority) pairs keep
distinct, correctly ordered scores, and due_ms = floor(score). Ties (same
due ms and priority) pop in id byte order (the zset's member order). A
message is due when due_ms <= now_ms, i.e. score < now_ms + 1: pop and peek
ask for scores up to "(now_ms+1" (exclusive).

Order across shards: exact (due, priority, id) order holds within a shard;
pop visits the shards round-robin, starting one shard further each call,
so with N > 1 shards a later-due or lower-priority message of one shard
may pop before a due message of another (Dyno-queues: "not strict FIFO").
`peek` merges the shards and is in exact order.

Where this differs from Dyno-queues: pop moves the id, its payload read
and its unack entry in one script (Dyno does ZADD NX, ZREM, HGET as three
calls and counts "misses"); the message store is per shard, not one hash
per queue, so each script stays in one slot (`ack`, `remove`, `get` and
the other by-id calls ask every shard in one pipelined round trip, as
Dyno's loops over shards do); `push` of an id already stored replaces it
in place (payload, priority, due time, and out of unack) instead of adding
it to a second shard — but two processes pushing the same NEW id at the
same moment may store it in two shards (no cross-slot check is atomic);
`unack` (not in Dyno's interface: a nack) puts a popped message back now;
it and `process_unacks` requeue at now_ms with the message's priority (Dyno
requeues at the old deadline score, losing the priority fraction);
`set_timeout` also reschedules a popped message (Dyno: only a queued one);
`pop(count, wait_ms)` returns as soon as at least one message is popped
(Dyno waits to fill `count`). Time comes from the `now_ms` callable, so
tests are exact; only pop's wait sleeps on the event loop.

The error classes, `RedisQueueConfig` and the connection and pop-loop
helpers below are shared with `broker.redis.rmq`.

Usage:

    import asyncio
    from broker.redis.dyno import DynoConfig, DynoQueue

    async def main():
        q = await DynoQueue.connect("redis://127.0.0.1:6379/0", "emails",
                                    DynoConfig(shards=3, unack_timeout_ms=30_000))
        async with q:
            await q.push("m-1", '{"to": "a@b.c"}', delay_ms=5_000, priority=10)
            sweeper = asyncio.create_task(q.sweep_unacks_forever())
            for message in await q.pop(count=10, wait_ms=10_000):
                print(message.id, message.payload)      # ... handle it ...
                await q.ack(message.id)                 # or: await q.unack(message.id)
            sweeper.cancel()

    asyncio.run(main())
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from storage.errors import ConfigError

from .keys import at_least
from .scripts import load_scripts
from .shards import (
    MAX_DELAY_MS,
    RedisQueueConfig,
    ShardedScripts,
    check_int,
    check_text,
    repeat,
    slot_prefix,
)


def due_of(score: float | str) -> int:
    """The due ms of a queue score (the priority fraction is below 1)."""
    return math.floor(float(score))


# == the Dyno queue ==========================================================

@dataclass(frozen=True)
class DynoConfig(RedisQueueConfig):
    # Shards per queue (Dyno: one per availability zone). Each is its own
    # slot in Redis Cluster; push and pop go round-robin over them.
    shards: int = 4
    # How long a popped message may stay unacked before process_unacks
    # puts it back (Dyno's unackTime), unless set_unack_timeout changes it.
    unack_timeout_ms: int = 60_000
    # sweep_unacks_forever: pause between two process_unacks runs (Dyno's
    # unackScheduleInMS).
    unack_sweep_ms: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.shards <= 1024:
            raise ConfigError(f"shards must be from 1 to 1024, got {self.shards}")
        at_least(self, 1, "unack_timeout_ms", "unack_sweep_ms")


@dataclass(frozen=True)
class DynoMessage:
    id: str
    payload: str
    priority: int  # 0..99, higher pops first within a millisecond
    shard: int  # 0..shards-1: which shard holds it


@dataclass(frozen=True)
class ShardSize:
    queued: int  # in the queue zset (due or not)
    unacked: int  # popped, waiting for an ack or the unack sweep


# Every script (broker/redis/lua/dyno/): KEYS = queue, unack, msg, prio of
# one shard.
SCRIPTS = load_scripts("dyno", with_common=("push", "unack", "set_timeout", "process_unacks"),
                       alone=("pop", "ack", "set_unack_timeout", "remove"))


@dataclass(frozen=True)
class _ShardKeys:
    queue: str
    unack: str
    msg: str
    prio: str

    @property
    def all(self) -> list[str]:
        return [self.queue, self.unack, self.msg, self.prio]

    @property
    def types(self) -> dict[str, str]:
        return {self.queue: "zset", self.unack: "zset", self.msg: "hash", self.prio: "hash"}


class DynoQueue(ShardedScripts[_ShardKeys]):
    """One Dyno queue of `config.shards` shards in one Redis database (or
    Redis Cluster: every script stays in one shard's slot).

    Example, 2 shards, unack timeout 30 s, now_ms = 1000: push("a",
    priority=5) -> shard 0 (queue score 1000.94), push("b", delay_ms=500)
    -> shard 1 (1500.99), push("c") -> shard 0 (1000.99). pop(count=3)
    visits shard 0 then 1: ["a", "c"] (b is not due), both now in shard 0's
    unack zset at 31000; the next pop starts at shard 1. ack("a") forgets a;
    at now_ms = 31000 process_unacks puts c back, due at 31000. Each call
    costs one round trip and O(log n) per message in Redis (pop: one
    script per shard visited; by-id calls: one pipeline over the shards).

    The round-robin positions live in this object: share one DynoQueue
    among the tasks of a process. Any number of processes may use the same
    queue at once.
    """

    def __init__(self, client: aioredis.Redis, name: str, config: DynoConfig | None = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        check_text("name", name)
        self.name = name
        self.config = config or DynoConfig()
        shards = []
        for index in range(self.config.shards):
            p = slot_prefix(self.config.key_prefix, "dyno", name, index)
            shards.append(_ShardKeys(p + "queue", p + "unack", p + "msg", p + "prio"))
        super().__init__(client, self.config, now_ms, SCRIPTS, shards)
        self._next_push = 0

    @classmethod
    async def connect(cls, url: str, name: str, config: DynoConfig | None = None,
                      now_ms: Callable[[], int] | None = None) -> DynoQueue:
        """A queue on its own client for `url` (redis://[:password@]HOST:PORT/DB),
        checked with a PING: a Redis that is down, or a wrong password,
        fails here with a sentence."""
        config = config or DynoConfig()
        return await cls(config.client(url), name, config, now_ms)._opened()

    def __repr__(self) -> str:
        return (f"DynoQueue(name={self.name!r}, shards={self.config.shards}, next_push_shard={self._next_push}, "
                f"next_pop_shard={self._next_pop})")

    # == the Dyno-queues interface ================================================

    async def push(self, msg_id: str, payload: str, *, delay_ms: int = 0, priority: int = 0) -> int:
        """Store the message, due in `delay_ms`; returns its shard. A new id
        goes to the next shard round-robin; an id already stored is
        replaced in place (payload, priority, due time; if it was popped, it
        is back in the queue)."""
        check_text("msg_id", msg_id)
        check_text("payload", payload, empty=True)
        check_int("delay_ms", delay_ms, 0, MAX_DELAY_MS)
        check_int("priority", priority, 0, 99)
        held = await self._read_every_shard(lambda pipe, keys: pipe.hexists(keys.msg, msg_id))
        if True in held:
            shard = held.index(True)
        else:
            shard, self._next_push = self._next_push, (self._next_push + 1) % self.config.shards
        await self._script("push", shard, [msg_id, payload, str(priority), str(self.now_ms() + delay_ms)])
        return shard

    async def pop(self, count: int = 1, wait_ms: int = 0) -> list[DynoMessage]:
        """Up to `count` due messages, best first within each shard, moved to
        unack (deadline now + unack_timeout_ms). With none due, waits up to
        `wait_ms` for one; returns as soon as any is popped."""
        async def take(now_ms: int, shard: int, want: int) -> tuple[list[DynoMessage], int | None]:
            head, flat = await self._script("pop", shard, [
                f"({now_ms + 1}", str(now_ms + self.config.unack_timeout_ms), str(want)])
            popped = [DynoMessage(flat[i], flat[i + 1], int(flat[i + 2]), shard) for i in range(0, len(flat), 3)]
            return popped, None if head is None else due_of(head)

        return await self._pop(count, wait_ms, take)

    async def ack(self, msg_id: str) -> bool:
        """Forget a popped message; False if it is not unacked (never popped,
        already acked, or put back by unack or the sweep)."""
        return any(await self._on_every_shard("ack", [msg_id]))

    async def unack(self, msg_id: str) -> bool:
        """Put a popped message back in the queue, due now; False if it is not unacked."""
        return any(await self._on_every_shard("unack", [msg_id, str(self.now_ms())]))

    async def set_unack_timeout(self, msg_id: str, timeout_ms: int) -> bool:
        """Move a popped message's ack deadline to now + timeout_ms (a longer
        lease); False if it is not unacked."""
        check_int("timeout_ms", timeout_ms, 0, MAX_DELAY_MS)
        return any(await self._on_every_shard("set_unack_timeout", [msg_id, str(self.now_ms() + timeout_ms)]))

    async def set_timeout(self, msg_id: str, delay_ms: int) -> bool:
        """Reschedule a queued or popped message: queued, due now + delay_ms,
        priority kept. False if there is no such message."""
        check_int("delay_ms", delay_ms, 0, MAX_DELAY_MS)
        return any(await self._on_every_shard("set_timeout", [msg_id, str(self.now_ms() + delay_ms)]))

    async def remove(self, msg_id: str) -> bool:
        """Delete a queued or popped message; False if there is none."""
        return any(await self._on_every_shard("remove", [msg_id]))

    async def get(self, msg_id: str) -> DynoMessage | None:
        """The stored message (queued or popped), or None."""
        def read(pipe: aioredis.client.Pipeline, keys: _ShardKeys) -> None:
            pipe.hget(keys.msg, msg_id)
            pipe.hget(keys.prio, msg_id)

        found = await self._read_every_shard(read)
        for shard in range(self.config.shards):
            payload, priority = found[2 * shard], found[2 * shard + 1]
            if payload is not None:
                return DynoMessage(msg_id, payload, int(priority), shard)
        return None

    async def size(self) -> int:
        """Messages in the queue zsets (due or not), not counting popped ones (as Dyno)."""
        return sum(s.queued for s in await self.shard_sizes())

    async def shard_sizes(self) -> list[ShardSize]:
        def read(pipe: aioredis.client.Pipeline, keys: _ShardKeys) -> None:
            pipe.zcard(keys.queue)
            pipe.zcard(keys.unack)

        counts = await self._read_every_shard(read)
        return [ShardSize(counts[i], counts[i + 1]) for i in range(0, len(counts), 2)]

    async def peek(self, count: int = 1) -> list[str]:
        """Ids of up to `count` due messages, in exact (due, priority, id)
        order over all shards, without popping them."""
        check_int("count", count, 1, 100_000)
        bound = f"({self.now_ms() + 1}"
        heads = await self._read_every_shard(
            lambda pipe, keys: pipe.zrangebyscore(keys.queue, "-inf", bound, 0, count, withscores=True))
        return [msg_id for msg_id, _ in sorted((m for head in heads for m in head), key=lambda m: (m[1], m[0]))][:count]

    async def process_unacks(self) -> int:
        """Dyno's unack sweep: every popped message whose ack deadline has
        passed goes back to the queue, due now. Returns how many."""
        return await self._drain("process_unacks", [str(self.now_ms())])

    async def sweep_unacks_forever(self) -> None:
        """process_unacks every unack_sweep_ms until cancelled (Dyno's
        scheduled unack processing). An error ends it: await the task."""
        await repeat(self.process_unacks, self.config.unack_sweep_ms)
