"""A commit-log append that fails (a full disk) leaves the store as if the
call had not been made: the next send numbers on without a gap, and the
directory opens again. A send the disk has no room for is refused before
anything is appended."""

import errno
import os
import re

import pytest

from storage import disk_room
from storage.disk import DISK
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
    with pytest.raises(OSError, match="No space left on device"):
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
    with pytest.raises(OSError, match="No space left on device"):
        store.update([StateChange(where, Status.ACKED, 0)], NOW)
    assert store.get("t", "a").status is Status.WAITING
    store.close()


def delay_files(path) -> list[str]:
    return sorted(os.listdir(path / "delay"))


@pytest.mark.parametrize("short_of", ["mapped room", "free space"])
def test_a_send_the_disk_has_no_room_for_is_refused_before_it_is_appended(tmp_path, monkeypatch, short_of):
    store = Store.open(str(tmp_path), now_ms=NOW)
    try:
        store.send([message("a", 1_000)], NOW)
        store.commit()
        end, files = store.log_end_offset, delay_files(tmp_path)
        if short_of == "mapped room":  # the near hour's mapped files cannot grow
            monkeypatch.setattr(os, "posix_fallocate", full_disk)
        else:  # the file system is short of what the batch commits the store to write
            monkeypatch.setattr(DISK, "free_bytes", lambda path: disk_room.DISK_HEADROOM_BYTES)
            monkeypatch.setattr(disk_room, "DISK_RECHECK_SENDS", 0)  # read at this send, not a cached figure
        big = "x" * 100_000
        batch = ([message(f"n{i}", 2_000)._replace(msg=big) for i in range(3)]
                 + [message("far", 3 * MS_PER_HOUR), message("next", MS_PER_HOUR)])  # a new far and near hour
        with pytest.raises(OSError, match=re.escape(f"[Errno {errno.ENOSPC}]")) as caught:
            store.send(batch, NOW)
        assert caught.value.errno == errno.ENOSPC
        assert str(tmp_path) not in str(caught.value)  # its text reaches clients (a 503): the path is the log's
        assert store.log_end_offset == end and store.pending_records == 0  # nothing appended
        assert all(store.get("t", m.msg_id) is None for m in batch)
        assert delay_files(tmp_path) == files  # no hour made for it is left behind
        monkeypatch.undo()
        store.send(batch, NOW)
        store.commit()
        assert [store.get("t", m.msg_id).location.global_index for m in batch] == [1, 2, 3, 0, 0]
    finally:
        store.close()
    store = Store.open(str(tmp_path), now_ms=NOW)
    try:
        assert store.get("t", "n2").msg == "x" * 100_000
    finally:
        store.close()


def full_disk(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_disk_that_fills_after_a_check_is_seen_within_disk_recheck_sends(tmp_path, monkeypatch):
    """The free space read by one send is trusted by at most
    DISK_RECHECK_SENDS later ones: a disk filled by someone else is refused
    (ENOSPC, nothing appended) by then."""
    store = Store.open(str(tmp_path), now_ms=NOW)
    try:
        store.send([message("a", 1_000)], NOW)
        store.commit()
        monkeypatch.setattr(DISK, "free_bytes", lambda path: disk_room.DISK_HEADROOM_BYTES)
        for i in range(disk_room.DISK_RECHECK_SENDS + 1):
            end = store.log_end_offset
            try:
                store.send([message(f"m{i}", 1_000)], NOW)
            except OSError as e:
                assert e.errno == errno.ENOSPC and store.log_end_offset == end  # noqa: PT017 (the send that fails ends the loop)
                break
            store.commit()
        else:
            pytest.fail(f"{disk_room.DISK_RECHECK_SENDS + 1} sends after the disk filled were all taken")
        assert 1 <= i <= disk_room.DISK_RECHECK_SENDS
    finally:
        store.close()


def test_growing_a_near_hour_counts_against_the_free_space_seen(tmp_path, monkeypatch):
    """A send that grows a near hour's mapped files (they double) spends
    that disk: the next send reads the free space again rather than trust
    the figure seen before the growth."""
    from storage.hour_files import HourFiles
    reads = []
    monkeypatch.setattr(DISK, "free_bytes", lambda path: reads.append(path) or 600 * 1024 * 1024)
    store = Store.open(str(tmp_path), now_ms=NOW)
    try:
        store.send([message("a", 1_000)], NOW)
        store.commit()
        assert len(reads) == 1
        store.send([message("b", 1_000)], NOW)  # room enough: the figure seen is trusted
        store.commit()
        assert len(reads) == 1
        sizes = iter([0, 500 * 1024 * 1024])  # before and after reserve: a growth of 500 MiB
        monkeypatch.setattr(HourFiles, "mapped_bytes", lambda self: next(sizes))
        store.send([message("c", 1_000)], NOW)
        store.commit()
        monkeypatch.undo()
        monkeypatch.setattr(DISK, "free_bytes", lambda path: reads.append(path) or 600 * 1024 * 1024)
        store.send([message("d", 1_000)], NOW)  # 500 MiB spent of 600: read again
        assert len(reads) == 2
    finally:
        store.close()
