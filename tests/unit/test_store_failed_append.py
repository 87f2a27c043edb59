"""A commit-log append that fails (a full disk) leaves the store as if the
call had not been made: the next send numbers on without a gap, and the
directory opens again."""

import errno

import pytest

from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, StateChange, Store

NOW = 490_000 * MS_PER_HOUR + 5_000


def message(msg_id: str, delay_ms: int) -> NewMessage:
    return NewMessage("t", msg_id, "body", NOW, NOW + delay_ms, 60_000, 3)


def fail_next_append(store, monkeypatch):
    real = store.log.append

    def append(body):
        monkeypatch.setattr(store.log, "append", real)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.log, "append", append)


def test_a_failed_send_leaves_no_gap_and_the_directory_reopens(tmp_path, monkeypatch):
    store = Store.open(str(tmp_path), now_ms=NOW)
    store.send([message("a", 1_000)], NOW)
    store.commit()
    fail_next_append(store, monkeypatch)
    with pytest.raises(OSError):
        store.send([message("b", 2_000), message("c", 3 * MS_PER_HOUR)], NOW)  # a new far hour too
    assert store.get("t", "b") is None and store.get("t", "c") is None
    store.send([message("b", 2_000), message("c", 3 * MS_PER_HOUR)], NOW)
    store.commit()
    store.checkpoint(NOW)
    store.close()
    store = Store.open(str(tmp_path), now_ms=NOW)
    assert [store.get("t", i).location.global_index for i in "abc"] == [0, 1, 0]
    store.close()


def test_a_failed_update_changes_nothing(tmp_path, monkeypatch):
    store = Store.open(str(tmp_path), now_ms=NOW)
    store.send([message("a", 0)], NOW)
    store.commit()
    where = store.get("t", "a").location
    fail_next_append(store, monkeypatch)
    with pytest.raises(OSError):
        store.update([StateChange(where, Status.ACKED, 0)], NOW)
    assert store.get("t", "a").status is Status.WAITING
    store.close()
