"""The topic settings kept in Redis (broker.redis.flow) on a real
redis-server: any sequence of settings saved through one node's store
reads back the same through another node's (`read`, `read_topic`),
topics cleared leave no hash and no index entry behind; a key paused
through the store parks its READY messages until it is resumed, also
once freed while paused; maxDueAgeMillis's order, with and without
tags; and a
shift or expire resume cut short on one node (its calls failing after
the first slice) is finished by another's, each message once."""

from __future__ import annotations

import asyncio
import dataclasses

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


# One change of one topic, made by node 0 or 1: (node, topic, key or None for the topic's own
# settings, the new pause of that key or topic (None: resumed), a release rate for the topic's own)
changes = st.tuples(st.integers(0, 1), st.sampled_from(["a", "c{x}"]), st.one_of(st.none(), st.sampled_from(["k", "l:m", "n"])),
                    st.one_of(st.none(), pauses), st.integers(0, 3))


@settings(max_examples=40, deadline=None)
@given(st.lists(changes, min_size=1, max_size=12))
def test_changes_made_by_either_node_read_the_same_on_both(redis_url, sequence):
    """Each change written as the fields it changes (broker.redis.flow's
    CHANGE mode), each node reading the topic first as the keeper does:
    both nodes then read what the changes made, whichever node made each,
    and a topic back at its defaults leaves no hash behind."""
    from broker.flow.settings import entry_changes

    async def main() -> None:
        nodes = brokers(redis_url)
        await nodes[0].redis.flushdb()
        model: dict[str, TopicSettings] = {}
        try:
            for who, topic, key, pause, rate in sequence:
                store = nodes[who].topic_settings
                current = await store.read_topic(topic) or TopicSettings(topic)
                assert current == model.get(topic, TopicSettings(topic))
                changed = current.with_pause(key, pause)
                if key is None:
                    changed = dataclasses.replace(changed, release_rate=rate)
                new = dict(store.load())
                if changed.is_default:
                    new.pop(topic, None)
                    model.pop(topic, None)
                else:
                    new[topic] = model[topic] = changed
                await store.save(new, entry_changes(changed, key))
                for node in nodes:
                    assert await node.topic_settings.read() == model
                    for name in ("a", "c{x}"):
                        assert await node.topic_settings.read_topic(name) == model.get(name)
            flows = [k for k in await nodes[0].redis.keys("hg:*") if k.endswith(":flow")]
            assert len(flows) == len(model), flows
        finally:
            for b in nodes:
                await b.redis.aclose()
    asyncio.run(main())


def test_a_read_of_many_topics_in_slices_reads_them_all(redis_url, monkeypatch):
    from broker.redis import flow

    monkeypatch.setattr(flow, "READ_SLICE", 2)
    kept = {f"t{i}": TopicSettings(f"t{i}", release_rate=i + 1) for i in range(5)}

    async def main() -> None:
        one, other = brokers(redis_url)
        await one.redis.flushdb()
        try:
            await one.topic_settings.save(kept)
            assert await other.topic_settings.read() == kept
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


@pytest.mark.parametrize("freed_by", ["ack", "nack", "delete", "retry_at"])
def test_a_paused_key_freed_while_paused_keeps_its_next_message_parked(redis_url, freed_by):
    """A key consuming when paused, then freed (its message acked, nacked,
    deleted, or filed for a push retry): none of its messages becomes
    pullable until the key is resumed."""
    from broker.core.params import AckRequest, DeleteRequest

    async def main() -> None:
        [broker] = brokers(redis_url, 1)
        await broker.redis.flushdb()
        await broker.start()
        try:
            now_ms = SystemClock().now_ms()
            await broker.send([NewMessage("t", f"k{i}", "x", now_ms, now_ms, 60_000, 3, 0, "", key="k")
                               for i in range(2)])
            assert [m.msg_id for m in await broker.pull(PullRequest("t", 30_000, 10, ()))] == ["k0"]
            store = broker.topic_settings
            await store.save({"t": TopicSettings("t", keys={"k": Pause(now_ms)})})
            if freed_by in ("ack", "nack"):
                await broker.ack(AckRequest("t", "k0", freed_by == "ack"))
            elif freed_by == "delete":
                await broker.delete(DeleteRequest("t", "k0", False))
            else:
                await broker.retry_at("t", "k0", now_ms + 60_000)
            assert await broker.pull(PullRequest("t", 30_000, 10, ())) == []
            assert await broker.redis.zrange(broker._link.keys("t").ready, 0, -1) == []
            await store.save({})
            pulled = [m.msg_id for m in await broker.pull(PullRequest("t", 30_000, 10, ()))]
            assert pulled == (["k0"] if freed_by == "nack" else ["k1"])  # (a nack's k0 is READY again, and first)
        finally:
            await broker.stop()
    asyncio.run(main())


@pytest.mark.parametrize("tags", [(), ("x",), ("x", "y")])
def test_max_due_age_takes_the_oldest_overdue_message_before_priority(redis_url, tags):
    """maxDueAgeMillis 1000: of messages due 5 s and 3 s ago at priority 0
    and due now at priority 9 (tagged x and y alike), a pull takes the
    oldest overdue first, then the other overdue one, then priority order;
    without the cap, priority order."""
    async def main() -> None:
        [broker] = brokers(redis_url, 1)
        await broker.redis.flushdb()
        await broker.start()
        try:
            now_ms = SystemClock().now_ms()
            for topic, cap_ms in (("capped", 1_000), ("plain", 0)):
                broker.set_flow(topic, False, 0, cap_ms)
                await broker.send([
                    NewMessage(topic, "new", "x", now_ms, now_ms, 60_000, 3, 9, "y"),
                    NewMessage(topic, "old3", "x", now_ms, now_ms - 3_000, 60_000, 3, 0, "y"),
                    NewMessage(topic, "old5", "x", now_ms, now_ms - 5_000, 60_000, 3, 0, "x"),
                    NewMessage(topic, "new-x", "x", now_ms, now_ms, 60_000, 3, 9, "x")])
            expected = {(): (["old5", "old3", "new", "new-x"], ["new", "new-x", "old5", "old3"]),
                        ("x",): (["old5", "new-x"], ["new-x", "old5"]),
                        ("x", "y"): (["old5", "old3", "new", "new-x"], ["new", "new-x", "old5", "old3"])}[tags]
            for topic, order in zip(("capped", "plain"), expected):
                got = [(await broker.pull(PullRequest(topic, 30_000, 1, tags)) or [None])[0] for _ in order]
                assert [m.msg_id for m in got if m is not None] == order, topic
        finally:
            await broker.stop()
    asyncio.run(main())


@pytest.mark.parametrize("policy", [OnResume.SHIFT, OnResume.EXPIRE])
def test_a_resume_cut_short_on_one_node_is_finished_by_another_each_message_once(redis_url, monkeypatch, policy):
    """A shift (or expire) resume whose node fails after its first slice
    leaves the topic paused with the resume's time kept in Redis; another
    node's resume moves (or ends) the rest by the same length, none twice."""
    from broker.flow import keeper
    from broker.flow.keeper import TopicFlow
    from broker.flow.settings import PauseRequest
    from storage.entry import Status
    from storage.errors import Unavailable

    monkeypatch.setattr(keeper, "RESUME_SLICE", 3)

    async def main() -> None:
        one, other = brokers(redis_url)
        await one.redis.flushdb()
        for b in (one, other):
            await b.start()
        try:
            now_ms = SystemClock().now_ms()
            since_ms, resume_ms = now_ms - 60_000, now_ms - 1_000
            first = TopicFlow(one.topic_settings, SystemClock().now_ms, 100, shared=one.topic_settings)
            calls = 0

            async def crashing(*args: object) -> tuple[int, bool]:
                nonlocal calls
                calls += 1
                if calls > 1:
                    raise Unavailable("the node died")
                if policy is OnResume.SHIFT:
                    return await one.reschedule_msgs(*args)
                return await one.expire_paused(*args)

            monkeypatch.setattr(one, "reschedule_msgs" if policy is OnResume.SHIFT else "expire_paused", crashing)
            first.start(one)
            await first.pause(PauseRequest("t", None, policy, at_ms=since_ms))
            triggers = {f"m{i}": since_ms + 1_000 * (i + 1) for i in range(10)}
            await one.send([NewMessage("t", msg_id, "x", since_ms, trigger, 600_000, 3, 0, "")
                            for msg_id, trigger in triggers.items()])
            with pytest.raises(Unavailable):
                await first.resume(PauseRequest("t", None, None, at_ms=resume_ms))
            assert calls == 2
            kept = await other.topic_settings.read_topic("t")
            assert kept is not None and kept.pause == Pause(since_ms, policy, resume_ms)
            assert await other.pull(PullRequest("t", 30_000, 10, ())) == []  # still paused

            await other.topic_settings.read()
            second = TopicFlow(other.topic_settings, SystemClock().now_ms, 100, shared=other.topic_settings)
            second.start(other)
            assert (await second.resume(PauseRequest("t", None, None, at_ms=now_ms + 5_000))).pause is None
            for msg_id, trigger in triggers.items():
                m = await other.get("t", msg_id)
                if policy is OnResume.SHIFT:
                    assert m.trigger_ms == trigger + (resume_ms - since_ms), m
                    assert m.status in (Status.WAITING, Status.READY), m
                else:
                    assert m.status is Status.EXPIRED and m.end_reason == "paused", m
            assert first.moved + second.moved + first.expired + second.expired == len(triggers)
        finally:
            for b in (one, other):
                await b.stop()
    asyncio.run(main())
