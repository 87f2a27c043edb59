"""Property tests of the commit-log format: frames (storage.framing) and
segments (storage.commit_log).

Each example writes a log into a fresh temporary directory with 4 KiB
segments (so a few records roll it), closes it, damages the files the way a
crash or a bad disk would, and reopens the same directory.
"""

from __future__ import annotations

import bisect
import os
import random
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from corruption import xor_byte
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.commit_log import HEADER_BYTES, CommitLog
from storage.config import FsyncPolicy
from storage.errors import CorruptionError
from storage.framing import FRAME_HEADER_BYTES, FrameProblem, decode_frame, encode_frame, find_valid_frame

SEGMENT_BYTES = 4096
SETTINGS = settings(max_examples=75, deadline=None)
# RAM-backed where there is one: these tests are about formats, not fsync.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

# Body sizes that matter to the format: around a frame header, multiples of
# 256 (the length field then starts with a zero byte), around a segment.
EDGE_SIZES = [1, 7, 8, 9, 255, 256, 512, 768, 1024, 4072, 4080, 4096, 5000]


def _sized_body(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


bodies = st.one_of(
    st.binary(min_size=1, max_size=300),
    st.builds(_sized_body, st.sampled_from(EDGE_SIZES), st.integers(0, 2**16)),
)
fsync_policies = st.sampled_from(list(FsyncPolicy))


@contextmanager
def log_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(dir=SCRATCH) as root:
        yield os.path.join(root, "commitlog")


def write_log(directory: str, records: list[bytes], fsync: FsyncPolicy = FsyncPolicy.BATCH) -> list[int]:
    log = CommitLog.open(directory, fsync, SEGMENT_BYTES)
    try:
        return [log.append(body) for body in records]
    finally:
        log.close()


def reopen_and_read(directory: str, scan_from: int = 0) -> tuple[list[tuple[int, bytes]], int]:
    log = CommitLog.open(directory, FsyncPolicy.BATCH, SEGMENT_BYTES, scan_from=scan_from)
    try:
        return list(log.read_from(log.start_offset)), log.end_offset
    finally:
        log.close()


def expected_offsets(records: list[bytes], start: int = 0) -> list[int]:
    offsets = []
    for body in records:
        offsets.append(start)
        start += FRAME_HEADER_BYTES + len(body)
    return offsets


def locate(directory: str, offset: int) -> tuple[str, int]:
    """(segment path, position in that file) of the record at `offset`."""
    bases = sorted(int(name[:-4]) for name in os.listdir(directory) if name.endswith(".log"))
    base = bases[bisect.bisect_right(bases, offset) - 1]
    return os.path.join(directory, f"{base:020d}.log"), offset - base + HEADER_BYTES


def snapshot(directory: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


# -- frames -------------------------------------------------------------------


@SETTINGS
@given(bodies, st.binary(max_size=20), st.binary(max_size=20))
def test_frame_round_trip(body, before, after):
    buf = before + encode_frame(body) + after
    frame = decode_frame(buf, len(before), len(buf))
    assert frame.problem is FrameProblem.OK
    assert bytes(frame.body) == body
    assert frame.next_offset == len(before) + FRAME_HEADER_BYTES + len(body)


@SETTINGS
@given(bodies, st.data())
def test_truncated_frame_is_bad(body, data):
    frame = encode_frame(body)
    cut = data.draw(st.integers(0, len(frame) - 1), label="bytes kept")
    problem = decode_frame(frame[:cut], 0, cut).problem
    assert problem in (FrameProblem.SHORT_HEADER, FrameProblem.TOO_LONG)


@SETTINGS
@given(bodies, st.data())
def test_flipped_frame_is_bad(body, data):
    frame = bytearray(encode_frame(body))
    position = data.draw(st.integers(0, len(frame) - 1), label="position")
    frame[position] ^= data.draw(st.integers(1, 255), label="mask")
    assert decode_frame(frame, 0, len(frame)).problem is not FrameProblem.OK


@SETTINGS
@given(st.lists(bodies, min_size=1, max_size=4), st.integers(0, 300))
def test_find_valid_frame_skips_zeros_to_the_first_frame(records, zeros):
    buf = bytes(zeros) + b"".join(encode_frame(b) for b in records) + bytes(16)
    assert find_valid_frame(buf, 0, len(buf)) == zeros


# -- segments: round trip ---------------------------------------------------


@SETTINGS
@given(st.lists(bodies, max_size=25), fsync_policies)
def test_round_trip_across_segment_rolls(records, fsync):
    with log_dir() as directory:
        offsets = write_log(directory, records, fsync)
        assert offsets == expected_offsets(records)
        got, end = reopen_and_read(directory)
        assert got == list(zip(offsets, records))
        assert end == expected_offsets([*records, b""])[-1]
        for name in os.listdir(directory):
            with open(os.path.join(directory, name), "rb") as f:
                header = f.read(HEADER_BYTES)
            assert header[:4] == b"HGCL"
            assert int.from_bytes(header[8:16], "little") == int(name[:-4])


@SETTINGS
@given(st.lists(bodies, max_size=25), st.data())
def test_read_from_any_record_boundary(records, data):
    with log_dir() as directory:
        offsets = write_log(directory, records)
        boundaries = [*offsets, expected_offsets([*records, b""])[-1]]
        k = data.draw(st.integers(0, len(records)), label="first record read")
        # The boundary doubles as the checkpoint's offset the tail scan starts at.
        log = CommitLog.open(directory, FsyncPolicy.BATCH, SEGMENT_BYTES, scan_from=boundaries[k])
        try:
            assert log.end_offset == boundaries[-1]
            assert list(log.read_from(boundaries[k])) == list(zip(offsets, records))[k:]
        finally:
            log.close()


# -- segments: torn tail ----------------------------------------------------


@SETTINGS
@given(st.lists(bodies, min_size=1, max_size=20), st.sampled_from(["truncate", "zero"]), bodies, st.data())
def test_torn_last_record_is_dropped_and_appending_continues(records, how, new_body, data):
    with log_dir() as directory:
        offsets = write_log(directory, records)
        path, position = locate(directory, offsets[-1])
        frame = encode_frame(records[-1])
        if how == "truncate":
            kept = data.draw(st.integers(1, len(frame) - 1), label="bytes kept")
            os.truncate(path, position + kept)
        else:
            # Zeroing must change something: keep less than the last non-zero byte.
            last_nonzero = len(frame.rstrip(b"\0")) - 1
            kept = data.draw(st.integers(1, last_nonzero), label="bytes kept")
            with open(path, "r+b") as f:
                f.seek(position + kept)
                f.write(bytes(len(frame) - kept))

        # The tail scan starts at the checkpoint's offset: any boundary up to the torn record.
        got, end = reopen_and_read(directory, scan_from=data.draw(st.sampled_from(offsets), label="scan_from"))
        assert got == list(zip(offsets, records))[:-1]
        assert end == offsets[-1]

        log = CommitLog.open(directory, FsyncPolicy.BATCH, SEGMENT_BYTES)
        try:
            assert log.append(new_body) == offsets[-1]
        finally:
            log.close()
        got, _ = reopen_and_read(directory)
        assert got == list(zip(offsets, [*records[:-1], new_body]))


# -- segments: corruption ---------------------------------------------------


@SETTINGS
@given(st.lists(bodies, min_size=2, max_size=20), st.data())
def test_corruption_before_the_last_record_is_refused(records, data):
    with log_dir() as directory:
        offsets = write_log(directory, records)
        victim = data.draw(st.integers(0, len(records) - 2), label="corrupted record")
        path, position = locate(directory, offsets[victim])
        frame_bytes = FRAME_HEADER_BYTES + len(records[victim])
        position += data.draw(st.integers(0, frame_bytes - 1), label="byte in frame")
        xor_byte(path, position, data.draw(st.sampled_from([1 << b for b in range(8)]) | st.integers(1, 255)))
        before = snapshot(directory)

        with pytest.raises(CorruptionError) as caught:
            reopen_and_read(directory)
        assert caught.value.path == path
        assert caught.value.offset == locate(directory, offsets[victim])[1]
        assert snapshot(directory) == before  # refusing changes nothing


@SETTINGS
@given(st.lists(bodies, min_size=1, max_size=12), st.data())
def test_corrupt_segment_header_is_refused(records, data):
    with log_dir() as directory:
        write_log(directory, records)
        names = sorted(os.listdir(directory))
        path = os.path.join(directory, data.draw(st.sampled_from(names), label="segment"))
        # Every header byte is checked: magic, version, then the header crc
        # (reserved bytes, base offset, salt and the crc itself).
        position = data.draw(st.integers(0, HEADER_BYTES - 1), label="byte")
        xor_byte(path, position, data.draw(st.integers(1, 255), label="mask"))

        with pytest.raises(CorruptionError) as caught:
            reopen_and_read(directory)
        assert caught.value.path == path
        assert caught.value.offset == (0 if position < 4 else 4 if position < 6 else 20)
