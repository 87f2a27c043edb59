"""The topic settings kept in Redis (broker.redis.flow) on a real
redis-server: any sequence of settings saved through one node's store
reads back the same through another node's (`read`, `read_topic`),
topics cleared leave no hash and no index entry behind; and a key paused
through the store parks its READY messages until it is resumed."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from broker.clock import SystemClock
from broker.core.params import Defaults, PullRequest
from broker.flow.settings import OnResume, Pause, TopicSettings
from broker.observe.metrics import Metrics
from broker.redis.backend import RedisBroker
from broker.redis.flow import fields, settings_of
from storage.store import NewMessage

names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=12)
pauses = st.builds(Pause, st.integers(0, 2**50), st.sampled_from(list(OnResume)),
                   st.one_of(st.none(), st.integers(0, 2**50)))
topics = st.builds(TopicSettings, st.sampled_from(["a", "b", "c{x}", "d:e"]), st.integers(0, 10**6),
                   st.sampled_from(["none", "fairKey"]), st.integers(0, 10**9), st.integers(0, 10**9),
                   st.one_of(st.none(), pauses), st.dictionaries(names, pauses, max_size=4))
states = st.lists(topics, max_size=4, unique_by=lambda s: s.topic).map(
    lambda found: {s.topic: s for s in found if not s.is_default})


@settings(max_examples=200, deadline=None)
@given(topics)
def test_a_topic_s_settings_round_trip_through_its_hash(kept):
    assert settings_of(kept.topic, fields(kept)) == (None if kept.is_default else kept)
    assert ("paused" in fields(kept)) == (kept.pause is not None)


def brokers(redis_url: str, count: int = 2) -> list[RedisBroker]:
    return [RedisBroker.from_url(redis_url, SystemClock(), Defaults(), Metrics()) for _ in range(count)]


@settings(max_examples=30, deadline=None)
@given(st.lists(states, min_size=1, max_size=4))
def test_settings_saved_by_one_node_read_the_same_on_another(redis_url, sequence):
    async def main() -> None:
        one, other = brokers(redis_url)
        await one.redis.flushdb()
        try:
            for kept in sequence:
                await one.topic_settings.save(kept)
                assert await other.topic_settings.read() == kept
                for topic in ("a", "b", "c{x}", "d:e"):
                    assert await other.topic_settings.read_topic(topic) == kept.get(topic)
            await one.topic_settings.save({})
            assert await one.redis.smembers(one.topic_settings.index_key) == set()
            assert [k for k in await one.redis.keys("hg:*") if k.endswith(":flow")] == []
        finally:
            for b in (one, other):
                await b.redis.aclose()
    asyncio.run(main())


def test_a_paused_key_s_messages_stay_parked_until_it_is_resumed(redis_url):
    async def main() -> None:
        [broker] = brokers(redis_url, 1)
        await broker.redis.flushdb()
        await broker.start()
        try:
            now_ms = SystemClock().now_ms()
            await broker.send([NewMessage("t", f"k{i}", "x", now_ms, now_ms, 60_000, 3, 0, "", key="k")
                               for i in range(3)] + [NewMessage("t", "free", "x", now_ms, now_ms, 60_000, 3, 0, "")])
            store = broker.topic_settings
            await store.save({"t": TopicSettings("t", keys={"k": Pause(1)})})
            pulled = await broker.pull(PullRequest("t", 30_000, 10, ()))
            assert [m.msg_id for m in pulled] == ["free"]
            await store.save({})
            pulled = await broker.pull(PullRequest("t", 30_000, 10, ()))
            assert [m.msg_id for m in pulled] == ["k0"]  # one at a time: the key is serial
        finally:
            await broker.stop()
    asyncio.run(main())
