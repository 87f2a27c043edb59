"""Push delivery: each push subscription's due messages POSTed to its URL
(docs/api.md, "Push delivery"), over any `broker.backend.Backend`.

A subscription's `TopicPusher` takes READY messages exactly as a pull
does -- the same windows, the same CONSUMING record, the same per-key
serial order, the same in-flight caps -- through the backend's long poll,
so a READY arrival wakes it as it wakes a consumer's long poll. Each
message is POSTed (signed with the subscription's secret); a 2xx acks it
as ackMsg does (the 2xx answers of a moment acked together, as one
batch ack: `ack_many`); anything else is a failed delivery: the message
goes back to waiting for its retry time, the backoff (broker.push.rules
.backoff_ms) from now, as a nack with a delay would (`Backend.retry_at`:
WAITING, filed at that time with its retry, one durable record; or ENDED,
status 6, after maxRetry + 1 deliveries or past its ttl). So a backoff
holds no in-flight capacity (--max-inflight, --max-inflight-total) and no
key: only the POSTs in flight are CONSUMING, at most `concurrency`. The
pull's ack timeout covers the POST, so a node killed mid-delivery
redelivers it at the deadline (on Redis, once the POST's timeoutMillis has
passed and the node's lease has lapsed: the poll carries timeoutMillis,
broker.redis.keys), and one killed mid-backoff at its retry time: at least
once, never lost, never before its trigger time.

    Pushers        the node's subscriptions (kept in `SubscriptionFile`),
                   one TopicPusher each while the node serves
    TopicPusher    concurrency (in-flight POSTs) and rateLimit (a token
                   bucket) per subscription; its own HTTP client
                   (broker.push.client), whose connections a slow
                   subscriber holds without touching another topic's: it
                   checks every address a URL's name resolves to against
                   --push-allow at connect time (no DNS rebinding around
                   it), follows no redirect, reads a response body up
                   to maxBodyBytes and an answer within --push-* limits
                   (PushLimits), and holds at most the subscription's
                   share of the node's push descriptors (--push-max-fds)
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from storage.entry import Message, Status
from storage.errors import CorruptionError, HourglassError, LimitReached, NewerFormatError, Unavailable
from storage.fileutil import atomic_write
from wheel.clock import Clock, Timer

from ..backend import Backend
from ..core.delay_msg import delay_msg
from ..core.params import LongPollRequest
from ..http.descriptors import DescriptorBudget
from ..observe.metrics import COUNTER, GAUGE, HISTOGRAM, Family, Sample, topic_labels
from ..observe.tracing import Spans
from .client import PostFailed, PushClient, PushDescriptors
from .rules import (
    DEFAULT_MAX_SUBSCRIPTIONS,
    LogGate,
    PushAllow,
    PushLimits,
    Subscription,
    backoff_ms,
    retry_after_ms,
    signature,
)

log = logging.getLogger("hourglass.push")

# How long one long poll of a pusher waits before polling again (a
# pusher's stop or a change of its subscription answers it sooner).
POLL_MS = 1000
# Most messages one batch ack of the delivered ones names.
ACK_BATCH = 1000
# A pull's ack timeout past the POST's timeoutMillis: time for the outcome's
# record (an ack, or the retry time) before the message is redelivered.
ACK_MARGIN_MS = 60_000
# Upper bounds of the trigger -> 2xx latency histogram, in ms.
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 5000, 30_000, 300_000)


@dataclass
class PushStats:
    """One subscription's counts, for /metrics, the console and getSubscription."""

    deliveries: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # by reason
    latency_ms: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    latency_sum_ms: int = 0
    in_flight: int = 0
    backing_off: int = 0
    last_error: str | None = None
    last_error_ms: int | None = None

    def delivered(self, latency_ms: int) -> None:
        self.deliveries += 1
        self.latency_sum_ms += latency_ms
        for i, upper in enumerate(LATENCY_BUCKETS_MS):
            if latency_ms <= upper:
                self.latency_ms[i] += 1
                return
        self.latency_ms[-1] += 1

    def failed(self, reason: str, detail: str, now_ms: int) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        self.last_error, self.last_error_ms = detail, now_ms

    def public(self) -> dict[str, object]:
        return {"deliveries": self.deliveries, "failures": dict(self.failures), "inFlight": self.in_flight,
                "backingOff": self.backing_off, "lastError": self.last_error, "lastErrorTime": self.last_error_ms}


class TokenBucket:
    """rateLimit: at most `rate` takes a second, bursts of a twentieth of it."""

    def __init__(self, clock: Clock, rate: int) -> None:
        self._clock = clock
        self._rate = rate
        self._capacity = max(1.0, rate / 20)
        self._tokens = self._capacity
        self._at = clock.monotonic_s()

    def _refill(self) -> None:
        now = self._clock.monotonic_s()
        self._tokens = min(self._capacity, self._tokens + (now - self._at) * self._rate)
        self._at = now

    async def take(self, most: int) -> int:
        """1..most tokens, waiting for the first."""
        self._refill()
        while self._tokens < 1:
            await self._clock.sleep((1 - self._tokens) / self._rate)
            self._refill()
        taken = min(most, int(self._tokens))
        self._tokens -= taken
        return taken

    def give_back(self, unused: int) -> None:
        self._tokens = min(self._capacity, self._tokens + unused)


class TopicPusher:
    """One subscription's delivery loop (see the module docstring)."""

    def __init__(self, subscription: Subscription, backend: Backend, clock: Clock, allow: PushAllow,
                 stats: PushStats, jitter: Callable[[], float] = lambda: random.uniform(0.5, 1.0),
                 limits: PushLimits | None = None, descriptors: PushDescriptors | None = None,
                 spans: Spans | None = None) -> None:
        self.subscription = s = subscription
        self._spans = spans  # a span of each POST (broker.observe.tracing); None: off
        self._backend = backend
        self._clock = clock
        self._allow = allow
        self.stats = stats
        self._limits = limits  # what an answer may cost, and the connections' descriptors (broker.push.client)
        self._descriptors = descriptors
        self._log_gate = LogGate()  # one line a minute about this subscription's failures
        self._jitter = jitter
        self._bucket = TokenBucket(clock, s.rate_limit) if s.rate_limit else None
        self._slot_free = asyncio.Event()
        self._slot_free.set()
        self._deliveries: set[asyncio.Task[None]] = set()
        self._backoffs: dict[str, Timer] = {}  # msgId -> its retry time (WAITING in the backend meanwhile)
        self._delivered: list[str] = []  # answered 2xx, not acked yet (the acker's)
        self._to_ack = asyncio.Event()
        self._stopped = False
        # The pull's ack timeout: the POST, and a margin for its outcome's
        # record, within the node's --max-ack-timeout-ms (a backoff waits
        # out of flight: `_retry_later`).
        self.ack_timeout_ms = min(s.timeout_ms + ACK_MARGIN_MS, backend.defaults.max_ack_timeout_ms)
        self._client: PushClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._acker: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"TopicPusher({self.subscription!r}, in_flight={self.stats.in_flight})"

    def start(self) -> None:
        s = self.subscription
        self._client = PushClient(s.url, self._allow, s.timeout_ms / 1000, s.max_body_bytes, self._limits,
                                  self._descriptors)
        self._start_tasks()

    def _start_tasks(self) -> None:
        """The delivery loop, and the acker of what was delivered."""
        self._task = asyncio.create_task(self._run(), name=f"push {self.subscription.topic}")
        self._acker = asyncio.create_task(self._ack_delivered(), name=f"push acks {self.subscription.topic}")

    async def stop(self, nack_backoffs: bool = False) -> None:
        """Stop taking and delivering: a delivery in flight stays CONSUMING
        and is delivered again at its ack deadline; one backing off waits
        in the backend for its retry time, unless `nack_backoffs` (the
        subscription changes, the node goes on): then it is due now."""
        self._stopped = True
        backing_off = list(self._backoffs)
        for timer in self._backoffs.values():
            timer.cancel()
        self._backoffs.clear()
        self.stats.backing_off = 0
        if nack_backoffs:
            await asyncio.gather(*(self._due_now(msg_id) for msg_id in backing_off))
        tasks = [t for t in (self._task, *self._deliveries) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._acker is not None:  # the deliveries answered 2xx are acked before it stops
            self._to_ack.set()
            await asyncio.gather(self._acker, return_exceptions=True)
        if self._client is not None:
            await self._client.close()

    async def _run(self) -> None:
        s = self.subscription
        while not self._stopped:
            await self._slot_free.wait()
            free = s.concurrency - self.stats.in_flight
            if free <= 0:
                self._slot_free.clear()
                continue
            if self._bucket is not None:
                free = await self._bucket.take(free)
            polled_s = self._clock.monotonic_s()
            try:
                messages = await self._backend.long_poll(LongPollRequest(s.topic, self.ack_timeout_ms, free, (),
                                                                         POLL_MS, s.timeout_ms))
            except (Unavailable, HourglassError) as e:  # stopping, or not serving now
                log.debug("push %s: %s", s.topic, e)
                messages = []
            if not messages and self._clock.monotonic_s() - polled_s < POLL_MS / 2000:
                await self._clock.sleep(POLL_MS / 1000)  # answered at once, empty: the node stops, or fails
            if self._bucket is not None:
                self._bucket.give_back(free - len(messages))
            for message in messages:
                self.stats.in_flight += 1
                task = asyncio.create_task(self._deliver(message))
                self._deliveries.add(task)
                task.add_done_callback(self._deliveries.discard)
            if self.stats.in_flight >= s.concurrency:
                self._slot_free.clear()

    async def _deliver(self, message: Message) -> None:
        try:
            failure, after_ms = await self._post(message)
            now_ms = self._clock.now_ms()
            if failure is None:
                self._delivered.append(message.msg_id)
                self._to_ack.set()
                self.stats.delivered(max(0, now_ms - message.trigger_ms))
                return
            reason, detail = failure
            self.stats.failed(reason, detail, now_ms)
            self._log_failure(message, detail, now_ms)
            await self._retry_later(message, backoff_ms(message.retry, after_ms, self._jitter()))
        finally:
            self.stats.in_flight -= 1
            self._slot_free.set()

    def _log_failure(self, message: Message, detail: str, now_ms: int) -> None:
        """One line a minute at most (LogGate), with how many failed meanwhile unlogged."""
        suppressed = self._log_gate.admit(now_ms)
        if suppressed is not None:
            log.info("push %s: delivery of %s failed (%s)%s", message.topic, message.msg_id, detail,
                     f"; {suppressed} more failed deliveries since the last line" if suppressed else "")

    async def _retry_later(self, message: Message, wait_ms: int) -> None:
        """A failed delivery: the message waits in the backend until its
        retry time (`Backend.retry_at`, durable once it returns), out of
        flight; or ends there, as a nack would, after its last delivery."""
        try:
            status = await self._backend.retry_at(message.topic, message.msg_id, self._clock.now_ms() + wait_ms)
        except HourglassError as e:  # stopping: redelivered at its ack deadline
            log.info("push %s: could not file %s for its retry: %s", message.topic, message.msg_id, e)
            return
        if status is Status.WAITING:  # counted as backing off until its retry time
            old = self._backoffs.pop(message.msg_id, None)
            if old is not None:
                old.cancel()
                self.stats.backing_off -= 1
            self.stats.backing_off += 1
            self._backoffs[message.msg_id] = self._clock.call_later(
                wait_ms / 1000, functools.partial(self._backoff_over, message.msg_id))

    def _backoff_over(self, msg_id: str) -> None:
        if self._backoffs.pop(msg_id, None) is not None:
            self.stats.backing_off -= 1

    async def _due_now(self, msg_id: str) -> None:
        """A message backing off, due now (rescheduleMsg to now), as it was
        nacked before: a changed or removed subscription leaves none waiting."""
        topic = self.subscription.topic
        try:
            await self._backend.reschedule(topic, msg_id, self._clock.now_ms())
        except HourglassError as e:  # pulled, acked or deleted since; or stopping (due at its retry time)
            log.debug("push %s: %s not made due now: %s", topic, msg_id, e)

    async def _ack_delivered(self) -> None:
        """Ack the messages answered 2xx, those of a moment in one batch ack
        (ACK_BATCH at most), until the pusher stops and none is left."""
        topic = self.subscription.topic
        while True:
            await self._to_ack.wait()
            self._to_ack.clear()
            while self._delivered:
                ids, self._delivered = self._delivered[:ACK_BATCH], self._delivered[ACK_BATCH:]
                try:
                    await self._backend.ack_many(topic, ids, True)
                except HourglassError as e:  # stopping: redelivered at their ack deadline
                    log.info("push %s: could not ack %d delivered messages: %s", topic, len(ids), e)
            if self._stopped:
                return

    async def _post(self, message: Message) -> tuple[tuple[str, str] | None, int | None]:
        """POST one message: None (a 2xx), or (reason, detail) of the failure,
        and the subscriber's Retry-After in ms if it gave one."""
        s = self.subscription
        if self._client is None:
            return ("stopped", "the pusher is not running"), None
        delay = delay_msg(message)
        body = orjson.dumps(delay)
        timestamp_ms = self._clock.now_ms()
        headers = [("Content-Type", "application/json"), ("Hourglass-Topic", message.topic),
                   ("Hourglass-Msg-Id", message.msg_id), ("Hourglass-Retry", str(message.retry)),
                   ("Hourglass-Timestamp", str(timestamp_ms))]
        if "scheduledTime" in delay:  # a schedule's run (broker.schedules.keeper)
            headers.append(("Hourglass-Scheduled-Time", str(delay["scheduledTime"])))
        if message.traceparent:  # the sender's W3C trace context, as it gave it
            headers.append(("traceparent", message.traceparent))
            if message.tracestate:
                headers.append(("tracestate", message.tracestate))
        if s.secret is not None:
            headers.append(("Hourglass-Signature", signature(s.secret, timestamp_ms, body)))
        spans = self._spans
        span = None if spans is None else spans.push_started(message)
        try:
            status, retry_after = await self._client.post(body, headers)
        except PostFailed as e:
            if spans is not None:
                spans.push_ended(span, e.reason, None)
            return (e.reason, e.detail), None
        if 200 <= status < 300:
            if spans is not None:
                spans.push_ended(span, None, status)
            return None, None
        reason = "redirect" if 300 <= status < 400 else "status"
        if spans is not None:
            spans.push_ended(span, reason, status)
        return (reason, f"HTTP {status}"), retry_after_ms(retry_after)


class SubscriptionStore(Protocol):
    """Where a node keeps its push subscriptions: `SubscriptionFile` on a
    standalone or Redis-backed node, the Raft group's replicated state on a
    cluster node (broker.cluster.records)."""

    def load(self) -> dict[str, Subscription]:
        ...

    async def save(self, subscriptions: dict[str, Subscription]) -> None:
        """Durable (and replicated) once it returns; raises Unavailable if not."""
        ...


class SubscriptionFile:
    """The node's push subscriptions, one JSON file replaced whole
    (written, fsync'ed, renamed: storage.fileutil.atomic_write), so a
    subscribe answered survives kill -9. The secret is in it: the data
    directory is the node's alone.

    Its format is FORMAT, a JSON list of subscriptions. A later format is
    a JSON object whose "version" is above FORMAT: `load` refuses it with
    NewerFormatError (docs/operations.md, "Upgrades and downgrades"), and
    nothing is written over it."""

    FORMAT = 1

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> dict[str, Subscription]:
        try:
            with open(self.path, "rb") as f:
                rows = orjson.loads(f.read())
        except FileNotFoundError:
            return {}
        if isinstance(rows, dict):
            version = rows.get("version")
            if isinstance(version, int) and version > self.FORMAT:
                raise NewerFormatError(self.path, version, self.FORMAT)
            raise CorruptionError(self.path, 0, f"not a list of subscriptions, nor a later format's object with "
                                                f"a version above {self.FORMAT}")
        return {row["topic"]: Subscription.from_stored(row) for row in rows}

    async def save(self, subscriptions: dict[str, Subscription]) -> None:
        data = orjson.dumps([s.stored() for s in subscriptions.values()])
        await asyncio.to_thread(atomic_write, self.path, data)


class Pushers:
    """The node's push subscriptions, and a TopicPusher for each while a
    backend serves here (`start`; `stop` when it no longer does)."""

    def __init__(self, clock: Clock, allow: PushAllow, store: SubscriptionStore | None,
                 max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS, *, limits: PushLimits | None = None,
                 descriptors: DescriptorBudget | None = None, spans: Spans | None = None,
                 pushes_here: Callable[[str], bool] = lambda topic: True) -> None:
        self.clock = clock
        self.allow = allow
        # Whether this process pushes a topic's subscription: on a node of
        # many shards one shard does, for the node (the shards' placement
        # of the topic's name), so that `concurrency` and `rateLimit` hold
        # for the node; every shard keeps every subscription all the same.
        self.pushes_here = pushes_here
        self.spans = spans  # handed to each TopicPusher (broker.observe.tracing); None: no spans
        # What a subscriber's answer may cost (--push-*), and the push
        # connections' part of the node's descriptor budget (broker.http.descriptors).
        self.limits = limits or PushLimits()
        self.descriptors = PushDescriptors(descriptors or DescriptorBudget(0), self.limits.max_fds)
        self._store = store
        self.max_subscriptions = max_subscriptions  # --max-subscriptions
        self.subscriptions: dict[str, Subscription] = store.load() if store is not None else {}
        self.stats: dict[str, PushStats] = {}
        self._running: dict[str, TopicPusher] = {}
        self._backend: Backend | None = None

    def __repr__(self) -> str:
        return f"Pushers(subscriptions={len(self.subscriptions)}, running={len(self._running)})"

    def describe(self, topic: str) -> dict[str, object] | None:
        """The subscription as getSubscription answers it (no secret), with its health; None: none."""
        subscription = self.subscriptions.get(topic)
        if subscription is None:
            return None
        stats = self.stats.get(topic)
        return {**subscription.public(), "health": None if stats is None else stats.public()}

    def public(self) -> list[dict[str, object]]:
        """`describe` of every subscription, by topic."""
        return [d for d in map(self.describe, sorted(self.subscriptions)) if d is not None]

    def start(self, backend: Backend) -> None:
        """Push every subscription through `backend`, as kept now (a cluster
        node that starts leading reads those the last leader replicated)."""
        self._backend = backend
        if self._store is not None:
            self.subscriptions = self._store.load()
        for subscription in self.subscriptions.values():
            self._launch(subscription)

    async def stop(self) -> None:
        self._backend = None
        running, self._running = self._running, {}
        await asyncio.gather(*(p.stop() for p in running.values()))

    def _launch(self, subscription: Subscription) -> None:
        if self._backend is None or not self.pushes_here(subscription.topic):
            return
        stats = self.stats.setdefault(subscription.topic, PushStats())
        pusher = TopicPusher(subscription, self._backend, self.clock, self.allow, stats, limits=self.limits,
                             descriptors=self.descriptors, spans=self.spans)
        self._running[subscription.topic] = pusher
        pusher.start()

    async def subscribe(self, subscription: Subscription) -> None:
        """Create or replace the topic's subscription; durable once it
        returns. LimitReached (429) if it would be one more than
        --max-subscriptions (a replacement is not one more)."""
        if subscription.topic not in self.subscriptions and len(self.subscriptions) >= self.max_subscriptions:
            raise LimitReached(f"the node has {len(self.subscriptions)} push subscriptions and --max-subscriptions "
                               f"is {self.max_subscriptions}: unsubscribe a topic first, or raise --max-subscriptions")
        subscriptions = {**self.subscriptions, subscription.topic: subscription}
        await self._save(subscriptions)
        old = self._running.pop(subscription.topic, None)
        if old is not None:
            await old.stop(nack_backoffs=True)
        self._launch(subscription)

    async def unsubscribe(self, topic: str) -> bool:
        """False: the topic had no subscription."""
        if topic not in self.subscriptions:
            return False
        await self._save({t: s for t, s in self.subscriptions.items() if t != topic})
        old = self._running.pop(topic, None)
        if old is not None:
            await old.stop(nack_backoffs=True)
        self.stats.pop(topic, None)
        return True

    async def _save(self, subscriptions: dict[str, Subscription]) -> None:
        if self._store is not None:
            await self._store.save(subscriptions)
        self.subscriptions = subscriptions


def push_families(stats: dict[str, PushStats], most_topics: int) -> list[Family]:
    """/metrics' push series: node-level sums over every subscription, and
    one label set each for at most `most_topics` subscribed topics
    (--metrics-topics; those with the most in flight and backing off, then
    the most failures, then deliveries, then by name): deliveries, failures
    by reason, in-flight and backing-off counts, and the latency from
    trigger time to the 2xx as a histogram. No URL or secret."""
    if not stats:
        return []
    shown = [(topic_labels(t), s) for t, s in sorted(heapq.nsmallest(max(0, most_topics), stats.items(),
                                                                     key=_busiest_first))]
    families = [
        Family("hourglass_push_subscriptions",
               "subscribed topics the node counts deliveries of (--max-subscriptions)", GAUGE,
               [Sample("hourglass_push_subscriptions", (), len(stats))]),
        Family("hourglass_push_topics_shown",
               "subscribed topics with push series of their own (--metrics-topics)", GAUGE,
               [Sample("hourglass_push_topics_shown", (), len(shown))]),
        Family("hourglass_node_push_deliveries_total", "", COUNTER,
               [Sample("hourglass_node_push_deliveries_total", (), sum(s.deliveries for s in stats.values()))]),
        Family("hourglass_node_push_failures_total", "", COUNTER,
               [Sample("hourglass_node_push_failures_total", (), sum(sum(s.failures.values()) for s in stats.values()))])]
    if not shown:
        return families
    name = "hourglass_push_latency_seconds"
    latencies = []
    for topic, s in shown:
        total = 0
        for upper, count in zip((*LATENCY_BUCKETS_MS, None), s.latency_ms):
            total += count
            le = "+Inf" if upper is None else f"{upper / 1000:g}"
            latencies.append(Sample(f"{name}_bucket", (*topic, ("le", le)), total))
        latencies += [Sample(f"{name}_sum", topic, s.latency_sum_ms / 1000), Sample(f"{name}_count", topic, s.deliveries)]
    return [*families,
            Family("hourglass_push_deliveries_total", "messages POSTed and answered 2xx", COUNTER,
                   [Sample("hourglass_push_deliveries_total", topic, s.deliveries) for topic, s in shown]),
            Family("hourglass_push_failures_total", "failed deliveries by reason", COUNTER,
                   [Sample("hourglass_push_failures_total", (*topic, ("reason", reason)), n) for topic, s in shown
                    for reason, n in sorted(s.failures.items())]),
            Family("hourglass_push_in_flight", "", GAUGE,
                   [Sample("hourglass_push_in_flight", topic, s.in_flight) for topic, s in shown]),
            Family("hourglass_push_backing_off", "", GAUGE,
                   [Sample("hourglass_push_backing_off", topic, s.backing_off) for topic, s in shown]),
            Family(name, "trigger time to the subscriber's 2xx", HISTOGRAM, latencies, "g")]


def _busiest_first(item: tuple[str, PushStats]) -> tuple[int, int, int, str]:
    topic, s = item
    return -(s.in_flight + s.backing_off), -sum(s.failures.values()), -s.deliveries, topic


def subscription_path(data_path: str) -> str:
    return os.path.join(data_path, "push-subscriptions.json")
