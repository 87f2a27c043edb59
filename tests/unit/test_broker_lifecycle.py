"""A message's lifecycle (docs/api.md, Semantics) on broker.disk.backend.Broker
over a real Store and a FakeClock (tests/broker_harness.py): every wait is the fake time set
forward, so each test checks the moment just before a change and the
moment of it, and runs in milliseconds.

Covered here: a delayed send is not delivered before its trigger time and
is at it; a delay <= 0 is due now; ack, nack, ack timeouts and retry
counting; maxRetry exhausted (6) and the dead-letter list; ttl expiry
while waiting, ready or consuming; reschedule; delete; priority and tag
order; duplicate ids (strictIdempotence); a restart keeping waiting, ready
and consuming messages with their times; long polls woken by a release or
a send, and one whose client left; a long poll's timeout (it waits on the
broker's clock too). The same paths with the real clock, in real
processes, stay in tests/conformance (one each: a delayed send, an
ack-timeout retry, a ttl expiry).
"""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest
from broker_harness import CONFIG, TOPIC, BrokerHarness
from broker_harness import BrokerNode as Node

from broker.core.bulk_params import BulkFilter, DeleteMsgsRequest
from broker.core.params import AckRequest, Defaults, DeleteRequest, LongPollRequest, NewSend, PullRequest
from broker.disk.backend import Broker
from broker.disk.ready import QueueLimits
from broker.observe.metrics import Metrics
from storage.entry import MS_PER_HOUR, Status
from storage.errors import Conflict, LimitReached, NotFound, Unavailable
from storage.store import NewMessage, Store

START_MS = 490_000 * MS_PER_HOUR + 1_000
WAITING, READY, CONSUMING, ACKED, EXPIRED, ENDED, DELETED = (
    Status.WAITING, Status.READY, Status.CONSUMING, Status.ACKED, Status.EXPIRED, Status.ENDED, Status.DELETED)


@pytest.fixture
def node():
    h = BrokerHarness("hourglass-lifecycle-", START_MS, QueueLimits(), Defaults())
    h.open_broker()
    try:
        yield Node(h)
    finally:
        h.teardown()


# -- delayed sends -------------------------------------------------------------------


def test_a_delayed_send_is_not_delivered_before_its_trigger_time_and_is_at_it(node):
    sent = node.send("a", delay_ms=300)
    assert (sent.status, sent.trigger_ms, sent.produce_ms) == (WAITING, START_MS + 300, START_MS)
    node.advance_to(sent.trigger_ms - 1)
    assert node.pull() == []  # never early
    assert node.state("a") == (WAITING, 0)
    assert node.info() == (1, 0, 0)
    node.advance_to(sent.trigger_ms)
    assert node.state("a") == (READY, 0)
    assert node.info() == (0, 1, 0)
    got = node.pull()
    assert [m.msg_id for m in got] == ["a"] and (got[0].status, got[0].retry) == (CONSUMING, 1)  # retry counts pulls
    assert node.now >= got[0].trigger_ms
    assert node.state("a") == (CONSUMING, 1)


def test_a_long_delay_is_delivered_at_its_trigger_time_hours_later(node):
    sent = node.send("far", delay_ms=5 * MS_PER_HOUR + 17)
    node.advance_to(sent.trigger_ms - 1)
    assert node.pull() == [] and node.state("far") == (WAITING, 0)
    node.advance_to(sent.trigger_ms)
    assert node.pulled_ids() == ["far"]


@pytest.mark.parametrize("delay_ms", [0, -5_000])
def test_a_delay_of_zero_or_less_is_due_now_and_the_answer_says_ready(node, delay_ms):
    sent = node.send("d", delay_ms=delay_ms)
    assert sent.status is READY and sent.trigger_ms == START_MS + delay_ms
    assert node.state("d") == (READY, 0) and node.info() == (0, 1, 0)  # ready before any pull
    assert node.pulled_ids() == ["d"]


def test_a_trigger_time_in_the_past_is_due_now(node):
    sent = node.send("p", trigger_ms=START_MS - 60_000)
    assert sent.status is READY
    assert node.pulled_ids() == ["p"]


def test_a_trigger_time_long_past_counts_late_from_its_arrival_not_from_1970(node):
    """triggerTime=1000 (or 0) is due when it arrives, so the lateness
    histogram (and the console's mean of it, sum / count), camellia's
    ready and pull gaps and the wheel's catch-up report count from then:
    one such send read 1.79e9 s of lateness, a mean of 2.7e10 ms."""
    node.send("w", delay_ms=600_000, ttl_ms=node.now + MS_PER_HOUR)  # rescheduled into the past below
    for msg_id, trigger_ms in (("t1000", 1_000), ("t0", 0)):
        sent = node.send(msg_id, trigger_ms=trigger_ms, ttl_ms=node.now + MS_PER_HOUR)  # not expired: READY
        assert (sent.status, sent.trigger_ms) == (READY, trigger_ms)
    node.advance(1_000)
    assert node.reschedule("w", 1_000).status is READY  # due at the reschedule
    broker = node.h.broker
    lateness = broker.metrics.load_lateness_seconds
    assert lateness.count == 3 and lateness.total < 1, (lateness.count, lateness.total)
    assert lateness.counts[-1] == 0  # none past the last bucket (60 s)
    m = broker.metrics.topic(TOPIC)
    assert m.ready_gap.count == 3 and m.ready_gap.max < 1_000
    assert sorted(node.pulled_ids()) == ["t0", "t1000", "w"]
    assert m.pull_gap.max <= 1_000  # pulled 1 s after they were sent
    report = broker.scheduler.catch_up
    assert report is None or report.max_lateness_ms < 1_000


# -- ack and nack -----------------------------------------------------------------------


def test_an_ack_ends_it_and_it_is_never_delivered_again(node):
    node.send("a")
    assert node.pulled_ids(ack_timeout_ms=200) == ["a"]
    node.ack("a")
    assert node.state("a") == (ACKED, 1)
    node.ack("a")  # acking twice is harmless
    assert node.state("a") == (ACKED, 1)
    node.advance(10_000)  # far past the ack timeout: no redelivery
    assert node.pull() == [] and node.state("a") == (ACKED, 1)
    assert node.info() == (0, 0, 0)


def test_an_ack_of_a_ready_message_acks_it(node):
    node.send("r")
    assert node.state("r") == (READY, 0)
    node.ack("r")
    assert node.state("r") == (ACKED, 0)
    assert node.pull() == []


def test_an_ack_of_a_waiting_message_acks_it_and_other_acks_change_nothing(node):
    node.send("w", delay_ms=600_000)
    node.send("w2", delay_ms=600_000)
    node.send("e", max_retry=0)
    node.ack("w", ack=False)  # a nack of a waiting message: nothing to do
    assert node.state("w") == (WAITING, 0)
    node.ack("w")  # as camellia: acked, never delivered
    assert node.state("w") == (ACKED, 0)
    assert node.info()[0] == 1
    assert node.pulled_ids() == ["e"]
    node.ack("e", ack=False)
    assert node.state("e") == (ENDED, 1)
    for ack in (True, False):  # ended: no error, no change
        node.ack("e", ack=ack)
        assert node.state("e") == (ENDED, 1)
    node.ack("nope")  # unknown: no error
    node.ack("nope", ack=False)
    node.advance(600_000)
    assert node.pulled_ids() == ["w2"]  # the acked one is never delivered
    assert node.state("w") == (ACKED, 0)


def test_a_nack_makes_it_ready_now_with_its_retry_and_ends_it_after_the_last(node):
    node.send("n", max_retry=0)
    node.send("n2", max_retry=3)
    assert sorted(node.pulled_ids(ack_timeout_ms=600_000)) == ["n", "n2"]
    node.ack("n2", ack=False)
    assert node.state("n2") == (READY, 1)  # delivered once so far
    before = node.get("n2")
    node.ack("n2", ack=False)  # of a ready one: no change
    assert node.get("n2") == before
    again = node.pull()
    assert [m.msg_id for m in again] == ["n2"] and again[0].retry == 2
    node.ack("n", ack=False)
    assert node.state("n") == (ENDED, 1)  # maxRetry=0: one delivery only


# -- ack timeouts and retries ------------------------------------------------------------


def test_an_unacked_pull_is_redelivered_at_its_ack_timeout_with_retry_counting_pulls(node):
    node.send("t", max_retry=3)
    first = node.pull(ack_timeout_ms=200)
    assert first[0].retry == 1
    pulled_at = node.now
    node.advance_to(pulled_at + 199)
    assert node.state("t") == (CONSUMING, 1) and node.pull() == []  # not before its deadline
    node.advance_to(pulled_at + 200)
    assert node.state("t") == (READY, 1)
    assert node.info() == (0, 1, 0)
    second = node.pull(ack_timeout_ms=200)
    assert [m.msg_id for m in second] == ["t"] and second[0].retry == 2


def test_max_retry_exhausted_ends_it_as_6_and_lists_it_as_a_dead_letter(node):
    node.send("t", max_retry=1)
    node.send("alive", delay_ms=600_000)
    assert node.pull(ack_timeout_ms=200)[0].retry == 1
    node.advance(200)
    second = node.pull(ack_timeout_ms=200)
    assert [m.msg_id for m in second] == ["t"] and second[0].retry == 2
    node.advance(199)
    assert node.state("t") == (CONSUMING, 2)
    node.advance(1)
    assert node.state("t") == (ENDED, 2)  # maxRetry=1: two deliveries, then ended
    node.advance(60_000)
    assert node.pull() == []  # never delivered again
    assert node.info() == (1, 0, 0)
    assert node.dead(ENDED) == ["t"] and node.dead(EXPIRED, ENDED) == ["t"]
    assert node.dead(EXPIRED) == []


def test_an_ack_after_the_timeout_redelivery_still_acks(node):
    node.send("late", max_retry=3)
    node.pull(ack_timeout_ms=100)
    node.advance(100)
    assert node.state("late") == (READY, 1)
    node.ack("late")  # acking a ready message acks it
    assert node.state("late") == (ACKED, 1)


# -- ttl ---------------------------------------------------------------------------------


def test_ttl_ends_a_never_delivered_ready_message_as_5_at_its_expire_time(node):
    sent = node.send("e", ttl_ms=100)
    assert sent.expire_ms == START_MS + 100
    node.advance_to(sent.expire_ms - 1)
    assert node.state("e") == (READY, 0)
    node.advance_to(sent.expire_ms)
    assert node.state("e") == (EXPIRED, 0)
    assert node.pull() == [] and node.info() == (0, 0, 0)
    assert node.dead(EXPIRED) == ["e"] and node.dead(ENDED) == []


def test_ttl_after_a_delivery_ends_as_6(node):
    sent = node.send("e6", ttl_ms=300, max_retry=5)
    assert node.pulled_ids(ack_timeout_ms=60_000) == ["e6"]
    node.ack("e6", ack=False)  # ready again, delivered once
    node.advance_to(sent.expire_ms - 1)
    assert node.state("e6") == (READY, 1)
    node.advance_to(sent.expire_ms)
    assert node.state("e6") == (ENDED, 1)
    assert node.pull() == []


def test_a_consuming_message_past_its_ttl_ends_at_its_ack_timeout(node):
    sent = node.send("c", ttl_ms=500, max_retry=5)
    assert node.pulled_ids(ack_timeout_ms=2_000) == ["c"]
    node.advance_to(sent.expire_ms + 100)  # past expireTime, within the ack timeout: left to its consumer
    assert node.state("c") == (CONSUMING, 1)
    node.advance_to(START_MS + 2_000 - 1)
    assert node.state("c") == (CONSUMING, 1)
    node.advance_to(START_MS + 2_000)
    assert node.state("c") == (ENDED, 1)
    assert node.pull() == []


def test_a_message_already_expired_when_due_ends_as_5(node):
    sent = node.send("old", trigger_ms=START_MS - 5_000, ttl_ms=1_000)
    assert sent.status is EXPIRED and sent.expire_ms < START_MS  # due at once, and already past its ttl
    assert node.state("old") == (EXPIRED, 0)
    assert node.pull() == []


def test_a_waiting_message_whose_ttl_passed_in_a_forward_jump_of_the_clock_ends_as_5(node):
    sent = node.send("w", delay_ms=1_000, ttl_ms=100)
    node.h.clock.set(sent.expire_ms + 500)  # the wall clock jumps over its trigger and expire times
    node.advance(0)
    assert node.state("w") == (EXPIRED, 0)
    assert node.pull() == [] and node.info() == (0, 0, 0)


def test_a_waiting_message_whose_ttl_passed_while_the_node_was_down_ends_as_5(node):
    sent = node.send("w", delay_ms=1_000, ttl_ms=1_000)
    node.h.close_broker()
    node.h.clock.set(sent.expire_ms + 60_000)  # down across its trigger and expire times
    node.h.open_broker()
    node.advance(0)
    assert node.state("w") == (EXPIRED, 0)
    assert node.pull() == []


# -- reschedule ----------------------------------------------------------------------------


def test_a_waiting_message_moved_later_is_not_delivered_at_the_old_time_nor_before_the_new(node):
    sent = node.send("w", delay_ms=300)
    moved = node.reschedule("w", START_MS + 1_500)
    assert (moved.status, moved.trigger_ms, moved.retry) == (WAITING, START_MS + 1_500, 0)
    node.advance_to(sent.trigger_ms + 300)  # past the old trigger time
    assert node.pull() == [] and node.state("w") == (WAITING, 0)
    node.advance_to(moved.trigger_ms - 1)
    assert node.pull() == []
    node.advance_to(moved.trigger_ms)
    assert node.pulled_ids() == ["w"]
    assert node.get("w").trigger_ms == moved.trigger_ms


def test_a_waiting_message_moved_earlier_is_delivered_at_the_new_time(node):
    node.send("w", delay_ms=600_000)
    moved = node.reschedule("w", START_MS + 700)
    node.advance_to(moved.trigger_ms - 1)
    assert node.pull() == []
    node.advance_to(moved.trigger_ms)
    assert node.pulled_ids(ack_timeout_ms=MS_PER_HOUR) == ["w"]
    node.advance(600_000)  # nor again at the old time
    assert node.state("w") == (CONSUMING, 1)


def test_a_reschedule_to_now_fires_a_far_message_now_keeping_it_whole(node):
    node.send("far", "body", delay_ms=10 * 24 * MS_PER_HOUR, priority=3, tag="x")
    moved = node.reschedule("far", node.now)
    assert moved.status is READY
    got = node.pull()
    assert [m.msg_id for m in got] == ["far"] and (got[0].priority, got[0].tag, got[0].msg) == (3, "x", "body")
    node.ack("far")
    assert node.state("far") == (ACKED, 1)


def test_a_ready_message_moved_later_leaves_the_ready_queue(node):
    node.send("r")
    assert node.state("r") == (READY, 0)
    moved = node.reschedule("r", START_MS + 800)
    assert moved.status is WAITING
    assert node.pull() == [] and node.info() == (1, 0, 0)
    node.advance_to(moved.trigger_ms - 1)
    assert node.pull() == []
    node.advance_to(moved.trigger_ms)
    assert node.pulled_ids() == ["r"]


def test_reschedule_refuses_a_consuming_or_ended_message(node):
    node.send("c")
    node.pull()
    with pytest.raises(Conflict, match="consuming"):
        node.reschedule("c", node.now)
    assert node.state("c") == (CONSUMING, 1)
    node.ack("c")
    with pytest.raises(Conflict, match="acked"):
        node.reschedule("c", node.now)
    with pytest.raises(NotFound):
        node.reschedule("nope", node.now)


def test_a_message_changed_again_while_its_reschedule_commits(node):
    """A delete and a second reschedule reach the message while the first
    reschedule's record is still in its commit (clients retrying after a
    failover send such pairs): the delete ends it, the second reschedule
    moves it again; the broker goes on serving (docs/drills.md)."""
    node.send("d", delay_ms=600_000)
    node.send("r", delay_ms=600_000)

    broker = node.h.broker

    async def delete_while_moving():  # the delete runs while the reschedule's commit is in flight
        return await asyncio.gather(broker.reschedule(TOPIC, "d", node.now + 5_000),
                                    broker.delete(DeleteRequest(TOPIC, "d", False)))

    async def reschedule_twice():  # both wait for the send's commit, then run in turn, the second on a pending move
        other = NewSend(NewMessage(TOPIC, "o", "m", node.now, node.now + 600_000, MS_PER_HOUR, 3), False)
        return await asyncio.gather(broker.send([other]), broker.reschedule(TOPIC, "r", node.now + 5_000),
                                    broker.reschedule(TOPIC, "r", node.now + 9_000))

    node._call(delete_while_moving())
    assert node.state("d") == (DELETED, 0)
    _, _, again = node._call(reschedule_twice())
    assert again.trigger_ms == START_MS + 9_000 and node.get("r").trigger_ms == START_MS + 9_000
    node.advance(5_000)
    assert node.pull() == []  # neither the deleted one nor the one moved on
    node.advance(4_000)
    assert node.pulled_ids() == ["r"]


# -- delete ----------------------------------------------------------------------------------


def test_delete_of_a_waiting_ready_or_consuming_message(node):
    node.send("w", delay_ms=600_000)
    node.send("c")
    assert node.pulled_ids() == ["c"]
    node.send("r")
    assert node.state("r") == (READY, 0)
    for msg_id in ("w", "r", "c"):
        node.delete(msg_id)
        assert node.get(msg_id).status is DELETED
    assert node.pull() == []
    assert node.info() == (0, 0, 0)
    node.advance(600_000)  # neither the waiting one's trigger nor the consuming one's deadline brings one back
    assert node.pull() == []
    node.ack("c")  # deleted: an ack changes nothing
    assert node.get("c").status is DELETED


def test_delete_of_an_ended_message_is_not_found_and_changes_nothing(node):
    node.send("a")
    node.pull()
    node.ack("a")
    with pytest.raises(NotFound):
        node.delete("a")
    assert node.state("a") == (ACKED, 1)
    with pytest.raises(NotFound):
        node.delete("nope")


def test_delete_with_release_forgets_the_id(node):
    node.send("x", "old", delay_ms=600_000)
    node.send("y", "acked")
    node.pull()
    node.ack("y")
    node.delete("x", release=True)
    with pytest.raises(NotFound):  # y had ended: NotFound, released all the same
        node.delete("y", release=True)
    for msg_id in ("x", "y"):
        with pytest.raises(NotFound):
            node.get(msg_id)
    with pytest.raises(NotFound):
        node.delete("x", release=True)
    again = node.send("x", "new")
    assert (again.msg, again.status, again.retry) == ("new", READY, 0)
    assert node.pulled_ids() == ["x"]


# -- order ----------------------------------------------------------------------------------


def test_priority_then_trigger_time_orders_the_ready_queue(node):
    now = node.now
    node.send("late-low", trigger_ms=now - 1_000)
    node.send("high", trigger_ms=now, priority=5)
    node.send("early-low", trigger_ms=now - 2_000)
    node.send("negative", trigger_ms=now - 9_000, priority=-3)
    node.send("higher-later", trigger_ms=now - 10, priority=5)
    assert node.pulled_ids(batch=10) == ["higher-later", "high", "early-low", "late-low", "negative"]


def test_messages_released_together_come_out_by_priority(node):
    for msg_id, priority in (("p1", 1), ("p9", 9), ("p0", 0), ("p5", 5)):
        node.send(msg_id, delay_ms=500, priority=priority)
    node.advance(500)
    assert node.pulled_ids(batch=1) == ["p9"]
    assert node.pulled_ids(batch=10) == ["p5", "p1", "p0"]


def test_tags_filter_pulls(node):
    now = node.now
    node.send("a", tag="red", trigger_ms=now - 30)
    node.send("b", tag="blue", trigger_ms=now - 20)
    node.send("g", tag="green", trigger_ms=now - 25, priority=1)
    node.send("c", trigger_ms=now - 40)
    assert node.pull(tags=("violet",)) == []
    got = node.pull(tags=("blue", "green"), batch=5)
    assert [m.msg_id for m in got] == ["g", "b"] and [m.tag for m in got] == ["green", "blue"]
    assert node.pulled_ids(batch=5) == ["c", "a"]


# -- duplicate ids ----------------------------------------------------------------------------


def test_a_send_of_a_live_id_answers_the_stored_message_unchanged(node):
    first = node.send("x", "one", delay_ms=60_000)
    again = node.send("x", "two", delay_ms=1)
    assert again == first
    assert node.info() == (1, 0, 0)
    node.advance(1)
    assert node.state("x") == (WAITING, 0)  # not moved to the second send's trigger


def test_a_resend_of_an_ended_id_stores_the_new_message_unless_strict(node):
    node.send("r", "first")
    assert node.send("r", "dup").msg == "first"  # alive: the stored one, unchanged
    node.pull()
    node.ack("r")
    strict = node.send("r", "strict", strict=True)
    assert (strict.msg, strict.status) == ("first", ACKED)
    again = node.send("r", "second", delay_ms=600_000)
    assert (again.msg, again.status, again.retry) == ("second", WAITING, 0)  # as camellia
    assert node.get("r").msg == "second"


# -- restart ------------------------------------------------------------------------------------


@pytest.mark.parametrize("checkpoint", [False, True], ids=["from-the-log", "after-a-checkpoint"])
def test_a_restart_keeps_waiting_ready_and_consuming_messages_with_their_times(node, checkpoint):
    waiting = node.send("waiting", "w", delay_ms=600_000)
    soon = node.send("soon", "s", delay_ms=1_500)
    node.send("consuming", "c", max_retry=3)
    node.send("acked", "a")
    node.send("gone", "g")
    node.send("ready", "r", priority=-1)
    node.delete("gone", release=True)
    assert node.pulled_ids(batch=2, ack_timeout_ms=1_000) == ["consuming", "acked"]
    node.ack("acked")
    pulled_at = node.now
    before = {msg_id: node.get(msg_id) for msg_id in ("waiting", "soon", "consuming", "acked", "ready")}
    assert [m.status for m in before.values()] == [WAITING, WAITING, CONSUMING, ACKED, READY]

    node.restart(checkpoint)
    assert {msg_id: node.get(msg_id) for msg_id in before} == before
    with pytest.raises(NotFound):
        node.get("gone")
    assert node.info() == (2, 1, 1)
    node.advance_to(pulled_at + 999)
    assert node.state("consuming") == (CONSUMING, 1)  # its pull's deadline, kept
    node.advance_to(pulled_at + 1_000)
    assert node.state("consuming") == (READY, 1)  # timed out as set: ready again (delivered once)
    node.advance_to(soon.trigger_ms - 1)
    assert node.state("soon") == (WAITING, 0)
    assert node.pulled_ids() == ["consuming", "ready"]  # by priority (ready has -1); acked is not delivered again
    node.advance_to(soon.trigger_ms)
    assert node.pulled_ids() == ["soon"]
    for msg_id in ("consuming", "ready", "soon"):
        node.ack(msg_id)
    node.advance_to(waiting.trigger_ms - 1)
    assert node.state("waiting") == (WAITING, 0)
    node.restart(checkpoint)
    node.advance_to(waiting.trigger_ms)
    assert node.pulled_ids() == ["waiting"]


def test_what_fell_due_while_the_node_was_down_is_delivered_at_once(node):
    due = node.send("due", delay_ms=1_000)
    node.send("c", max_retry=3)
    assert node.pulled_ids(ack_timeout_ms=500) == ["c"]
    node.h.close_broker()
    node.h.clock.set(due.trigger_ms + 5_000)  # down past the trigger and the ack deadline
    node.h.open_broker()
    node.advance(0)
    assert node.state("due") == (READY, 0)
    assert node.state("c") == (READY, 1)
    assert sorted(node.pulled_ids()) == ["c", "due"]
    assert node.h.broker.metrics.load_lateness_seconds.total == 5.0  # sent in time: late from its trigger


# -- long polls: woken, or answered empty at their timeout (on the fake clock) ---------------


def long_poll(node: Node, timeout_ms: int = 60_000, gone=lambda: False) -> asyncio.Task:
    """Start a long poll on the harness's loop and let it block."""
    request = LongPollRequest(TOPIC, 60_000, 5, (), timeout_ms)
    task = node.h.loop.create_task(node.h.broker.long_poll(request, gone))
    node.h.run(node.h.quiesce())
    return task


def test_a_long_poll_is_answered_when_the_message_is_released(node):
    sent = node.send("lp", delay_ms=700)
    task = long_poll(node)
    node.advance_to(sent.trigger_ms - 1)
    assert not task.done()
    node.advance_to(sent.trigger_ms)
    assert task.done() and [m.msg_id for m in task.result()] == ["lp"]


def test_a_long_poll_is_answered_by_a_send_while_it_waits(node):
    task = long_poll(node)
    assert not task.done()
    node.send("s")
    assert task.done() and [m.msg_id for m in task.result()] == ["s"]


def test_a_long_poll_whose_client_left_takes_nothing(node):
    left = []
    task = long_poll(node, gone=lambda: bool(left))
    left.append(True)  # the poll's client is gone
    node.send("g", max_retry=0)
    assert task.done() and task.result() == []
    assert node.state("g") == (READY, 0)  # still ready, not handed to nobody
    assert node.pulled_ids() == ["g"]


def test_a_long_poll_answers_empty_at_its_timeout_and_not_before(node):
    started = node.now
    task = long_poll(node, timeout_ms=2_500)
    node.advance_to(started + 2_499)
    assert not task.done()
    node.advance_to(started + 2_500)
    assert task.done() and task.result() == []


def test_a_long_poll_is_answered_at_once_by_a_release_before_its_timeout(node):
    sent = node.send("soon", delay_ms=700)
    task = long_poll(node, timeout_ms=2_500)
    node.advance_to(sent.trigger_ms - 1)
    assert not task.done()
    node.advance_to(sent.trigger_ms)
    assert task.done() and [m.msg_id for m in task.result()] == ["soon"]
    assert node.state("soon") == (CONSUMING, 1)


def test_a_long_poll_is_answered_at_once_by_a_send_before_its_timeout(node):
    task = long_poll(node, timeout_ms=2_500)
    node.advance(1_000)
    assert not task.done()
    node.send("now")
    assert task.done() and [m.msg_id for m in task.result()] == ["now"]


# -- the topic cap (--max-topics) -----------------------------------------------------------------


@pytest.fixture
def capped():
    h = BrokerHarness("hourglass-topics-", START_MS, QueueLimits(topics=2), Defaults())
    h.open_broker()
    try:
        yield Node(h)
    finally:
        h.teardown()


def test_a_send_to_a_new_topic_past_the_cap_is_refused_and_stores_nothing(capped):
    """The cap counts the topics of sends still in their group commit too:
    two sends to two new topics in one commit, with room for one, store
    one. The count is the store's, so a restart keeps it."""
    capped.send("a", topic="one")
    broker = capped.h.broker

    async def together():
        sends = [broker.send([NewSend(NewMessage(topic, "m", "x", capped.now, capped.now + 60_000, MS_PER_HOUR, 3, 0,
                                                 ""), False)]) for topic in ("two", "three")]
        return await asyncio.gather(*sends, return_exceptions=True)
    results = capped.h.run(together())
    refused = [r for r in results if isinstance(r, LimitReached)]
    assert len(refused) == 1 and "--max-topics is 2" in str(refused[0]), results
    stored = [topic for topic, r in zip(("two", "three"), results) if not isinstance(r, BaseException)]
    capped.h.run(capped.h.quiesce())
    assert broker.topic_list() == sorted(["one", *stored])
    capped.send("b", topic="one")  # a topic the node has still takes sends
    capped.restart()
    with pytest.raises(LimitReached):
        capped.send("c", topic="four")
    with pytest.raises(NotFound):
        capped.h.run(capped.h.broker.get("four", "c"))
    assert capped.h.broker.topic_list() == sorted(["one", *stored])


# -- a leader whose quorum is slow -----------------------------------------------------------


class _SlowQuorumHarness(BrokerHarness):
    """The broker as a cluster's leader builds it, with a `replicated` that
    answers as a leader log does when no quorum acknowledges in time while
    `refusing` is set."""

    refusing = False

    def open_broker(self) -> None:
        async def replicated(end_offset: int) -> None:
            if self.refusing:
                raise Unavailable(f"no quorum acknowledged offset {end_offset} within 3000 ms; retry")

        self.store = Store.open(self.directory, CONFIG, now_ms=self.clock.now_ms())
        self.broker = Broker(self.store, self.clock, self.defaults, Metrics(), replicated=replicated,
                             tick_path=os.path.join(self.directory, "tick"), limits=self.limits)

        async def start():
            self.broker.start()
            await self.quiesce()
        self.run(start())


def test_background_records_no_quorum_acknowledged_in_time_fail_nothing():
    """A release, an ack timeout and the tick persisted while no quorum
    answers (followers restarting or installing a snapshot): the wheel and
    the timers go on, the broker does not fail (a fault drill saw leaders
    exit so), and once the quorum is back the messages are delivered."""
    h = _SlowQuorumHarness("hourglass-quorum-", START_MS, QueueLimits(), Defaults())
    h.open_broker()
    node = Node(h)
    try:
        node.send("w", delay_ms=5_000)
        node.send("c")
        assert node.pulled_ids(ack_timeout_ms=2_000) == ["c"]
        h.refusing = True
        node.advance(6_000)  # "w" released, "c"'s ack deadline passed, ticks persisted: none quorum-acknowledged
        assert h.broker.failed is None
        assert node.state("w") == (READY, 0) and node.state("c") == (READY, 1)
        h.refusing = False
        assert sorted(node.pulled_ids()) == ["c", "w"]
        assert node.state("c") == (CONSUMING, 2) and node.state("w") == (CONSUMING, 1)
    finally:
        h.teardown()


# -- a bulk call and the requests that run while it reads ------------------------------------


def test_a_bulk_delete_takes_the_messages_changed_while_it_read_as_they_now_are(node, monkeypatch):
    """A deleteMsgs reads its matches a slice at a time, the loop free
    between: an ack, a reschedule, a deleteMsg and a pull land meanwhile on
    messages it has read. Its record takes each as it is at the end -- the
    acked one stays acked, the moved one is deleted at its new place (or
    left there if read before it moved), nothing is changed twice -- and
    the broker goes on serving."""
    import broker.disk.bulk
    monkeypatch.setattr(broker.disk.bulk, "BULK_SCAN", 2)
    for i in range(6):
        node.send(f"r{i}")
    for i in range(6):
        node.send(f"w{i}", delay_ms=600_000)
    consuming = node.pulled_ids(batch=2)
    b = node.h.broker
    between = asyncio.Event()  # the bulk call has read its first slice and yields
    go_on = asyncio.Event()

    async def first_yield_waits(_: float) -> None:
        if not between.is_set():
            between.set()
            await go_on.wait()
    monkeypatch.setattr(broker.disk.bulk, "asyncio", SimpleNamespace(sleep=first_yield_waits))

    async def meanwhile():
        await between.wait()
        await b.ack(AckRequest(TOPIC, consuming[0], True))
        await b.reschedule(TOPIC, "w5", node.now + 1_200_000)
        await b.delete(DeleteRequest(TOPIC, "w4", False))
        pulled = [m.msg_id for m in await b.pull(PullRequest(TOPIC, 30_000, 1, ()))]
        go_on.set()
        return pulled

    async def both():
        return await asyncio.gather(b.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), 1000)), meanwhile())

    (deleted, more), pulled = node._call(both())
    assert not more and node.h.broker.failed is None
    states = {f"{p}{i}": node.state(f"{p}{i}")[0] for p in "rw" for i in range(6)}
    assert states[consuming[0]] is ACKED
    assert all(s is DELETED for msg_id, s in states.items() if msg_id not in (consuming[0], "w5"))
    assert states["w5"] in (DELETED, WAITING)  # at its new place: read by the bulk call after it moved, or not
    assert deleted == sum(1 for msg_id, s in states.items() if s is DELETED and msg_id != "w4")
    assert len(pulled) <= 1
    node.advance(1_300_000)
    assert node.pulled_ids() == ([] if states["w5"] is DELETED else ["w5"])
