"""Edge cases of storage.commit_log: empty logs, records larger than a
segment, a crash while rolling, delete_before, fsync policies, refusals."""

from __future__ import annotations

import os

import pytest
from corruption import commit_log_frame
from fakes import FaultyDisk

from storage import framing
from storage.commit_log import HEADER_BYTES, CommitLog
from storage.config import FsyncPolicy
from storage.errors import ContractError, CorruptionError, InvalidRequest
from storage.framing import FRAME_HEADER_BYTES

SEGMENT_BYTES = 4096


def open_log(directory, fsync=FsyncPolicy.BATCH, **kwargs) -> CommitLog:
    return CommitLog.open(str(directory), fsync, SEGMENT_BYTES, **kwargs)


def records(directory) -> list[tuple[int, bytes]]:
    log = open_log(directory)
    try:
        return list(log.read_from(log.start_offset))
    finally:
        log.close()


def segment_names(directory) -> list[str]:
    return sorted(os.listdir(directory))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- empty log ------------------------------------------------------------------


def test_a_new_log_is_one_empty_segment_at_offset_zero(tmp_path):
    log = open_log(tmp_path)
    try:
        assert (log.start_offset, log.end_offset) == (0, 0)
        assert list(log.read_from(0)) == []
        with pytest.raises(ContractError, match="outside the log"):
            list(log.read_from(1))
        assert repr(log) == f"CommitLog({str(tmp_path)!r}, segments=1, offsets=[0, 0), fsync=batch)"
    finally:
        log.close()
    assert segment_names(tmp_path) == [f"{0:020d}.log"]
    assert os.path.getsize(tmp_path / f"{0:020d}.log") == SEGMENT_BYTES
    assert records(tmp_path) == []


def test_an_empty_body_is_refused_and_nothing_is_appended(tmp_path):
    # Its frame would be all zeros, which reads as the end of the log.
    log = open_log(tmp_path)
    try:
        log.append(b"a")
        with pytest.raises(InvalidRequest):
            log.append(b"")
        log.append(b"b")
        assert list(log.read_from(0)) == [(0, b"a"), (9, b"b")]
    finally:
        log.close()
    assert records(tmp_path) == [(0, b"a"), (9, b"b")]


def test_a_body_over_the_frame_limit_is_refused(tmp_path, monkeypatch):
    # Reopening would take such a frame for a torn tail and drop it.
    monkeypatch.setattr(framing, "MAX_BODY_BYTES", 100)
    log = open_log(tmp_path)
    try:
        with pytest.raises(InvalidRequest):
            log.append(b"x" * 101)
        assert log.append(b"x" * 100) == 0
    finally:
        log.close()
    assert records(tmp_path) == [(0, b"x" * 100)]


# -- records larger than a segment --------------------------------------------


def test_a_record_larger_than_a_segment_fits_in_the_first_segment(tmp_path):
    big = os.urandom(3 * SEGMENT_BYTES)
    log = open_log(tmp_path)
    try:
        assert log.append(big) == 0
        assert log.append(b"small") == FRAME_HEADER_BYTES + len(big)
    finally:
        log.close()
    assert records(tmp_path) == [(0, big), (FRAME_HEADER_BYTES + len(big), b"small")]
    first, second = segment_names(tmp_path)
    assert os.path.getsize(tmp_path / first) >= HEADER_BYTES + FRAME_HEADER_BYTES + len(big)
    assert int(second[:-4]) == FRAME_HEADER_BYTES + len(big)


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    big = os.urandom(2 * SEGMENT_BYTES)
    log = open_log(tmp_path)
    try:
        offsets = [log.append(b"a" * 100), log.append(big), log.append(b"b" * 100)]
    finally:
        log.close()
    assert offsets == [0, 108, 108 + 8 + len(big)]
    assert [int(name[:-4]) for name in segment_names(tmp_path)] == offsets
    assert records(tmp_path) == list(zip(offsets, [b"a" * 100, big, b"b" * 100]))


def test_a_large_record_after_a_torn_tail_emptied_the_last_segment(tmp_path):
    log = open_log(tmp_path)
    try:
        log.append(b"a" * 4000)
        last = log.append(b"b" * 1000)  # rolls: the only record of segment 2
    finally:
        log.close()
    os.truncate(tmp_path / f"{last:020d}.log", HEADER_BYTES + 3)
    big = os.urandom(2 * SEGMENT_BYTES)
    log = open_log(tmp_path)
    try:
        assert log.end_offset == last
        assert log.append(big) == last
    finally:
        log.close()
    assert records(tmp_path) == [(0, b"a" * 4000), (last, big)]


# -- a crash while rolling ------------------------------------------------------


@pytest.mark.parametrize("size", [0, HEADER_BYTES - 1, SEGMENT_BYTES])
def test_a_newest_segment_never_written_is_dropped(tmp_path, size):
    log = open_log(tmp_path)
    try:
        log.append(b"a" * 100)
        end = log.end_offset
    finally:
        log.close()
    with open(tmp_path / f"{end:020d}.log", "wb") as f:  # created, header not yet written
        f.truncate(size)
    log = open_log(tmp_path)
    try:
        assert log.end_offset == end
        assert log.append(b"b") == end
    finally:
        log.close()
    assert records(tmp_path) == [(0, b"a" * 100), (end, b"b")]


def test_an_only_segment_never_written_gives_an_empty_log(tmp_path):
    (tmp_path / f"{0:020d}.log").write_bytes(b"")
    assert records(tmp_path) == []


def test_a_zeroed_header_over_data_is_refused_not_dropped(tmp_path):
    log = open_log(tmp_path)
    try:
        log.append(b"a" * 100)
    finally:
        log.close()
    path = tmp_path / f"{0:020d}.log"
    with open(path, "r+b") as f:
        f.write(bytes(HEADER_BYTES))
    with pytest.raises(CorruptionError) as caught:
        open_log(tmp_path)
    assert caught.value.path == str(path)
    assert path.exists()


# -- delete_before ------------------------------------------------------------------


def test_delete_before_removes_whole_segments_only(tmp_path):
    log = open_log(tmp_path)
    try:
        offsets = [log.append(bytes([i + 1]) * 2000) for i in range(7)]  # two per segment
        bases = [int(name[:-4]) for name in segment_names(tmp_path)]
        assert bases == [0, offsets[2], offsets[4], offsets[6]]

        assert log.delete_before(0) == 0
        assert log.delete_before(offsets[2] - 1) == 0  # segment 0 ends at offsets[2]
        assert log.delete_before(offsets[3]) == 1
        assert log.start_offset == offsets[2]
        assert [o for o, _ in log.read_from(log.start_offset)] == offsets[2:]
        with pytest.raises(ContractError, match="outside the log"):
            list(log.read_from(0))
        assert log.delete_before(log.end_offset + 1000) == 2  # never the active one
        assert log.start_offset == offsets[6]
    finally:
        log.close()
    assert [int(name[:-4]) for name in segment_names(tmp_path)] == [offsets[6]]
    assert records(tmp_path) == [(offsets[6], bytes([7]) * 2000)]
    log = open_log(tmp_path)
    try:
        assert log.append(b"next") == offsets[6] + 2008
    finally:
        log.close()


# -- fsync policies --------------------------------------------------------------


# The fdatasyncs are counted by the disk the log is opened with.


def test_fsync_always_syncs_every_append(tmp_path):
    disk = FaultyDisk()
    log = open_log(tmp_path, FsyncPolicy.ALWAYS, disk=disk)
    try:
        log.append(b"a")
        log.append(b"b")
        assert disk.fdatasyncs == 2
        log.sync()  # nothing new
        assert disk.fdatasyncs == 2
    finally:
        log.close()


def test_fsync_batch_syncs_on_sync_only(tmp_path):
    disk = FaultyDisk()
    log = open_log(tmp_path, FsyncPolicy.BATCH, disk=disk)
    try:
        log.append(b"a")
        log.append(b"b")
        assert disk.fdatasyncs == 0
        log.sync()
        assert disk.fdatasyncs == 1
        log.append(b"c" * 3000)
        log.append(b"d" * 3000)  # rolls: the sealed segment is synced first
        assert disk.fdatasyncs == 2
        log.sync()
        assert disk.fdatasyncs == 3
    finally:
        log.close()


def test_fsync_never_leaves_syncing_to_the_system(tmp_path):
    disk = FaultyDisk()
    log = open_log(tmp_path, FsyncPolicy.NEVER, disk=disk)
    try:
        log.append(b"a")
        log.sync()
        assert disk.fdatasyncs == 0
    finally:
        log.close()
    assert records(tmp_path) == [(0, b"a")]  # a killed process loses nothing


# -- the tail scan and refusals ---------------------------------------------------------


@pytest.mark.parametrize("scan_from", [0, 9, 10**9])
def test_the_tail_scan_finds_the_end_from_any_start(tmp_path, scan_from):
    log = open_log(tmp_path)
    try:
        log.append(b"a")
        log.append(b"b")
    finally:
        log.close()
    log = open_log(tmp_path, scan_from=scan_from)
    try:
        assert log.end_offset == 18
    finally:
        log.close()


def test_corruption_followed_by_a_256_byte_record_is_refused(tmp_path):
    # A 256-byte body's frame starts with a zero byte; the scan for valid
    # records after a bad frame once skipped it, and the bad frame and the
    # good record after it were both thrown away as a torn tail.
    log = open_log(tmp_path)
    try:
        log.append(b"a" * 100)
        log.append(b"b" * 256)
    finally:
        log.close()
    path = tmp_path / f"{0:020d}.log"
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + FRAME_HEADER_BYTES + 50)
        f.write(b"X")
    with pytest.raises(CorruptionError) as caught:
        open_log(tmp_path)
    assert (caught.value.path, caught.value.offset) == (str(path), HEADER_BYTES)


def test_a_segment_name_that_is_not_an_offset_is_refused(tmp_path):
    open_log(tmp_path).close()
    (tmp_path / "junk.log").write_bytes(b"")
    with pytest.raises(CorruptionError):
        open_log(tmp_path)


def test_a_header_naming_another_base_is_refused(tmp_path):
    open_log(tmp_path).close()
    os.rename(tmp_path / f"{0:020d}.log", tmp_path / f"{5:020d}.log")
    with pytest.raises(CorruptionError) as caught:
        open_log(tmp_path)
    assert caught.value.offset == 8


def test_a_segment_too_short_for_where_the_next_starts_is_refused(tmp_path):
    log = open_log(tmp_path)
    try:
        log.append(b"a" * 3000)
        second = log.append(b"b" * 3000)
    finally:
        log.close()
    os.truncate(tmp_path / f"{0:020d}.log", second - 10)
    with pytest.raises(CorruptionError) as caught:
        open_log(tmp_path)
    assert caught.value.path == str(tmp_path / f"{0:020d}.log")


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_a_refused_open_leaks_no_file_descriptor(tmp_path, bad):
    log = open_log(tmp_path)
    try:
        for _ in range(3):
            log.append(b"a" * 3000)
    finally:
        log.close()
    with open(tmp_path / segment_names(tmp_path)[bad], "r+b") as f:
        f.write(b"XXXX")
    before = open_fds()
    for _ in range(3):
        with pytest.raises(CorruptionError):
            open_log(tmp_path)
    assert open_fds() == before


def test_a_record_far_past_a_hole_is_still_found(tmp_path):
    # The tail scan skips holes and reserved, never-written blocks (SEEK_DATA);
    # a valid record written far beyond them must still be seen, so a zeroed
    # region followed by data is refused rather than dropped as a torn tail.
    segment = 64 * 1024 * 1024
    log = CommitLog.open(str(tmp_path), FsyncPolicy.BATCH, segment)
    try:
        log.append(b"a" * 100)
    finally:
        log.close()
    path = tmp_path / f"{0:020d}.log"
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + FRAME_HEADER_BYTES + 100)
        f.write(b"\xff" * 4)  # a torn frame after the good record
        f.seek(40 * 1024 * 1024)
        f.write(commit_log_frame(str(path), 40 * 1024 * 1024, b"later record"))
    with pytest.raises(CorruptionError) as caught:
        CommitLog.open(str(tmp_path), FsyncPolicy.BATCH, segment)
    assert "valid record follows" in str(caught.value)


# -- record checksums cover the record's position ------------------------------------


def v1_segment(path, base: int, bodies: list[bytes]) -> list[int]:
    """Write a version 1 segment (16-byte header, checksums of the body
    alone), as the engine wrote before version 2; returns the offsets."""
    from storage.commit_log import V1_HEADER

    data = bytearray(V1_HEADER.pack(b"HGCL", 1, 0, base))
    offsets = []
    for body in bodies:
        offsets.append(base + len(data) - V1_HEADER.size)
        data += framing.encode_frame(body)
    path.write_bytes(bytes(data) + bytes(SEGMENT_BYTES - len(data)))
    return offsets


def torn_record_embedding_a_frame(make_inner) -> tuple[bytes, int]:
    """A record body holding a complete frame (built by `make_inner(position
    in body)`), and where in the body that frame ends."""
    prefix = b"msg:" + bytes(range(1, 40))
    inner = make_inner(len(prefix))
    return prefix + inner + b"tail" * 50, len(prefix) + len(inner)


def tear_after(path, position: int, frame_end: int) -> None:
    """Zero [position, frame_end): a record whose last bytes never reached the disk."""
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(bytes(frame_end - position))


def test_a_frame_inside_a_torn_record_does_not_pass_for_a_record(tmp_path):
    # A client's message may hold bytes laid out as a frame. With checksums of
    # the body alone, that copy looked like a valid record after a torn tail,
    # so the tail read as corruption in the middle and the log refused to open.
    log = open_log(tmp_path)
    try:
        first = log.append(b"a" * 100)
        second = log.end_offset
        start = second + FRAME_HEADER_BYTES  # the body's offset
        # As the sender would craft it: a plain frame, and one seeded with the
        # offset it lands at (the sender may guess that, not the salt).
        for make in (lambda at: framing.encode_frame(b"forged"),
                     lambda at: framing.encode_frame(b"forged", framing.frame_seed(0, start + at))):
            body, inner_end = torn_record_embedding_a_frame(make)
            assert log.append(body) == second
            log.close()
            path = tmp_path / f"{0:020d}.log"
            position = HEADER_BYTES + second
            tear_after(path, position + FRAME_HEADER_BYTES + inner_end, position + FRAME_HEADER_BYTES + len(body))
            log = open_log(tmp_path)
            assert log.end_offset == second  # the torn record is dropped, the log opens
            assert list(log.read_from(0)) == [(first, b"a" * 100)]
    finally:
        log.close()


def test_in_a_version_1_segment_the_same_torn_record_was_refused(tmp_path):
    body, inner_end = torn_record_embedding_a_frame(lambda at: framing.encode_frame(b"forged"))
    path = tmp_path / f"{0:020d}.log"
    _, second = v1_segment(path, 0, [b"a" * 100, body])
    position = 16 + second
    tear_after(path, position + FRAME_HEADER_BYTES + inner_end, position + FRAME_HEADER_BYTES + len(body))
    with pytest.raises(CorruptionError, match="valid record follows"):
        open_log(tmp_path)


def test_version_1_segments_are_read_and_appends_go_to_a_version_2_segment(tmp_path):
    bodies = [b"one" * 30, b"two" * 30, b"three" * 30]
    offsets = v1_segment(tmp_path / f"{0:020d}.log", 0, bodies)
    end = offsets[-1] + FRAME_HEADER_BYTES + len(bodies[-1])
    log = open_log(tmp_path, scan_from=offsets[1])
    try:
        assert log.end_offset == end
        assert log.append(b"four") == end
    finally:
        log.close()
    assert segment_names(tmp_path) == [f"{0:020d}.log", f"{end:020d}.log"]
    with open(tmp_path / f"{end:020d}.log", "rb") as f:
        assert f.read(6) == b"HGCL\x02\x00"
    assert records(tmp_path) == list(zip([*offsets, end], [*bodies, b"four"]))


def test_an_empty_version_1_segment_is_replaced_by_a_version_2_one(tmp_path):
    v1_segment(tmp_path / f"{5000:020d}.log", 5000, [])
    log = open_log(tmp_path)
    try:
        assert (log.start_offset, log.end_offset) == (5000, 5000)
        assert log.append(b"x") == 5000
    finally:
        log.close()
    assert segment_names(tmp_path) == [f"{5000:020d}.log"]
    assert records(tmp_path) == [(5000, b"x")]


def test_a_version_2_header_damaged_into_version_1_is_refused(tmp_path):
    log = open_log(tmp_path)
    try:
        log.append(b"a" * 100)
    finally:
        log.close()
    path = tmp_path / f"{0:020d}.log"
    with open(path, "r+b") as f:
        f.seek(4)
        f.write(b"\x01")
    with pytest.raises(CorruptionError) as caught:
        open_log(tmp_path)
    assert (caught.value.path, caught.value.offset) == (str(path), 4)


def test_a_full_disk_while_rolling_leaves_no_segment_behind(tmp_path):
    disk = FaultyDisk()
    log = open_log(tmp_path, disk=disk)
    try:
        log.append(b"a" * 4000)
        disk.full = True
        with pytest.raises(OSError, match="No space left on device"):
            log.append(b"b" * 1000)  # needs a new segment
        assert disk.refused == 1
        assert segment_names(tmp_path) == [f"{0:020d}.log"]
        disk.full = False
        assert log.append(b"b" * 1000) == 4008  # the disk has room again
    finally:
        log.close()
    assert records(tmp_path) == [(0, b"a" * 4000), (4008, b"b" * 1000)]
