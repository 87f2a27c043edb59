"""The ack deadline of a CONSUMING message rides in its status record, so a
store that applied the record (a follower, or a reopened store replaying
it) knows when to redeliver; any later status forgets it."""

from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, StateChange, Store

NOW = 490_000 * MS_PER_HOUR


def test_deadline_kept_through_replay_and_forgotten_after_ack(tmp_path):
    store = Store.open(str(tmp_path), now_ms=NOW)
    (sent,) = store.send([NewMessage("t", "a", "x", NOW, NOW, 60_000, 3)], NOW)
    store.commit()
    where = sent.message.location
    store.update([StateChange(where, Status.READY, 0)], NOW)
    store.update([StateChange(where, Status.CONSUMING, 0, deadline_ms=NOW + 4_000)], NOW)
    assert store.ack_deadline(where) is None  # not before it is applied
    store.commit()
    assert store.ack_deadline(where) == NOW + 4_000
    store.close()
    store = Store.open(str(tmp_path), now_ms=NOW)  # replayed from the commit log
    assert store.ack_deadline(where) == NOW + 4_000
    store.update([StateChange(where, Status.ACKED, 0)], NOW)
    store.commit()
    assert store.ack_deadline(where) is None
    store.close()
