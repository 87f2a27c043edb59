"""broker.redis.rmq.RmqTopic against a real redis-server (the session's,
flushed by each test; a password-protected one and a Redis Cluster node
started by the tests that need them), on a FakeClock. The helpers come
from test_redis_dyno.py."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from hypothesis import given, settings
from hypothesis import strategies as st
from test_redis_dyno import (
    T0,
    FakeClock,
    check_password,
    check_unreachable_fails_fast,
    cluster_node,
    run_with,
    strict_scripts,
)

import broker.redis.rmq as redis_rmq
from broker.redis.rmq import Kind, Outcome, RmqConfig, RmqMessage, RmqSizes, RmqTopic, Sent, TopicMismatch
from broker.redis.shards import WrongTypeKey
from storage.errors import InvalidRequest

TOPIC = "prices"


def run(redis_url: str, scenario, kind: Kind, config: RmqConfig | None = None, clock=None, topics: int = 1):
    config = config or RmqConfig(slots=1, ack_timeout_ms=1000)
    return run_with(redis_url, lambda url: RmqTopic.connect(url, TOPIC, kind, config, clock), scenario, topics)


async def pop_ids(t: RmqTopic, count: int = 100) -> list[str]:
    return [m.body for m in await t.pop(count=count)]


# == configuration and sending ===============================================

def test_config_and_arguments_are_validated_with_a_sentence(redis_url):
    with pytest.raises(ValueError, match="slots must be a power of 2 from 1 to 16384, got 6"):
        RmqConfig(slots=6)
    with pytest.raises(ValueError, match="max_retries must be at least 0"):
        RmqConfig(max_retries=-1)
    with pytest.raises(ValueError, match="ack_timeout_ms must be at least 1"):
        RmqConfig(ack_timeout_ms=0)

    async def scenario(t: RmqTopic):
        for call, parameter in ((t.send_range_merge("x", 0), "range_ms"), (t.send_priority("x", 5), "kind"),
                                (t.send_range_merge(3, 10), "body"), (t.ack("nope"), "id"), (t.nack("9-" + "0" * 32), "id"),
                                (t.pop(count=0), "count"), (t.dead(limit=0), "limit")):
            with pytest.raises(InvalidRequest) as caught:
                await call
            assert caught.value.parameter == parameter
        assert await t.sizes() == RmqSizes(0, 0, 0)
    run(redis_url, scenario, Kind.RANGE_MERGE, clock=FakeClock())


def test_a_topic_keeps_its_kind_and_slot_count(redis_url):
    async def scenario(t: RmqTopic):
        assert repr(t) == "RmqTopic(topic='prices', kind=PRIORITY, slots=1, next_pop_slot=0)"
        for kind, config in ((Kind.RANGE_MERGE, RmqConfig(slots=1)), (Kind.PRIORITY, RmqConfig(slots=2))):
            with pytest.raises(TopicMismatch, match=r"is defined as 'priority 1' .*, not '"):
                await RmqTopic.connect(redis_url, TOPIC, kind, config)
        async with await RmqTopic.connect(redis_url, TOPIC, Kind.PRIORITY, RmqConfig(slots=1)) as same:
            assert await same.sizes() == RmqSizes(0, 0, 0)
    run(redis_url, scenario, Kind.PRIORITY)


def test_range_merge_keeps_the_first_due_time_while_pending(redis_url):
    clock = FakeClock()

    async def scenario(t: RmqTopic):
        first = await t.send_range_merge("item-42", range_ms=2000)
        assert first.merged is False and first.id.startswith("0-")
        clock.advance(500)
        assert await t.send_range_merge("item-42", range_ms=2000) == Sent(first.id, merged=True)
        await t.send_range_merge("v1", range_ms=100, key="item-7")
        assert (await t.send_range_merge("v2", range_ms=5000, key="item-7")).merged
        assert await t.sizes() == RmqSizes(2, 0, 0)
        clock.advance(99)
        assert await t.pop() == []
        clock.advance(1)  # item-7 due at T0 + 500 + 100: its first time, the last body
        assert [(m.key, m.body, m.retries) for m in await t.pop(count=10)] == [("item-7", "v2", 0)]
        clock.advance(1400)  # item-42 due at T0 + 2000
        got, = await t.pop(count=10)
        assert got == RmqMessage(first.id, "item-42", "item-42", 0, 0)
        # being consumed: a duplicate now is a new message
        again = await t.send_range_merge("item-42", range_ms=10)
        assert again.merged is False and again.id != first.id
        assert await t.sizes() == RmqSizes(1, 2, 0)
    run(redis_url, scenario, Kind.RANGE_MERGE, clock=clock)


def test_priority_pops_highest_first_and_a_merge_takes_the_last_priority(redis_url):
    clock = FakeClock()

    async def scenario(t: RmqTopic):
        for body, priority in (("p20", 20), ("p50", 50), ("low", -5), ("p30", 30), ("p0", 0)):
            await t.send_priority(body, priority)
        assert (await t.send_priority("low", 40)).merged  # same content: merged, priority 40 now
        assert await pop_ids(t, 2) == ["p50", "low"]
        assert await pop_ids(t) == ["p30", "p20", "p0"]
    run(redis_url, scenario, Kind.PRIORITY, clock=clock)


def test_fixed_time_delivers_at_the_time_and_a_merge_takes_the_last_time(redis_url):
    clock = FakeClock()

    async def scenario(t: RmqTopic):
        await t.send_fixed_time("x", T0 + 300)
        await t.send_fixed_time("y", T0 + 100)
        assert (await t.send_fixed_time("x", T0 + 50)).merged
        await t.send_fixed_time("past", T0 - 10_000)  # due at once
        assert await pop_ids(t) == ["past"]
        clock.advance(50)
        assert await pop_ids(t) == ["x"]
        clock.advance(49)
        assert await pop_ids(t) == []
        clock.advance(1)
        assert await pop_ids(t) == ["y"]
    run(redis_url, scenario, Kind.FIXED_TIME, clock=clock)


# == consuming, retries and the dead queue ===================================

def test_sixteen_retries_then_the_dead_queue_then_redrive(redis_url):
    clock = FakeClock()

    async def scenario(t: RmqTopic):
        sent = await t.send_fixed_time("job", T0)
        for retries in range(17):
            m, = await t.pop()
            assert (m.id, m.retries) == (sent.id, retries)
            clock.advance(1)
            assert await t.nack(m.id) is (Outcome.RETRY if retries < 16 else Outcome.DEAD)
        assert await t.pop() == [] and await t.sizes() == RmqSizes(0, 0, 1)
        assert await t.dead() == [RmqMessage(sent.id, "job", "job", 17, 0, died_ms=T0 + 17)]
        assert await t.nack(sent.id) is Outcome.GONE
        assert await t.redrive() == 1 and await t.redrive() == 0
        m, = await t.pop()
        assert (m.id, m.retries) == (sent.id, 0)
        assert await t.ack(m.id) is True and await t.ack(m.id) is False
        assert await t.sizes() == RmqSizes(0, 0, 0)
        assert await t.redis.keys("*") == [t._definition_key]  # nothing left behind
    run(redis_url, scenario, Kind.FIXED_TIME, clock=clock)


def test_ack_timeouts_count_as_failures_and_redrive_takes_chosen_ids(redis_url):
    clock = FakeClock()

    async def scenario(t: RmqTopic):
        for body, priority in (("a", 3), ("b", 2), ("c", 1)):
            await t.send_priority(body, priority)
        for _ in range(3):  # max_retries 2: three deliveries, then dead
            assert await pop_ids(t) == ["a", "b", "c"]
            assert await t.process_timeouts() == 0
            clock.advance(1000)  # the ack deadline
            assert await t.process_timeouts() == 3
        assert await t.sizes() == RmqSizes(0, 0, 3)
        dead = await t.dead()
        assert {m.body for m in dead} == {"a", "b", "c"} and {m.retries for m in dead} == {3}
        assert [m.body for m in await t.dead(limit=2)] == [m.body for m in dead][:2]
        by_body = {m.body: m.id for m in dead}
        assert await t.redrive([by_body["c"], by_body["a"], f"0-{'f' * 32}"]) == 2
        assert await t.redrive([]) == 0
        got = await t.pop(count=5)
        assert [(m.body, m.retries) for m in got] == [("a", 0), ("c", 0)]  # at their priority again
        assert [m.body for m in await t.dead()] == ["b"]
    run(redis_url, scenario, Kind.PRIORITY, clock=clock,
        config=RmqConfig(slots=1, max_retries=2, ack_timeout_ms=1000, script_batch=2))


def test_a_retried_message_waits_retry_delay_and_merges_into_a_newer_pending_one(redis_url):
    clock = FakeClock()

    async def scenario(t: RmqTopic):
        await t.send_range_merge("v1", range_ms=1, key="k")
        clock.advance(1)
        m, = await t.pop()
        assert await t.nack(m.id) is Outcome.RETRY
        clock.advance(499)
        assert await t.pop() == []
        clock.advance(1)  # retry_delay_ms after the failure
        m, = await t.pop()
        assert m.retries == 1
        newer = await t.send_range_merge("v2", range_ms=1, key="k")  # pending while m is consumed
        assert await t.nack(m.id) is Outcome.MERGED
        assert await t.sizes() == RmqSizes(1, 0, 0)
        clock.advance(1)
        assert await t.pop() == [RmqMessage(newer.id, "k", "v2", 0, t.slot_of("k"))]
    run(redis_url, scenario, Kind.RANGE_MERGE, clock=clock, config=RmqConfig(slots=4, retry_delay_ms=500))


def test_messages_spread_over_slots_by_key_and_pop_visits_them_round_robin(redis_url):
    clock = FakeClock()

    async def scenario(t: RmqTopic):
        keys = [f"item-{i}" for i in range(40)]
        for key in keys:
            sent = await t.send_range_merge(key, range_ms=1)
            assert sent.id.startswith(f"{t.slot_of(key)}-")
        assert len({t.slot_of(k) for k in keys}) == 8
        clock.advance(1)
        first = await t.pop()
        second = await t.pop()
        assert (first[0].slot, second[0].slot) == (0, 1)
        rest = await t.pop(count=100)
        assert sorted(m.key for m in first + second + rest) == sorted(keys)
        assert all(m.slot == t.slot_of(m.key) for m in rest)
    run(redis_url, scenario, Kind.RANGE_MERGE, clock=clock, config=RmqConfig(slots=8))


def test_two_consumers_never_pop_the_same_message(redis_url):
    count = 300

    async def scenario(a: RmqTopic, b: RmqTopic):
        for i in range(count):
            await (a if i % 2 else b).send_priority(f"m{i}", i % 17)
        seen: list[str] = []

        async def consume(t: RmqTopic):
            while got := await t.pop(count=5):
                seen.extend(m.body for m in got)

        await asyncio.wait_for(asyncio.gather(*(consume(t) for t in (a, b) * 4)), 20)
        assert len(seen) == count and set(seen) == {f"m{i}" for i in range(count)}
        assert await a.sizes() == RmqSizes(0, count, 0)
    run(redis_url, scenario, Kind.PRIORITY, config=RmqConfig(slots=4), topics=2)


@settings(max_examples=30, deadline=None)
@given(sends=st.lists(st.tuples(st.sampled_from("abcd"), st.text(max_size=2), st.integers(-3, 3)), max_size=12))
def test_pending_messages_are_one_per_key_with_the_last_body_and_priority(redis_url, sends):
    async def scenario(t: RmqTopic):
        last: dict[str, tuple[str, int]] = {}
        for key, body, priority in sends:
            sent = await t.send_priority(body, priority, key=key)
            assert sent.merged is (key in last)
            last[key] = (body, priority)
        assert await t.sizes() == RmqSizes(len(last), 0, 0)
        got = await t.pop(count=20)
        assert sorted((m.key, m.body) for m in got) == sorted((k, body) for k, (body, _) in last.items())
        assert [last[m.key][1] for m in got] == sorted((p for _, p in last.values()), reverse=True)
    run(redis_url, scenario, Kind.PRIORITY, clock=FakeClock())


# == failures ================================================================

def test_a_key_of_the_wrong_type_is_a_named_error(redis_url):
    async def scenario(t: RmqTopic):
        slot = t.slot_of("x")
        await t.redis.lpush(t._shards[slot].pending, "a list")
        with pytest.raises(WrongTypeKey, match=r"hg:rmq:\{prices:\d\}:pending holds a list, not a hash") as caught:
            await t.send_range_merge("x", range_ms=5)
        assert caught.value.keys == {t._shards[slot].pending: "list"}
        await t.redis.delete(t._definition_key)
        await t.redis.hset(t._definition_key, "a", "b")
        with pytest.raises(WrongTypeKey, match="holds a hash, not a string"):
            await t.define()
    run(redis_url, scenario, Kind.RANGE_MERGE, config=RmqConfig(slots=2))


def test_a_redis_that_is_down_or_silent_fails_within_a_bounded_time():
    async def connect(url, connect_timeout_ms, retries):
        config = RmqConfig(connect_timeout_ms=connect_timeout_ms, command_timeout_ms=connect_timeout_ms,
                           retries=retries)
        await (await RmqTopic.connect(url, TOPIC, Kind.PRIORITY, config)).aclose()
    check_unreachable_fails_fast(connect)


def test_a_wrong_password_is_a_named_error(tmp_path):
    async def connect(url):
        async with await RmqTopic.connect(url, TOPIC, Kind.PRIORITY) as t:
            await t.send_priority("x", 1)
    check_password(tmp_path, connect)


def test_every_script_stays_in_its_slot_on_a_redis_cluster_node(tmp_path, monkeypatch):
    strict_scripts(monkeypatch, redis_rmq)
    clock = FakeClock()
    with cluster_node(tmp_path) as url:
        async def scenario(t: RmqTopic):
            for i in range(8):
                await t.send_fixed_time(f"m{i}", T0)
            assert (await t.send_fixed_time("m0", T0 + 5)).merged
            popped = await t.pop(count=8)
            assert len(popped) == 7
            assert await t.ack(popped[0].id) and await t.nack(popped[1].id) is Outcome.DEAD
            clock.advance(1000)
            assert await t.process_timeouts() == 5
            assert len(await t.dead()) == 6 and await t.redrive([popped[1].id]) == 1 and await t.redrive() == 5
            clock.advance(5)
            assert len(await t.pop(count=10)) == 7
        run(url, scenario, Kind.FIXED_TIME, clock=clock, config=RmqConfig(slots=4, max_retries=0, ack_timeout_ms=1000))
