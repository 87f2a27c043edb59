"""Recurring schedules on the Redis backend (docs/redis.md, "Recurring
schedules on Redis"): broker.schedules.keeper' `Schedules`, unchanged, over a
`RedisScheduleStore`. Every node sharing the Redis serves the API's calls
(put, delete, pause, resume, get, list) from Redis; the runs are made by
the one node that holds the schedules lease (`ScheduleWork`).

Keys (P = "<prefix>:{T'}:", the topic's hash tag as broker.redis.keys
makes it, so every script of a topic's schedules is on one Cluster slot):

    P schedules    hash    scheduleId -> the schedule's row (JSON: every
                           parameter, version, paused, pending, runs,
                           catchUp, lastRuns, stale), as the disk's "put"
    P schedstale   hash    scheduleId -> the msgId of a deleted schedule's
                           run, to delete if still waiting (as a "delete"
                           record's `stale`)
    P schedrev     hash    scheduleId -> the revision of its row: the
                           value of `schedseq` at the write that made it
    P schedseq     string  a counter: each write of the topic's rows adds one
    P schedchanged set     scheduleIds a node without the lease changed,
                           for the holder to read again
    <prefix>:schedtopics   set of topics that ever had a schedule
    <prefix>:scheddirty    set of topics whose `schedchanged` has members
    <prefix>:schedlease    string: the id of the node holding the lease
                           (expires after lease_ms unless renewed)
    <prefix>:schedepoch    counter: each taking of the lease adds one (logs)

Each change of one topic's schedules is ONE script (`WRITE`) over its
keys, a compare-and-set: each row is written only if its revision is the
one this node read or wrote last, all of them or none (else the write is
refused, `StaleRows`, and the caller reads them again and decides anew).
The caller writes at most ADVANCE_SLICE (100) rows a script
(broker.schedules.keeper's slices), so a script is bounded by 250 rows of at most
--max-msg-bytes each. Reads of rows with their revisions are one script
too (`READ`, `PAGE`), so a row is never paired with another's revision.

The API. Every node keeps a `Schedules` (loaded at its start: its counts
for --max-schedules); each call first reads the schedules it is about
from Redis (one script), decides on them as the disk does, and writes
(the compare-and-set). So any node answers at once, whichever node holds
the lease, or none (a dead holder's lease not lapsed yet); two nodes
changing one schedule at once are ordered by the revision. A node without
the lease adds what it changed to the topic's `schedchanged` in the same
script, and the topic to `scheddirty` after it.

The runs. A node takes the free lease (broker.redis.lease), reads every schedule afresh and
starts a `Schedules` of its own that makes the runs, recovering as after a
restart on disk: each pending run that does not exist is sent, strictly
(msgId `<scheduleId>@<nominal ms>`: a run the old holder sent meanwhile is
answered, not made again), and one released is followed. It serves the
node's API calls from then on. `ChangeFeed` reads the schedules other
nodes changed (popped from `scheddirty` and `schedchanged` every
WATCH_MAX_SLEEP_MS, every topic's every lease_ms in case a node died
between its write and its `scheddirty`). A holder that lost the lease and
does not know yet writes with revisions too: of two nodes following one
release, the second's write is refused, and it reads what the first did.
So no run is lost or made twice across node deaths, and the only cost of a
holder's death is the wait for its lease to lapse (a run due meanwhile is
released on time by any node's mover, and the next one made when the next
holder sees it released).

Releases. On disk broker.disk.messages tells `Schedules.on_release` in
the turn it releases a run; on Redis any node's TICK script releases it, so the holder
watches (`RunWatch`): at each pending run's trigger time it reads the
run's status (GET), and a run no longer WAITING is handed to `on_release`
with the time it was seen released. That time, not the TICK's, is the
release's for lateness and misfire. A run of misfire=skip is sent with its
deadline (nominal + misfireGraceMillis, `NewSend.skip_after_ms`, kept in
its meta): the script that releases it after that ends it unseen (status
5) in the same step, as the disk's release does through `on_release`, so
it is never delivered; one that the script delivered was released within
its grace and counts so even if the watch saw it later. A run due while
its topic or serial key is paused is held back by the scripts themselves
(lua/backend/common.lua's hold: left WAITING, released by the resume's
flow_save.lua), so the watch, reading it WAITING long past its trigger
time (HELD_AFTER_MS) every WATCH_MAX_SLEEP_MS, makes no next run until it
sees that release, judged by the misfire rule then. getSchedule lists
a released run whose next run is not made yet (broker.schedules.keeper'
`last_runs`), so an acked run is listed on every node at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from storage.entry import Status
from storage.errors import HourglassError, NotFound, Unavailable
from wheel.clock import Clock

from ..backend import Backend
from ..schedules.file import Key, Row, RowError, RunProgress
from ..schedules.keeper import ADVANCE_SLICE, Fresh, ScheduleLimits, Schedules, StaleRows, seen_released_ms
from ..tasks import cancel_and_wait
from .keys import escape_topic
from .link import REDIS_ERRORS

log = logging.getLogger("hourglass.redis.schedules")

# KEYS: schedules, schedstale, schedrev, schedseq, schedchanged. ARGV:
# announce ("1": add the ids to schedchanged), then quads kind id rev value:
# "P" id rev row (put), "D" id rev stale-or-"" (delete), "F" id "" ""
# (a stale run dealt with). P and D apply only if the id's revision is
# `rev` ("0": none), all or none -> {revision written} | {0, stale ids}.
WRITE = """
local stale = {}
for i = 2, #ARGV, 4 do
  if ARGV[i] ~= 'F' and (redis.call('HGET', KEYS[3], ARGV[i + 1]) or '0') ~= ARGV[i + 2] then
    stale[#stale + 1] = ARGV[i + 1]
  end
end
if #stale > 0 then return {0, stale} end
local rev = redis.call('INCR', KEYS[4])
for i = 2, #ARGV, 4 do
  local kind, id, value = ARGV[i], ARGV[i + 1], ARGV[i + 3]
  if kind == 'P' then
    redis.call('HSET', KEYS[1], id, value)
    redis.call('HSET', KEYS[3], id, rev)
    redis.call('HDEL', KEYS[2], id)
  elseif kind == 'D' then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[3], id)
    if value ~= '' then redis.call('HSET', KEYS[2], id, value) else redis.call('HDEL', KEYS[2], id) end
  else
    redis.call('HDEL', KEYS[2], id)
  end
  if kind ~= 'F' and ARGV[1] == '1' then redis.call('SADD', KEYS[5], id) end
end
return {rev}
"""
# KEYS: schedules, schedstale, schedrev. ARGV: ids -> {rows, stale runs, revisions} (false: none).
READ = """
return {redis.call('HMGET', KEYS[1], unpack(ARGV)), redis.call('HMGET', KEYS[2], unpack(ARGV)),
        redis.call('HMGET', KEYS[3], unpack(ARGV))}
"""
# KEYS: schedules, schedrev. ARGV: cursor count -> {next cursor, {id, row, ...}, revisions}.
PAGE = """
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local ids = {}
for i = 1, #page[2], 2 do ids[#ids + 1] = page[2][i] end
local revs = {}
if #ids > 0 then revs = redis.call('HMGET', KEYS[2], unpack(ids)) end
return {page[1], page[2], revs}
"""
# Rows read at a time when the lease is taken (HSCAN's COUNT), and
# changed scheduleIds popped at a time by the holder.
READ_PAGE = 200
# A pending run found still WAITING at its trigger time is read again this
# soon (the TICK that releases it runs at about that time, on some node).
RECHECK_MS = 20
# A pending run still WAITING this long past its trigger time is held back
# by a pause of its topic or serial key (lua/backend/common.lua's hold): read
# again every WATCH_MAX_SLEEP_MS, so its resume is seen within that.
HELD_AFTER_MS = 1_000
# The longest the watch sleeps: a run put or made since its last look is
# seen within this; and how often the holder reads what other nodes changed.
WATCH_MAX_SLEEP_MS = 200


def _parse_row(topic: str, schedule_id: str, value: str) -> Row:
    row = orjson.loads(value)
    if not isinstance(row, dict):
        raise RowError(f"schedule {schedule_id!r} of topic {topic!r} is not a JSON object")
    return row


class RedisScheduleStore:
    """broker.schedules.keeper' ScheduleStore over Redis (the module docstring):
    the rows, and the revision this node last read or wrote of each, the
    compare-and-set of its writes. `open` reads them all; `announce` (a
    node without the lease) tells the holder of each change."""

    def __init__(self, client: aioredis.Redis | RedisCluster, key_prefix: str, *, announce: bool) -> None:
        self._redis = client
        self._prefix = key_prefix
        self.announce = announce
        self.rows: dict[Key, Row] = {}
        self.stale: dict[Key, str] = {}
        self._revs: dict[Key, int] = {}  # the revision of each row this node knows (absent: none)
        self._write = client.register_script(WRITE)
        self._read = client.register_script(READ)
        self._page = client.register_script(PAGE)
        self._topics: set[str] = set()  # topics known to be in schedtopics
        self.scripts = 0  # WRITE scripts run (tests)

    def __repr__(self) -> str:
        return (f"RedisScheduleStore(prefix={self._prefix!r}, rows={len(self._revs)}, "
                f"topics={len(self._topics)}, announce={self.announce})")

    def keys(self, topic: str) -> list[str]:
        """schedules, schedstale, schedrev, schedseq, schedchanged."""
        return topic_keys(self._prefix, topic)

    @property
    def topics_key(self) -> str:
        return f"{self._prefix}:schedtopics"

    @property
    def dirty_key(self) -> str:
        return f"{self._prefix}:scheddirty"

    async def open(self, *, clear_changes: bool = False) -> None:
        """Read every topic's rows. `clear_changes` (the lease holder's):
        the changes announced before are in what is read, so forgotten
        first (one made meanwhile is announced again)."""
        try:
            if clear_changes:
                await self._redis.delete(self.dirty_key)
            self._topics = {str(t) for t in await self._redis.smembers(self.topics_key)}
            for topic in sorted(self._topics):
                rows, stale, revs, _, changed = self.keys(topic)
                if clear_changes:
                    await self._redis.delete(changed)
                cursor = "0"
                while True:
                    cursor, pairs, at = await self._page(keys=[rows, revs], args=[cursor, str(READ_PAGE)])
                    for n in range(0, len(pairs), 2):
                        key = (topic, str(pairs[n]))
                        self.rows[key] = _parse_row(topic, key[1], pairs[n + 1])
                        self._revs[key] = int(at[n // 2] or 0)
                    if str(cursor) == "0":
                        break
                async for schedule_id, msg_id in self._redis.hscan_iter(stale, count=READ_PAGE):
                    self.stale[(topic, schedule_id)] = msg_id
        except REDIS_ERRORS as e:
            raise Unavailable(f"cannot read the schedules from Redis: {e}") from e

    async def read(self, keys: Sequence[Key]) -> Fresh:
        """The schedules whose revision is not the one this node knows, as
        they are now (one script per topic), and the stale runs of those
        deleted (ScheduleStore.read)."""
        by_topic: dict[str, list[str]] = {}
        for topic, schedule_id in keys:
            by_topic.setdefault(topic, []).append(schedule_id)
        rows: dict[Key, Row | None] = {}
        stale: dict[Key, str] = {}
        for topic, ids in by_topic.items():
            ids = list(dict.fromkeys(ids))
            try:
                values, runs, revs = await self._read(keys=self.keys(topic)[:3], args=ids)
            except REDIS_ERRORS as e:
                raise Unavailable(f"cannot read the schedules from Redis: {e}") from e
            for schedule_id, value, run, rev in zip(ids, values, runs, revs):
                key = (topic, schedule_id)
                if value is None and run is not None:
                    stale[key] = str(run)
                now = int(rev or 0)
                if now == self._revs.get(key, 0) and (value is None) == (now == 0):
                    continue
                rows[key] = None if value is None else _parse_row(topic, schedule_id, value)
                if value is None:
                    self._revs.pop(key, None)
                else:
                    self._revs[key] = now
        return rows, stale

    async def topic_ids(self, topic: str) -> set[str]:
        try:
            return {str(i) for i in await self._redis.hkeys(self.keys(topic)[0])}
        except REDIS_ERRORS as e:
            raise Unavailable(f"cannot read the schedules from Redis: {e}") from e

    async def write(self, records: list[Row]) -> None:
        """The records applied, one script per topic (in the order given
        within it), each if no other node changed its rows since this one
        read them (else StaleRows, that topic's nothing applied): durable
        as Redis keeps what it is told."""
        by_topic: dict[str, list[tuple[str, str, str]]] = {}
        for record in records:
            row = record.get("put")
            if isinstance(row, dict):
                topic = str(row["topic"])
                by_topic.setdefault(topic, []).append(("P", str(row["scheduleId"]), orjson.dumps(row).decode()))
                continue
            deleted = record["delete"]
            assert isinstance(deleted, list)  # a record broker.schedules.keeper made
            stale = record.get("stale")
            by_topic.setdefault(str(deleted[0]), []).append(
                ("D", str(deleted[1]), stale if isinstance(stale, str) else ""))
        await self._apply(by_topic)

    async def _apply(self, by_topic: dict[str, list[tuple[str, str, str]]]) -> None:
        for topic, ops in by_topic.items():
            try:
                if topic not in self._topics:
                    await self._redis.sadd(self.topics_key, topic)
                    self._topics.add(topic)
                self.scripts += 1
                args = ["1" if self.announce else "0"]
                for kind, schedule_id, value in ops:
                    args += (kind, schedule_id, str(self._revs.get((topic, schedule_id), 0)), value)
                answer = await self._write(keys=self.keys(topic), args=args)
                if int(answer[0]) == 0:
                    raise StaleRows([(topic, str(i)) for i in answer[1]])
                for kind, schedule_id, _ in ops:
                    if kind == "P":
                        self._revs[(topic, schedule_id)] = int(answer[0])
                    elif kind == "D":
                        self._revs.pop((topic, schedule_id), None)
                if self.announce:  # the holder reads them again (ChangeFeed)
                    await self._redis.sadd(self.dirty_key, topic)
            except REDIS_ERRORS as e:
                raise Unavailable(f"cannot write the schedules to Redis: {e}") from e

    async def write_runs(self, states: Sequence[RunProgress]) -> None:
        """Runs made: each schedule's row (one script per topic)."""
        await self.write([{"put": s.row()} for s in states])

    def rewrite_due(self, live_bytes: int) -> bool:
        return False  # a hash keeps each row once

    async def rewrite(self, rows: Sequence[RunProgress]) -> None:
        return None

    async def forget_stale(self, keys: list[Key]) -> None:
        by_topic: dict[str, list[tuple[str, str, str]]] = {}
        for topic, schedule_id in keys:
            by_topic.setdefault(topic, []).append(("F", schedule_id, ""))
        await self._apply(by_topic)

    def close(self) -> None:
        return None


class ChangeFeed:
    """The lease holder's: reads again the schedules other nodes changed
    (the module docstring), every WATCH_MAX_SLEEP_MS, and every topic's
    every `sweep_ms`."""

    def __init__(self, client: aioredis.Redis | RedisCluster, store: RedisScheduleStore, schedules: Schedules,
                 clock: Clock, sweep_ms: int) -> None:
        self._redis = client
        self._store = store
        self._schedules = schedules
        self._clock = clock
        self._sweep_ms = sweep_ms
        self.read = 0  # schedules read again (tests)

    def __repr__(self) -> str:
        return f"ChangeFeed({self.read} schedules read again)"

    async def run(self) -> None:
        swept_ms = self._clock.now_ms()
        while True:
            await self._clock.sleep(WATCH_MAX_SLEEP_MS / 1000)
            try:
                if self._clock.now_ms() - swept_ms >= self._sweep_ms:
                    swept_ms = self._clock.now_ms()
                    topics = {str(t) for t in await self._redis.smembers(self._store.topics_key)}
                else:
                    topics = set()
                while True:
                    popped = await self._redis.spop(self._store.dirty_key, READ_PAGE)
                    if not popped:
                        break
                    topics.update(str(t) for t in popped)
                for topic in sorted(topics):
                    await self._follow(topic)
            except (*REDIS_ERRORS, HourglassError) as e:  # looked at again next round
                log.warning("schedules: cannot read what other nodes changed: %s", e)

    async def _follow(self, topic: str) -> None:
        changed = self._store.keys(topic)[4]
        while True:
            ids = [str(i) for i in await self._redis.spop(changed, READ_PAGE) or ()]
            if not ids:
                return
            try:
                await self._schedules.refresh([(topic, i) for i in ids])
            except BaseException:  # put back for the next round
                with contextlib.suppress(*REDIS_ERRORS):
                    await self._redis.sadd(changed, *ids)
                    await self._redis.sadd(self._store.dirty_key, topic)
                raise
            self.read += len(ids)


def topic_keys(key_prefix: str, topic: str) -> list[str]:
    """A topic's schedules, schedstale, schedrev, schedseq and schedchanged
    keys (the module docstring)."""
    p = f"{key_prefix}:{{{escape_topic(topic)}}}:"
    return [p + "schedules", p + "schedstale", p + "schedrev", p + "schedseq", p + "schedchanged"]


async def scheduled(client: aioredis.Redis | RedisCluster, key_prefix: str, topic: str,
                    schedule_ids: Sequence[str]) -> set[str]:
    """Which of `schedule_ids` are schedules of `topic`, as Redis holds
    them: what any node asks before it takes a send under a run's msgId
    (broker.http.api refuses one of a schedule). One round trip (one key)."""
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
                if message.status is Status.WAITING and made:  # (long past due: held back by a pause, read less often)
                    late = self._clock.now_ms() - state.trigger_ms(nominal_ms) > HELD_AFTER_MS
                    next_ms = min(next_ms, self._clock.now_ms() + (WATCH_MAX_SLEEP_MS if late else RECHECK_MS))
                    continue
                self._told.add((state.key, nominal_ms))
                if message.status is Status.DELETED or not made:
                    self._schedules.on_gone(state.key, nominal_ms)  # skipped: the schedule goes on past it
                    continue
                self._schedules.on_release([message], seen_released_ms(state.spec, nominal_ms, message.status,
                                                                        self._clock.now_ms()))
                # its next run is made now, and may be due already (runs caught up after a lease changed hands)
                next_ms = min(next_ms, self._clock.now_ms() + RECHECK_MS)
            await self._clock.sleep(max(0, next_ms - self._clock.now_ms()) / 1000)


class ScheduleWork:
    """The node's schedules: a `Schedules` that serves the API (handed to
    `publish` by `open`), and, while this node holds the schedules lease
    (broker.redis.lease), a `Schedules` that makes the runs, serving the API
    too (published in its place). `lease_ms`: the lease's (the change feed
    looks at every topic that often)."""

    what = "schedules"
    tick_ms: int | None = None

    def __init__(self, client: aioredis.Redis | RedisCluster, key_prefix: str, backend: Backend, clock: Clock,
                 limits: ScheduleLimits, publish: Callable[[Schedules | None], None], *,
                 lease_ms: int = 10_000) -> None:
        self.key = f"{key_prefix}:schedlease"
        self._redis = client
        self._clock = clock
        self.lease_ms = lease_ms
        self._prefix = key_prefix
        self._backend = backend
        self._limits = limits
        self._publish = publish
        self.view: Schedules | None = None  # serves the API while this node does not hold the lease
        self.schedules: Schedules | None = None  # makes the runs: while this node holds the lease
        self._store: RedisScheduleStore | None = None  # the store of `schedules`
        self._tasks: list[asyncio.Task[None]] = []  # the holder's RunWatch and ChangeFeed
        self.epoch = 0

    def __repr__(self) -> str:
        return f"ScheduleWork(holding={self.schedules is not None}, epoch={self.epoch})"

    @property
    def opened(self) -> bool:
        return self.view is not None or self.schedules is not None

    async def open(self) -> None:
        """Read the schedules and serve the API's calls (before the node
        listens, so that it answers them from its first request)."""
        store = RedisScheduleStore(self._redis, self._prefix, announce=True)
        await store.open()
        view = Schedules(store, self._clock, self._limits)
        view.serve(self._backend)
        self.view = view
        if self.schedules is None:
            self._publish(view)

    async def take(self) -> None:
        self.epoch = int(await self._redis.incr(f"{self._prefix}:schedepoch"))
        store = RedisScheduleStore(self._redis, self._prefix, announce=False)
        await store.open(clear_changes=True)
        schedules = Schedules(store, self._clock, self._limits)
        schedules.start(self._backend)
        self.schedules, self._store = schedules, store
        self.view = None  # (its RAM given back: `schedules` serves the API now)
        self._tasks = [asyncio.create_task(RunWatch(schedules, self._backend, self._clock).run(), name="run-watch"),
                       asyncio.create_task(ChangeFeed(self._redis, store, schedules, self._clock,
                                                      self.lease_ms).run(), name="schedule-changes")]
        self._publish(schedules)
        log.info("schedules: this node holds the lease (epoch %d): %d schedules", self.epoch, len(schedules))

    async def tick(self) -> None:
        return None  # (the run watch and the change feed are tasks of their own)

    async def let_go(self) -> None:
        """Stop making runs; the schedules that made them serve the API
        from now on (the freshest this node has), telling the next holder
        of each change."""
        schedules, self.schedules = self.schedules, None
        tasks, self._tasks = self._tasks, []
        try:
            await cancel_and_wait(tasks)
        finally:  # (a stop that cancels this wait still stops the runs: nothing else would)
            if schedules is not None:
                await schedules.stop()  # (it serves the API meanwhile, and again at once after)
        if schedules is None:
            return
        if self._store is not None:
            self._store.announce = True
        schedules.serve(self._backend)
        self.view = schedules


__all__ = ["ADVANCE_SLICE", "ChangeFeed", "RedisScheduleStore", "RunWatch", "ScheduleWork"]
