"""Pending: records appended and not applied, and the overlays that
describe exactly them."""

import pytest

from storage import records
from storage.commit_log import CommitLog
from storage.entry import Location, Message, Status
from storage.errors import InvariantError
from storage.pending import Pending

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
    assert len(pending.take(1)) == 1
    pending.applied()
    assert pending.messages(SEND.key) and pending.states and pending.far_bytes == 200
    assert [kind for kind, _, _ in pending.take(1)] == [records.Kind.SEND]
    pending.applied()
    assert (pending.messages(SEND.key), dict(pending.states), pending.far_bytes) == ((), {}, 0)
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
