"""A commit-log append that fails (a full disk) leaves the store as if the
call had not been made: the next send numbers on without a gap, and the
directory opens again. A send the disk has no room for is refused before
anything is appended. The disk is a FaultyDisk the store is opened with
(storage.disk): full, or short of free space, when the test says so."""

import errno
import os
import re

import pytest
from fakes import FaultyDisk

from storage.config import StoreConfig
from storage.disk_room import DISK_HEADROOM_BYTES, DISK_RECHECK_MARGIN_BYTES, DISK_RECHECK_SENDS
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, StateChange, Store

NOW = 490_000 * MS_PER_HOUR + 5_000
# Commit-log segments smaller than a first record of FIRST_BODY: it grows
# the empty first segment to its own size, so the next append starts a new
# segment -- and asks the disk for its blocks.
SMALL_SEGMENTS = StoreConfig(segment_bytes=4096)
FIRST_BODY = "a" * 10_000
MIB = 1024 * 1024


def message(msg_id: str, delay_ms: int) -> NewMessage:
    return NewMessage("t", msg_id, "body", NOW, NOW + delay_ms, 60_000, 3)


def a_store_whose_next_append_starts_a_segment(path, disk: FaultyDisk) -> Store:
    store = Store.open(str(path), SMALL_SEGMENTS, now_ms=NOW, disk=disk)
    store.send([message("a", 1_000)._replace(msg=FIRST_BODY)], NOW)
    store.commit()
    return store


def test_a_failed_send_leaves_no_gap_and_the_directory_reopens(tmp_path):
    disk = FaultyDisk()
    store = a_store_whose_next_append_starts_a_segment(tmp_path, disk)
    disk.full = True
    with pytest.raises(OSError, match="No space left on device"):
        store.send([message("b", 2_000), message("c", 3 * MS_PER_HOUR)], NOW)  # a new far hour too
    assert disk.refused == 1  # the append's: its new segment's blocks
    assert store.get("t", "b") is None and store.get("t", "c") is None
    disk.full = False
    store.send([message("b", 2_000), message("c", 3 * MS_PER_HOUR)], NOW)
    store.commit()
    store.checkpoint(NOW)
    store.close()
    store = Store.open(str(tmp_path), SMALL_SEGMENTS, now_ms=NOW)
    assert [store.get("t", i).location.global_index for i in "abc"] == [0, 1, 0]
    store.close()


def test_a_failed_update_changes_nothing(tmp_path):
    disk = FaultyDisk()
    store = a_store_whose_next_append_starts_a_segment(tmp_path, disk)
    where = store.get("t", "a").location
    disk.full = True
    with pytest.raises(OSError, match="No space left on device"):
        store.update([StateChange(where, Status.ACKED, 0)], NOW)
    assert disk.refused == 1
    assert store.get("t", "a").status is Status.WAITING
    disk.full = False
    store.close()


def delay_files(path) -> list[str]:
    return sorted(os.listdir(path / "delay"))


@pytest.mark.parametrize("short_of", ["mapped room", "free space"])
def test_a_send_the_disk_has_no_room_for_is_refused_before_it_is_appended(tmp_path, short_of):
    disk = FaultyDisk()
    # Free space within DISK_RECHECK_MARGIN_BYTES: every send reads it (storage.disk_room).
    disk.free = DISK_RECHECK_MARGIN_BYTES // 2 if short_of == "free space" else None
    store = Store.open(str(tmp_path), now_ms=NOW, disk=disk)
    try:
        store.send([message("a", 1_000)], NOW)
        store.commit()
        end, files = store.log_end_offset, delay_files(tmp_path)
        if short_of == "mapped room":  # the near hour's mapped files cannot grow
            disk.full = True
        else:  # the file system is short of what the batch commits the store to write
            disk.free = DISK_HEADROOM_BYTES
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
        assert disk.refused == (1 if short_of == "mapped room" else 0)
        disk.full, disk.free = False, None
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


def test_a_disk_that_fills_after_a_check_is_seen_within_disk_recheck_sends(tmp_path):
    """The free space read by one send is trusted by at most
    DISK_RECHECK_SENDS later ones: a disk filled by someone else is refused
    (ENOSPC, nothing appended) by then."""
    disk = FaultyDisk()
    store = Store.open(str(tmp_path), now_ms=NOW, disk=disk)
    try:
        store.send([message("a", 1_000)], NOW)
        store.commit()
        disk.free = DISK_HEADROOM_BYTES
        for i in range(DISK_RECHECK_SENDS + 1):
            end = store.log_end_offset
            try:
                store.send([message(f"m{i}", 1_000)], NOW)
            except OSError as e:
                assert e.errno == errno.ENOSPC and store.log_end_offset == end  # noqa: PT017 (the send that fails ends the loop)
                break
            store.commit()
        else:
            pytest.fail(f"{DISK_RECHECK_SENDS + 1} sends after the disk filled were all taken")
        assert 1 <= i <= DISK_RECHECK_SENDS
        assert len(disk.free_reads) == 2  # the first send's, and the one that failed
    finally:
        store.close()


def test_growing_a_near_hour_counts_against_the_free_space_seen(tmp_path):
    """A send that grows a near hour's mapped files (they double) spends
    that disk: the free space is read again rather than trusted as seen
    before the growth. The disk reports 1 MiB more than small sends leave
    unread; a send of 600 KB grows the hour's delay log from 64 KiB to
    1 MiB: its record alone would stay within that, with the growth it
    does not."""
    disk = FaultyDisk()
    disk.free = DISK_RECHECK_MARGIN_BYTES + DISK_HEADROOM_BYTES + MIB
    store = Store.open(str(tmp_path), now_ms=NOW, disk=disk)
    try:
        store.send([message("a", 1_000)], NOW)
        store.commit()
        assert len(disk.free_reads) == 1
        store.send([message("b", 1_000)], NOW)  # room enough: the figure seen is trusted
        store.commit()
        assert len(disk.free_reads) == 1
        grown = len(disk.preallocated)
        store.send([message("c", 1_000)._replace(msg="c" * 600_000)], NOW)
        assert disk.preallocated[grown:] == [1 * MIB]  # the delay log, doubled up to 1 MiB at once
        assert len(disk.free_reads) == 2  # 600 KB written and 960 KiB grown of 1 MiB: read again
        store.commit()
        store.send([message("d", 1_000)], NOW)  # trusted again
        assert len(disk.free_reads) == 2
    finally:
        store.close()
