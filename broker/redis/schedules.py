"""Recurring schedules on the Redis backend (docs/redis.md, "Recurring
schedules on Redis"): broker.schedules' `Schedules`, unchanged, over a
`RedisScheduleStore`, run by the one node among those sharing the Redis
that holds the schedules lease (`ScheduleLease`).

Keys (P = "<prefix>:{T'}:", the topic's hash tag as broker.redis.keys
makes it, so every script of a topic's schedules is on one Cluster slot):

    P schedules   hash    scheduleId -> the schedule's row (JSON: every
                          parameter, version, paused, pending, runs,
                          catchUp, lastRuns, stale), as the disk's "put"
    P schedstale  hash    scheduleId -> the msgId of a deleted schedule's
                          run, to delete if still waiting (as a "delete"
                          record's `stale`)
    P schedepoch  string  the highest lease epoch that wrote the topic's
                          schedules: a script of a lower one is refused
    <prefix>:schedtopics  set of topics that ever had a schedule
    <prefix>:schedlease   string: the id of the node holding the lease
                          (expires after lease_ms unless renewed)
    <prefix>:schedepoch   counter: each taking of the lease adds one

Each change of one topic's schedules is ONE script (`WRITE`) over its
three keys: the rows put, deleted or their stale runs forgotten, in the
order given, after checking the caller's epoch; the caller writes at most
ADVANCE_SLICE (100) rows a script (broker.schedules' slices), so a script
is bounded by 100 rows of at most --max-msg-bytes each.

Only the lease holder makes runs. A node takes the free lease (SET NX PX),
draws a new epoch (INCR), claims every topic of `schedtopics` with it
(CLAIM: from then on a script of an older epoch, a node that lost the
lease and does not know yet, is refused) and only then reads the rows (in
pages, HSCAN): whatever the old holder wrote before the claim is read.
Its `Schedules` then recovers as after a restart on disk: each pending run
that does not exist is sent, strictly (msgId `<scheduleId>@<nominal ms>`:
a run the old holder sent meanwhile is answered, not made again), and one
released is followed. So no run is lost or made twice across node deaths,
and the only cost of a holder's death is the wait for its lease to lapse
(a run due meanwhile is released on time by any node's mover, and the
next one made when the next holder sees it released).

Releases. On disk the releaser tells `Schedules.on_release` in the turn it
releases a run; on Redis any node's TICK script releases it, so the holder
watches (`RunWatch`): at each pending run's trigger time it reads the
run's status (GET), and a run no longer WAITING is handed to `on_release`
with the time it was seen released. That time, not the TICK's, is the
release's for lateness and misfire. A run of misfire=skip is sent with its
deadline (nominal + misfireGraceMillis, `NewSend.skip_after_ms`, kept in
its meta): the script that releases it after that ends it unseen (status
5) in the same step, as the disk's releaser does through `on_release`, so
it is never delivered; one that the script delivered was released within
its grace and counts so even if the watch saw it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from storage.entry import Message, Status
from storage.errors import HourglassError, NotFound, Unavailable
from wheel.clock import Clock

from ..backend import Backend
from ..recurrence import Misfire
from ..schedule_file import Key, Row, RowError, RunProgress
from ..schedules import ADVANCE_SLICE, ScheduleLimits, Schedules, ScheduleState
from .keys import escape_topic
from .link import REDIS_ERRORS

log = logging.getLogger("hourglass.redis.schedules")

# KEYS: schedules, schedstale, schedepoch. ARGV: epoch, then triples
# kind id value: "P" id row (put), "D" id stale-or-"" (delete), "F" id ""
# (a stale run dealt with). -> the number applied, or the error HGFENCED.
WRITE = """
local epoch = tonumber(ARGV[1])
local held = tonumber(redis.call('GET', KEYS[3]) or '0')
if epoch < held then return redis.error_reply('HGFENCED schedules written by lease epoch ' .. held) end
if epoch > held then redis.call('SET', KEYS[3], ARGV[1]) end
local n = 0
for i = 2, #ARGV, 3 do
  local kind, id, value = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if kind == 'P' then
    redis.call('HSET', KEYS[1], id, value)
    redis.call('HDEL', KEYS[2], id)
  elseif kind == 'D' then
    redis.call('HDEL', KEYS[1], id)
    if value ~= '' then redis.call('HSET', KEYS[2], id, value) else redis.call('HDEL', KEYS[2], id) end
  else
    redis.call('HDEL', KEYS[2], id)
  end
  n = n + 1
end
return n
"""
# KEYS: schedepoch. ARGV: epoch -> 1, or the error HGFENCED (a later holder claimed it).
CLAIM = """
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < held then return redis.error_reply('HGFENCED schedules claimed by lease epoch ' .. held) end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""
# KEYS: schedlease. ARGV: node lease_ms -> 1 renewed | 0 another's (or lapsed).
RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
# KEYS: schedlease. ARGV: node -> 1 released | 0 not ours.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
FENCED = "HGFENCED"
# Rows read at a time when the lease is taken (HSCAN's COUNT).
READ_PAGE = 200
# A pending run found still WAITING at its trigger time is read again this
# soon (the TICK that releases it runs at about that time, on some node).
RECHECK_MS = 20
# The longest the watch sleeps: a run put or made since its last look is
# seen within this.
WATCH_MAX_SLEEP_MS = 200


class RedisScheduleStore:
    """broker.schedules' ScheduleStore over Redis (the module docstring).
    `open` claims every topic for `epoch` and reads the rows."""

    def __init__(self, client: aioredis.Redis | RedisCluster, key_prefix: str, epoch: int) -> None:
        self._redis = client
        self._prefix = key_prefix
        self.epoch = epoch
        self.rows: dict[Key, Row] = {}
        self.stale: dict[Key, str] = {}
        self._write = client.register_script(WRITE)
        self._claim = client.register_script(CLAIM)
        self._topics: set[str] = set()  # topics known to be in schedtopics
        self.scripts = 0  # WRITE scripts run (tests)

    def __repr__(self) -> str:
        return f"RedisScheduleStore(prefix={self._prefix!r}, epoch={self.epoch}, topics={len(self._topics)})"

    def keys(self, topic: str) -> list[str]:
        return topic_keys(self._prefix, topic)

    @property
    def topics_key(self) -> str:
        return f"{self._prefix}:schedtopics"

    async def open(self) -> None:
        """Claim every topic with schedules for this epoch, then read its rows."""
        try:
            self._topics = {str(t) for t in await self._redis.smembers(self.topics_key)}
            for topic in sorted(self._topics):
                rows, stale, epoch_key = self.keys(topic)
                await self._call(self._claim, [epoch_key], [str(self.epoch)])
                async for schedule_id, value in self._redis.hscan_iter(rows, count=READ_PAGE):
                    row = orjson.loads(value)
                    if not isinstance(row, dict):
                        raise RowError(f"schedule {schedule_id!r} of topic {topic!r} is not a JSON object")
                    self.rows[(topic, schedule_id)] = row
                async for schedule_id, msg_id in self._redis.hscan_iter(stale, count=READ_PAGE):
                    self.stale[(topic, schedule_id)] = msg_id
        except REDIS_ERRORS as e:
            raise Unavailable(f"cannot read the schedules from Redis: {e}") from e

    async def _call(self, script: Any, keys: list[str], args: list[str]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except REDIS_ERRORS as e:
            if str(e).startswith(FENCED):
                raise Unavailable(f"this node no longer holds the schedules lease ({e}); retry") from e
            raise Unavailable(f"cannot write the schedules to Redis: {e}") from e

    async def write(self, records: list[Row]) -> None:
        """The records applied, one script per topic (in the order given
        within it): durable as Redis keeps what it is told."""
        by_topic: dict[str, list[str]] = {}
        for record in records:
            row = record.get("put")
            if isinstance(row, dict):
                topic, schedule_id = str(row["topic"]), str(row["scheduleId"])
                by_topic.setdefault(topic, []).extend(("P", schedule_id, orjson.dumps(row).decode()))
                continue
            deleted = record["delete"]
            assert isinstance(deleted, list)  # a record broker.schedules made
            stale = record.get("stale")
            by_topic.setdefault(str(deleted[0]), []).extend(
                ("D", str(deleted[1]), stale if isinstance(stale, str) else ""))
        await self._apply(by_topic)

    async def _apply(self, by_topic: dict[str, list[str]]) -> None:
        for topic, ops in by_topic.items():
            if topic not in self._topics:
                try:
                    await self._redis.sadd(self.topics_key, topic)
                except REDIS_ERRORS as e:
                    raise Unavailable(f"cannot write the schedules to Redis: {e}") from e
                self._topics.add(topic)
            self.scripts += 1
            await self._call(self._write, self.keys(topic), [str(self.epoch), *ops])

    async def write_runs(self, states: Sequence[RunProgress]) -> None:
        """Runs made: each schedule's row (one script per topic)."""
        await self.write([{"put": s.row()} for s in states])

    def rewrite_due(self, live_bytes: int) -> bool:
        return False  # a hash keeps each row once

    async def rewrite(self, rows: Sequence[RunProgress]) -> None:
        return None

    async def forget_stale(self, keys: list[Key]) -> None:
        by_topic: dict[str, list[str]] = {}
        for topic, schedule_id in keys:
            by_topic.setdefault(topic, []).extend(("F", schedule_id, ""))
        await self._apply(by_topic)

    def close(self) -> None:
        return None


def topic_keys(key_prefix: str, topic: str) -> list[str]:
    """A topic's schedules, schedstale and schedepoch keys (the module docstring)."""
    p = f"{key_prefix}:{{{escape_topic(topic)}}}:"
    return [p + "schedules", p + "schedstale", p + "schedepoch"]


async def scheduled(client: aioredis.Redis | RedisCluster, key_prefix: str, topic: str,
                    schedule_ids: Sequence[str]) -> set[str]:
    """Which of `schedule_ids` are schedules of `topic`, as Redis holds
    them: what any node asks before it takes a send under a run's msgId
    (broker.api refuses one of a schedule). One round trip (one key)."""
    key = topic_keys(key_prefix, topic)[0]
    try:
        if len(schedule_ids) == 1:
            return set(schedule_ids) if await client.hexists(key, schedule_ids[0]) else set()
        pipe = client.pipeline(transaction=False)
        for schedule_id in schedule_ids:
            pipe.hexists(key, schedule_id)
        found = await pipe.execute()
    except REDIS_ERRORS as e:
        raise Unavailable(f"cannot read the schedules from Redis: {e}") from e
    return {sid for sid, there in zip(schedule_ids, found) if there}


class RunWatch:
    """Tells `schedules.on_release` of each pending run once it is no longer
    WAITING (released by some node's TICK): the module docstring's
    "Releases"."""

    def __init__(self, schedules: Schedules, backend: Backend, clock: Clock) -> None:
        self._schedules = schedules
        self._backend = backend
        self._clock = clock
        self._told: set[tuple[Key, int]] = set()  # runs handed over, until their schedule moves on
        self.reads = 0  # status reads (tests)

    def __repr__(self) -> str:
        return f"RunWatch({len(self._told)} runs handed over, {self.reads} reads)"

    async def run(self) -> None:
        while True:
            now_ms = self._clock.now_ms()
            next_ms = now_ms + WATCH_MAX_SLEEP_MS
            due = []
            live: set[tuple[Key, int]] = set()
            for state in self._schedules.states():
                if state.pending is None:
                    continue
                run = (state.key, state.pending)
                live.add(run)
                if run in self._told:
                    continue
                trigger_ms = state.trigger_ms(state.pending)
                if trigger_ms <= now_ms:
                    due.append((state, state.pending))
                else:
                    next_ms = min(next_ms, trigger_ms)
            self._told &= live
            for state, nominal_ms in due:
                try:
                    self.reads += 1
                    message = await self._backend.get(state.spec.topic, state.msg_id(nominal_ms))
                except NotFound:  # deleted and gone (or not sent yet: the worker's repair sends it)
                    self._told.add((state.key, nominal_ms))
                    self._schedules.on_gone(state.key, nominal_ms)
                    continue
                except HourglassError as e:  # Redis away: looked at again next round
                    log.debug("schedules: cannot read run %s: %s", state.msg_id(nominal_ms), e)
                    next_ms = min(next_ms, now_ms + RECHECK_MS)
                    continue
                made = state.made(nominal_ms, message)
                if message.status is Status.WAITING and made:
                    next_ms = min(next_ms, self._clock.now_ms() + RECHECK_MS)
                    continue
                self._told.add((state.key, nominal_ms))
                if message.status is Status.DELETED or not made:
                    self._schedules.on_gone(state.key, nominal_ms)  # skipped: the schedule goes on past it
                    continue
                self._schedules.on_release([message], self._released_ms(state, nominal_ms, message))
                # its next run is made now, and may be due already (runs caught up after a lease changed hands)
                next_ms = min(next_ms, self._clock.now_ms() + RECHECK_MS)
            await self._clock.sleep(max(0, next_ms - self._clock.now_ms()) / 1000)

    def _released_ms(self, state: ScheduleState, nominal_ms: int, message: Message) -> int:
        """When the run counts as released: when it was seen so, except that
        a run of misfire=skip that a script delivered was released within
        its grace (the script would have ended it unseen past it), so it is
        not counted missed for having been seen late."""
        now_ms = self._clock.now_ms()
        spec = state.spec
        if spec.misfire is Misfire.SKIP and message.status is not Status.EXPIRED:
            return min(now_ms, nominal_ms + spec.grace_ms)
        return now_ms


class ScheduleLease:
    """Takes and holds the schedules lease for this node, and while it holds
    it runs the node's `Schedules` (handed to `publish`; None while it does
    not hold it). Renewed every lease_ms / 3; a renewal that fails, or no
    renewal for 2/3 of lease_ms, stops the schedules before the lease can
    have lapsed for another node to take."""

    def __init__(self, client: aioredis.Redis | RedisCluster, key_prefix: str, backend: Backend, clock: Clock,
                 limits: ScheduleLimits, publish: Callable[[Schedules | None], None], *,
                 lease_ms: int = 10_000) -> None:
        self._redis = client
        self._prefix = key_prefix
        self._backend = backend
        self._clock = clock
        self._limits = limits
        self._publish = publish
        self.lease_ms = lease_ms
        self.node = uuid.uuid4().hex
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self.schedules: Schedules | None = None
        self._watch: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.epoch = 0
        self.takes = 0  # times this node took the lease (tests)

    def __repr__(self) -> str:
        return f"ScheduleLease(node={self.node}, holding={self.schedules is not None}, epoch={self.epoch})"

    @property
    def lease_key(self) -> str:
        return f"{self._prefix}:schedlease"

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="schedule-lease")
        self._task.add_done_callback(_lease_loop_ended)

    async def stop(self) -> None:
        """Stop the schedules and let the lease go (another node takes it at once)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        held = self.schedules is not None
        await self._let_go()
        if held:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._release(keys=[self.lease_key], args=[self.node])

    async def _run(self) -> None:
        renewed_ms = 0
        while True:
            now_ms = self._clock.now_ms()
            try:
                if self.schedules is None:
                    if await self._redis.set(self.lease_key, self.node, nx=True, px=self.lease_ms):
                        renewed_ms = now_ms
                        await self._take()
                elif await self._renew(keys=[self.lease_key], args=[self.node, str(self.lease_ms)]):
                    renewed_ms = now_ms
                else:
                    log.warning("schedules: the lease passed to another node; this node stops making runs")
                    await self._let_go()
            except (*REDIS_ERRORS, HourglassError, OSError) as e:
                log.warning("schedules: lease: %s", e)
                if self.schedules is not None and self._clock.now_ms() - renewed_ms > 2 * self.lease_ms // 3:
                    await self._let_go()  # it may lapse before a renewal gets through
            await self._clock.sleep(self.lease_ms / 3000)

    async def _take(self) -> None:
        self.epoch = int(await self._redis.incr(f"{self._prefix}:schedepoch"))
        store = RedisScheduleStore(self._redis, self._prefix, self.epoch)
        await store.open()
        schedules = Schedules(store, self._clock, self._limits)
        schedules.start(self._backend)
        self.schedules = schedules
        self._watch = asyncio.create_task(RunWatch(schedules, self._backend, self._clock).run(), name="run-watch")
        self.takes += 1
        self._publish(schedules)
        log.info("schedules: this node holds the lease (epoch %d): %d schedules", self.epoch, len(schedules))

    async def _let_go(self) -> None:
        schedules, self.schedules = self.schedules, None
        watch, self._watch = self._watch, None
        self._publish(None)
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        if schedules is not None:
            await schedules.stop()
            schedules.close()


def _lease_loop_ended(task: asyncio.Task[None]) -> None:
    """The lease loop ends only when stopped; an error that ended it is
    logged (this node would not take the schedules lease again)."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("schedules: the lease loop ended: %r; this node takes the schedules lease no more",
                     task.exception(), exc_info=task.exception())


__all__ = ["ADVANCE_SLICE", "RedisScheduleStore", "RunWatch", "ScheduleLease"]
