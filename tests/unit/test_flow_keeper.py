"""broker.flow.keeper's TopicFlow on a real disk Broker and Store, with a
FakeClock (tests/broker_harness.py): a paused serial key while one of its
messages is in flight, a paused key with more messages than its share of
the window, a shift in several whole calls, and a pause kept across a
restart of the broker on the same directory."""

from __future__ import annotations

import os

import pytest
from broker_harness import BrokerHarness

import broker.flow.keeper as keeper
from broker.core.params import AckRequest, Defaults, NewSend, PullRequest
from broker.disk.ready import QueueLimits
from broker.flow.file import SettingsFile
from broker.flow.keeper import TopicFlow
from broker.flow.settings import OnResume, PauseRequest
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage

START_MS = 490_000 * MS_PER_HOUR + 1_000
TTL_MS = MS_PER_HOUR
LIMITS = QueueLimits(window=8, window_total=64, key_window=2)


@pytest.fixture
def h():
    harness = BrokerHarness("hourglass-flow-", START_MS, LIMITS, Defaults())
    harness.open_broker()
    yield harness
    harness.teardown()


def _flow(h: BrokerHarness) -> TopicFlow:
    flow = TopicFlow(SettingsFile(os.path.join(h.directory, "topic-settings")), h.clock.now_ms, 100, 10)
    flow.start(h.broker)
    return flow


def _send(h: BrokerHarness, *specs: tuple[str, str, int]) -> None:
    """(msgId, key, delay ms) each."""
    now = h.clock.now_ms()
    batch = [NewSend(NewMessage("t", msg_id, "x", now, now + delay, TTL_MS, 3, 0, key=key), False)
             for msg_id, key, delay in specs]

    async def send():
        await h.broker.send(batch)
        await h.quiesce()
    h.run(send())


def _pull(h: BrokerHarness, batch: int = 100) -> list[str]:
    async def pull():
        got = await h.broker.pull(PullRequest("t", 60_000, batch, ()))
        await h.quiesce()
        return [m.msg_id for m in got]
    return h.run(pull())


def _ack(h: BrokerHarness, *msg_ids: str) -> None:
    async def ack():
        for msg_id in msg_ids:
            await h.broker.ack(AckRequest("t", msg_id, True))
        await h.quiesce()
    h.run(ack())


def _call(h: BrokerHarness, coro):
    async def call():
        result = await coro
        await h.quiesce()
        return result
    return h.run(call())


def test_a_key_paused_while_one_of_its_messages_is_in_flight_stays_paused_after_its_ack(h):
    flow = _flow(h)
    _send(h, ("a1", "a", 0), ("a2", "a", 0), ("b1", "b", 0))
    assert sorted(_pull(h)) == ["a1", "b1"]
    _call(h, flow.pause(PauseRequest("t", "a", None)))
    _ack(h, "a1", "b1")
    assert _pull(h) == []  # a1's ack frees the key's flight, not its pause
    _call(h, flow.resume(PauseRequest("t", "a", None)))
    assert _pull(h) == ["a2"]


def test_a_paused_key_beyond_its_window_share_comes_back_whole(h):
    """More of the key than key_window and the window: parked, the rest left
    on disk; after resume every one is handed out, one at a time."""
    flow = _flow(h)
    _call(h, flow.pause(PauseRequest("t", "hot", None)))
    _send(h, *[(f"h{i:02}", "hot", 0) for i in range(20)], ("c", "cold", 0))
    assert _pull(h) == ["c"]
    _call(h, flow.resume(PauseRequest("t", "hot", None)))
    got = []
    for _ in range(40):
        pulled = _pull(h)
        assert len(pulled) <= 1  # serial
        got += pulled
        _ack(h, *pulled)
    assert got == [f"h{i:02}" for i in range(20)]


def test_a_shift_moves_each_message_that_fell_due_once_in_whole_calls(h, monkeypatch):
    monkeypatch.setattr(keeper, "RESUME_SLICE", 7)
    flow = _flow(h)
    _call(h, flow.pause(PauseRequest("t", None, OnResume.SHIFT)))
    paused_at = h.clock.now_ms()
    _send(h, *[(f"m{i:02}", "", 1000 + i) for i in range(30)], ("late", "", 60_000))
    h.advance_to(paused_at + 10_000)
    assert _pull(h) == []
    _call(h, flow.resume(PauseRequest("t", None, None)))
    assert flow.moved == 30
    for i in range(30):
        m = h.store.get("t", f"m{i:02}")
        assert m is not None and m.status is Status.WAITING
        assert m.trigger_ms == paused_at + 1000 + i + 10_000
    assert h.store.get("t", "late").trigger_ms == paused_at + 60_000
    assert _pull(h) == []
    h.advance_to(paused_at + 11_000 + 29)
    got: list[str] = []
    while pulled := _pull(h):
        got += pulled
    assert sorted(got) == [f"m{i:02}" for i in range(30)]


def test_a_pause_is_kept_across_a_restart(h):
    flow = _flow(h)
    _call(h, flow.pause(PauseRequest("t", None, None)))
    _call(h, flow.pause(PauseRequest("t", "k", OnResume.SHIFT)))
    _send(h, ("m", "", 0), ("k1", "k", 0))
    h.restart()
    again = _flow(h)
    assert again.get("t").paused_json() is True and set(again.get("t").keys) == {"k"}
    assert again.get("t").keys["k"].on_resume is OnResume.SHIFT
    assert _pull(h) == []
    _call(h, again.resume(PauseRequest("t", None, None)))
    assert _pull(h) == ["m"]
    _call(h, again.resume(PauseRequest("t", "k", OnResume.HOLD)))
    assert _pull(h) == ["k1"]
    assert again.settings == {}


def test_an_expire_cut_short_ends_the_rest_when_asked_again(h, monkeypatch):
    """onResume=expire in whole calls of RESUME_SLICE: a resume cut short
    after two calls (a crash) leaves the topic paused with its resume time
    kept; after a restart, resuming again ends the rest of [pausedAt, R),
    each message once, and nothing else (one due before the pause, one due
    after R)."""
    monkeypatch.setattr(keeper, "RESUME_SLICE", 7)
    flow = _flow(h)
    _send(h, ("before", "", 0))
    h.advance_to(h.clock.now_ms() + 10)
    _call(h, flow.pause(PauseRequest("t", None, OnResume.EXPIRE)))
    paused_at = h.clock.now_ms()
    _send(h, *[(f"m{i:02}", "", 1000 + i) for i in range(30)], ("late", "", 60_000))
    h.advance_to(paused_at + 10_000)
    calls = 0
    real = h.broker.expire_paused

    async def crashing(topic, flt, limit):
        nonlocal calls
        calls += 1
        if calls > 2:
            raise OSError("killed")
        return await real(topic, flt, limit)

    monkeypatch.setattr(h.broker, "expire_paused", crashing)
    with pytest.raises(OSError, match="killed"):
        _call(h, flow.resume(PauseRequest("t", None, None)))
    assert flow.expired == 14
    kept = flow.get("t").pause
    assert kept is not None and kept.resume_ms == paused_at + 10_000
    h.restart()
    again = _flow(h)
    assert _pull(h) == []  # still paused
    h.advance_to(paused_at + 20_000)
    _call(h, again.resume(PauseRequest("t", None, None)))
    assert again.expired == 16
    for i in range(30):
        m = h.store.get("t", f"m{i:02}")
        assert m is not None and m.status is Status.EXPIRED and m.end_reason == "paused", m
    assert h.store.get("t", "late").status is Status.WAITING
    assert _pull(h) == ["before"]
    assert h.store.get("t", "before").end_reason == ""


def test_topic_settings_are_carried_out_again_after_a_restart(h):
    """releaseRate (this shard's share of it), fairness and maxDueAgeMillis
    are kept in the settings and set on the broker again when it starts."""
    from broker.flow.settings import TopicConfig

    flow = _flow(h)
    flow.shares = 2
    _call(h, flow.set_config(TopicConfig("t", 100, "fairKey", 5000, 0)))
    _send(h, ("m", "", 0))
    queue = h.broker.topics["t"]
    assert queue.rate is not None and queue.rate.per_s == 50 and queue.fair and queue.max_due_age_ms == 5000
    h.restart()
    again = TopicFlow(SettingsFile(os.path.join(h.directory, "topic-settings")), h.clock.now_ms, 100, 10, 2)
    again.start(h.broker)
    _send(h, ("n", "", 0))
    queue = h.broker.topics["t"]
    assert queue.rate is not None and queue.rate.per_s == 50 and queue.fair and queue.max_due_age_ms == 5000
    _call(h, again.set_config(TopicConfig("t", 0, "none", 0, 0)))
    assert queue.rate is None and not queue.fair and queue.max_due_age_ms == 0 and queue.by_due == []
    assert again.settings == {}
