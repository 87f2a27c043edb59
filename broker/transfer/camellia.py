"""camellia-delay-queue's Redis layout, read and never written
(docs/operations.md, "From camellia-delay-queue").

Its server (camellia-delay-queue-server, `CamelliaDelayQueueServer.java`)
keeps, for a namespace NS (its keys made by camellia-core's
`CacheUtil.buildCacheKey`: the parts joined by "|"):

    camellia_delay_queue_msg|NS|TOPIC|MSGID   string: the message as JSON
        (fastjson of `CamelliaDelayMsg`: topic, msgId, msg, produceTime,
        triggerTime, expireTime, maxRetry, retry, status), kept with a
        Redis expiry past its own
    camellia_delay_queue_waiting|{|NS|TOPIC|}  zset msgId -> trigger time
    camellia_delay_queue_ready|{|NS|TOPIC|}    list of msgIds, due
    camellia_delay_queue_ack|{|NS|TOPIC|}      zset msgId -> ack deadline
    camellia_delay_queue_topics|NS, ..._topics_tmp|NS   zsets of topics

A message's `status` in its JSON is 1 waiting, 2 ready, 3 consuming and
4-7 ended; the server does not write it back when a message merely moves
between its lists (due, or back from an ack timeout), so what counts for a
message is its JSON's status (ended or not), its times and its counts.

What an import makes of each message (`pending`):

    ended (4-7, or unknown)        not sent
    expireTime passed              not sent: camellia ends it at its next
                                   look (5 or 6)
    retry > maxRetry               not sent: no delivery left
    in the ack zset (consuming)    due at its ack deadline, when camellia
                                   would hand it out again
    else                           due at its triggerTime (at once if past)

kept: msgId, msg, triggerTime, expireTime (as ttlMillis from the trigger
time, so the same instant), maxRetry and retry (the deliveries it had:
camellia delivers while retry <= maxRetry, and counts the one under way;
so does hourglass).

The messages are found by SCAN over the namespace's message keys (so one
the server stored but had not filed yet is found too), COUNT a page, and
each page's keys read with MGET and the ack zsets' ZSCORE: read-only
commands only. A key is taken only if its JSON's topic and msgId make
exactly that key (a namespace "a" pattern also matches "a|b"'s keys). A
message camellia stored but never filed in a queue (its server stopped
between the two writes of a send) is brought too: at least once.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from storage.errors import ConfigError

from ..client import NewMsg
from .sending import Outgoing

MSG_TAG = "camellia_delay_queue_msg"
ACK_TAG = "camellia_delay_queue_ack"
LIVE = frozenset((1, 2, 3))
# The glob characters SCAN's MATCH gives a meaning to.
_GLOB = re.compile(r"([*?\[\]\\])")


def msg_key(namespace: str, topic: str, msg_id: str) -> str:
    return f"{MSG_TAG}|{namespace}|{topic}|{msg_id}"


def ack_key(namespace: str, topic: str) -> str:
    return f"{ACK_TAG}|{{|{namespace}|{topic}|}}"


def msg_pattern(namespace: str) -> str:
    """SCAN's MATCH for every message key of the namespace."""
    escaped = _GLOB.sub(r"\\\1", namespace)
    return f"{MSG_TAG}|{escaped}|*"


@dataclass(frozen=True)
class Found:
    """A message key read: its JSON object ({}: gone since the SCAN), and
    its ack deadline (None: not consuming)."""

    key: bytes
    row: dict[str, object]
    ack_deadline: float | None


def pending(found: Found, namespace: str, now_ms: int) -> Outgoing | str:
    """(topic, the send) of a message camellia would still deliver, or
    why it is not sent (module docstring)."""
    row: Any = found.row
    if not row:
        return "gone"
    try:
        topic, msg_id, status = row["topic"], row["msgId"], int(row["status"])
        trigger, expire = int(row["triggerTime"]), int(row["expireTime"])
        max_retry, retry, body = int(row["maxRetry"]), int(row["retry"]), row["msg"]
    except (KeyError, TypeError, ValueError):
        return "unreadable"
    if not (isinstance(topic, str) and isinstance(msg_id, str) and isinstance(body, str)):
        return "unreadable"
    if msg_key(namespace, topic, msg_id).encode() != found.key:
        return "another namespace"
    if status not in LIVE:  # (4-7, or a status camellia does not know: it ends those too)
        return "ended"
    due = trigger if found.ack_deadline is None else max(trigger, int(found.ack_deadline))
    if expire <= max(now_ms, due):
        return "expired"
    if retry > max_retry:
        return "retries used"
    return Outgoing(topic, NewMsg(body, msg_id=msg_id, trigger_time_ms=due, ttl_ms=expire - due, max_retry=max_retry),
                    1, retry)


class CamelliaSource:
    """The pending messages of one namespace of a camellia Redis, a page
    at a time from a SCAN cursor (0: the start)."""

    def __init__(self, url: str, namespace: str, *, page: int = 1000) -> None:
        try:
            import redis.asyncio
        except ImportError:
            raise ConfigError("--from-camellia needs redis-py: pip install 'hourglass[redis]'") from None
        if "cluster=" in url:
            raise ConfigError("--from-camellia reads one Redis (redis://HOST:PORT/DB); for a Redis Cluster, "
                              "import from each master in turn")
        if not namespace:
            raise ConfigError("--namespace is required: camellia's namespace (its server's `namespace` setting)")
        self.namespace = namespace
        self._page = page
        self._redis = redis.asyncio.from_url(url)

    async def close(self) -> None:
        await self._redis.aclose()

    async def pages(self, cursor: int, now_ms: int) -> AsyncIterator[tuple[int, list[Outgoing], Counter[str]]]:
        """(the cursor after the page, its messages to send, the others
        counted by why), until the cursor comes back to 0."""
        pattern = msg_pattern(self.namespace)
        while True:
            cursor, raw_keys = await self._redis.scan(cursor, match=pattern, count=self._page)
            sends: list[Outgoing] = []
            skipped: Counter[str] = Counter()
            for found in await self._read([k if isinstance(k, bytes) else k.encode() for k in raw_keys]):
                outcome = pending(found, self.namespace, now_ms)
                if isinstance(outcome, str):
                    skipped[outcome] += 1
                else:
                    sends.append(outcome)
            yield cursor, sends, skipped
            if cursor == 0:
                return

    async def _read(self, keys: list[bytes]) -> list[Found]:
        if not keys:
            return []
        rows = [_row(value) for value in await self._redis.mget(keys)]
        async with self._redis.pipeline(transaction=False) as pipe:
            for row in rows:  # a message's ack deadline, if it is in its topic's ack zset
                pipe.zscore(ack_key(self.namespace, str(row.get("topic"))), str(row.get("msgId")))
            scores = await pipe.execute()
        return [Found(key, row, score) for key, row, score in zip(keys, rows, scores, strict=True)]


def _row(value: bytes | str | None) -> dict[str, object]:
    """A message key's JSON object: {} for a key gone since the SCAN, one
    without the message's fields for a value that is not a JSON object."""
    if value is None:
        return {}
    try:
        row = orjson.loads(value)
    except orjson.JSONDecodeError:
        return {"unreadable": True}
    return row if isinstance(row, dict) else {"unreadable": True}
