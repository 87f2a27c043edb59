"""broker.redis_backend.RedisBroker against a real redis-server (one per
test session, on a free loopback port, no persistence; each test flushes
it). Drives the broker directly, with the real clock and short delays."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from broker.clock import SystemClock  # noqa: E402
from broker.metrics import Metrics  # noqa: E402
from broker.params import AckRequest, Defaults, DeleteRequest, LongPollRequest, PullRequest  # noqa: E402
from broker.redis_backend import RedisBroker, RedisConfig  # noqa: E402
from broker.service import NotFound  # noqa: E402
from storage.entry import Status  # noqa: E402
from storage.errors import InvalidRequest  # noqa: E402
from storage.store import NewMessage  # noqa: E402

TOPIC = "orders"


def run(redis_url: str, scenario, brokers: int = 1, config: RedisConfig | None = None):
    """Flush the database, start `brokers` RedisBrokers on it, run
    `scenario(*brokers)`, stop them."""
    async def main():
        started = [RedisBroker.from_url(redis_url, SystemClock(), Defaults(), Metrics(), config)
                   for _ in range(brokers)]
        await started[0].redis.flushdb()
        for b in started:
            await b.start()
        try:
            return await scenario(*started)
        finally:
            for b in started:
                await b.stop()
    return asyncio.run(main())


def new(msg_id: str, *, delay_ms: int = 0, ttl_ms: int = 60_000, max_retry: int = 3, priority: int = 0,
        tag: str = "", now_ms: int | None = None, body: str = "body", topic: str = TOPIC) -> NewMessage:
    now_ms = SystemClock().now_ms() if now_ms is None else now_ms
    return NewMessage(topic, msg_id, body, now_ms, now_ms + delay_ms, ttl_ms, max_retry, priority, tag)


def pulling(batch: int = 10, ack_timeout_ms: int = 30_000, tags: tuple[str, ...] = ()) -> PullRequest:
    return PullRequest(TOPIC, ack_timeout_ms, batch, tags)


async def wait_for_status(broker: RedisBroker, msg_id: str, status: Status, within_s: float = 3.0):
    deadline = time.monotonic() + within_s
    while True:
        message = await broker.get(TOPIC, msg_id)
        if message.status is status or time.monotonic() > deadline:
            return message
        await asyncio.sleep(0.02)


def test_send_get_and_duplicate_id_returns_the_stored_message(redis_url):
    async def scenario(b: RedisBroker):
        first, = await b.send([new("a", delay_ms=120_000, body="one", priority=5, tag="t")])
        assert (first.msg_id, first.msg, first.status, first.retry, first.priority, first.tag) == \
            ("a", "one", Status.WAITING, 0, 5, "t")
        again, = await b.send([new("a", delay_ms=0, body="two")])
        assert again == first
        assert await b.get(TOPIC, "a") == first
        with pytest.raises(NotFound):
            await b.get(TOPIC, "nope")
        info = await b.topic_info(TOPIC)
        assert info["waitingQueueSize"] == 1 and info["waitingQueueInfo"]["sizeOf1minTo10min"] == 1
        assert b.topic_list() == [TOPIC]
        with pytest.raises(NotFound):
            await b.topic_info("unknown")
        assert await b.pull(PullRequest("never-sent", 1000, 10, ())) == []
    run(redis_url, scenario)


def test_pull_order_is_priority_then_trigger_and_tags_filter(redis_url):
    async def scenario(b: RedisBroker):
        now = SystemClock().now_ms()
        await b.send([new("late", now_ms=now - 10), new("early", now_ms=now - 20), new("high", now_ms=now, priority=9),
                      new("low", now_ms=now - 30, priority=-1), new("tagged", now_ms=now - 40, tag="x")])
        assert [m.msg_id for m in await b.pull(pulling(tags=("x",)))] == ["tagged"]
        taken = await b.pull(pulling())
        assert [m.msg_id for m in taken] == ["high", "early", "late", "low"]
        assert all(m.status is Status.CONSUMING for m in taken)
        assert await b.pull(pulling()) == []
    run(redis_url, scenario)


def test_ack_and_its_edges(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("a"), new("w", delay_ms=60_000)])
        await b.pull(pulling())
        await b.ack(AckRequest(TOPIC, "a", True))
        await b.ack(AckRequest(TOPIC, "a", True))  # repeated: fine
        assert (await b.get(TOPIC, "a")).status is Status.ACKED
        with pytest.raises(InvalidRequest):
            await b.ack(AckRequest(TOPIC, "w", True))  # waiting
        with pytest.raises(NotFound):
            await b.ack(AckRequest(TOPIC, "nope", True))
        info = await b.topic_info(TOPIC)
        assert (info["readyQueueSize"], info["ackQueueSize"]) == (0, 0)
    run(redis_url, scenario)


def test_nack_requeues_with_retry_and_ends_after_max_retry(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("a", max_retry=1)])
        first, = await b.pull(pulling())
        assert first.retry == 0
        await b.ack(AckRequest(TOPIC, "a", False))
        await b.ack(AckRequest(TOPIC, "a", False))  # of a READY message: no-op
        second, = await b.pull(pulling())
        assert (second.retry, second.status) == (1, Status.CONSUMING)
        await b.ack(AckRequest(TOPIC, "a", False))
        assert (await b.get(TOPIC, "a")).status is Status.ENDED
        assert await b.pull(pulling()) == []
    run(redis_url, scenario)


def test_ack_timeout_redelivers_with_retry_then_ends(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("a", max_retry=1)])
        m, = await b.pull(pulling(ack_timeout_ms=100))
        assert m.retry == 0
        again = await wait_for_status(b, "a", Status.READY)
        assert again.retry == 1
        m, = await b.pull(pulling(ack_timeout_ms=100))
        assert m.retry == 1
        ended = await wait_for_status(b, "a", Status.ENDED)
        assert (ended.status, ended.retry) == (Status.ENDED, 1)
    run(redis_url, scenario)


def test_ttl_expiry_ends_as_5_when_never_delivered_and_6_after(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("one", ttl_ms=150), new("two", ttl_ms=150)])
        taken, = await b.pull(pulling(batch=1))
        await b.ack(AckRequest(TOPIC, taken.msg_id, False))  # READY again, retry 1
        never = "two" if taken.msg_id == "one" else "one"
        assert (await wait_for_status(b, never, Status.EXPIRED)).status is Status.EXPIRED
        assert (await wait_for_status(b, taken.msg_id, Status.ENDED)).status is Status.ENDED
        assert await b.pull(pulling()) == []
        # due after its expiry already: expired at the move
        now = SystemClock().now_ms()
        await b.send([NewMessage(TOPIC, "dead", "x", now - 1000, now - 500, 100, 3)])
        assert (await b.get(TOPIC, "dead")).status is Status.EXPIRED
    run(redis_url, scenario)


def test_delete_and_release(redis_url):
    async def scenario(b: RedisBroker):
        await b.send([new("w", delay_ms=60_000), new("r"), new("c")])
        await b.pull(pulling(batch=1))  # takes "c" or "r": both trigger now; ids break the tie
        for msg_id in ("w", "r", "c"):
            await b.delete(DeleteRequest(TOPIC, msg_id, False))
            assert (await b.get(TOPIC, msg_id)).status is Status.DELETED
        info = await b.topic_info(TOPIC)
        assert (info["waitingQueueSize"], info["readyQueueSize"], info["ackQueueSize"]) == (0, 0, 0)
        await b.delete(DeleteRequest(TOPIC, "w", True))
        with pytest.raises(NotFound):
            await b.get(TOPIC, "w")
        with pytest.raises(NotFound):
            await b.delete(DeleteRequest(TOPIC, "w", False))
        again, = await b.send([new("w", body="new")])  # the id is free again
        assert (again.msg, again.status) == ("new", Status.READY)
    run(redis_url, scenario)


def test_delayed_message_becomes_ready_on_time_and_wakes_a_long_poll(redis_url):
    async def scenario(b: RedisBroker):
        poll = asyncio.create_task(b.long_poll(LongPollRequest(TOPIC, 30_000, 10, (), 5_000)))
        await asyncio.sleep(0.05)
        sent, = await b.send([new("a", delay_ms=300)])
        got = await asyncio.wait_for(poll, 5)
        assert [m.msg_id for m in got] == ["a"]  # before the poll's 5 s timeout
        assert SystemClock().now_ms() >= sent.trigger_ms
        empty = await b.long_poll(LongPollRequest(TOPIC, 30_000, 10, (), 100))
        assert empty == []
    run(redis_url, scenario)


def test_long_poll_on_one_broker_is_woken_by_another(redis_url):
    async def scenario(a: RedisBroker, b: RedisBroker):
        poll = asyncio.create_task(a.long_poll(LongPollRequest(TOPIC, 30_000, 1, (), 5_000)))
        await asyncio.sleep(0.05)
        await b.send([new("x")])
        got = await asyncio.wait_for(poll, 5)
        assert [m.msg_id for m in got] == ["x"]  # before the poll's 5 s timeout
    run(redis_url, scenario, brokers=2)


def test_two_brokers_on_one_redis_never_deliver_a_message_twice(redis_url):
    count = 300

    async def scenario(a: RedisBroker, b: RedisBroker):
        now = SystemClock().now_ms()
        await a.send([new(f"m{i}", now_ms=now, delay_ms=(i % 30) * 10) for i in range(count)])
        seen: list[str] = []

        async def consume(broker: RedisBroker):
            while len(seen) < count:
                got = await broker.long_poll(LongPollRequest(TOPIC, 30_000, 7, (), 200))
                for m in got:
                    seen.append(m.msg_id)
                    await broker.ack(AckRequest(TOPIC, m.msg_id, True))

        await asyncio.wait_for(asyncio.gather(*(consume(x) for x in (a, b, a, b))), 20)
        assert sorted(seen) == sorted(f"m{i}" for i in range(count))
    run(redis_url, scenario, brokers=2, config=RedisConfig(poll_ms=50))
