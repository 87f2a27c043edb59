"""The Redis backend's bulk calls (docs/api.md, "Bulk calls"; docs/redis.md):
listMsg, deleteMsgs, rescheduleMsgs, with the disk broker's outcomes.

Finding: the topic's `meta` hash is read with HSCAN, SCAN_COUNT fields a
round trip (the event loop and Redis both free between them); a msgId
prefix is HSCAN's MATCH pattern (glob characters escaped), so Redis skips
the rest itself. With a key, only that key's messages are read: their ids
from the key's range of the `keyed` zset (broker.redis.keys), SCAN_COUNT a
round trip, with their metas; with a tag (and no key), that tag's range of
the `tags` zset the same way. Each read is a script (lua/backend/scan.lua)
that never reads a call half applied (the fence, below). Each meta's
status, trigger time, key and tag decide the match; a page's bodies are
read once its members are known (HMGET).

Changing, all or nothing per call, in steps of bounded length (Redis
answers nobody while a script runs; docs/redis.md, "Bulk calls in bounded
steps"):

1. gather: the matches' changes are pushed onto a staging list of the
   call's own (`<P>staging:<call>`) as they are read, a round trip's
   worth at a time (at most SCAN_COUNT, one RPUSH); it expires
   STAGING_TTL_MS after the last push, so a node that dies here leaves
   nothing behind);
2. commit: ONE script (lua/backend/bulk_commit.lua) renames it to the
   topic's `bulk` list; from then on the call takes effect whole;
3. apply: scripts of at most RedisConfig.bulk_batch changes each
   (lua/backend/bulk_apply.lua) make them, as deleteMsg and rescheduleMsg
   do -- a message acked, pulled or gone since it was read is left as it
   is. While `bulk` holds changes every other script of the topic answers
   HGBULK instead of running (the fence in common.lua): whoever meets it
   applies the rest first (`finish`), then runs its script again. So no
   client of any process sees the call half made, and a call whose node
   died after the commit is finished by the next request on the topic, or
   the next round of any node's mover. Other topics are served between
   the steps.

The caller's answer is the count the steps recorded for its call in the
topic's `bulkinfo` hash, whoever applied them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import cast

from storage.entry import Message, Status
from storage.errors import InvalidRequest, Unavailable
from wheel.clock import Clock

from ..core.bulk_params import BulkFilter, DeleteMsgsRequest, ListMsgRequest, PageKeeper, RescheduleMsgsRequest
from ..core.lifecycle import Lifecycle
from ..observe.metrics import Metrics, due_ms
from .keys import message_of, ready_member
from .link import REDIS_ERRORS, RedisLink, made_ready

# meta fields HSCAN returns per round trip (a hint to Redis), and tagged
# ids a round trip: the node decodes and matches a round trip's worth in
# one turn of its event loop (about 20 µs a message in pure Python, so
# 500 hold it some 10 ms; 2,000 held it 40 ms: docs/redis.md).
SCAN_COUNT = 500
# How long a staging list outlives its last push unless committed.
STAGING_TTL_MS = 600_000


def _glob_escaped(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisBulk:
    """listMsg, deleteMsgs, rescheduleMsgs over a `RedisLink`; a part of
    RedisBroker. It is also the link's `fence`: a script that meets a bulk
    call being applied has the rest of it applied here first (`finish`)."""

    def __init__(self, link: RedisLink, clock: Clock, metrics: Metrics, lifecycle: Lifecycle) -> None:
        self._link = link
        self._clock = clock
        self._metrics = metrics
        self._lifecycle = lifecycle

    def __repr__(self) -> str:
        return "RedisBulk()"

    async def _metas(self, topic: str, flt: BulkFilter) -> AsyncIterator[list[tuple[str, dict[str, str]]]]:
        """(msgId, meta) of the topic's matches, a round trip's worth at a time."""
        self._lifecycle.check_serving()
        if not flt.statuses:
            return
        wanted = {str(int(s)) for s in flt.statuses}

        def matches(msg_id: str, meta: dict[str, str]) -> bool:
            return (meta["status"] in wanted and flt.in_range(int(meta["trigger"]))
                    and (flt.key is None or meta.get("key", "") == flt.key)
                    and (flt.tag is None or meta["tag"] == flt.tag)
                    and (flt.msg_id_prefix is None or msg_id.startswith(flt.msg_id_prefix))
                    and (flt.held_runs or "held" not in meta))

        if flt.key is not None:  # every keyed message is in `keyed` (keys came with it)
            reads = self._indexed(topic, "key", flt.key, "\x00", "\x01")
        elif flt.tag is not None and await self._tags_complete(topic):
            reads = self._indexed(topic, "tag", flt.tag, ",", "-")
        else:
            reads = self._scanned(topic, flt)
        async for fields in reads:
            yield [(msg_id, meta) for msg_id, raw in fields if raw is not None
                   and matches(msg_id, meta := json.loads(raw))]
            self._lifecycle.check_serving()

    async def _scanned(self, topic: str, flt: BulkFilter) -> AsyncIterator[list[tuple[str, str | None]]]:
        """(msgId, raw meta) of every message of the topic (with a msgId
        prefix, of those having it), by HSCAN."""
        match = "" if flt.msg_id_prefix is None else _glob_escaped(flt.msg_id_prefix) + "*"
        cursor = "0"
        while True:
            cursor, flat = await self._link.script("scan", topic, ["meta", cursor, match, str(SCAN_COUNT)])
            flat = cast(list[str], flat)  # (decode_responses: text)
            yield list(zip(flat[::2], flat[1::2]))
            if cursor == "0":
                return

    async def _tags_complete(self, topic: str) -> bool:
        """Does the topic's `tags` hold every tagged message? (Not for a
        topic that held messages before `tags` existed, until it is empty.)"""
        key = self._link.keys(topic).tags
        try:
            return await self._link.redis.zscore(key, "") is not None
        except REDIS_ERRORS as e:
            raise Unavailable(await self._link.problem(e, [key])) from e

    async def _indexed(self, topic: str, index: str, name: str, sep: str,
                       past: str) -> AsyncIterator[list[tuple[str, str | None]]]:
        """(msgId, raw meta or None if purged meanwhile) of the messages
        stored with tag or key `name`, by its range of the `tags` or `keyed`
        zset (`index` "tag" or "key"): "<name><sep><msgId>" members, where
        no name holds `sep` and `past` is the byte after it (a tag holds no
        comma, "-" follows ","; a key no NUL, then \\1)."""
        low, high, after = f"[{name}{sep}", f"({name}{past}", ""
        while True:
            flat = cast(list[str | None], await self._link.script("scan", topic, [
                index, after or low, high, str(SCAN_COUNT), name]))
            ids = cast(list[str], flat[::2])
            yield list(zip(ids, flat[1::2]))
            if len(ids) < SCAN_COUNT:
                return
            after = f"({name}{sep}{ids[-1]}"

    async def page(self, request: ListMsgRequest) -> tuple[list[Message], str | None]:
        keeper = PageKeeper(request.cursor, request.limit)
        async for found in self._metas(request.topic, request.filter):
            for msg_id, meta in found:
                keeper.offer(message_of(request.topic, msg_id, meta, ""))
        page, cursor = keeper.page()
        return await self._with_bodies(request.topic, page), None if cursor is None else cursor.text()

    async def export_page(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                          limit: int) -> tuple[list[Message], str | None]:
        """exportMsg: the topic's messages in `statuses` in HSCAN's order
        of its `meta` hash, a round trip (SCAN_COUNT fields) after another
        until `limit` are found or the scan ends (HSCAN's last batch may
        take the page a little past `limit`); the cursor, HSCAN's. A
        message present throughout the walk is met at least once (twice if
        the hash is resized meanwhile)."""
        self._lifecycle.check_serving()
        scan = cursor or "0"
        if not (scan.isascii() and scan.isdigit() and len(scan) < 21 and int(scan) < 1 << 64):
            raise InvalidRequest("cursor", f"must be a cursor an exportMsg page answered, got {scan[:40]!r}")
        wanted = {str(int(s)) for s in statuses}
        page: list[Message] = []
        while len(page) < limit:
            scan, flat = await self._link.script("scan", topic, ["meta", scan, "", str(min(SCAN_COUNT, limit))])
            flat = cast(list[str], flat)  # (decode_responses: text)
            page.extend(message_of(topic, msg_id, meta, "") for msg_id, raw in zip(flat[::2], flat[1::2])
                        if raw is not None and (meta := json.loads(raw))["status"] in wanted and "held" not in meta)
            self._lifecycle.check_serving()
            if scan == "0":
                break
        return await self._with_bodies(topic, page), None if scan == "0" else scan

    async def _with_bodies(self, topic: str, page: list[Message]) -> list[Message]:
        """The page's messages with their bodies (`body` hash), one round trip."""
        if not page:
            return page
        key = self._link.keys(topic).body
        try:
            bodies = cast(list[str | None], await self._link.redis.hmget(key, [m.msg_id for m in page]))
        except REDIS_ERRORS as e:
            raise Unavailable(await self._link.problem(e, [key])) from e
        return [m._replace(msg=body or "") for m, body in zip(page, bodies)]

    async def count(self, topic: str, flt: BulkFilter) -> int:
        n = 0
        async for found in self._metas(topic, flt):
            n += len(found)
        return n

    async def delete(self, request: DeleteMsgsRequest) -> tuple[int, bool]:
        retire_at = self._clock.now_ms() + self._link.config.retention_ms
        return await self._run(request.topic, request.filter, request.limit,
                               lambda msg_id, meta: f"D{retire_at} {msg_id}")

    async def reschedule(self, request: RescheduleMsgsRequest) -> tuple[int, bool]:
        now_ms = self._clock.now_ms()

        def change(msg_id: str, meta: dict[str, str]) -> str:
            trigger_ms = request.new_trigger_ms(int(meta["trigger"]))
            return (f"R{now_ms} {trigger_ms} {trigger_ms + int(meta['ttl'])} "
                    f"{ready_member(int(meta['priority']), trigger_ms, msg_id)}")
        return await self._run(request.topic, request.filter, request.limit, change)

    async def expire_paused(self, topic: str, flt: BulkFilter, limit: int) -> tuple[int, bool]:
        """A resume's `expire` (broker.flow.keeper): the WAITING and READY
        matches, at most `limit`, EXPIRED with the end reason `paused`, as
        one whole call; how many, and whether more match."""
        retire_at = self._clock.now_ms() + self._link.config.retention_ms
        return await self._run(topic, flt, limit, lambda msg_id, meta: f"E{retire_at} {msg_id}")

    async def _run(self, topic: str, flt: BulkFilter, limit: int,
                   change: Callable[[str, dict[str, str]], str]) -> tuple[int, bool]:
        """Push the change of each of the first `limit` matches onto a
        staging list as they are read, commit them in one script, apply
        them in bounded steps; how many messages they changed, and whether
        more matches remain."""
        call = uuid.uuid4().hex
        keys = self._link.keys(topic)
        staging = keys.staging(call)
        staged, more = 0, False
        async for found in self._metas(topic, flt):
            if staged + len(found) > limit:
                found, more = found[:limit - staged], True
            if found:
                await self._stage(staging, [change(msg_id, meta) for msg_id, meta in found])
                staged += len(found)
            if more:
                break
        if not staged:
            return 0, more
        self._lifecycle.check_serving()
        if await self._link.script("bulk_commit", topic, [call], extra_keys=[staging]) != "OK":
            raise Unavailable(f"the bulk call's {staged} changes expired in Redis before they were "
                              f"committed (over {STAGING_TTL_MS // 1000} s between two pushes): nothing changed")
        while not await self.step(topic, call):
            pass
        try:
            async with self._link.redis.pipeline(transaction=False) as pipe:
                pipe.hget(keys.bulkinfo, "n:" + call)
                pipe.hdel(keys.bulkinfo, "n:" + call)
                changed, _ = await pipe.execute()
        except REDIS_ERRORS as e:
            raise Unavailable(await self._link.problem(e, [keys.bulkinfo])) from e
        return int(changed or 0), more

    async def _stage(self, staging: str, changes: list[str]) -> None:
        try:
            async with self._link.redis.pipeline(transaction=False) as pipe:
                pipe.rpush(staging, *changes)
                pipe.pexpire(staging, STAGING_TTL_MS)
                await pipe.execute()
        except REDIS_ERRORS as e:
            raise Unavailable(await self._link.problem(e, [staging])) from e

    async def step(self, topic: str, call: str = "") -> bool:
        """Apply one bounded step of the topic's committed bulk call (`call`,
        or whichever is being applied); True once it is applied whole (or
        none is being applied). Whoever applies a step counts it in this
        process's metrics, and wakes long polls and the mover for it."""
        deleted, moved, expired, done, next_waiting, woke, *triggers = await self._link.script(
            "bulk_apply", topic, [str(self._link.config.bulk_batch), call])
        m = self._metrics.topic(topic)
        m.deletes += int(deleted)
        m.reschedules += int(moved)
        m.ended += int(expired)
        if triggers:  # made READY (their trigger times): counted, long polls woken
            now_ms = self._clock.now_ms()
            made_ready(self._metrics, topic, [due_ms(int(t), now_ms) for t in triggers], now_ms)
        if triggers or woke:  # woke: a deleted consuming message's key is free, its next message pullable
            await self._link.publish(topic)
        if next_waiting and int(next_waiting) < self._link.state.next_due_ms:  # due before the mover meant to wake
            self._link.state.mover_wake.set()
        return bool(done)

    async def finish(self, topic: str) -> None:
        """Apply the rest of the topic's committed bulk call (the fence is
        up: a script answered HGBULK)."""
        while not await self.step(topic):
            pass

