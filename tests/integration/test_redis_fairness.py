"""fairness=fairKey on the Redis backend (docs/redis.md, "Fairness on
Redis"), on a real redis-server: pulls in batches hand the due messages
out round-robin over their fairKeys (the groups in the order of their
names, the messages without one the group ""), each group's own messages
by priority, the turn carried from one pull to the next; nothing lost or
handed out twice; turned on with messages already READY (they are indexed
then), and off again (the plain order, the index dropped). A topic without
fairness writes no index."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from broker.clock import SystemClock
from broker.core.params import Defaults, PullRequest
from broker.flow.settings import TopicSettings
from broker.observe.metrics import Metrics
from broker.redis.backend import RedisBroker
from storage.store import NewMessage

FAIR = {"t": TopicSettings("t", fairness="fairKey")}
sends = st.lists(st.tuples(st.sampled_from(["", "A", "B", "b,c"]), st.integers(0, 2)), min_size=1, max_size=30)
batches = st.lists(st.integers(1, 7), min_size=1, max_size=12)


def model_order(messages: list[tuple[str, str, int]], batch_sizes: list[int]) -> list[list[str]]:
    """The pulls' ids by the rule: the next group (by name) after the one
    served last, wrapping, gives its best (-priority, msgId)."""
    left = list(messages)
    turn: str | None = None
    out = []
    for size in batch_sizes:
        got = []
        while len(got) < size and left:
            groups = sorted({g for _, g, _ in left})
            after = [g for g in groups if turn is None or g > turn]
            turn = after[0] if after else groups[0]
            best = min((m for m in left if m[1] == turn), key=lambda m: (-m[2], m[0]))
            left.remove(best)
            got.append(best[0])
        out.append(got)
    return out


async def started(redis_url: str) -> RedisBroker:
    broker = RedisBroker.from_url(redis_url, SystemClock(), Defaults(), Metrics())
    await broker.redis.flushdb()
    await broker.start()
    return broker


@settings(max_examples=25, deadline=None)
@given(sends, batches, st.booleans())
def test_pulls_take_turns_over_the_fair_keys(redis_url, specs, sizes, on_before):
    """on_before False: the messages are READY before fairness is turned
    on, and indexed by that change."""
    messages = [(f"m{i:02}", group, priority) for i, (group, priority) in enumerate(specs)]

    async def main() -> None:
        broker = await started(redis_url)
        try:
            if on_before:
                await broker.topic_settings.save(FAIR)
            now_ms = SystemClock().now_ms()
            await broker.send([NewMessage("t", msg_id, "x", now_ms, now_ms - 1000, 600_000, 3, priority,
                                          fair_key=group) for msg_id, group, priority in messages])
            if not on_before:
                await broker.topic_settings.save(FAIR)
            pulled = [[m.msg_id for m in await broker.pull(PullRequest("t", 30_000, size, ()))] for size in sizes]
            assert pulled == model_order(messages, sizes)
            rest = [m.msg_id for m in await broker.pull(PullRequest("t", 30_000, len(messages), ()))]
            everything = [i for got in pulled for i in got] + rest
            assert sorted(everything) == [m[0] for m in messages]  # none lost, none twice
            assert await broker.redis.zcard(broker._link.keys("t").fair) == 0
        finally:
            await broker.stop()
    asyncio.run(main())


def test_fairness_turned_off_again_pulls_by_the_plain_order_and_drops_the_index(redis_url):
    async def main() -> None:
        broker = await started(redis_url)
        keys = broker._link.keys("t")
        try:
            now_ms = SystemClock().now_ms()
            await broker.send([NewMessage("t", f"a{i}", "x", now_ms, now_ms - 1000, 600_000, 3, fair_key="A")
                               for i in range(4)] +
                              [NewMessage("t", "b0", "x", now_ms, now_ms - 1000, 600_000, 3, fair_key="B")])
            assert await broker.redis.exists(keys.fair) == 0  # no fairness: no index written
            await broker.topic_settings.save(FAIR)
            assert await broker.redis.zcard(keys.fair) == 5
            assert [m.msg_id for m in await broker.pull(PullRequest("t", 30_000, 2, ()))] == ["a0", "b0"]
            await broker.topic_settings.save({})
            assert await broker.redis.exists(keys.fair) == 0
            await broker.send([NewMessage("t", "b1", "x", now_ms, now_ms - 1000, 600_000, 3, fair_key="B")])
            assert await broker.redis.exists(keys.fair) == 0
            assert [m.msg_id for m in await broker.pull(PullRequest("t", 30_000, 10, ()))] == ["a1", "a2", "a3", "b1"]
        finally:
            await broker.stop()
    asyncio.run(main())


def test_the_turn_survives_another_settings_change(redis_url):
    """A change of the topic's other settings keeps fairness's turn."""
    async def main() -> None:
        broker = await started(redis_url)
        try:
            await broker.topic_settings.save(FAIR)
            now_ms = SystemClock().now_ms()
            await broker.send([NewMessage("t", f"{g}{i}", "x", now_ms, now_ms - 1000, 600_000, 3, fair_key=g)
                               for g in "AB" for i in range(2)])
            assert [m.msg_id for m in await broker.pull(PullRequest("t", 30_000, 1, ()))] == ["A0"]
            await broker.topic_settings.save({"t": TopicSettings("t", fairness="fairKey", max_due_age_ms=3_600_000)})
            assert [m.msg_id for m in await broker.pull(PullRequest("t", 30_000, 3, ()))] == ["B0", "A1", "B1"]
        finally:
            await broker.stop()
    asyncio.run(main())
