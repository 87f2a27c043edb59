"""broker.core.transitions.step: every transition of a message and every
refusal, as (state, event, now_ms) -> (state, effects, refusal); no clock,
no disk, no socket."""

from __future__ import annotations

import typing

import pytest

from broker.core.leases import new_delivery
from broker.core.transitions import (
    ACK,
    GIVE_BACK,
    NACK,
    REDRIVE,
    RELEASE,
    TABLE,
    TTL,
    Ack,
    AckTimeout,
    Delete,
    Effect,
    Event,
    Extend,
    MessageState,
    Nack,
    Pull,
    Redrive,
    Refusal,
    Reschedule,
    Send,
    Step,
    due,
    step,
)
from storage.entry import Location, Message, Status
from storage.store import NewMessage

E = Effect
WAITING, READY, CONSUMING = Status.WAITING, Status.READY, Status.CONSUMING
ACKED, EXPIRED, ENDED, DELETED = Status.ACKED, Status.EXPIRED, Status.ENDED, Status.DELETED
FINAL = (ACKED, EXPIRED, ENDED, DELETED)
ALIVE = (WAITING, READY, CONSUMING)

NOW = 1_000_000
DELIVERY_MS = NOW - 1_000  # a hand-over a second ago
DELIVERY, OTHER = new_delivery(DELIVERY_MS), new_delivery(NOW - 500)
LEASE_MS = 12 * 3600 * 1000
TRIGGER, TTL_MS = NOW - 5_000, 60_000  # expire: NOW + 55_000


def state(status: Status, retry: int = 0, max_retry: int = 2, deadline_ms: int = 0,
          trigger_ms: int = TRIGGER, ttl_ms: int = TTL_MS, delivery: int = 0) -> MessageState:
    return MessageState(status, retry, max_retry, trigger_ms, ttl_ms, deadline_ms, delivery)


SENT = MessageState(WAITING, 0, 2, NOW + 1_000, TTL_MS)  # what a send stores, due in a second
SENT_DUE = SENT._replace(trigger_ms=NOW)


# -- send ----------------------------------------------------------------------------------------


def test_a_send_of_a_new_id_is_filed_waiting_and_due_now_if_its_time_has_come():
    assert step(None, Send(SENT), NOW) == Step(SENT, (E.FILE,))
    assert step(None, Send(SENT_DUE), NOW) == Step(SENT_DUE, (E.FILE, E.DUE_NOW))
    assert step(None, Send(SENT._replace(trigger_ms=0)), NOW).effects == (E.FILE, E.DUE_NOW)


@pytest.mark.parametrize("status", ALIVE)
@pytest.mark.parametrize("strict", [False, True])
def test_a_send_of_an_id_alive_answers_the_stored_message_unchanged(status, strict):
    stored = state(status, retry=1)
    assert step(stored, Send(SENT, strict), NOW) == Step(stored)


@pytest.mark.parametrize("status", FINAL)
def test_a_send_of_an_ended_id_releases_it_and_is_stored_anew_unless_strict(status):
    stored = state(status, retry=1)
    assert step(stored, Send(SENT), NOW) == Step(stored, (E.RELEASE_ID, E.REPLACE))
    assert step(stored, Send(SENT, strict=True), NOW) == Step(stored)


def test_what_a_send_stores():
    new = NewMessage("t", "id", "body", NOW, NOW + 1_000, TTL_MS, 2)
    assert MessageState.sent(new) == SENT


# -- release -------------------------------------------------------------------------------------


def test_a_release_makes_a_waiting_message_ready_held_and_its_polls_woken():
    done = step(state(WAITING, retry=1), RELEASE, NOW)
    assert done == Step(state(READY, retry=1), (E.HOLD, E.WAKE, E.COUNT_READY))


def test_a_release_at_or_past_the_expire_time_expires_it():
    expire = TRIGGER + TTL_MS
    assert step(state(WAITING), RELEASE, expire - 1).state.status is READY
    assert step(state(WAITING), RELEASE, expire) == Step(state(EXPIRED), (E.COUNT_ENDED,))
    assert step(state(WAITING, retry=2), RELEASE, expire + 1).state == state(EXPIRED, retry=2)


@pytest.mark.parametrize("status", [READY, CONSUMING, *FINAL])
def test_a_release_of_a_message_no_longer_waiting_changes_nothing(status):
    assert step(state(status), RELEASE, NOW) == Step(state(status))


# -- pull ----------------------------------------------------------------------------------------


def test_a_pull_takes_a_ready_message_counting_the_delivery_with_its_deadline():
    done = step(state(READY, retry=1), Pull(NOW + 30_000, DELIVERY), NOW)
    assert done == Step(state(CONSUMING, retry=2, deadline_ms=NOW + 30_000, delivery=DELIVERY), (E.TAKE,))


@pytest.mark.parametrize("status", [WAITING, CONSUMING, *FINAL])
def test_a_pull_takes_nothing_but_ready_messages(status):
    assert step(state(status), Pull(NOW + 30_000, DELIVERY), NOW) == Step(state(status))


# -- ack and nack --------------------------------------------------------------------------------


def test_an_ack_of_a_waiting_message_takes_it_out_of_the_wheel():
    assert step(state(WAITING), ACK, NOW) == Step(state(ACKED), (E.CANCEL, E.COUNT_ACK))


@pytest.mark.parametrize("status", [READY, CONSUMING])
def test_an_ack_of_a_ready_or_consuming_message_lets_ram_forget_it(status):
    done = step(state(status, retry=1, deadline_ms=NOW + 1), ACK, NOW)
    assert done == Step(state(ACKED, retry=1), (E.FORGET, E.COUNT_ACK))


@pytest.mark.parametrize("status", FINAL)
def test_an_ack_or_nack_of_an_ended_message_changes_nothing(status):
    assert step(state(status), ACK, NOW) == Step(state(status))
    assert step(state(status), NACK, NOW) == Step(state(status))


@pytest.mark.parametrize("event", [ACK, NACK])
def test_an_ack_or_nack_of_an_unknown_id_changes_nothing_and_is_no_error(event):
    assert step(None, event, NOW) == Step(None)


def test_a_nack_makes_a_consuming_message_ready_again_keeping_its_delivery_count():
    done = step(state(CONSUMING, retry=1, deadline_ms=NOW + 9), NACK, NOW)
    assert done == Step(state(READY, retry=1), (E.REQUEUE, E.WAKE, E.COUNT_NACK, E.COUNT_RETRY))


def test_a_nack_after_max_retry_plus_one_deliveries_ends_it():
    assert step(state(CONSUMING, retry=2, max_retry=2), NACK, NOW).state.status is READY
    done = step(state(CONSUMING, retry=3, max_retry=2), NACK, NOW)
    assert done == Step(state(ENDED, retry=3), (E.FORGET, E.COUNT_NACK, E.COUNT_ENDED))


def test_a_nack_past_the_expire_time_ends_it():
    expire = TRIGGER + TTL_MS
    assert step(state(CONSUMING, retry=1), NACK, expire - 1).state.status is READY
    assert step(state(CONSUMING, retry=1), NACK, expire).state == state(ENDED, retry=1)


@pytest.mark.parametrize("status", [WAITING, READY])
def test_a_nack_of_a_message_not_consuming_changes_nothing(status):
    assert step(state(status, retry=1), NACK, NOW) == Step(state(status, retry=1))


# -- ack timeout ---------------------------------------------------------------------------------


def test_an_ack_timeout_at_the_current_deadline_is_a_nack_without_the_nack_counted():
    consuming = state(CONSUMING, retry=1, deadline_ms=NOW)
    assert step(consuming, AckTimeout(NOW), NOW) == Step(state(READY, retry=1), (E.REQUEUE, E.WAKE, E.COUNT_RETRY))
    last = state(CONSUMING, retry=3, max_retry=2, deadline_ms=NOW)
    assert step(last, AckTimeout(NOW), NOW) == Step(state(ENDED, retry=3), (E.FORGET, E.COUNT_ENDED))
    late = state(CONSUMING, retry=1, deadline_ms=TRIGGER + TTL_MS)
    assert step(late, AckTimeout(TRIGGER + TTL_MS), TRIGGER + TTL_MS).state.status is ENDED


def test_a_stale_ack_timer_changes_nothing():
    pulled_again = state(CONSUMING, retry=2, deadline_ms=NOW + 30_000)
    assert step(pulled_again, AckTimeout(NOW), NOW) == Step(pulled_again)
    for status in (WAITING, READY, *FINAL):
        assert step(state(status), AckTimeout(NOW), NOW) == Step(state(status))


# -- ttl -----------------------------------------------------------------------------------------


def test_a_ready_message_past_its_ttl_expires_if_never_delivered_else_ends():
    expire = TRIGGER + TTL_MS
    assert step(state(READY), TTL, expire - 1) == Step(state(READY))
    assert step(state(READY), TTL, expire) == Step(state(EXPIRED), (E.FORGET, E.COUNT_ENDED))
    assert step(state(READY, retry=1), TTL, expire) == Step(state(ENDED, retry=1), (E.FORGET, E.COUNT_ENDED))


@pytest.mark.parametrize("status", [WAITING, CONSUMING, *FINAL])
def test_the_ttl_ends_only_ready_messages(status):
    """A consuming one is left to its ack or its ack timeout; a waiting one
    expires when it is released."""
    assert step(state(status), TTL, NOW + 10 * TTL_MS) == Step(state(status))


# -- delete --------------------------------------------------------------------------------------


def test_a_delete_of_a_waiting_message_takes_it_out_of_the_wheel():
    assert step(state(WAITING), Delete(), NOW) == Step(state(DELETED), (E.CANCEL, E.COUNT_DELETE))
    assert step(state(WAITING), Delete(release=True), NOW).effects == (E.CANCEL, E.COUNT_DELETE, E.RELEASE_ID)


@pytest.mark.parametrize("status", [READY, CONSUMING])
def test_a_delete_of_a_held_message_lets_ram_forget_it(status):
    assert step(state(status, deadline_ms=7), Delete(), NOW) == Step(state(DELETED), (E.FORGET, E.COUNT_DELETE))
    assert step(state(status), Delete(release=True), NOW).effects == (E.FORGET, E.COUNT_DELETE, E.RELEASE_ID)


@pytest.mark.parametrize("status", FINAL)
def test_a_delete_of_an_ended_message_is_refused_though_it_may_release_the_id(status):
    assert step(state(status), Delete(), NOW) == Step(state(status), (), Refusal.ENDED)
    assert step(state(status), Delete(release=True), NOW) == Step(state(status), (E.RELEASE_ID, E.COUNT_DELETE),
                                                                  Refusal.ENDED)


# -- reschedule ----------------------------------------------------------------------------------


def test_a_reschedule_files_a_waiting_or_ready_message_anew_keeping_its_retry():
    later = NOW + 600_000
    moved = state(WAITING, retry=1, trigger_ms=later)
    assert step(state(WAITING, retry=1), Reschedule(later), NOW) == Step(moved, (E.CANCEL, E.MOVE, E.FILE))
    assert step(state(READY, retry=1), Reschedule(later), NOW) == Step(moved, (E.FORGET, E.MOVE, E.FILE))


def test_a_reschedule_to_a_time_come_already_is_due_now():
    done = step(state(WAITING), Reschedule(NOW), NOW)
    assert done.effects == (E.CANCEL, E.MOVE, E.FILE, E.DUE_NOW) and done.state.trigger_ms == NOW
    assert step(state(READY), Reschedule(0), NOW).effects == (E.FORGET, E.MOVE, E.FILE, E.DUE_NOW)


@pytest.mark.parametrize("status", [CONSUMING, *FINAL])
def test_a_reschedule_of_a_consuming_or_ended_message_is_refused(status):
    assert step(state(status), Reschedule(NOW), NOW) == Step(state(status), (), Refusal.NOT_MOVABLE)


# -- redrive -------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [EXPIRED, ENDED])
def test_a_redrive_files_a_dead_letter_now_with_a_fresh_retry_budget_and_ttl(status):
    done = step(state(status, retry=3), REDRIVE, NOW)
    assert done == Step(MessageState(WAITING, 0, 2, NOW, TTL_MS), (E.MOVE, E.FILE, E.DUE_NOW))
    assert done.state.expire_ms == NOW + TTL_MS


@pytest.mark.parametrize("status", [WAITING, READY, CONSUMING, ACKED, DELETED])
def test_a_redrive_of_a_message_not_dead_is_refused(status):
    assert step(state(status), REDRIVE, NOW) == Step(state(status), (), Refusal.NOT_DEAD)


@pytest.mark.parametrize("event", [Delete(), Delete(release=True), Reschedule(NOW), REDRIVE])
def test_an_unknown_id_is_not_found_for_what_names_one_message(event):
    assert step(None, event, NOW) == Step(None, (), Refusal.NOT_FOUND)


# -- give back -----------------------------------------------------------------------------------


def test_a_give_back_undoes_a_pull():
    pulled = step(state(READY, retry=1), Pull(NOW + 30_000, DELIVERY), NOW).state
    assert step(pulled, GIVE_BACK, NOW) == Step(state(READY, retry=1), (E.REQUEUE, E.WAKE))


@pytest.mark.parametrize("status", [WAITING, READY, *FINAL])
def test_a_give_back_of_a_message_not_consuming_changes_nothing(status):
    assert step(state(status), GIVE_BACK, NOW) == Step(state(status))


# -- leases: fenced acks, nacks and extensions ------------------------------------------------------


def test_a_pull_hands_the_message_over_in_its_delivery():
    assert step(state(READY), Pull(NOW + 30_000, DELIVERY), NOW).state.delivery == DELIVERY


@pytest.mark.parametrize(("event", "after"), [(Ack(DELIVERY), ACKED), (Nack(DELIVERY), READY)])
def test_an_ack_or_nack_fenced_by_the_current_delivery_acts_as_one_by_msg_id(event, after):
    held = state(CONSUMING, retry=1, deadline_ms=NOW + 5, delivery=DELIVERY)
    plain = step(held, ACK if after is ACKED else NACK, NOW)
    assert step(held, event, NOW) == plain and plain.state.status is after


@pytest.mark.parametrize("event", [Ack(OTHER), Nack(OTHER), Extend(NOW + 60_000, OTHER, LEASE_MS)])
def test_a_fenced_call_of_another_delivery_is_refused_stale_and_changes_nothing(event):
    held = state(CONSUMING, retry=1, deadline_ms=NOW + 5, delivery=DELIVERY)
    assert step(held, event, NOW) == Step(held, (), Refusal.STALE)


@pytest.mark.parametrize("status", [None, WAITING, READY, *FINAL])
@pytest.mark.parametrize("event", [Ack(DELIVERY), Nack(DELIVERY), Extend(NOW + 60_000, DELIVERY, LEASE_MS)])
def test_a_fenced_call_of_a_message_not_consuming_is_refused_stale(status, event):
    before = None if status is None else state(status, retry=1)
    assert step(before, event, NOW) == Step(before, (), Refusal.STALE)


def test_an_extension_moves_the_deadline_only():
    held = state(CONSUMING, retry=1, deadline_ms=NOW + 5, delivery=DELIVERY)
    done = step(held, Extend(NOW + 60_000, DELIVERY, LEASE_MS), NOW)
    assert done == Step(held._replace(deadline_ms=NOW + 60_000), (E.EXTEND,))


def test_an_extension_may_reach_the_lease_bound_but_not_pass_it():
    held = state(CONSUMING, retry=1, deadline_ms=NOW + 5, delivery=DELIVERY)
    assert step(held, Extend(DELIVERY_MS + LEASE_MS, DELIVERY, LEASE_MS), NOW).refusal is None
    assert step(held, Extend(DELIVERY_MS + LEASE_MS + 1, DELIVERY, LEASE_MS), NOW) == Step(held, (), Refusal.LEASE_CAP)


def test_an_extended_message_times_out_at_its_new_deadline_only():
    held = state(CONSUMING, retry=1, deadline_ms=NOW + 5, delivery=DELIVERY)
    extended = step(held, Extend(NOW + 30_000, DELIVERY, LEASE_MS), NOW).state
    assert step(extended, AckTimeout(NOW + 5), NOW + 5) == Step(extended)  # the old timer: stale
    assert step(extended, AckTimeout(NOW + 30_000), NOW + 30_000).state.status is READY


# -- the table as a whole ------------------------------------------------------------------------

EVENTS: list[Event] = [Send(SENT), Send(SENT, strict=True), RELEASE, Pull(NOW + 1, DELIVERY), ACK, NACK, AckTimeout(NOW),
                       TTL, Delete(), Delete(release=True), Reschedule(NOW + 1), Reschedule(NOW), REDRIVE,
                       GIVE_BACK, Ack(DELIVERY), Ack(OTHER), Nack(DELIVERY), Nack(OTHER),
                       Extend(NOW + 60_000, DELIVERY, LEASE_MS), Extend(NOW + 60_000, OTHER, LEASE_MS),
                       Extend(DELIVERY_MS + LEASE_MS + 1, DELIVERY, LEASE_MS)]


@pytest.mark.parametrize("status", [None, *Status])
def test_every_event_in_every_status_is_answered_and_changes_what_it_says(status):
    """A step that changes the status says so by an effect, a refusal
    changes nothing, and nothing is answered with a state out of the table."""
    before = None if status is None else state(status, retry=1, deadline_ms=NOW,
                                               delivery=DELIVERY if status is CONSUMING else 0)
    for event in EVENTS:
        done = step(before, event, NOW)
        if done.refusal is not None:
            assert done.state == before, (status, event)
            assert set(done.effects) <= {E.RELEASE_ID, E.COUNT_DELETE}, (status, event)
        elif done.state != before and before is not None:
            assert done.effects, (status, event)
            assert done.state.status is not before.status or isinstance(event, (Reschedule, Redrive, Extend)), \
                (status, event)
        if done.state is not None and done.state.status is not CONSUMING:
            assert done.state.deadline_ms in (0, NOW), (status, event)
            assert done.state.delivery == 0, (status, event)  # a delivery is a consuming message's only


def test_the_table_has_a_cell_for_every_event_in_every_column():
    """step is one look-up: an event type or a status the table lacks would
    be a KeyError, not a rule."""
    assert set(TABLE) == set(typing.get_args(Event))
    for row in TABLE.values():
        assert set(row) == {None, *Status}


def test_the_state_of_a_stored_message():
    message = Message("t", "id", "body", NOW - 9, TRIGGER, TTL_MS, 2, 0, "", READY, 1, Location(5, 0))
    assert MessageState.of(message) == state(READY, retry=1)
    assert MessageState.of(message).expire_ms == TRIGGER + TTL_MS


def test_a_send_is_due_at_its_trigger_millisecond_and_not_before():
    """`due`, the rule behind a send's DUE_NOW, is the one step() applies to a send."""
    for trigger in (NOW - 1, NOW, NOW + 1):
        sent = step(None, Send(MessageState.sent(NewMessage("t", "m", "x", NOW, trigger, TTL_MS, 3))), NOW)
        assert (E.DUE_NOW in sent.effects) is due(trigger, NOW) is (trigger <= NOW)
