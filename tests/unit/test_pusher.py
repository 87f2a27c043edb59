"""broker.push.rules and broker.push.pusher without a network: --push-allow,
signatures, the backoff, and a TopicPusher on a FakeClock over a fake
backend whose POSTs are scripted (the real subscriber process is
tests/conformance/test_conformance_push.py's)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac

import pytest
from fakes import FakeClock

from broker.core.params import AckRequest, Defaults, LongPollRequest
from broker.push import rules as push_rules
from broker.push.pusher import PushStats, TopicPusher
from broker.push.rules import PushAllow, Subscription, backoff_ms, parse_subscribe, retry_after_ms, signature
from storage.entry import Location, Message, Status
from storage.errors import ConfigError, Forbidden, InvalidRequest, NotFound


def test_push_allow_entries():
    allow = PushAllow.parse(["hooks.example.com", "api.example.com:8443", "10.0.0.0/8", "127.0.0.1:9000",
                             "[::1]:80", "fd00::/8"])
    assert allow.allows_name("HOOKS.example.com.", 1) and not allow.allows_name("evil.example.com", 80)
    assert allow.allows_name("api.example.com", 8443) and not allow.allows_name("api.example.com", 443)
    assert allow.allows_address("10.1.2.3", 80) and not allow.allows_address("11.0.0.1", 80)
    assert allow.allows_address("127.0.0.1", 9000) and not allow.allows_address("127.0.0.1", 9001)
    assert allow.allows_address("::1", 80) and allow.allows_address("fd12::1", 1)
    assert allow.allows_address("::ffff:10.0.0.1", 80)  # v4-mapped is its v4 address
    assert not PushAllow.parse([]) and not PushAllow.parse([" "])
    for bad in ("10.0.0.0/33", "host:99999", "a b", "x:y"):
        with pytest.raises(ConfigError):
            PushAllow.parse([bad])


def test_subscribe_is_forbidden_without_push_allow_and_for_addresses_it_does_not_name():
    with pytest.raises(Forbidden, match="--push-allow"):
        parse_subscribe({"topic": "t", "url": "http://127.0.0.1/x"}, PushAllow())
    with pytest.raises(Forbidden, match="--push-allow"):
        parse_subscribe({"topic": "t", "url": "http://169.254.169.254/x"}, PushAllow.parse(["10.0.0.0/8"]))
    s = parse_subscribe({"topic": "t", "url": "https://hooks.example.com/x", "secret": "k"},
                        PushAllow.parse(["10.0.0.0/8"]))  # a name: checked at connect time
    assert (s.concurrency, s.rate_limit, s.timeout_ms, s.max_body_bytes) == (8, 0, 10_000, 65536)
    assert "k" not in repr(s).replace("hooks", "") and "secret" not in s.public()
    for bad in ({"url": "file:///etc/passwd"}, {"url": "http:///x"}, {"url": "http://h/x", "timeoutMillis": 0},
                {"url": "http://h/x", "rateLimit": -1}, {"url": "http://h/x", "maxBodyBytes": "x"}):
        with pytest.raises(InvalidRequest):
            parse_subscribe({"topic": "t", **bad}, PushAllow.parse(["h"]))


def test_signature_is_hmac_sha256_of_timestamp_dot_body():
    expected = hmac.new(b"key", b"1700000000000.{\"a\":1}", hashlib.sha256).hexdigest()
    assert signature("key", 1_700_000_000_000, b'{"a":1}') == "sha256=" + expected


def test_backoff_doubles_from_one_second_up_to_the_cap_jittered_down_to_half():
    assert [backoff_ms(n, None, 1.0) for n in (1, 2, 3, 4)] == [1000, 2000, 4000, 8000]
    assert backoff_ms(1, None, 0.5) == 500 and backoff_ms(2, None, 0.0) == 1000  # jitter floored at half
    assert backoff_ms(40, None, 1.0) == push_rules.BACKOFF_CAP_MS
    assert backoff_ms(1, 7000, 0.5) == 7000  # Retry-After wins, as given
    assert backoff_ms(1, 10 * push_rules.BACKOFF_CAP_MS, 1.0) == push_rules.BACKOFF_CAP_MS
    assert retry_after_ms("3") == 3000 and retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert retry_after_ms(None) is None


class FakeBackend:
    """Just what a TopicPusher calls: long_poll takes READY messages (retry+1,
    as a pull does), ack removes, retry_at puts back at the retry time (or
    ends after maxRetry), reschedule is recorded."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.defaults = Defaults()
        self.ready: list[Message] = []
        self.acks: list[tuple[str, bool, int]] = []
        self.batch_acks: list[int] = []  # the size of each ack_many
        self.ended: list[str] = []
        self.retried: list[tuple[str, int, int]] = []  # (msgId, retry time, when asked)
        self.rescheduled: list[tuple[str, int]] = []  # (msgId, trigger time)
        self.requeue = False  # a nack puts the message back READY
        self._taken: dict[str, Message] = {}
        self._arrived = asyncio.Event()

    def add(self, msg_id: str) -> None:
        self.ready.append(Message("t", msg_id, "m", 0, self.clock.now_ms(), 3_600_000, 10, 0, "", Status.READY, 0,
                                  Location(0, 0)))
        self._arrived.set()

    async def long_poll(self, request: LongPollRequest, gone: object = None) -> list[Message]:
        if not self.ready:
            self._arrived.clear()
            try:
                await self.clock.wait_for(self._arrived.wait(), request.long_polling_timeout_ms / 1000)
            except TimeoutError:
                return []
        taken, self.ready = self.ready[:request.batch], self.ready[request.batch:]
        for m in taken:
            self._taken[m.msg_id] = m
        return [m._replace(retry=m.retry + 1, status=Status.CONSUMING) for m in taken]

    async def ack(self, request: AckRequest) -> None:
        self.acks.append((request.msg_id, request.ack, self.clock.now_ms()))
        m = self._taken.pop(request.msg_id)
        if not request.ack and self.requeue:
            self.ready.append(m._replace(retry=m.retry + 1))
            self._arrived.set()

    async def retry_at(self, topic: str, msg_id: str, at_ms: int) -> Status | None:
        m = self._taken.pop(msg_id, None)
        if m is None:
            return None
        self.retried.append((msg_id, at_ms, self.clock.now_ms()))
        if m.retry + 1 > m.max_retry:
            self.ended.append(msg_id)
            return Status.ENDED

        def due() -> None:
            if self.requeue:
                self.ready.append(m._replace(retry=m.retry + 1))
                self._arrived.set()
        self.clock.call_later((at_ms - self.clock.now_ms()) / 1000, due)
        return Status.WAITING

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        self.rescheduled.append((msg_id, trigger_ms))
        raise NotFound("not kept by this fake")

    async def ack_many(self, topic: str, msg_ids: list[str], ack: bool = True) -> list[Status | None]:
        self.batch_acks.append(len(msg_ids))
        for msg_id in msg_ids:
            await self.ack(AckRequest(topic, msg_id, ack))
        return [Status.ACKED if ack else None for _ in msg_ids]


class Scripted(TopicPusher):
    """A TopicPusher whose POSTs answer from `outcomes` (None: 2xx), each
    held until `release` is set when it is given."""

    def __init__(self, backend: FakeBackend, subscription: Subscription, outcomes: list | None = None) -> None:
        super().__init__(subscription, backend, backend.clock, PushAllow.parse(["h"]), PushStats(),
                         jitter=lambda: 1.0)
        self.backend = backend
        self.outcomes = outcomes or []
        self.posts: list[tuple[str, int, int]] = []  # (msgId, time, retry)
        self.concurrent = self.most_concurrent = 0
        self.release: asyncio.Event | None = None

    def start(self) -> None:  # no HTTP client: _post is scripted
        self._start_tasks()

    async def _post(self, message: Message) -> tuple[tuple[str, str] | None, int | None]:
        self.posts.append((message.msg_id, self._clock.now_ms(), message.retry))
        self.concurrent += 1
        self.most_concurrent = max(self.most_concurrent, self.concurrent)
        try:
            if self.release is not None:
                await self.release.wait()
            outcome = self.outcomes.pop(0) if self.outcomes else None
        finally:
            self.concurrent -= 1
        if outcome is None:
            return None, None
        return ("status", "HTTP 500"), outcome if isinstance(outcome, int) else None


def run(test):
    asyncio.run(test())


def test_failed_deliveries_wait_their_retry_time_out_of_flight():
    async def test() -> None:
        clock = FakeClock(1_000_000)
        backend = FakeBackend(clock)
        pusher = Scripted(backend, Subscription("t", "http://h/x"), outcomes=["fail", "fail", None])
        backend.add("a")
        backend.requeue = True
        pusher.start()
        await clock.run_until(1_000_500)
        # a failed delivery is filed for its retry at once (a nack with a delay): nothing in flight meanwhile
        assert backend.retried == [("a", 1_001_000, 1_000_000)]
        assert (pusher.stats.in_flight, pusher.stats.backing_off) == (0, 1)
        await clock.run_until(1_010_000)
        await pusher.stop()
        # delivery 1 at once, fails: due again 1 s later; delivery 2 fails: 2 s later; delivery 3 acked
        assert backend.retried == [("a", 1_001_000, 1_000_000), ("a", 1_003_000, 1_001_000)]
        assert backend.acks == [("a", True, 1_003_000)]
        assert pusher.posts == [("a", 1_000_000, 1), ("a", 1_001_000, 2), ("a", 1_003_000, 3)]
        assert pusher.stats.backing_off == 0
        assert pusher.stats.failures == {"status": 2} and pusher.stats.deliveries == 1
    run(test)


def test_retry_after_sets_the_wait():
    async def test() -> None:
        clock = FakeClock(0)
        backend = FakeBackend(clock)
        pusher = Scripted(backend, Subscription("t", "http://h/x"), outcomes=[7000])
        backend.add("a")
        pusher.start()
        await clock.run_until(20_000)
        await pusher.stop()
        assert backend.retried[0] == ("a", 7000, 0)
    run(test)


def test_concurrency_bounds_the_posts_in_flight():
    async def test() -> None:
        clock = FakeClock(0)
        backend = FakeBackend(clock)
        pusher = Scripted(backend, Subscription("t", "http://h/x", concurrency=3))
        pusher.release = asyncio.Event()
        for i in range(10):
            backend.add(str(i))
        pusher.start()
        await clock.run_until(100)
        assert pusher.concurrent == 3 and len(backend.ready) == 7  # the rest stay READY, not taken
        pusher.release.set()
        await clock.run_until(5000)
        await pusher.stop()
        assert pusher.most_concurrent == 3 and len({a[0] for a in backend.acks}) == 10
    run(test)


def test_rate_limit_bounds_deliveries_per_second():
    async def test() -> None:
        clock = FakeClock(0)
        backend = FakeBackend(clock)
        pusher = Scripted(backend, Subscription("t", "http://h/x", concurrency=64, rate_limit=20))
        for i in range(100):
            backend.add(str(i))
        pusher.start()
        await clock.run_until(999)
        first_second = len(pusher.posts)
        await clock.run_until(10_000)
        await pusher.stop()
        assert first_second <= 20 + 1  # the rate, plus a burst of a twentieth of it
        assert len(pusher.posts) == 100
        for i in range(len(pusher.posts) - 21):  # no second holds more than rate + burst
            assert pusher.posts[i + 21][1] - pusher.posts[i][1] >= 1000
    run(test)


def test_a_changed_subscription_makes_what_backs_off_due_now_and_a_stopping_node_does_not():
    async def test() -> None:
        for nack_backoffs, expected in ((True, [("a", 100)]), (False, [])):
            clock = FakeClock(0)
            backend = FakeBackend(clock)
            pusher = Scripted(backend, Subscription("t", "http://h/x"), outcomes=[7000])
            backend.add("a")
            pusher.start()
            await clock.run_until(100)
            assert pusher.stats.backing_off == 1
            await pusher.stop(nack_backoffs=nack_backoffs)
            await clock.run_until(20_000)
            assert backend.rescheduled == expected  # else WAITING until its retry time: delivered again then
    run(test)


def test_deliveries_answered_together_are_acked_in_one_batch_and_each_once():
    async def test() -> None:
        clock = FakeClock(0)
        backend = FakeBackend(clock)
        pusher = Scripted(backend, Subscription("t", "http://h/x", concurrency=50))
        pusher.release = asyncio.Event()
        for i in range(50):
            backend.add(str(i))
        pusher.start()
        await clock.run_until(100)
        assert pusher.concurrent == 50 and backend.acks == []
        pusher.release.set()  # every POST answers 2xx in the same moment
        await clock.run_until(200)
        await pusher.stop()
        assert sorted(a[0] for a in backend.acks) == sorted(str(i) for i in range(50))
        assert all(a[1] for a in backend.acks) and len(backend.batch_acks) < 5
        assert pusher.stats.deliveries == 50
    run(test)
