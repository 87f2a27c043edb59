"""Pending: records appended and not applied, and the overlays that
describe exactly them."""

import gc

import pytest

from storage import records
from storage.commit_log import CommitLog
from storage.entry import Location, Message, Status
from storage.errors import InvariantError
from storage.pending import Pending, pack_state, unpack_state
from storage.types import MAX_RETRY_COUNT

WHERE = Location(490_000, 0)
MESSAGE = Message("t", "a", "x", 0, 0, 0, 0, 0, "", Status.WAITING, 0, WHERE, "")
SEND = records.SendItem(WHERE.hour, WHERE.global_index, -1, 0, 5, 0, 40, 0, 0, 77, 0, 9, b"body")


@pytest.fixture
def pending(tmp_path):
    log = CommitLog.open(str(tmp_path))
    yield Pending(log)
    log.close()


def append_send(pending):
    pending.append(records.encode(records.Kind.SEND, 0, [SEND]), records.Kind.SEND, 0, [SEND], far_bytes=100)
    pending.add_message(SEND.key, MESSAGE)
    pending.set_slot((WHERE.hour, SEND.second), (0, 1))
    pending.set_states({WHERE: (int(Status.READY), 0, 0, 77)})


def test_the_overlays_last_while_any_record_is_held(pending):
    append_send(pending)
    append_send(pending)
    taken = pending.take(1)
    assert len(taken) == 1
    pending.applied(taken)
    assert pending.states and pending.far_bytes == 200 and pending.slot((WHERE.hour, SEND.second)) == (0, 1)
    taken = pending.take(1)
    assert [kind for kind, _, _ in taken] == [records.Kind.SEND]
    pending.applied(taken)
    assert (pending.messages(SEND.key), len(pending.states), pending.far_bytes) == ((), 0, 0)
    assert pending.slot((WHERE.hour, SEND.second)) is None


def test_a_sent_message_is_known_by_its_topic_until_applied(pending):
    append_send(pending)
    assert pending.topic_hash_of(WHERE) == 77
    with pytest.raises(InvariantError):
        pending.topic_hash_of(Location(WHERE.hour, 1))


def test_undoing_puts_the_overlays_back(pending):
    pending.add_message(SEND.key, MESSAGE)
    pending.set_slot((WHERE.hour, 5), (0, 1))
    pending.drop_last_message(SEND.key)
    pending.set_slot((WHERE.hour, 5), None)
    assert pending.messages(SEND.key) == () and pending.slot((WHERE.hour, 5)) is None


@pytest.mark.parametrize("state", [(1, 0, 0, 0), (7, 3, MAX_RETRY_COUNT, 2**32 - 1), (2, 255, 5, -1)])
def test_a_state_is_held_as_it_was_given(pending, state):
    pending.set_states({WHERE: state, Location(2**23 + 5, 2**32 - 1): (3, 1, 2, 9)})
    assert unpack_state(pack_state(state)) == state
    assert pending.states.get(WHERE) == state and pending.states.get((WHERE.hour, WHERE.global_index)) == state
    assert pending.states.get(Location(2**23 + 5, 2**32 - 1)) == (3, 1, 2, 9)
    assert pending.states.get(Location(WHERE.hour, 1)) is None and Location(WHERE.hour, 1) not in pending.states
    assert WHERE in pending.states and len(pending.states) == 2


def test_the_states_are_nothing_the_garbage_collector_walks(pending):
    """A sliced bulk call holds its states until its parts are applied: a
    million of them, which a tracked dict made every full collection walk."""
    pending.set_states({Location(WHERE.hour, gi): (7, 0, 0, 77) for gi in range(1000)})
    gc.collect()
    pending.set_states({Location(WHERE.hour, 1000): (7, 0, 0, 77)})
    assert not gc.is_tracked(pending.states.packed)


def test_an_applied_records_messages_leave_the_ids_while_later_records_pend(pending):
    later_where = Location(WHERE.hour, 1)
    later = SEND._replace(global_index=1)
    append_send(pending)
    pending.append(records.encode(records.Kind.SEND, 0, [later]), records.Kind.SEND, 0, [later])
    pending.add_message(later.key, MESSAGE._replace(location=later_where))
    pending.applied(pending.take(1))
    assert [m.location for m in pending.messages(SEND.key)] == [later_where]  # the first's form let go
    assert pending.states and pending.slot((WHERE.hour, SEND.second)) == (0, 1)  # the rest wait for none
    pending.applied(pending.take(1))
    assert pending.messages(SEND.key) == () and not pending.states
