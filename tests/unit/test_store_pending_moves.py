"""A message moved (rescheduled) moments ago, its MOVE record appended and
not yet committed, changed again before the commit: deleted, acked, or
moved once more. Each used to fail the store -- the change looked for the
message's topic among pending *sends* only (an InvariantError that made a
cluster leader exit, found by a fault drill: docs/drills.md), and a second
move refused it as "no movable message". Each is checked here before the
commit, after it, and after a reopen."""

from __future__ import annotations

import pytest

from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, StateChange, Store

NOW_MS = 490_000 * MS_PER_HOUR + 1_000


@pytest.fixture
def store(tmp_path):
    s = Store.open(str(tmp_path), now_ms=NOW_MS)
    yield s
    s.close()


def sent(store: Store, msg_id: str = "m", delay_ms: int = 60_000, commit: bool = True):
    result, = store.send([NewMessage("t", msg_id, "x", NOW_MS, NOW_MS + delay_ms, MS_PER_HOUR, 3)], NOW_MS)
    if commit:
        store.commit()
    return result.message


def reopened(store: Store, tmp_path) -> Store:
    store.close()
    return Store.open(str(tmp_path), now_ms=NOW_MS)


@pytest.mark.parametrize("status", [Status.DELETED, Status.READY, Status.ACKED])
def test_a_change_to_a_message_moved_in_the_same_commit(store, tmp_path, status):
    moved, = store.move([(sent(store).location, NOW_MS + 5_000, 2)], NOW_MS)
    store.update([StateChange(moved.location, status, 2)], NOW_MS)  # before the MOVE is committed
    assert store.status(moved.location) is status
    store.commit()
    assert (store.get("t", "m").status, store.get("t", "m").retry) == (status, 2)
    again = reopened(store, tmp_path)
    try:
        m = again.get("t", "m")
        assert (m.status, m.retry, m.location, m.trigger_ms) == (status, 2, moved.location, NOW_MS + 5_000)
    finally:
        again.close()


def test_a_message_moved_twice_before_a_commit(store, tmp_path):
    first, = store.move([(sent(store).location, NOW_MS + 5_000, 0)], NOW_MS)
    second, = store.move([(first.location, NOW_MS + 9_000, 1)], NOW_MS)
    assert second.location != first.location
    assert store.get("t", "m").location == second.location
    store.commit()
    again = reopened(store, tmp_path)
    try:
        m = again.get("t", "m")
        assert (m.location, m.trigger_ms, m.retry, m.status) == (second.location, NOW_MS + 9_000, 1, Status.WAITING)
        assert again.read_message(first.location) is None  # its first new place ended, released
    finally:
        again.close()


def test_a_message_sent_and_moved_in_the_same_commit(store, tmp_path):
    m = sent(store, commit=False)
    moved, = store.move([(m.location, NOW_MS + 7_000, 0)], NOW_MS)
    store.commit()
    again = reopened(store, tmp_path)
    try:
        assert (again.get("t", "m").location, again.get("t", "m").trigger_ms) == (moved.location, NOW_MS + 7_000)
    finally:
        again.close()
