"""A topic's dedupWindowMillis (docs/api.md, "Deduplication window") on a
real disk Broker and Store with a FakeClock (tests/broker_harness.py),
set through broker.flow.keeper's TopicFlow: an ended id sent again within
the window answers the ended message unchanged and stores nothing; after
it, the id is stored anew (camellia's rule); the window slides (each send
it answers moves it on); a batch is judged per message; an end not yet
applied counts; ends before the window was set do not; the window holds
across a restart, with or without a checkpoint."""

from __future__ import annotations

import asyncio
import os

import pytest
from broker_harness import BrokerHarness

from broker.core.params import AckRequest, Defaults, DeleteRequest, NewSend, PullRequest
from broker.disk.ready import QueueLimits
from broker.flow.file import SettingsFile
from broker.flow.keeper import TopicFlow
from broker.flow.settings import TopicConfig
from storage.entry import MS_PER_HOUR, Message, Status
from storage.store import NewMessage

START_MS = 490_000 * MS_PER_HOUR + 1_000
TTL_MS = 10 * MS_PER_HOUR
LIMITS = QueueLimits(window=8, window_total=64, key_window=2)
WINDOW_MS = 10_000


@pytest.fixture
def h():
    harness = BrokerHarness("hourglass-dedup-", START_MS, LIMITS, Defaults())
    harness.open_broker()
    yield harness
    harness.teardown()


def _flow(h: BrokerHarness, window_ms: int = WINDOW_MS, topic: str = "t") -> TopicFlow:
    flow = TopicFlow(SettingsFile(os.path.join(h.directory, "topic-settings")), h.clock.now_ms, 100, 10)
    flow.start(h.broker)
    if window_ms != flow.get(topic).dedup_window_ms:
        h.run(flow.set_config(TopicConfig(topic, 0, "none", 0, window_ms)))
    return flow


def _send(h: BrokerHarness, *msg_ids: str, topic: str = "t", body: str = "x") -> list[Message]:
    now = h.clock.now_ms()
    batch = [NewSend(NewMessage(topic, msg_id, body, now, now, TTL_MS, 3), False) for msg_id in msg_ids]

    async def send():
        got = await h.broker.send(batch)
        await h.quiesce()
        return got
    return h.run(send())


def _pull(h: BrokerHarness, topic: str = "t") -> list[str]:
    async def pull():
        got = await h.broker.pull(PullRequest(topic, 60_000, 100, ()))
        await h.quiesce()
        return [m.msg_id for m in got]
    return h.run(pull())


def _ack(h: BrokerHarness, *msg_ids: str, topic: str = "t") -> None:
    async def ack():
        for msg_id in msg_ids:
            await h.broker.ack(AckRequest(topic, msg_id, True))
        await h.quiesce()
    h.run(ack())


def _consume(h: BrokerHarness, *msg_ids: str, topic: str = "t") -> None:
    """Send, pull and ack each: ended (4) at the clock's now."""
    _send(h, *msg_ids, topic=topic)
    assert sorted(_pull(h, topic)) == sorted(msg_ids)
    _ack(h, *msg_ids, topic=topic)


def _sends(h: BrokerHarness) -> int:
    return h.broker.metrics.topic("t").sends


def test_an_ended_id_sent_within_the_window_answers_the_ended_message_and_stores_nothing(h):
    _flow(h)
    _consume(h, "a")
    acked = h.store.get("t", "a")
    assert acked is not None and acked.status is Status.ACKED
    stored = _sends(h)
    h.clock.advance(WINDOW_MS - 1)
    [again] = _send(h, "a", body="another body")
    assert again == acked  # the ended message, unchanged
    assert h.store.get("t", "a") == acked
    assert _sends(h) == stored and _pull(h) == []


def test_an_ended_id_sent_once_the_window_has_passed_is_stored_anew(h):
    _flow(h)
    _consume(h, "a")
    h.clock.advance(WINDOW_MS)
    [again] = _send(h, "a", body="new")
    assert again.status is Status.READY and again.msg == "new"
    assert _pull(h) == ["a"]


def test_the_window_slides_an_id_sent_every_half_window_is_deduplicated_every_time(h):
    """nats-server#7302's case, the other way: a window that counts from the
    end only would store the id anew every other send."""
    _flow(h)
    _consume(h, "a")
    acked = h.store.get("t", "a")
    for _ in range(8):
        h.clock.advance(WINDOW_MS // 2)
        assert _send(h, "a") == [acked]
    assert _pull(h) == []
    h.restart()  # the last send's time is kept, not only the end's
    _flow(h)
    h.clock.advance(WINDOW_MS - 1)
    assert _send(h, "a") == [acked]
    h.clock.advance(WINDOW_MS)
    assert _send(h, "a")[0].status is Status.READY


@pytest.mark.parametrize("end", ["ack", "delete", "expire"])
def test_every_kind_of_end_is_in_the_window(h, end):
    _flow(h)
    if end == "ack":
        _consume(h, "a")
    elif end == "delete":
        _send(h, "a")
        h.run(h.broker.delete(DeleteRequest("t", "a", False)))
        h.run(h.quiesce())
    else:
        now = h.clock.now_ms()
        h.run(h.broker.send([NewSend(NewMessage("t", "a", "x", now, now + 1_000, 500, 3), False)]))
        h.advance_to(now + 1_500)  # its expiry: trigger time + ttl
    ended = h.store.get("t", "a")
    assert ended is not None and ended.status in (Status.ACKED, Status.DELETED, Status.EXPIRED)
    h.clock.advance(WINDOW_MS - 1)
    assert _send(h, "a") == [ended]


def test_a_batch_is_judged_per_message(h):
    _flow(h)
    _consume(h, "old")
    h.clock.advance(WINDOW_MS // 2)
    _consume(h, "recent")
    h.clock.advance(WINDOW_MS // 2 + 1)  # "old" ended a window and 1 ms ago, "recent" half a window
    recent = h.store.get("t", "recent")
    got = _send(h, "old", "recent", "new", "recent")
    assert [m.msg_id for m in got] == ["old", "recent", "new", "recent"]
    assert got[0].status is Status.READY and got[1] == recent and got[3] == recent
    assert got[2].status is Status.READY
    assert sorted(_pull(h)) == ["new", "old"]


def test_an_end_not_yet_applied_is_in_the_window(h):
    """An ack and a send of its id appended before one group commit."""
    _flow(h)
    _send(h, "a")
    assert _pull(h) == ["a"]

    async def ack_then_send():
        ack = h.broker.ack(AckRequest("t", "a", True))
        now = h.clock.now_ms()
        send = h.broker.send([NewSend(NewMessage("t", "a", "again", now, now, TTL_MS, 3), False)])
        _, got = await asyncio.gather(ack, send)
        await h.quiesce()
        return got
    [got] = h.run(ack_then_send())
    assert got.status is Status.ACKED and got.msg == "x"


def test_topics_without_a_window_and_ends_before_it_keep_camellias_rule(h):
    _consume(h, "before")  # ended before the topic had a window
    _flow(h)
    _consume(h, "b", topic="other")  # a topic without one
    h.clock.advance(1)
    assert _send(h, "before")[0].status is Status.READY
    assert _send(h, "b", topic="other")[0].status is Status.READY


def test_a_window_set_back_to_zero_stores_ended_ids_anew(h):
    flow = _flow(h)
    _consume(h, "a")
    h.run(flow.set_config(TopicConfig("t", 0, "none", 0, 0)))
    h.clock.advance(1)
    assert _send(h, "a")[0].status is Status.READY


@pytest.mark.parametrize("checkpoint", [False, True])
def test_the_window_holds_across_a_restart(h, checkpoint):
    _flow(h)
    _consume(h, "a")
    acked = h.store.get("t", "a")
    h.restart(checkpoint=checkpoint)
    _flow(h)  # the settings file read again, the window set on the new broker
    h.clock.advance(WINDOW_MS - 1)
    assert _send(h, "a") == [acked]
    h.clock.advance(WINDOW_MS)
    assert _send(h, "a")[0].status is Status.READY
