"""Leases (docs/api.md, "Leases") on broker.disk.backend.Broker over a real
Store and a FakeClock (tests/broker_harness.py): a message extended every
10 s with a 30 s ack timeout stays with its holder for 6 hours and is
never delivered again meanwhile; a stale delivery is refused and changes
nothing, before and after a restart (with and without a checkpoint); the
lease's bound; an extension survives a restart; extensions to sooner
and later deadlines, in any order, time a message out at its last
deadline to the millisecond (the timer re-armed when it fires), also
through the timers' compaction."""

from __future__ import annotations

import contextlib

import pytest
from broker_harness import TOPIC, BrokerHarness
from broker_harness import BrokerNode as Node
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.leases import new_delivery
from broker.core.params import Defaults, Fenced
from broker.core.transitions import Refusal
from broker.disk.ready import QueueLimits
from storage.entry import MS_PER_HOUR, Status

START_MS = 490_000 * MS_PER_HOUR + 1_000
ACK_TIMEOUT_MS = 30_000
LEASE_MS = 12 * MS_PER_HOUR
TTL_MS = 24 * MS_PER_HOUR  # (longer than any lease here: a timeout redelivers, never ends)
CONSUMING, READY, ACKED = Status.CONSUMING, Status.READY, Status.ACKED


@contextlib.contextmanager
def _node(limits: QueueLimits | None = None):
    h = BrokerHarness("hourglass-leases-", START_MS, limits or QueueLimits(), Defaults(max_lease_ms=LEASE_MS))
    h.open_broker()
    try:
        yield Node(h)
    finally:
        h.teardown()


@pytest.fixture
def node():
    with _node() as n:
        yield n


def test_a_message_extended_every_10_s_stays_consuming_for_6_hours_then_times_out(node):
    node.send("a", ttl_ms=TTL_MS)
    (got,) = node.pull()
    assert got.delivery and got.status is CONSUMING and got.retry == 1
    for _ in range(6 * 360):  # 6 h of extensions, 10 s apart
        node.advance(10_000)
        (outcome,) = node.fenced(Fenced.EXTEND, ("a",), (got.delivery,))
        assert outcome.refusal is None and outcome.deadline_ms == node.now + ACK_TIMEOUT_MS
    assert node.pull() == [] and node.state("a") == (CONSUMING, 1)  # 0 redeliveries
    node.advance(ACK_TIMEOUT_MS - 1)
    assert node.pull() == [] and node.state("a") == (CONSUMING, 1)  # not before its deadline
    node.advance(1)  # the holder stopped extending: delivered again at its deadline, under a new delivery
    (again,) = node.pull()
    assert again.retry == 2 and again.delivery != got.delivery


def test_a_stale_delivery_is_refused_and_the_current_holder_goes_on(node):
    node.send("a", ttl_ms=TTL_MS)
    (first,) = node.pull(ack_timeout_ms=1_000)
    node.advance(1_000)
    (second,) = node.pull()
    for kind in (Fenced.ACK, Fenced.NACK, Fenced.EXTEND):
        (outcome,) = node.fenced(kind, ("a",), (first.delivery,))
        assert (outcome.status, outcome.refusal) == (CONSUMING, Refusal.STALE)
        assert node.state("a") == (CONSUMING, 2)
    (outcome,) = node.fenced(Fenced.ACK, ("a",), (second.delivery,))
    assert (outcome.status, outcome.refusal) == (ACKED, None)
    (outcome,) = node.fenced(Fenced.ACK, ("a",), (second.delivery,))  # a retried ack: no delivery is current
    assert (outcome.status, outcome.refusal) == (ACKED, Refusal.STALE)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_the_holders_delivery_and_its_extension_survive_a_restart(node, checkpoint):
    node.send("a", ttl_ms=TTL_MS)
    (got,) = node.pull()
    node.advance(20_000)
    node.fenced(Fenced.EXTEND, ("a",), (got.delivery,), ack_timeout_ms=25_000)
    node.h.restart(checkpoint)
    (outcome,) = node.fenced(Fenced.EXTEND, ("a",), (new_delivery(node.now),))
    assert outcome.refusal is Refusal.STALE  # a made-up delivery is no holder's
    node.advance(24_999)  # the extended deadline (within the default timeout after the restart) kept
    assert node.state("a") == (CONSUMING, 1)
    (outcome,) = node.fenced(Fenced.EXTEND, ("a",), (got.delivery,))
    assert outcome.refusal is None  # the holder's delivery is still its own after the restart
    (outcome,) = node.fenced(Fenced.ACK, ("a",), (got.delivery,))
    assert (outcome.status, outcome.refusal) == (ACKED, None)


def test_an_extension_past_the_lease_bound_is_refused_and_changes_nothing(node):
    node.send("a", ttl_ms=TTL_MS)
    (got,) = node.pull()
    for _ in range(int(LEASE_MS / 20_000) - 2):
        node.advance(20_000)
        (outcome,) = node.fenced(Fenced.EXTEND, ("a",), (got.delivery,))
        assert outcome.refusal is None
    node.advance(20_000)  # now + 30 s passes the 12 h since the hand-over
    (outcome,) = node.fenced(Fenced.EXTEND, ("a",), (got.delivery,))
    assert (outcome.status, outcome.refusal) == (CONSUMING, Refusal.LEASE_CAP)
    assert node.state("a") == (CONSUMING, 1)


def test_many_ids_each_answered_alone_and_counted(node):
    for msg_id in "abc":
        node.send(msg_id, ttl_ms=TTL_MS)
    got = {m.msg_id: m.delivery for m in node.pull()}
    outcomes = node.fenced(Fenced.EXTEND, ("a", "b", "c", "nope", "a"),
                           (got["a"], got["b"] + 1, got["c"], got["a"], got["b"]))
    assert [(o.status, o.refusal) for o in outcomes] == [
        (CONSUMING, None), (CONSUMING, Refusal.STALE), (CONSUMING, None), (None, Refusal.STALE),
        (CONSUMING, None)]  # a repeated id: its first delivery's outcome
    assert node.h.broker.metrics.topic(TOPIC).extensions == 2
    assert node.h.broker.metrics.topic(TOPIC).stale == 2


def _statuses(node: Node, msg_ids) -> dict[str, Status]:
    return {msg_id: node.state(msg_id)[0] for msg_id in msg_ids}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 60_000), st.integers(0, 20_000)), max_size=12))
def test_extensions_sooner_and_later_time_out_at_the_last_deadline(steps):
    with _node() as node:
        _extend_and_time_out(node, steps)


def _extend_and_time_out(node: Node, steps) -> None:
    for msg_id in "abc":
        node.send(msg_id, ttl_ms=TTL_MS)
    got = {m.msg_id: m for m in node.pull()}
    deadline = {msg_id: node.now + ACK_TIMEOUT_MS for msg_id in "abc"}  # the model: each one's last deadline
    for which, timeout_ms, wait_ms in steps:
        node.advance(wait_ms)
        assert _statuses(node, "abc") == {m: CONSUMING if node.now < d else READY for m, d in deadline.items()}
        msg_id = "abc"[which]
        (outcome,) = node.fenced(Fenced.EXTEND, (msg_id,), (got[msg_id].delivery,), ack_timeout_ms=timeout_ms)
        if node.now < deadline[msg_id]:
            assert outcome.refusal is None and outcome.deadline_ms == node.now + timeout_ms
            deadline[msg_id] = node.now + timeout_ms
        else:
            assert outcome.refusal is Refusal.STALE
    for at in sorted(set(deadline.values())):
        if at - 1 > node.now:
            node.advance(at - 1 - node.now)
            assert _statuses(node, "abc") == {m: CONSUMING if node.now < d else READY for m, d in deadline.items()}
        if at > node.now:
            node.advance(at - node.now)
        assert _statuses(node, "abc") == {m: CONSUMING if node.now < d else READY for m, d in deadline.items()}


def test_extensions_through_the_timers_compaction_each_time_out_at_their_deadline():
    with _node(QueueLimits(inflight=3_000, inflight_total=3_000)) as node:
        ids = [f"m{i}" for i in range(1_500)]
        for msg_id in ids:
            node.send(msg_id, ttl_ms=TTL_MS)
        got = {m.msg_id: m.delivery for m in node.pull(batch=1_500)}
        assert len(got) == 1_500
        later, sooner = ids[:750], ids[750:]
        # Sooner deadlines set timers: 1,500 + 8 x 750 places pass the compaction's bound (2 x 1,500 + 1,024).
        for round_ in range(8):
            node.advance(1_000)
            for part, timeout_ms in ((later, 60_000 + round_), (sooner, 20_000 - 2_000 * round_)):
                outcomes = node.fenced(Fenced.EXTEND, tuple(part), tuple(got[m] for m in part),
                                       ack_timeout_ms=timeout_ms)
                assert all(o.refusal is None for o in outcomes)
        sooner_at, later_at = node.now + 6_000, node.now + 60_007
        node.advance(sooner_at - 1 - node.now)
        assert set(_statuses(node, ids).values()) == {CONSUMING}
        node.advance(1)
        assert set(_statuses(node, sooner).values()) == {READY}
        assert set(_statuses(node, later).values()) == {CONSUMING}
        node.advance(later_at - 1 - node.now)
        assert set(_statuses(node, later).values()) == {CONSUMING}
        node.advance(1)
        assert set(_statuses(node, later).values()) == {READY}
