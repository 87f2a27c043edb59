"""RMQ's three message kinds (seed 002) on Redis, with redis.asyncio.

A topic holds one kind of message, fixed when it is defined (RMQ's
topicType), spread over `slots` slots (RMQ's slotAmount, a power of 2):
a message goes to slot CRC32(key) % slots, so every message with the same
key meets in one slot, where merging happens. The key is the body unless
the sender names one (RMQ merges by content; its slotBasis is the key).

| kind          | store score     | pops                          | a send whose key is pending      |
|---------------|-----------------|-------------------------------|----------------------------------|
| `RANGE_MERGE` | now + range_ms  | due ones (score <= now),      | merges: keeps the pending due    |
|               |                 | earliest first                | time, takes the new body         |
| `PRIORITY`    | priority        | highest priority first, due   | merges: takes the new priority   |
|               |                 | at once (ties: random order)  | and body ("the last stored")     |
| `FIXED_TIME`  | at_ms (absolute)| due ones, earliest first      | merges: takes the new time and   |
|               |                 |                               | body ("the last stored")         |

"Pending" is waiting in the store, due or not: a duplicate that arrives
while the first is being consumed is a new message (RMQ the same: the
member left the StoreQueue for the PrepareQueue).

Consumption is RMQ's two-phase: `pop` moves a message from the store to
`prepare`, scored by its ack deadline (now + ack_timeout_ms); `ack`
forgets it; `nack`, or a deadline passed and found by `process_timeouts`
(run it periodically, or `sweep_timeouts_forever`), is a failed delivery:
it goes back to the store (range-merge, fixed-time: due now +
retry_delay_ms; priority: at its priority) with its failure count + 1,
until the failure after `max_retries` (16) retries — the 17th delivery —
sends it to the dead queue. `dead()` lists the dead queue, oldest death
first; `redrive()` puts dead messages back in the store, due now (at their
priority), with the failure count reset to 0. A message coming back to the
store (retry or re-drive) while another with its key is pending merges into
that newer one (it is dropped; the pending one carries the latest body).

Keys of slot i of topic T (P = "<key_prefix>:rmq:{T':i}:", T' escaped as
in `broker.redis.keys.escape_topic`; the braces are the slot's Redis
Cluster hash tag, so each script touches one slot):

    | key        | type | member -> value                                      |
    |------------|------|------------------------------------------------------|
    | P store    | zset | id -> score of its kind (table above)                |
    | P prepare  | zset | id -> ack deadline ms (popped, not yet acked)        |
    | P dead     | zset | id -> ms it went dead                                |
    | P pending  | hash | key -> id of the message with that key in the store  |
    | P body     | hash | id -> body                                           |
    | P key      | hash | id -> key                                            |
    | P retry    | hash | id -> failed deliveries so far (absent: 0)           |
    | P prio     | hash | id -> priority (priority topics)                     |
    | P lease    | str  | the id of the worker that owns the slot (RmqWorker), |
    |            |      | expiring after the lease time unless renewed         |
    | <key_prefix>:rmq:{T'}:def | string | "<kind> <slots>", set by connect  |
    | <key_prefix>:rmq:{T'}:workers | zset | worker id -> registration expiry ms |

An id is "<slot>-<32 hex digits>" (the slot is where ack, nack and
redrive find it) and is in exactly one of store, prepare and dead, with
its body and key, until ack (or a merge) forgets it. Every transition is
ONE Lua script given its slot's eight keys in KEYS; scripts build no key
names. Scores are integers (ms, or priority within +-2^53): exact in a
double. Time comes from the `now_ms` callable.

Where this differs from RMQ: members are ids, not the bodies themselves,
so a body may be large and a key explicit; the retry count is a hash field
instead of RMQ's encoding in the StoreQueue score (remaining retries, which
is why RMQ's priorities must be above 16): a retried message keeps its
kind's order; there is no ZooKeeper: `RmqTopic.pop` visits the slots
round-robin (order is exact within a slot), and per-key serial
consumption -- RMQ's one worker per slot, assigned through ZooKeeper -- is
`RmqWorker`'s, with leases in Redis (below); fixed times in the past are
accepted (due at once); range and times are in ms, not seconds.

Workers (`topic.worker()`): each registers in the topic's `workers` zset
(renewed every lease_ms / 3, dropped when it lapses) and owns slots by
lease: the slot's `lease` key holds its id and expires after lease_ms
unless renewed. Each heartbeat a worker renews its leases, gives up the
slots beyond its fair share (ceil(slots / live workers)) whose delivery is
finished, and takes free slots up to its share; so slots move to a worker
that joins, and from one that dies (SIGKILL: its leases lapse within
lease_ms). A worker pops only from slots it owns, one message at a time
per slot, and only while nothing of the slot is in prepare: a new owner
waits for the old owner's last delivery to be acked or to time out. So a
key (all its messages meet in one slot) is consumed by one worker at a
time, in order, even across a handover.

Usage:

    import asyncio
    from broker.redis.rmq import Kind, RmqConfig, RmqTopic

    async def main():
        prices = await RmqTopic.connect("redis://127.0.0.1:6379/0", "price-changed", Kind.RANGE_MERGE,
                                        RmqConfig(slots=8, ack_timeout_ms=30_000))
        async with prices:
            await prices.send_range_merge("item-42", range_ms=2_000)
            await prices.send_range_merge("item-42", range_ms=2_000)  # merged: one delivery in ~2 s
            sweeper = asyncio.create_task(prices.sweep_timeouts_forever())
            for message in await prices.pop(count=10, wait_ms=5_000):
                try:
                    print("redraw", message.body)
                    await prices.ack(message.id)
                except Exception:
                    await prices.nack(message.id)     # retried; dead after 16 retries
            print(await prices.dead())                # then: await prices.redrive()
            sweeper.cancel()

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import enum
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from storage.errors import ConfigError, InvalidRequest

from .keys import at_least, escape_topic
from .scripts import load_scripts
from .shards import (
    MAX_DELAY_MS,
    RedisAdapterError,
    RedisQueueConfig,
    ShardedScripts,
    call_redis,
    check_int,
    check_text,
    repeat,
    slot_prefix,
)

# Priorities are zset scores: integers beyond 2^53 are not exact in a double.
MAX_PRIORITY = 2**53


class Kind(enum.Enum):
    RANGE_MERGE = "range-merge"
    PRIORITY = "priority"
    FIXED_TIME = "fixed-time"


class Outcome(enum.Enum):
    """What a nack did."""
    RETRY = "retry"  # back in the store, to be delivered again
    MERGED = "merged"  # a newer message with its key was pending: dropped in its favour
    DEAD = "dead"  # that was the failure after max_retries retries: in the dead queue
    GONE = "gone"  # it was not being consumed (acked, timed out already, unknown)


class TopicMismatch(RedisAdapterError):
    """Raised when the topic is already defined in Redis with another kind or slot count
    (RMQ: a topic name has one topicType and slotAmount)."""


@dataclass(frozen=True)
class RmqConfig(RedisQueueConfig):
    # Slots per topic (RMQ's slotAmount): a power of 2. Each is its own
    # Redis Cluster slot; pop visits them round-robin.
    slots: int = 8
    # Failed or timed-out deliveries retried before the dead queue (RMQ: 16):
    # at most max_retries + 1 deliveries.
    max_retries: int = 16
    # How long a popped message may stay unacked before process_timeouts
    # counts a failed delivery.
    ack_timeout_ms: int = 30_000
    # Range-merge and fixed-time topics: a failed delivery is due again this
    # long after the failure (RMQ: at once). Priority topics retry at once.
    retry_delay_ms: int = 0
    # sweep_timeouts_forever: pause between two process_timeouts runs.
    sweep_ms: int = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.slots <= 16384 or self.slots & (self.slots - 1):
            raise ConfigError(f"slots must be a power of 2 from 1 to 16384, got {self.slots}")
        at_least(self, 0, "max_retries", "retry_delay_ms")
        at_least(self, 1, "ack_timeout_ms", "sweep_ms")
        if self.retry_delay_ms > MAX_DELAY_MS:
            raise ConfigError(f"retry_delay_ms must be at most {MAX_DELAY_MS}, got {self.retry_delay_ms}")


@dataclass(frozen=True)
class RmqMessage:
    id: str
    key: str
    body: str
    retries: int  # failed deliveries before this one (0 on the first)
    slot: int
    died_ms: int | None = None  # set in the dead queue's listing


@dataclass(frozen=True)
class Sent:
    id: str  # the stored message's id: the pending one's if merged
    merged: bool  # True: merged into a pending message with the same key


@dataclass(frozen=True)
class RmqSizes:
    pending: int  # in the store, due or not
    in_flight: int  # popped, waiting for ack, nack or timeout
    dead: int


# Every script (broker/redis/lua/rmq/): KEYS = store, prepare, dead, pending,
# body, key, retry, prio, lease of one slot; ARGV[1] = the topic's kind.
SCRIPTS = load_scripts("rmq", with_common=("send", "pop", "pop_serial", "lease", "release", "ack", "nack", "timeouts",
                                           "redrive", "redrive_oldest", "dead"))


@dataclass(frozen=True)
class _SlotKeys:
    store: str
    prepare: str
    dead: str
    pending: str
    body: str
    key: str
    retry: str
    prio: str
    lease: str

    @property
    def all(self) -> list[str]:
        return [self.store, self.prepare, self.dead, self.pending, self.body, self.key, self.retry, self.prio,
                self.lease]

    @property
    def types(self) -> dict[str, str]:
        return {k: "zset" if i < 3 else "hash" if i < 8 else "string" for i, k in enumerate(self.all)}


class RmqTopic(ShardedScripts[_SlotKeys]):
    """One RMQ topic of one kind over `config.slots` slots.

    Example, a RANGE_MERGE topic, now_ms = 1000: send_range_merge("item-42",
    range_ms=2000) stores it due at 3000; the same body again at 1500
    merges (still due at 3000, one message). At 3000 pop() moves it to
    prepare (deadline 3000 + ack_timeout_ms); nack() puts it back due now
    with retries 1; after 16 retries the 17th nack sends it to the dead
    queue; redrive() brings it back with retries 0. Each call is one
    script (one round trip) on one slot, O(log n) per message; pop visits
    the slots round-robin, one script each until it has `count`.

    The pop position lives in this object: share one RmqTopic among the
    tasks of a process. Any number of processes may use the topic at once.
    """

    def __init__(self, client: aioredis.Redis, topic: str, kind: Kind, config: RmqConfig | None = None,
                 now_ms: Callable[[], int] | None = None) -> None:
        check_text("topic", topic)
        if not isinstance(kind, Kind):
            raise InvalidRequest("kind", f"must be a Kind ({', '.join(k.name for k in Kind)}), got {kind!r}")
        self.topic = topic
        self.kind = kind
        self.config = config or RmqConfig()
        slots = []
        for index in range(self.config.slots):
            p = slot_prefix(self.config.key_prefix, "rmq", topic, index)
            slots.append(_SlotKeys(*(p + name for name in ("store", "prepare", "dead", "pending", "body", "key",
                                                           "retry", "prio", "lease"))))
        super().__init__(client, self.config, now_ms, SCRIPTS, slots)
        self._definition_key = f"{self.config.key_prefix}:rmq:{{{escape_topic(topic)}}}:def"
        self.workers_key = f"{self.config.key_prefix}:rmq:{{{escape_topic(topic)}}}:workers"

    @classmethod
    async def connect(cls, url: str, topic: str, kind: Kind, config: RmqConfig | None = None,
                      now_ms: Callable[[], int] | None = None) -> RmqTopic:
        """A topic on its own client for `url` (redis://[:password@]HOST:PORT/DB).
        A Redis that is down, or a wrong password, fails here with a
        sentence; so does a topic already defined with another kind or slot
        count (TopicMismatch)."""
        config = config or RmqConfig()
        opened = await cls(config.client(url), topic, kind, config, now_ms)._opened()
        try:
            await opened.define()
        except BaseException:
            await opened.aclose()
            raise
        return opened

    async def define(self) -> None:
        """Record this topic's kind and slot count in Redis, or check them
        against the recorded ones (TopicMismatch)."""
        mine = f"{self.kind.value} {self.config.slots}"
        key_types = {self._definition_key: "string"}
        await call_redis(self.redis, self.redis.set(self._definition_key, mine, nx=True), key_types)
        recorded = await call_redis(self.redis, self.redis.get(self._definition_key), key_types)
        if recorded != mine:
            raise TopicMismatch(f"topic {self.topic!r} is defined as {recorded!r} (kind slots), not {mine!r}: "
                                "a topic keeps its kind and slot count")

    def __repr__(self) -> str:
        return (f"RmqTopic(topic={self.topic!r}, kind={self.kind.name}, slots={self.config.slots}, "
                f"next_pop_slot={self._next_pop})")

    def slot_of(self, key: str) -> int:
        """RMQ's slot: CRC32 of the key (its slotBasis), mod the slot count."""
        return zlib.crc32(key.encode()) % self.config.slots

    def _slot_of_id(self, msg_id: str) -> int:
        head, _, tail = msg_id.partition("-") if isinstance(msg_id, str) else ("", "", "")
        if not (head.isascii() and head.isdigit() and int(head) < self.config.slots and len(tail) == 32):
            raise InvalidRequest("id", f"is not an id of this topic (<slot>-<32 hex digits>), got {msg_id!r}")
        return int(head)

    # == sending =================================================================

    async def send_range_merge(self, body: str, range_ms: int, *, key: str | None = None) -> Sent:
        """Due in range_ms; a send with the same key while this one is
        pending merges into it (its due time stays, the body is the new one)."""
        check_int("range_ms", range_ms, 1, MAX_DELAY_MS)
        return await self._send(Kind.RANGE_MERGE, body, key, self.now_ms() + range_ms)

    async def send_priority(self, body: str, priority: int, *, key: str | None = None) -> Sent:
        """Higher priority pops first; a send with the same key while this
        one is pending merges into it, with the new priority and body."""
        check_int("priority", priority, -MAX_PRIORITY, MAX_PRIORITY)
        return await self._send(Kind.PRIORITY, body, key, priority)

    async def send_fixed_time(self, body: str, at_ms: int, *, key: str | None = None) -> Sent:
        """Due at at_ms (ms since the epoch; in the past: at once); a send
        with the same key while this one is pending merges into it, with
        the new time and body."""
        check_int("at_ms", at_ms, 0, self.now_ms() + MAX_DELAY_MS)
        return await self._send(Kind.FIXED_TIME, body, key, at_ms)

    async def _send(self, kind: Kind, body: str, key: str | None, score: int) -> Sent:
        if kind is not self.kind:
            raise InvalidRequest("kind", f"topic {self.topic!r} holds {self.kind.value} messages, "
                                         f"not {kind.value}: use send_{self.kind.name.lower()}")
        check_text("body", body, empty=True)
        key = body if key is None else key
        check_text("key", key, empty=True)
        slot = self.slot_of(key)
        stored, msg_id = await self._script("send", slot, [
            kind.value, f"{slot}-{uuid.uuid4().hex}", key, body, str(score)])
        return Sent(msg_id, merged=not stored)

    # == consuming ===============================================================

    async def pop(self, count: int = 1, wait_ms: int = 0) -> list[RmqMessage]:
        """Up to `count` deliverable messages (due ones; all, for priority
        topics), best first within each slot, moved to prepare until
        now + ack_timeout_ms. With none, waits up to `wait_ms` for one;
        returns as soon as any is popped."""
        async def take(now_ms: int, slot: int, want: int) -> tuple[list[RmqMessage], int | None]:
            head, flat = await self._script("pop", slot, [
                self.kind.value, str(now_ms), str(now_ms + self.config.ack_timeout_ms), str(want)])
            popped = [RmqMessage(flat[i], flat[i + 1], flat[i + 2], int(flat[i + 3]), slot)
                      for i in range(0, len(flat), 4)]
            return popped, None if head is None else int(float(head))

        return await self._pop(count, wait_ms, take)

    async def ack(self, msg_id: str) -> bool:
        """Consumed: forget it. False if it is not being consumed (acked
        already, or its deadline passed and process_timeouts took it back)."""
        return bool(await self._script("ack", self._slot_of_id(msg_id), [self.kind.value, msg_id]))

    async def nack(self, msg_id: str) -> Outcome:
        """Failed: back to the store (retries + 1), or dead after max_retries retries."""
        now_ms = self.now_ms()
        outcome = await self._script("nack", self._slot_of_id(msg_id), [
            self.kind.value, str(now_ms), str(now_ms + self.config.retry_delay_ms), str(self.config.max_retries),
            msg_id])
        return Outcome(outcome)

    async def process_timeouts(self) -> int:
        """Every popped message past its ack deadline is a failed delivery
        (as nack). Returns how many."""
        now_ms = self.now_ms()
        return await self._drain("timeouts", [self.kind.value, str(now_ms), str(now_ms + self.config.retry_delay_ms),
                                              str(self.config.max_retries)])

    async def sweep_timeouts_forever(self) -> None:
        """process_timeouts every sweep_ms until cancelled. An error ends it:
        await the task."""
        await repeat(self.process_timeouts, self.config.sweep_ms)

    # == the dead queue ==========================================================

    async def dead(self, limit: int = 100) -> list[RmqMessage]:
        """Up to `limit` dead messages, oldest death first (over all slots)."""
        check_int("limit", limit, 1, 100_000)
        per_slot = await self._on_every_shard("dead", [self.kind.value, str(limit)])
        listed = [RmqMessage(flat[i], flat[i + 2], flat[i + 3], int(flat[i + 4]), slot, died_ms=int(flat[i + 1]))
                  for slot, flat in enumerate(per_slot) for i in range(0, len(flat), 5)]
        return sorted(listed, key=lambda m: (m.died_ms, m.id))[:limit]

    async def redrive(self, ids: Sequence[str] | None = None) -> int:
        """Dead messages back to the store (due now; priority topics: at their
        priority) with retries reset to 0: those of `ids` (others are
        ignored), or all. Returns how many left the dead queue."""
        now = str(self.now_ms())
        if ids is None:
            return await self._drain("redrive_oldest", [self.kind.value, now])
        by_slot: dict[int, list[str]] = {}
        for msg_id in ids:
            by_slot.setdefault(self._slot_of_id(msg_id), []).append(msg_id)
        if not by_slot:
            return 0
        return sum(await self._on_shards("redrive", {slot: [self.kind.value, now, *group]
                                                     for slot, group in by_slot.items()}))

    def worker(self, worker_id: str | None = None, lease_ms: int = 10_000) -> RmqWorker:
        """A consumer owning slots of this topic by lease (see the module
        docstring): per-key serial consumption across processes."""
        return RmqWorker(self, worker_id, lease_ms)

    async def sizes(self) -> RmqSizes:
        def read(pipe: aioredis.client.Pipeline, keys: _SlotKeys) -> None:
            pipe.zcard(keys.store)
            pipe.zcard(keys.prepare)
            pipe.zcard(keys.dead)

        counts = await self._read_every_shard(read)
        return RmqSizes(sum(counts[0::3]), sum(counts[1::3]), sum(counts[2::3]))


class RmqWorker:
    """One consumer of an RmqTopic that owns slots by lease, so that each key
    is consumed by one worker at a time (RMQ's slot assignment, without
    ZooKeeper; see the module docstring).

        worker = topic.worker()
        beats = asyncio.create_task(worker.run())    # heartbeats: keep and balance slots
        sweeper = asyncio.create_task(topic.sweep_timeouts_forever())
        for message in await worker.pop(wait_ms=1000):
            ...                                      # handle it, then
            await worker.ack(message.id)             # or nack
        await worker.close()                         # leases given back

    `run` must keep going (a worker whose heartbeats stop loses its slots
    after lease_ms); an ack deadline (the topic's ack_timeout_ms) shorter
    than lease_ms makes a paused worker's delivery time out before its
    slot can move."""

    def __init__(self, topic: RmqTopic, worker_id: str | None = None, lease_ms: int = 10_000) -> None:
        check_int("lease_ms", lease_ms, 3, MAX_DELAY_MS)
        self.topic = topic
        self.id = worker_id or uuid.uuid4().hex
        check_text("worker_id", self.id)
        self.lease_ms = lease_ms
        self.owned: set[int] = set()
        self._first = zlib.crc32(self.id.encode()) % topic.config.slots  # where it starts looking for free slots

    def __repr__(self) -> str:
        return f"RmqWorker({self.id!r}, topic={self.topic.topic!r}, owned={sorted(self.owned)})"

    async def heartbeat(self) -> None:
        """Register, renew the leases held, give up slots beyond the fair
        share (only those with no delivery in progress), take free ones up
        to it."""
        topic, now_ms = self.topic, self.topic.now_ms()
        redis, types = topic.redis, {topic.workers_key: "zset"}
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zadd(topic.workers_key, {self.id: now_ms + self.lease_ms})
            pipe.zremrangebyscore(topic.workers_key, "-inf", now_ms)
            pipe.zcard(topic.workers_key)
            _, _, live = await call_redis(redis, pipe.execute(), types)
        slots = topic.config.slots
        share = -(-slots // max(1, live))
        for slot in sorted(self.owned):
            if not await topic._script("lease", slot, [topic.kind.value, self.id, str(self.lease_ms)]):
                self.owned.discard(slot)  # lapsed and taken: another owns it now
        for slot in sorted(self.owned)[share:]:
            if await topic._script("release", slot, [topic.kind.value, self.id]):
                self.owned.discard(slot)
        for i in range(slots):
            if len(self.owned) >= share:
                break
            slot = (self._first + i) % slots
            if slot not in self.owned and await topic._script("lease", slot, [topic.kind.value, self.id,
                                                                              str(self.lease_ms)]):
                self.owned.add(slot)

    async def run(self) -> None:
        """Heartbeats every lease_ms / 3 until cancelled."""
        while True:
            await self.heartbeat()
            await asyncio.sleep(self.lease_ms / 3000)

    async def pop(self, count: int = 1, wait_ms: int = 0) -> list[RmqMessage]:
        """Up to `count` messages, at most one per owned slot and only from
        slots with no delivery in progress; waits up to `wait_ms` for one."""
        topic = self.topic
        deadline = topic.now_ms() + wait_ms
        while True:
            now_ms = topic.now_ms()
            got: list[RmqMessage] = []
            for slot in sorted(self.owned):
                if len(got) >= count:
                    break
                _, flat = await topic._script("pop_serial", slot, [
                    topic.kind.value, str(now_ms), str(now_ms + topic.config.ack_timeout_ms), self.id])
                if flat:
                    got.append(RmqMessage(flat[0], flat[1], flat[2], int(flat[3]), slot))
            if got or now_ms >= deadline:
                return got
            await asyncio.sleep(min(topic.config.poll_ms, deadline - now_ms) / 1000)

    async def ack(self, msg_id: str) -> bool:
        return await self.topic.ack(msg_id)

    async def nack(self, msg_id: str) -> Outcome:
        return await self.topic.nack(msg_id)

    async def close(self) -> None:
        """Give back every slot with no delivery in progress and deregister
        (the rest lapse after lease_ms)."""
        topic = self.topic
        for slot in sorted(self.owned):
            if await topic._script("release", slot, [topic.kind.value, self.id]):
                self.owned.discard(slot)
        await call_redis(topic.redis, topic.redis.zrem(topic.workers_key, self.id), {topic.workers_key: "zset"})
