"""The Redis backend's bulk calls (docs/api.md, "Bulk calls"; docs/redis.md):
listMsg, deleteMsgs, rescheduleMsgs, with the disk broker's outcomes.

Finding: the topic's `meta` hash is read with HSCAN, SCAN_COUNT fields a
round trip (the event loop and Redis both free between them); a msgId
prefix is HSCAN's MATCH pattern (glob characters escaped), so Redis skips
the rest itself. With a tag, only that tag's messages are read: their ids
from the tag's range of the `tags` zset (broker.redis.keys), SCAN_COUNT a
round trip, then their metas (HMGET). Each meta's status, trigger time and
tag decide the match;
a page's bodies are read once its members are known (HMGET). A key filter
matches nothing here: this backend refuses keyed sends.

Changing, all or nothing per call: the matches' ids are gathered, then ONE
script (lua/backend/bulk_delete.lua, bulk_reschedule.lua) steps each as
deleteMsg and rescheduleMsg do -- a message acked, pulled or gone since it
was read is left as it is -- so Redis applies the call whole or not at all,
and it is as durable as Redis' own persistence makes it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import cast

from redis import asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from storage.entry import Message, Status
from storage.errors import Unavailable

from ..bulk_params import BulkFilter, DeleteMsgsRequest, ListMsgRequest, PageKeeper, RescheduleMsgsRequest
from ..lifecycle import Lifecycle
from ..metrics import Metrics
from .keys import RedisConfig, TopicKeys, ready_member
from .requests import NO_LOCATION
from .scripts import Reply

# meta fields HSCAN returns per round trip (a hint to Redis).
SCAN_COUNT = 2000

def _glob_escaped(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisBulk:
    """listMsg, deleteMsgs, rescheduleMsgs over one Redis; a part of
    RedisBroker, handed its client, scripts' caller and error mapping."""

    def __init__(self, redis: aioredis.Redis | RedisCluster, config: RedisConfig, metrics: Metrics,
                 lifecycle: Lifecycle, keys: Callable[[str], TopicKeys],
                 script: Callable[[str, str, Sequence[str]], Awaitable[Reply]],
                 problem: Callable[[Exception, list[str]], Awaitable[str]], errors: tuple[type[Exception], ...],
                 now_ms: Callable[[], int], on_moved: Callable[[str, list[int], int], Awaitable[None]]) -> None:
        self._redis = redis
        self._config = config
        self._metrics = metrics
        self._lifecycle = lifecycle
        self._keys = keys
        self._script = script
        self._problem = problem
        self._errors = errors
        self._now_ms = now_ms
        self._on_moved = on_moved

    def __repr__(self) -> str:
        return "RedisBulk()"

    async def _metas(self, topic: str, flt: BulkFilter) -> AsyncIterator[list[tuple[str, dict[str, str]]]]:
        """(msgId, meta) of the topic's matches, a round trip's worth at a time."""
        self._lifecycle.check_serving()
        if not flt.statuses or flt.key is not None:
            return
        wanted = {str(int(s)) for s in flt.statuses}

        def matches(msg_id: str, meta: dict[str, str]) -> bool:
            return (meta["status"] in wanted and flt.in_range(int(meta["trigger"]))
                    and (flt.tag is None or meta["tag"] == flt.tag)
                    and (flt.msg_id_prefix is None or msg_id.startswith(flt.msg_id_prefix)))

        tagged = flt.tag is not None and await self._tags_complete(topic)
        async for fields in (self._tagged(topic, flt.tag) if tagged and flt.tag is not None
                             else self._scanned(topic, flt)):
            yield [(msg_id, meta) for msg_id, raw in fields if raw is not None
                   and matches(msg_id, meta := json.loads(raw))]
            self._lifecycle.check_serving()

    async def _scanned(self, topic: str, flt: BulkFilter) -> AsyncIterator[list[tuple[str, str | None]]]:
        """(msgId, raw meta) of every message of the topic (with a msgId
        prefix, of those having it), by HSCAN."""
        key = self._keys(topic).meta
        match = None if flt.msg_id_prefix is None else _glob_escaped(flt.msg_id_prefix) + "*"
        cursor: int = 0
        while True:
            try:
                cursor, fields = await self._redis.hscan(key, cursor, match=match, count=SCAN_COUNT)
            except self._errors as e:
                raise Unavailable(await self._problem(e, [key])) from e
            yield list(cast(dict[str, str], fields).items())  # (decode_responses: text)
            if not cursor:
                return

    async def _tags_complete(self, topic: str) -> bool:
        """Does the topic's `tags` hold every tagged message? (Not for a
        topic that held messages before `tags` existed, until it is empty.)"""
        key = self._keys(topic).tags
        try:
            return await self._redis.zscore(key, "") is not None
        except self._errors as e:
            raise Unavailable(await self._problem(e, [key])) from e

    async def _tagged(self, topic: str, tag: str) -> AsyncIterator[list[tuple[str, str | None]]]:
        """(msgId, raw meta or None if purged meanwhile) of the messages
        stored with `tag`, by the tag's range of `tags`: "<tag>,<msgId>"
        members (a tag holds no comma; "-" follows ",")."""
        keys = self._keys(topic)
        low, high, after = f"[{tag},", f"({tag}-", ""
        while True:
            try:
                members = cast(list[str], await self._redis.zrangebylex(keys.tags, after or low, high, 0, SCAN_COUNT))
                ids = [m[len(tag) + 1:] for m in members]
                raws = cast(list[str | None], await self._redis.hmget(keys.meta, ids)) if ids else []
            except self._errors as e:
                raise Unavailable(await self._problem(e, [keys.tags, keys.meta])) from e
            yield list(zip(ids, raws))
            if len(members) < SCAN_COUNT:
                return
            after = "(" + members[-1]

    async def page(self, request: ListMsgRequest) -> tuple[list[Message], str | None]:
        keeper = PageKeeper(request.cursor, request.limit)
        async for found in self._metas(request.topic, request.filter):
            for msg_id, meta in found:
                keeper.offer(_message(request.topic, msg_id, meta, ""))
        page, cursor = keeper.page()
        if page:
            key = self._keys(request.topic).body
            try:
                bodies = cast(list[str | None], await self._redis.hmget(key, [m.msg_id for m in page]))
            except self._errors as e:
                raise Unavailable(await self._problem(e, [key])) from e
            page = [m._replace(msg=body or "") for m, body in zip(page, bodies)]
        return page, None if cursor is None else cursor.text()

    async def count(self, topic: str, flt: BulkFilter) -> int:
        n = 0
        async for found in self._metas(topic, flt):
            n += len(found)
        return n

    async def _gather(self, topic: str, flt: BulkFilter, limit: int) -> tuple[list[tuple[str, dict[str, str]]], bool]:
        out: list[tuple[str, dict[str, str]]] = []
        async for found in self._metas(topic, flt):
            for item in found:
                if len(out) == limit:
                    return out, True
                out.append(item)
        return out, False

    async def delete(self, request: DeleteMsgsRequest) -> tuple[int, bool]:
        found, more = await self._gather(request.topic, request.filter, request.limit)
        if not found:
            return 0, more
        retire_at = str(self._now_ms() + self._config.retention_ms)
        deleted = int(await self._script("bulk_delete", request.topic, [retire_at, *(i for i, _ in found)]))
        self._metrics.topic(request.topic).deletes += deleted
        return deleted, more

    async def reschedule(self, request: RescheduleMsgsRequest) -> tuple[int, bool]:
        found, more = await self._gather(request.topic, request.filter, request.limit)
        if not found:
            return 0, more
        now_ms = self._now_ms()
        args = [str(now_ms)]
        triggers = []
        for msg_id, meta in found:
            trigger_ms = request.new_trigger_ms(int(meta["trigger"]))
            triggers.append(trigger_ms)
            args += [msg_id, str(trigger_ms), str(trigger_ms + int(meta["ttl"])),
                     ready_member(int(meta["priority"]), trigger_ms, msg_id)]
        moved, ready = await self._script("bulk_reschedule", request.topic, args)
        self._metrics.topic(request.topic).reschedules += int(moved)
        await self._on_moved(request.topic, triggers, int(ready))
        return int(moved), more


def _message(topic: str, msg_id: str, f: dict[str, str], body: str) -> Message:
    return Message(topic=topic, msg_id=msg_id, msg=body, produce_ms=int(f["produce"]),
                   trigger_ms=int(f["trigger"]), ttl_ms=int(f["ttl"]), max_retry=int(f["maxRetry"]),
                   priority=int(f["priority"]), tag=f["tag"], status=Status(int(f["status"])),
                   retry=int(f["retry"]), location=NO_LOCATION)
