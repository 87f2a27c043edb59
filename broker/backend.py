"""What the HTTP API (broker.http.api) needs of a backend, and what every
backend shares.

`Backend` is the protocol `broker.http.api.Api` types against; its `requests`
(`MessageRequests`) is the part the API's hot paths (send, pull, ack...)
call directly, with no forwarding frame between. Two classes implement
it: the disk `broker.disk.backend.Broker` (the lifecycle of
docs/api.md over the commit log and the timing wheel) and `broker.redis.backend.RedisBroker`
(the same lifecycle in Redis, one Lua script per transition). Both answer
the same calls with the same outcomes: a message, a list, or one of the
errors of storage.errors (InvalidRequest 400, NotFound 404, Conflict 409,
Unavailable 503). Starting differs (the disk broker's `start()` launches
its tasks at once; Redis's is awaited, as it checks the connection), so
the server starts each itself; stopping is `begin_stop()` then `stop()`
(each builds a broker.core.lifecycle.Lifecycle and broker.core.long_polls.LongPolls).

Also here, neutral ground both backends import (neither imports the
other): camellia's names for the waiting queue's delay buckets, the shape
of a TopicInfo, the bounds of a dead-letter page, and the refusal of a
new topic past --max-topics (each backend counts its topics its own way:
the disk broker those with a message in a live hour, Redis its topic set).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from storage.entry import Message, Status
from storage.errors import InvariantError, LimitReached
from storage.store import NewMessage
from wheel.clock import Clock

from .core.bulk_params import BulkFilter, DeleteMsgsRequest, ListMsgRequest, RescheduleMsgsRequest
from .core.params import AckRequest, Defaults, DeleteRequest, FencedRequest, LongPollRequest, NewSend, PullRequest
from .core.transitions import Fencing
from .observe.metrics import Backlog, Metrics


def new_msg_id() -> str:
    """32 random hex digits, as uuid4().hex without its version bits (a fifth of its cost)."""
    return os.urandom(16).hex()


class MessageRequests(Protocol):
    """A backend's message requests, as the API calls them (the disk
    broker's part broker.disk.requests.Requests, the Redis broker's
    broker.redis.requests.RedisRequests). `now_ms` is the time a send is
    stored at: the one its parameters were read at."""

    async def send(self, sends: Sequence[NewSend], now_ms: int) -> list[Message]: ...

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]: ...

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool]) -> list[Message]: ...

    def ack(self, request: AckRequest) -> Awaitable[object]: ...

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]: ...

    async def fenced(self, request: FencedRequest) -> list[Fencing]: ...

    async def delete(self, request: DeleteRequest) -> None: ...

    async def get(self, topic: str, msg_id: str) -> Message: ...


class Backend(Protocol):
    """The queues behind the HTTP API. Every method runs on the event loop;
    each request method raises Unavailable once `begin_stop()` was called."""

    clock: Clock
    defaults: Defaults  # what a request leaves out
    metrics: Metrics
    on_fatal: Callable[[BaseException], None] | None  # called once when it stops itself

    @property
    def requests(self) -> MessageRequests:
        """What answers send, pull, long poll, ack, delete and get (the
        methods below of those names are its own, bound): the API calls it."""
        ...

    @property
    def failed(self) -> BaseException | None:
        """Why the backend stopped itself (None: it did not)."""
        ...

    async def send(self, sends: Sequence[NewSend | NewMessage]) -> list[Message]:
        """Store new messages; a duplicate id answers the stored message."""
        ...

    async def pull(self, request: PullRequest | LongPollRequest) -> list[Message]:
        """Up to `batch` READY messages of the topic, now CONSUMING."""
        ...

    async def long_poll(self, request: LongPollRequest, gone: Callable[[], bool] = ...) -> list[Message]:
        """As pull, waiting up to the timeout for a READY message; `gone()`:
        the client hung up (nothing is taken)."""
        ...

    def ack(self, request: AckRequest) -> Awaitable[object]:
        """Ack (-> ACKED) or nack (-> READY, or ENDED) one message (the
        disk broker's hands back `ack_many`'s coroutine: MessageRequests)."""
        ...

    async def ack_many(self, topic: str, msg_ids: Sequence[str], ack: bool = True) -> list[Status | None]:
        """`ack` of each id; each one's status after it (None: unknown)."""
        ...

    async def delete(self, request: DeleteRequest) -> None:
        """A live message -> DELETED; NotFound for an unknown or ended one."""
        ...

    async def get(self, topic: str, msg_id: str) -> Message:
        """The message as committed; NotFound if there is none."""
        ...

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        """A WAITING or READY message gets a new trigger time; else Conflict."""
        ...

    async def retry_at(self, topic: str, msg_id: str, at_ms: int) -> Status | None:
        """A failed push delivery (broker.push.pusher): the CONSUMING message
        leaves flight and waits again until `at_ms`, its trigger time then
        (a nack with a delay: no in-flight cap is spent on the wait), or is
        ENDED as a nack would end it (after maxRetry + 1 deliveries, or if
        `at_ms` is past its expiry). Any other message is left as it is.
        Its status after it (None: none was in flight)."""
        ...

    async def list_dead(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                        limit: int) -> tuple[list[Message], str | None]:
        """A page of dead letters (5, 6) and the next page's cursor."""
        ...

    async def redrive(self, topic: str, msg_id: str) -> Message:
        """A dead letter READY again, retry 0; else Conflict."""
        ...

    async def redrive_all(self, topic: str, limit: int) -> tuple[int, bool]:
        """Up to `limit` dead letters READY again; how many, and if more are left."""
        ...

    async def list_msgs(self, request: ListMsgRequest) -> tuple[list[Message], str | None]:
        """listMsg: a page of matches in (trigger time, msgId) order, and the next cursor."""
        ...

    async def count_msgs(self, topic: str, flt: BulkFilter) -> int:
        """listMsg countOnly=true: the exact number of matches."""
        ...

    async def export_msgs(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                          limit: int) -> tuple[list[Message], str | None]:
        """exportMsg: a page of the topic's messages in `statuses` in the
        order the backend holds them, and the next page's cursor."""
        ...

    async def delete_msgs(self, request: DeleteMsgsRequest) -> tuple[int, bool]:
        """deleteMsgs: live matches DELETED, all or nothing; how many, and if more remain."""
        ...

    async def reschedule_msgs(self, request: RescheduleMsgsRequest) -> tuple[int, bool]:
        """rescheduleMsgs: waiting and ready matches moved; how many, and if more remain."""
        ...

    async def topic_info(self, topic: str) -> dict[str, object]:
        """camellia's TopicInfo (`topic_info_json`)."""
        ...

    async def topic_infos(self, topics: Sequence[str]) -> list[dict[str, object]]:
        """`topic_info` of each topic."""
        ...

    def topic_list(self) -> list[str]:
        """The topics known, sorted."""
        ...

    async def topic_backlogs(self) -> dict[str, Backlog]:
        """(waiting, ready, consuming, dead) of every topic known, for
        /metrics: one pass over all topics, yielding to the event loop
        between slices."""
        ...

    def wake_all(self) -> None:
        """Answer every long poll now (going offline, broker.http.health)."""
        ...

    def begin_stop(self) -> None:
        """Refuse new work (503) and answer every long poll now."""
        ...

    async def stop(self) -> None:
        """Finish: stop the background tasks (after the server's requests)."""
        ...

# getTopicInfo's waitingQueueInfo buckets, as camellia names them: upper
# bounds of time-until-trigger, in ms.
WAITING_BUCKETS = (
    ("sizeOf0To1min", 60_000),
    ("sizeOf1minTo10min", 600_000),
    ("sizeOf10minTo30min", 1_800_000),
    ("sizeOf30minTo1hour", 3_600_000),
    ("sizeOf1hourTo6hour", 6 * 3_600_000),
    ("sizeOf6hourTo1day", 24 * 3_600_000),
    ("sizeOf1dayTo7day", 7 * 24 * 3_600_000),
    ("sizeOf7dayTo30day", 30 * 24 * 3_600_000),
    ("sizeOf30dayToInfinite", None),
)


# listDeadMsg and redriveMsg all=true read at most this many index entries
# (Redis: members) per page or step; a re-drive moves at most REDRIVE_STEP
# messages a record (Redis: a script).
DEAD_SCAN = 65536
REDRIVE_STEP = 1000


def topic_cap_error(topics: int, max_topics: int) -> LimitReached:
    """The refusal of a send to a new topic when `topics` exist and one
    more would pass `max_topics` (--max-topics): code 429, nothing stored."""
    return LimitReached(f"the node has {topics} topics and --max-topics is {max_topics}: a send to a new topic is "
                        f"refused until topics retire (their messages ended and past retention), or raise "
                        f"--max-topics")


def waiting_bucket(until_trigger_ms: int) -> int:
    """The index in WAITING_BUCKETS of a message triggering in `until_trigger_ms`."""
    for i, (_, upper) in enumerate(WAITING_BUCKETS):
        if upper is None or until_trigger_ms < upper:
            return i
    raise InvariantError("the last bucket is unbounded")


def topic_info_json(topic: str, waiting: int, buckets: list[int], ready: int, consuming: int,
                    oldest_ready_ms: int | None = None, now_ms: int = 0,
                    longest_held_ms: int | None = None) -> dict[str, object]:
    """camellia's TopicInfo: queue sizes and the waiting queue by delay
    bucket (`buckets` counts per WAITING_BUCKETS entry); and hourglass's
    `dueUndelivered` (READY: due, not handed out), `oldestDueAgeMillis`
    (now - the oldest READY message's trigger time, 0 if none) and, where
    the backend keeps it, `longestHeldMillis` (now - the hand-over of the
    consuming message held longest, 0 if none: docs/api.md, "Leases").
    (`paused` is the node's to add: broker.flow.)"""
    return {
        "topic": topic,
        "waitingQueueSize": waiting,
        "waitingQueueInfo": {name: n for (name, _), n in zip(WAITING_BUCKETS, buckets)},
        "readyQueueSize": ready,
        "ackQueueSize": consuming,
        "dueUndelivered": ready,
        "oldestDueAgeMillis": 0 if oldest_ready_ms is None else max(0, now_ms - oldest_ready_ms),
        **({} if longest_held_ms is None else {"longestHeldMillis": longest_held_ms}),
    }
