"""An asyncio client for hourglass's HTTP API (camellia-delay-queue's
wire format), and a consumer that long-polls, runs a handler and acks.

Five minutes with it:

    import asyncio
    from broker.client import Consumer, DelayQueueClient

    async def main():
        async with DelayQueueClient("http://127.0.0.1:8080") as client:
            sent = await client.send("orders", "pay order 42?", delay_ms=30_000)
            print(sent.msg_id, sent.trigger_time)          # due in 30 s

            async def handle(msg):                         # raise to nack: it comes back with retry + 1
                print("due:", msg.msg, "retry", msg.retry)

            consumer = Consumer(client, "orders", handle, concurrency=8)
            task = asyncio.create_task(consumer.run())     # acks each message its handler finished
            await asyncio.sleep(60)
            consumer.stop()                                # returns once running handlers finish
            await task

    asyncio.run(main())

Retries follow `broker.retry.RetryPolicy` (docs/api.md, "Clients:
retries"): a call the node refused (429, 503) or never received (no
connection) is sent again, with exponential backoff and full jitter,
honouring Retry-After; one it may have applied (502, 504, a timeout, a
connection lost mid-call) is sent again only when repeating it changes
nothing: a read, an ack, nack or delete, or a send. `send` and
`send_batch` give every message without a `msg_id` a uuid4 id before the
first attempt, so a repeated send answers the stored message rather than
storing it twice; and they send `strictIdempotence=true` (docs/api.md,
"Sending"), so an attempt held up in the network that reaches the node
after its message was acked answers the acked message instead of storing
it again (a fault drill found that: bench/drills.py).
`strict_idempotence=False` gives camellia's rule back, for callers that
re-send an ended message's id to schedule it anew. A pull is not
repeated after such a failure: a pull the node applied handed out
messages, and a second one would hand out more.
Any other answer but 200 raises `DelayQueueError` at once.

Clusters. Give every node's address (a list, or one string with commas):
any node answers any call (a follower forwards it to the leader), and when
the node in use fails (a refused connection, a timeout, a 503) the next
attempt goes to the next address. With the retries above and client-made
ids, a send rides through a leader failover without being lost or stored
twice.

Shards. A node of many shards (docs/api.md, "Shards") names each shard's
own port (getShardMap): the client reads it once, then sends a message and
acks or nacks it on its shard's port (its key's shard when it has one, else
its msgId's), so the node forwards none of them; a batch send and every
pull go to the node's port (the node validates a batch whole and keeps its
pull order). When a shard's port fails (no connection, a 503) the call goes
on through the node's port, and the map is read again after
SHARD_MAP_RETRY_S (`broker.shard_map`, which the Spark sink shares).

Redirects. A follower may answer 307/308 with the leader's address. aiohttp
would follow it but drops `Authorization` when the port changes (a new
origin), so this client follows up to `MAX_REDIRECTS` itself and keeps the
token: it is the cluster's token, and it goes wherever a node redirects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

from storage.entry import Status
from storage.errors import ConfigError, HourglassError

from .core.params import MAX_ACK_BATCH
from .http.paths import PREFIX
from .retry import Failure, RetryPolicy, retry_after_s, status_failure
from .shard_map import ShardMap

log = logging.getLogger("hourglass.client")

# A redirect chain longer than this is a misconfigured cluster, not a leader change.
MAX_REDIRECTS = 5
# What the server waits in a long poll that names no timeout (camellia's 10 s);
# the client's HTTP timeout must outlast it.
SERVER_LONG_POLL_DEFAULT_MS = 10_000
# The ack timeout a pull gets from the server when it names none (docs/api.md):
# what a Consumer without `ack_timeout_ms` extends its messages by.
SERVER_ACK_TIMEOUT_DEFAULT_MS = 30_000
# Failures that a retry may cure: the node is down, restarting or electing.
TRANSIENT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


class DelayQueueError(HourglassError):
    """Raised when the server answered a code other than 200 (after retries,
    for those `broker.retry` retries). `answer` is the whole JSON object,
    e.g. with `leader` on a 503; `retry_after_s` the pause its Retry-After
    header asked for, if any."""

    def __init__(self, code: int, msg: str, endpoint: str, answer: Mapping[str, Any] | None = None,
                 retry_after_s: float | None = None) -> None:
        super().__init__(f"{endpoint}: {code} {msg}")
        self.code = code
        self.msg = msg
        self.endpoint = endpoint
        self.answer = dict(answer or {})
        self.retry_after_s = retry_after_s

    @property
    def transient(self) -> bool:
        """429, 502, 503, 504: a limit, or no node to answer now; worth retrying."""
        return status_failure(self.code) is not Failure.FINAL


def failure_of(error: BaseException) -> Failure:
    """What a failed call tells about its request (`broker.retry`)."""
    if isinstance(error, DelayQueueError):
        return status_failure(error.code)
    if isinstance(error, aiohttp.ClientConnectorError):  # no connection made: nothing was sent
        return Failure.NOT_APPLIED
    if isinstance(error, TRANSIENT_ERRORS):
        return Failure.MAYBE_APPLIED
    return Failure.FINAL


def is_transient(error: BaseException) -> bool:
    """Whether a failed call may succeed if repeated unchanged."""
    return failure_of(error) is not Failure.FINAL


@dataclass(frozen=True)
class DelayMsg:
    """A message as the server reports it (camellia's `delayMsg`). Times are
    ms since the epoch; `retry` counts redeliveries (0 on the first)."""

    topic: str
    msg_id: str
    msg: str
    produce_time: int
    trigger_time: int
    expire_time: int
    max_retry: int
    retry: int
    status: Status
    priority: int = 0
    tag: str = ""
    key: str = ""  # the serial key (docs/api.md, "Tags and serial keys"); "" for none
    # a recurring schedule's run (docs/api.md, "Recurring schedules"): its
    # schedule and nominal time (ms); None for any other message
    schedule_id: str | None = None
    scheduled_time: int | None = None
    # the hand-over a pull made of it (docs/api.md, "Leases"): fences its
    # ack and extensions; None in any other answer, or from a camellia server
    delivery_id: str | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> DelayMsg:
        """From the camelCase JSON object; `priority`, `tag`, `key`,
        `scheduleId`, `scheduledTime` and `deliveryId` (hourglass
        extensions) may be absent, as from a camellia server."""
        scheduled = obj.get("scheduledTime")
        return cls(obj["topic"], obj["msgId"], obj["msg"], int(obj["produceTime"]), int(obj["triggerTime"]),
                   int(obj["expireTime"]), int(obj["maxRetry"]), int(obj["retry"]), Status(obj["status"]),
                   int(obj.get("priority") or 0), obj.get("tag") or "", obj.get("key") or "",
                   obj.get("scheduleId"), None if scheduled is None else int(scheduled), obj.get("deliveryId"))


@dataclass(frozen=True)
class NewMsg:
    """One message of `send_batch`; None leaves a field to the server's
    default (`msg_id` is filled in by the client, see the module docstring)."""

    msg: str
    msg_id: str | None = None
    delay_ms: int | None = None
    ttl_ms: int | None = None
    max_retry: int | None = None
    priority: int | None = None
    trigger_time_ms: int | None = None
    tag: str | None = None
    key: str | None = None

    def params(self) -> dict[str, Any]:
        """The wire keys, without the fields left to the server."""
        wire = {"msg": self.msg, "msgId": self.msg_id, "delayMillis": self.delay_ms, "ttlMillis": self.ttl_ms,
                "maxRetry": self.max_retry, "priority": self.priority, "triggerTime": self.trigger_time_ms,
                "tag": self.tag, "key": self.key}
        return {key: value for key, value in wire.items() if value is not None}


class DelayQueueClient:
    """One kept-alive HTTP session to a node (any node of a cluster).

    Use it as an async context manager, or call `close()`; a `session` passed
    in is the caller's and is not closed. `timeout_s` bounds each attempt of
    a call (a long poll gets its own wait on top); a call makes at most
    `retries` + 1 attempts, pausing between them up to `backoff_s` doubled
    each time, capped at `max_backoff_s` (`broker.retry.RetryPolicy`).
    """

    def __init__(self, base_url: str | Sequence[str], *, token: str | None = None, timeout_s: float = 10.0,
                 retries: int = 8,
                 backoff_s: float = 0.1, max_backoff_s: float = 2.0,
                 session: aiohttp.ClientSession | None = None) -> None:
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {timeout_s}")
        self.retry = RetryPolicy(retries=retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s)
        urls = base_url.split(",") if isinstance(base_url, str) else list(base_url)
        self.base_urls = [u.strip().rstrip("/") for u in urls if u.strip()]
        if not self.base_urls:
            raise ConfigError("base_url names no node")
        self._node = 0  # index in base_urls of the node in use
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = session
        self._owns_session = session is None
        self._shard_map = ShardMap()  # of the node in use (getShardMap)

    def __repr__(self) -> str:
        return f"DelayQueueClient({self.base_url!r}, timeout_s={self.timeout_s}, retries={self.retry.retries})"

    @property
    def base_url(self) -> str:
        """The node in use."""
        return self.base_urls[self._node]

    async def __aenter__(self) -> DelayQueueClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------ produce

    async def send(self, topic: str, msg: str, *, msg_id: str | None = None, delay_ms: int | None = None,
                   ttl_ms: int | None = None, max_retry: int | None = None, priority: int | None = None,
                   trigger_time_ms: int | None = None, tag: str | None = None, key: str | None = None,
                   strict_idempotence: bool = True) -> DelayMsg:
        """sendMsg. Sending an id that exists answers the stored message,
        unchanged (one that has ended too, unless `strict_idempotence` is
        False: see the module docstring). `trigger_time_ms` (absolute) wins
        over `delay_ms`; `key` makes the message's consumption serial with
        its key's others."""
        new = NewMsg(msg, msg_id or uuid.uuid4().hex, delay_ms, ttl_ms, max_retry, priority, trigger_time_ms, tag,
                     key)
        form = {"topic": topic, **new.params(), "strictIdempotence": "true" if strict_idempotence else "false"}
        answer = await self._call("POST", "sendMsg", idempotent=True, form=form,
                                  shard=await self._shard(new.msg_id or "", key or ""))
        return DelayMsg.from_json(answer["delayMsg"])

    async def send_batch(self, topic: str, msgs: Iterable[NewMsg | Mapping[str, Any]], *,
                         strict_idempotence: bool = True) -> list[DelayMsg]:
        """sendMsgBatch: all or nothing, answered in order. Items are `NewMsg`
        or dicts of its fields, e.g. `{"msg": "hi", "delay_ms": 500}`;
        `strict_idempotence` as for `send`."""
        items = [m if isinstance(m, NewMsg) else NewMsg(**m) for m in msgs]
        wire = [{**m.params(), "msgId": m.msg_id or uuid.uuid4().hex} for m in items]
        body = {"topic": topic, "strictIdempotence": strict_idempotence, "msgs": wire}
        answer = await self._call("POST", "sendMsgBatch", idempotent=True, body=body)
        return [DelayMsg.from_json(m) for m in answer["delayMsgList"]]

    async def import_batch(self, topic: str, msgs: Iterable[tuple[NewMsg, int, int]]) -> list[DelayMsg]:
        """importMsgBatch: `send_batch`'s, strict, each (message, status,
        retry) stored with that status (1: pending; 5, 6: dead) and retry
        count (docs/api.md, "Export and import")."""
        wire = [{**m.params(), "msgId": m.msg_id or uuid.uuid4().hex, "status": status, "retry": retry}
                for m, status, retry in msgs]
        answer = await self._call("POST", "importMsgBatch", idempotent=True, body={"topic": topic, "msgs": wire})
        return [DelayMsg.from_json(m) for m in answer["delayMsgList"]]

    # ------------------------------------------------------------ consume

    async def pull(self, topic: str, *, batch: int | None = None, ack_timeout_ms: int | None = None,
                   tags: Iterable[str] | None = None) -> list[DelayMsg]:
        """pullMsg: up to `batch` deliverable messages, now (maybe none).
        Each must be acked within `ack_timeout_ms` or it comes back."""
        form = _pull_form(topic, batch, ack_timeout_ms, tags)
        answer = await self._call("POST", "pullMsg", idempotent=False, form=form)
        return [DelayMsg.from_json(m) for m in answer["delayMsgList"]]

    async def long_poll(self, topic: str, *, timeout_ms: int | None = None, batch: int | None = None,
                        ack_timeout_ms: int | None = None, tags: Iterable[str] | None = None) -> list[DelayMsg]:
        """longPollingMsg: as `pull`, but waits up to `timeout_ms` for a
        message to become deliverable; an empty list when none did."""
        form = _pull_form(topic, batch, ack_timeout_ms, tags)
        if timeout_ms is not None:
            form["longPollingTimeoutMillis"] = str(timeout_ms)
        wait_s = (timeout_ms if timeout_ms and timeout_ms > 0 else SERVER_LONG_POLL_DEFAULT_MS) / 1000
        answer = await self._call("POST", "longPollingMsg", idempotent=False, form=form, wait_s=wait_s)
        return [DelayMsg.from_json(m) for m in answer["delayMsgList"]]

    async def ack(self, topic: str, msg_id: str) -> None:
        """ackMsg: the message is done and never delivered again."""
        await self._call("POST", "ackMsg", idempotent=True, form={"topic": topic, "msgId": msg_id},
                         shard=await self._shard(msg_id))

    async def ack_many(self, topic: str, msg_ids: Sequence[str]) -> dict[str, int | None]:
        """ackMsg with msgIds (1..1000, one request, one fsync on the
        server): each id's status after it, None for an unknown one."""
        return {msg_id: result["status"] for msg_id, result in
                (await self._many("ackMsg", topic, msg_ids, None, {})).items()}

    async def ack_leased(self, topic: str, msg_ids: Sequence[str], delivery_ids: Sequence[str],
                         ack: bool = True) -> dict[str, dict[str, Any]]:
        """ackMsg (`ack` False: nack) with msgIds and deliveryIds (each
        msgId's, in order): fenced (docs/api.md, "Leases"). Each id's
        result: `code` 200 and its `status` after it, or 409 with `msg`,
        the message left with its current holder."""
        return await self._many("ackMsg", topic, msg_ids, delivery_ids, {} if ack else {"ack": False})

    async def extend_many(self, topic: str, msg_ids: Sequence[str], delivery_ids: Sequence[str],
                          ack_timeout_ms: int | None = None) -> dict[str, dict[str, Any]]:
        """extendMsg with msgIds (1..1000): each message, while `delivery_ids`'
        (in order) is its current hand-over, stays consuming `ack_timeout_ms`
        from now (None: the server's default). Each id's result: `code` 200
        with its new `deadline`, or 409 with `msg` (docs/api.md, "Leases")."""
        extra = {} if ack_timeout_ms is None else {"ackTimeoutMillis": ack_timeout_ms}
        return await self._many("extendMsg", topic, msg_ids, delivery_ids, extra)

    async def _many(self, endpoint: str, topic: str, msg_ids: Sequence[str], delivery_ids: Sequence[str] | None,
                    extra: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """`endpoint` with msgIds (and deliveryIds), one request a shard of
        the node: each id's result."""
        parts: dict[str | None, list[int]] = {}
        for at, msg_id in enumerate(msg_ids):
            parts.setdefault(await self._shard(msg_id), []).append(at)

        def body(ats: list[int]) -> dict[str, Any]:
            b: dict[str, Any] = {"topic": topic, "msgIds": [msg_ids[at] for at in ats], **extra}
            if delivery_ids is not None:
                b["deliveryIds"] = [delivery_ids[at] for at in ats]
            return b

        answers = await asyncio.gather(*(self._call("POST", endpoint, idempotent=True, shard=shard, body=body(ats))
                                         for shard, ats in parts.items()))
        return {r["msgId"]: r for answer in answers for r in answer["results"]}

    async def nack(self, topic: str, msg_id: str) -> None:
        """ackMsg with ack=false: deliverable again now (its next delivery
        counts retry + 1). A nack of a message no longer consuming changes
        nothing, which is also what a retry meets whose first attempt was
        applied."""
        await self._call("POST", "ackMsg", idempotent=True, form={"topic": topic, "msgId": msg_id, "ack": "false"},
                         shard=await self._shard(msg_id))

    # ------------------------------------------------------------ push

    async def subscribe(self, topic: str, url: str, *, secret: str | None = None, concurrency: int | None = None,
                        rate_limit: int | None = None, timeout_ms: int | None = None,
                        max_body_bytes: int | None = None) -> dict[str, Any]:
        """subscribe: the topic's due messages are POSTed to `url` from now
        on (docs/api.md, "Push delivery"); replaces its subscription if it
        had one. The answer's `data` (never the secret)."""
        form = {"topic": topic, "url": url}
        for name, value in (("secret", secret), ("concurrency", concurrency), ("rateLimit", rate_limit),
                            ("timeoutMillis", timeout_ms), ("maxBodyBytes", max_body_bytes)):
            if value is not None:
                form[name] = str(value)
        data: dict[str, Any] = (await self._call("POST", "subscribe", idempotent=True, form=form))["data"]
        return data

    async def unsubscribe(self, topic: str) -> bool:
        """unsubscribe; False when the topic had no subscription."""
        answer = await self._call("POST", "unsubscribe", idempotent=True, form={"topic": topic}, missing_ok=True)
        return answer is not None

    async def get_subscription(self, topic: str) -> dict[str, Any] | None:
        """getSubscription's `data` (the subscription and its health); None when there is none."""
        answer = await self._call("GET", "getSubscription", idempotent=True, query={"topic": topic},
                                  missing_ok=True)
        return None if answer is None else answer["data"]

    # ------------------------------------------------------------ recurring schedules

    async def put_schedule(self, topic: str, schedule_id: str, msg: str, *, cron: str | None = None,
                           every_ms: int | None = None, time_zone: str | None = None, ttl_ms: int | None = None,
                           max_retry: int | None = None, priority: int | None = None, tag: str | None = None,
                           key: str | None = None, start_time_ms: int | None = None,
                           end_time_ms: int | None = None, limit: int | None = None, jitter_ms: int | None = None,
                           misfire: str | None = None, misfire_grace_ms: int | None = None,
                           max_catch_up: int | None = None, version: int | None = None) -> dict[str, Any]:
        """putSchedule (docs/api.md, "Recurring schedules"): creates or
        replaces it; one of `cron` or `every_ms`. With `version`, only if
        the stored version is that one (0: none exists), else
        DelayQueueError 409. Answers the `schedule` (its `version`,
        `nextFireTimes`...). Not repeated after a failure that may have
        applied it (a second put replaces the first: one more version)."""
        form = {"topic": topic, "scheduleId": schedule_id, "msg": msg}
        for name, value in (("cron", cron), ("everyMillis", every_ms), ("timeZone", time_zone),
                            ("ttlMillis", ttl_ms), ("maxRetry", max_retry), ("priority", priority), ("tag", tag),
                            ("key", key), ("startTime", start_time_ms), ("endTime", end_time_ms), ("limit", limit),
                            ("jitterMillis", jitter_ms), ("misfire", misfire),
                            ("misfireGraceMillis", misfire_grace_ms), ("maxCatchUp", max_catch_up),
                            ("version", version)):
            if value is not None:
                form[name] = str(value)
        schedule: dict[str, Any] = (await self._call("POST", "putSchedule", idempotent=False, form=form))["schedule"]
        return schedule

    async def delete_schedule(self, topic: str, schedule_id: str) -> bool:
        """deleteSchedule (its waiting run too); False when there was none."""
        answer = await self._call("POST", "deleteSchedule", idempotent=True, missing_ok=True,
                                  form={"topic": topic, "scheduleId": schedule_id})
        return answer is not None

    async def pause_schedule(self, topic: str, schedule_id: str) -> dict[str, Any] | None:
        """pauseSchedule: no runs until resumed (its waiting run deleted);
        the `schedule`, None when there is none."""
        answer = await self._call("POST", "pauseSchedule", idempotent=True, missing_ok=True,
                                  form={"topic": topic, "scheduleId": schedule_id})
        return None if answer is None else answer["schedule"]

    async def resume_schedule(self, topic: str, schedule_id: str) -> dict[str, Any] | None:
        """resumeSchedule: runs again from the first nominal time after now;
        the `schedule`, None when there is none."""
        answer = await self._call("POST", "resumeSchedule", idempotent=True, missing_ok=True,
                                  form={"topic": topic, "scheduleId": schedule_id})
        return None if answer is None else answer["schedule"]

    async def get_schedule(self, topic: str, schedule_id: str, *, next: int | None = None) -> dict[str, Any] | None:
        """getSchedule: the `schedule` with its `next` (default 5) next fire
        times and `lastRuns`; None when there is none."""
        query = {"topic": topic, "scheduleId": schedule_id}
        if next is not None:
            query["next"] = str(next)
        answer = await self._call("GET", "getSchedule", idempotent=True, missing_ok=True, query=query)
        return None if answer is None else answer["schedule"]

    async def list_schedules(self, topic: str, *, limit: int | None = None) -> AsyncIterator[list[dict[str, Any]]]:
        """listSchedules, page after page (an async iterator of lists) by
        scheduleId, `limit` a page (default 100)."""
        query = {"topic": topic}
        if limit is not None:
            query["limit"] = str(limit)
        while True:
            answer = await self._call("GET", "listSchedules", idempotent=True, query=query)
            yield list(answer["schedules"])
            if answer["cursor"] is None:
                return
            query["cursor"] = answer["cursor"]

    # ------------------------------------------------------------ inspect

    async def get(self, topic: str, msg_id: str) -> DelayMsg | None:
        """getMsg; None when the server has no such message (404)."""
        answer = await self._call("POST", "getMsg", idempotent=True, form={"topic": topic, "msgId": msg_id}, missing_ok=True)
        return None if answer is None else DelayMsg.from_json(answer["delayMsg"])

    async def delete(self, topic: str, msg_id: str, release: bool = False) -> bool:
        """deleteMsg: never delivered again; with `release`, forgotten too
        (`get` answers None). False when there was no live message to
        delete (unknown or already ended: code 404, as camellia's SDK)."""
        answer = await self._call("POST", "deleteMsg", idempotent=True, form={"topic": topic, "msgId": msg_id,
                                                             "release": "true" if release else "false"},
                                  missing_ok=True)
        return answer is not None

    # ------------------------------------------------------------ bulk (docs/api.md, "Bulk calls")

    async def list_msgs(self, topic: str, *, limit: int | None = None, **filters: Any) -> AsyncIterator[list[DelayMsg]]:
        """listMsg, page after page (an async iterator of lists), in
        (trigger time, msgId) order, `limit` a page. Filters, combined with
        AND: key, tag, msg_id_prefix, statuses (e.g. [1, 2]; default 1,2,3),
        trigger_from_ms (inclusive), trigger_to_ms (exclusive).

            async for page in client.list_msgs("orders", key="order-42"):
                ..."""
        async for page in self.list_msg_rows(topic, limit=limit, **filters):
            yield [DelayMsg.from_json(m) for m in page]

    async def list_msg_rows(self, topic: str, *, limit: int | None = None,
                            **filters: Any) -> AsyncIterator[list[dict[str, Any]]]:
        """`list_msgs`' pages as the node wrote each message: every field
        of its `delayMsg`, those `DelayMsg` has no place for included."""
        query = _bulk_form(topic, filters)
        if limit is not None:
            query["limit"] = str(limit)
        while True:
            answer = await self._call("GET", "listMsg", idempotent=True, query=query)
            yield answer["delayMsgList"]
            if answer["cursor"] is None:
                return
            query["cursor"] = answer["cursor"]

    async def export_rows(self, topic: str, statuses: Iterable[int] = ()) -> AsyncIterator[list[dict[str, Any]]]:
        """exportMsg, page after page: the topic's messages in `statuses`
        (default: the live and the dead) in the order the node holds them,
        each as its `delayMsg`, every field. On a node of shards each
        shard's part of the walk is asked of that shard's own port
        (getShardMap), so no page is forwarded. A message moved while the
        walk goes on may come twice (docs/api.md, "exportMsg")."""
        query = {"topic": topic}
        if statuses:
            query["status"] = ",".join(str(int(s)) for s in statuses)
        if self._shard_map.due(self.base_url, time.monotonic()):
            await self._read_shard_map()
        cursor: str | None = None
        while True:
            answer = await self._call("GET", "exportMsg", idempotent=True, shard=self._walk_shard(cursor),
                                      query=query if cursor is None else {**query, "cursor": cursor})
            yield answer["delayMsgList"]
            cursor = answer["cursor"]
            if cursor is None:
                return

    def _walk_shard(self, cursor: str | None) -> str | None:
        """The base URL of the shard a walk's `cursor` ("s<shard>.…") goes on
        in; None: the node's own port (one shard, or no map)."""
        shards = self._shard_map.shards
        index, dot, _ = (cursor or "s0.").partition(".")
        if len(shards) < 2 or not dot or not index[1:].isascii() or not index[1:].isdigit():
            return None
        return shards[int(index[1:])] if int(index[1:]) < len(shards) else None

    async def count_msgs(self, topic: str, **filters: Any) -> int:
        """listMsg countOnly=true: how many messages match (filters as `list_msgs`)."""
        answer = await self._call("GET", "listMsg", idempotent=True, query={**_bulk_form(topic, filters),
                                                                            "countOnly": "true"})
        return int(answer["count"])

    async def delete_msgs(self, topic: str, *, all: bool = False, limit: int | None = None,
                          **filters: Any) -> tuple[int, bool]:
        """deleteMsgs: the live matches (at most `limit`, default 100,000)
        never delivered; at least one filter (as `list_msgs`) or
        `all=True`. Returns (deleted, more): `more` -- call again."""
        form = _bulk_form(topic, filters, all, limit)
        answer = await self._call("POST", "deleteMsgs", idempotent=True, form=form)
        return int(answer["deleted"]), bool(answer["more"])

    async def reschedule_msgs(self, topic: str, *, shift_ms: int | None = None, trigger_time_ms: int | None = None,
                              delay_ms: int | None = None, all: bool = False, limit: int | None = None,
                              **filters: Any) -> tuple[int, bool]:
        """rescheduleMsgs: the waiting and ready matches moved by `shift_ms`,
        to `trigger_time_ms`, or to `delay_ms` from now (exactly one).
        Returns (rescheduled, more). A shift is not repeated after a
        failure that may have applied it (it would shift twice)."""
        form = _bulk_form(topic, filters, all, limit)
        for name, value in (("shiftMillis", shift_ms), ("triggerTime", trigger_time_ms), ("delayMillis", delay_ms)):
            if value is not None:
                form[name] = str(value)
        answer = await self._call("POST", "rescheduleMsgs", idempotent=trigger_time_ms is not None, form=form)
        return int(answer["rescheduled"]), bool(answer["more"])

    async def reschedule(self, topic: str, msg_id: str, trigger_time_ms: int) -> DelayMsg | None:
        """rescheduleMsg to an absolute trigger time (so a repeated attempt
        asks for the same change): the message as moved, None if there is
        no such message (404); DelayQueueError 409 for one consuming or
        ended."""
        answer = await self._call("POST", "rescheduleMsg", idempotent=True, missing_ok=True,
                                  form={"topic": topic, "msgId": msg_id, "triggerTime": str(trigger_time_ms)})
        return None if answer is None else DelayMsg.from_json(answer["delayMsg"])

    async def topic_info(self, topic: str) -> dict[str, Any] | None:
        """getTopicInfo's `data` (camellia's shape; zeros for an unknown
        topic). None only from a server that answers 404 for one."""
        answer = await self._call("GET", "getTopicInfo", idempotent=True, query={"topic": topic}, missing_ok=True)
        return None if answer is None else answer["data"]

    async def topic_info_list(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = (await self._call("GET", "getTopicInfoList", idempotent=True))["data"]
        return data

    async def monitor_data(self) -> dict[str, Any]:
        data: dict[str, Any] = (await self._call("GET", "getMonitorData", idempotent=True))["data"]
        return data

    async def health(self) -> dict[str, Any]:
        """GET /health: the whole answer, e.g. `{"status": "ok", "role":
        "leader", "leader": "n1", ...}`."""
        answer: dict[str, Any] = await self._call("GET", "/health", idempotent=True)
        return answer

    # ------------------------------------------------------------ transport

    async def _shard(self, msg_id: str, key: str = "") -> str | None:
        """The base URL of the shard that owns a message (its key's, else
        its msgId's) on the node in use; None: the node's own (one shard, a
        cluster or Redis node, or a map that could not be read or used)."""
        if self._shard_map.due(self.base_url, time.monotonic()):
            await self._read_shard_map()
        return self._shard_map.owner(msg_id, key)

    async def _read_shard_map(self) -> None:
        """getShardMap of the node in use, once (again SHARD_MAP_RETRY_S after a failure: broker.shard_map)."""
        node = self.base_url
        self._shard_map.reading(node)
        try:
            answer = await self._call("GET", "getShardMap", idempotent=True, missing_ok=True, attempts=1)
        except (HourglassError, aiohttp.ClientError, TimeoutError, OSError, ValueError) as error:
            log.debug("getShardMap of %s failed (%r): calls go through the node's port", node, error)
            self._shard_map.give_up(time.monotonic())
            return
        self._shard_map.read(node, answer)

    async def _call(self, method: str, endpoint: str, *, idempotent: bool, form: Mapping[str, str] | None = None,
                    body: Any = None, query: Mapping[str, str] | None = None, wait_s: float = 0.0,
                    missing_ok: bool = False, shard: str | None = None, attempts: int | None = None) -> Any:
        """The answer's JSON object after retries; None for a 404 when
        `missing_ok`; raises DelayQueueError for any other non-200.
        `idempotent`: repeating the call after the node applied it changes
        nothing, so it may be repeated when that is unknown (broker.retry).
        `shard`: a shard's base URL for the first attempt (the node's own
        port for the others); `attempts`: at most this many, not the policy's."""
        path = endpoint if endpoint.startswith("/") else PREFIX + endpoint
        timeout = aiohttp.ClientTimeout(total=self.timeout_s + wait_s)
        attempt = 0
        while True:
            url = URL((shard or self.base_url) + path).update_query(query)
            try:
                code, answer, retry_after = await self._request(method, url, form, body, timeout, endpoint)
                if code == 200 or (code == 404 and missing_ok):
                    return answer if code == 200 else None
                raise DelayQueueError(code, str(answer.get("msg", "")), endpoint, answer, retry_after)
            except Exception as error:
                if attempts is not None and attempt + 1 >= attempts:
                    raise
                if not self.retry.may_retry(attempt, failure_of(error), idempotent):
                    raise
                if shard is not None:  # the shard's port failed: the node's own from now on
                    shard = None
                    self._shard_map.give_up(time.monotonic())
                    attempt += 1
                    continue
                self._node = (self._node + 1) % len(self.base_urls)  # the next node, if there are several
                pause_s = self.retry.pause_s(attempt, error.retry_after_s if isinstance(error, DelayQueueError) else None)
                log.debug("%s %s failed (%r), attempt %d; again in %.2f s", method, endpoint, error, attempt + 1,
                          pause_s)
                await asyncio.sleep(pause_s)
                attempt += 1

    async def _request(self, method: str, url: URL, form: Mapping[str, str] | None, body: Any,
                       timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's own, per request)
                       endpoint: str) -> tuple[int, dict[str, Any], float | None]:
        """One attempt, following 307/308 with method, body and token kept:
        (the code, the answer, the pause its Retry-After header asks)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        for _ in range(MAX_REDIRECTS + 1):
            async with self._session.request(method, url, data=form, json=body, headers=self._headers,
                                             timeout=timeout, allow_redirects=False) as resp:
                location = resp.headers.get("Location")
                if resp.status in (307, 308) and location:
                    url = url.join(URL(location))
                    continue
                retry_after = retry_after_s(resp.headers.get("Retry-After"), time.time())
                answer = _json_object(resp.status, await resp.text(), endpoint, retry_after)
                if resp.status == 200:  # the API's outcome is the code in the body (camellia)
                    code = answer.get("code", 200)
                    return (code if isinstance(code, int) else 200), answer, retry_after
                return resp.status, answer, retry_after
        raise DelayQueueError(resp.status, f"more than {MAX_REDIRECTS} redirects, the last to {url}", endpoint)


# The bulk calls' filters: keyword -> wire name.
BULK_FILTERS = {"key": "key", "tag": "tag", "msg_id_prefix": "msgIdPrefix", "statuses": "status",
                "trigger_from_ms": "triggerFrom", "trigger_to_ms": "triggerTo"}


def _bulk_form(topic: str, filters: Mapping[str, Any], every: bool = False, limit: int | None = None) -> dict[str, str]:
    form = {"topic": topic}
    for name, value in filters.items():
        wire = BULK_FILTERS.get(name)
        if wire is None:
            raise ConfigError(f"unknown filter {name!r}: one of {', '.join(BULK_FILTERS)}")
        if value is not None:
            form[wire] = ",".join(str(int(s)) for s in value) if name == "statuses" else str(value)
    if every:
        form["all"] = "true"
    if limit is not None:
        form["limit"] = str(limit)
    return form


def _pull_form(topic: str, batch: int | None, ack_timeout_ms: int | None,
               tags: Iterable[str] | None) -> dict[str, str]:
    form = {"topic": topic}
    if batch is not None:
        form["batch"] = str(batch)
    if ack_timeout_ms is not None:
        form["ackTimeoutMillis"] = str(ack_timeout_ms)
    if tags is not None:
        form["tags"] = tags if isinstance(tags, str) else ",".join(tags)
    return form


def _json_object(code: int, text: str, endpoint: str, retry_after: float | None) -> dict[str, Any]:
    """The answer's JSON object; a body that is not one (a proxy's error
    page, say) becomes a DelayQueueError with the answer's status."""
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise DelayQueueError(code, f"answer is not a JSON object: {text[:200]!r}", endpoint, None, retry_after)
    return answer


class Consumer:
    """Long-polls a topic and runs `await handler(msg)` for each message,
    at most `concurrency` at once; acks when the handler returns, nacks (the
    message comes back now, retry + 1) when it raises. Acks go in batches:
    one ackMsg with msgIds at a time, carrying every id whose handler
    returned meanwhile (up to 1000), so a busy consumer makes one request
    and the server one fsync for many messages.

    It holds each message as long as its handler runs (docs/api.md,
    "Leases"): every third of the ack timeout (`ack_timeout_ms`, else the
    server's default 30 s) one extendMsg a topic carries every message
    whose handler still runs, and its acks and nacks are fenced by the
    message's deliveryId. A lease lost (code 409: the message timed out and
    went to another consumer meanwhile) is logged, and that message is not
    acked or nacked by this consumer. (A server that hands no deliveryId
    out, camellia's, gets plain acks and no extensions.)

    It never holds more messages than it has free handler slots: each poll
    asks for min(`batch`, free slots), so a slow handler leaves the rest of
    the topic to other consumers. `stop()` ends `run()` after the handlers
    in flight finish; a long poll in flight is abandoned, and any message the
    server handed to it comes back after `ack_timeout_ms`. When the broker is
    unreachable past the client's retries, the consumer logs and polls again
    after `idle_s`; any other error (say 401) stops it and `run()` raises.
    """

    def __init__(self, client: DelayQueueClient, topic: str, handler: Callable[[DelayMsg], Awaitable[object]], *,
                 concurrency: int = 4, batch: int | None = None, ack_timeout_ms: int | None = None,
                 long_poll_ms: int = 5_000, tags: Iterable[str] | None = None, idle_s: float = 1.0) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
        if batch is not None and batch < 1:
            raise ConfigError(f"batch must be at least 1, got {batch}")
        self.client = client
        self.topic = topic
        self.handler = handler
        self.concurrency = concurrency
        self.batch = batch or concurrency
        self.ack_timeout_ms = ack_timeout_ms
        self.long_poll_ms = long_poll_ms
        self.tags = tuple(tags) if tags is not None else None
        self.idle_s = idle_s
        self.acked = 0
        self.nacked = 0
        self._slots = asyncio.Semaphore(concurrency)
        self._running: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._to_ack: list[DelayMsg] = []
        self._ack_wake = asyncio.Event()
        self._holding: dict[str, DelayMsg] = {}  # msgId -> the message its handler runs on
        self._lost: set[tuple[str, str]] = set()  # (msgId, deliveryId) of leases lost while their handler ran
        self.extended = 0  # extensions the server granted
        self.lost = 0  # leases lost (409)
        self._acks_done = False

    def __repr__(self) -> str:
        state = "stopping" if self._stopping.is_set() else "running"
        return (f"Consumer(topic={self.topic!r}, in_flight={len(self._running)}/{self.concurrency}, "
                f"acked={self.acked}, nacked={self.nacked}, {state})")

    def stop(self) -> None:
        """Ask `run()` to return once the handlers in flight finish."""
        self._stopping.set()

    async def run(self) -> None:
        acker = asyncio.create_task(self._run_acks())
        extender = asyncio.create_task(self._run_extensions())
        try:
            while not self._stopping.is_set():
                free = await self._take_slots()
                msgs = await self._poll(free) if free else []
                for _ in range(free - len(msgs)):
                    self._slots.release()
                for msg in msgs:
                    task = asyncio.create_task(self._handle(msg))
                    self._running.add(task)
                    task.add_done_callback(self._running.discard)
        except asyncio.CancelledError:
            for task in self._running:  # their messages come back after the ack timeout
                task.cancel()
            raise
        finally:  # stopped, failed or cancelled: no handler outlives run(); their acks are sent
            if self._running:
                await asyncio.wait(set(self._running))
            extender.cancel()
            await asyncio.wait({extender})
            self._acks_done = True
            self._ack_wake.set()
            await acker  # sends what the handlers left

    async def _run_acks(self) -> None:
        while True:
            await self._ack_wake.wait()
            self._ack_wake.clear()
            while self._to_ack:
                await self._send_acks()
            if self._acks_done:
                return

    async def _send_acks(self) -> None:
        """One ackMsg with the ids waiting (up to MAX_ACK_BATCH), fenced by
        their deliveryIds when the server gave them; a failure is logged,
        not raised: those messages come back after their ack timeout."""
        msgs, self._to_ack = self._to_ack[:MAX_ACK_BATCH], self._to_ack[MAX_ACK_BATCH:]
        leased = [m for m in msgs if m.delivery_id]
        plain = [m.msg_id for m in msgs if not m.delivery_id]
        try:
            if leased:
                results = await self.client.ack_leased(self.topic, [m.msg_id for m in leased],
                                                       [m.delivery_id or "" for m in leased])
                self._note_lost(leased, results, "ack")
                self.acked += sum(1 for r in results.values() if r.get("code") == 200)
            if plain:
                await self.client.ack_many(self.topic, plain)
                self.acked += len(plain)
        except (DelayQueueError, *TRANSIENT_ERRORS) as error:
            log.warning("ack of %d messages of %s failed: %r", len(msgs), self.topic, error)

    async def _run_extensions(self) -> None:
        """Every third of the ack timeout, extend the messages whose handlers
        still run, MAX_ACK_BATCH a call; a lost lease is noted (`_note_lost`)."""
        timeout_ms = self.ack_timeout_ms or SERVER_ACK_TIMEOUT_DEFAULT_MS
        while True:
            await asyncio.sleep(timeout_ms / 3 / 1000)
            held = [m for m in self._holding.values() if m.delivery_id and (m.msg_id, m.delivery_id) not in self._lost]
            for at in range(0, len(held), MAX_ACK_BATCH):
                part = held[at:at + MAX_ACK_BATCH]
                try:
                    results = await self.client.extend_many(self.topic, [m.msg_id for m in part],
                                                            [m.delivery_id or "" for m in part], timeout_ms)
                except (DelayQueueError, *TRANSIENT_ERRORS) as error:
                    log.warning("extension of %d messages of %s failed: %r", len(part), self.topic, error)
                    continue
                self.extended += sum(1 for r in results.values() if r.get("code") == 200)
                self._note_lost(part, results, "extension")

    def _note_lost(self, msgs: Sequence[DelayMsg], results: Mapping[str, Mapping[str, Any]], what: str) -> None:
        """The messages of `msgs` a fenced call was refused (409): their lease
        is lost, logged; this consumer neither acks nor nacks them."""
        for m in msgs:
            result = results.get(m.msg_id, {})
            lease = (m.msg_id, m.delivery_id or "")
            if result.get("code") == 409 and lease not in self._lost:
                if what != "ack":  # (an ack comes after its handler: nothing is left to skip)
                    self._lost.add(lease)
                self.lost += 1
                log.warning("lost the lease of %s/%s (%s refused: %s); not acked here", self.topic, m.msg_id, what,
                            result.get("msg"))

    async def _take_slots(self) -> int:
        """Wait for one free handler slot, then take up to `batch` that are
        free; 0 if stopped first."""
        if not await self._until_stopped(self._slots.acquire()):
            return 0
        taken = 1
        while taken < self.batch and not self._slots.locked():
            await self._slots.acquire()  # does not block: a slot is free
            taken += 1
        return taken

    async def _poll(self, batch: int) -> list[DelayMsg]:
        """Up to `batch` messages; none when stopped, or after a pause when
        the broker stayed unreachable through the client's retries."""
        try:
            return await self._until_stopped(self.client.long_poll(
                self.topic, timeout_ms=self.long_poll_ms, batch=batch, ack_timeout_ms=self.ack_timeout_ms,
                tags=self.tags)) or []
        except Exception as error:
            if not is_transient(error):
                raise
            log.warning("long poll of %r failed: %r; again in %.1f s", self.topic, error, self.idle_s)
            await self._until_stopped(asyncio.sleep(self.idle_s))
            return []

    async def _until_stopped(self, work: Awaitable[Any]) -> Any:
        """`work`'s result, or None if stop() came first (work is cancelled)."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        return None if task.cancelled() else task.result()

    async def _handle(self, msg: DelayMsg) -> None:
        self._holding[msg.msg_id] = msg
        try:
            try:
                await self.handler(msg)
            except Exception:
                log.exception("handler failed on %s/%s (retry %d); nack", msg.topic, msg.msg_id, msg.retry)
                if (msg.msg_id, msg.delivery_id or "") not in self._lost and await self._nack(msg):
                    self.nacked += 1
            else:
                if (msg.msg_id, msg.delivery_id or "") not in self._lost:
                    self._to_ack.append(msg)
                    self._ack_wake.set()
        finally:
            if self._holding.get(msg.msg_id) is msg:  # (not a later delivery of it, handed here again)
                del self._holding[msg.msg_id]
            self._lost.discard((msg.msg_id, msg.delivery_id or ""))
            self._slots.release()

    async def _nack(self, msg: DelayMsg) -> bool:
        """Nack, fenced by its deliveryId when it has one; a failure is
        logged, not raised: the message comes back after its ack timeout
        either way."""
        try:
            if msg.delivery_id:
                results = await self.client.ack_leased(msg.topic, [msg.msg_id], [msg.delivery_id], ack=False)
                self._note_lost([msg], results, "nack")
                return results[msg.msg_id].get("code") == 200
            await self.client.nack(msg.topic, msg.msg_id)
            return True
        except (DelayQueueError, *TRANSIENT_ERRORS) as error:
            log.warning("nack of %s/%s failed: %r", msg.topic, msg.msg_id, error)
            return False
