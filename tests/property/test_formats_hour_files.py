"""Property tests of an hour's three files: delay-log frames
(storage.delay_log), index entries (storage.delay_index) and second-table
slots (storage.second_table), written and read through storage.hour_files.

Each example lays out a random hour the way the store does (consecutive
globalIndexes, per-second preGlobalIndex chains, 8-byte aligned frames),
writes it mapped or plain, closes it, damages a file and reopens it (mapped
or plain again: a mapped open grows a short file with zeros, which must not
hide the damage).
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import pytest
from corruption import xor_byte
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import delay_index, delay_log, second_table
from storage.entry import IndexEntry, Status
from storage.errors import CorruptionError
from storage.framing import encode_frame
from storage.hour_files import HourFiles, hour_paths

HOUR = 490_000
SETTINGS = settings(max_examples=60, deadline=None)
# RAM-backed where there is one: these tests are about formats, not fsync.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

u32 = st.integers(0, 2**32 - 1)


class Msg(NamedTuple):
    second: int
    trigger_ms: int
    priority: int
    topic: str
    msg_id: str
    msg: str
    produce_ms: int
    ttl_ms: int
    max_retry: int
    tag: str
    status: int
    flags: int
    retry: int


messages = st.builds(
    Msg,
    second=st.one_of(st.integers(0, 3), st.integers(0, 3599)),  # few seconds: long chains
    trigger_ms=st.integers(0, 2**64 - 1),
    priority=st.integers(-(2**15), 2**15 - 1),
    topic=st.text(min_size=1, max_size=10),
    msg_id=st.text(min_size=1, max_size=10),
    msg=st.text(max_size=200),
    produce_ms=st.integers(0, 2**63 - 1),
    ttl_ms=st.integers(0, 2**63 - 1),
    max_retry=st.integers(0, 2**16 - 1),
    tag=st.text(max_size=8),
    status=st.integers(1, 7),
    flags=st.integers(0, 255),
    retry=st.integers(0, 2**16 - 1),
)
hours = st.lists(messages, min_size=1, max_size=30)


class Layout(NamedTuple):
    """What an hour's files should hold, computed without the files."""

    entries: list[tuple[IndexEntry, int, int, int]]  # as HourFiles.read_entry returns them
    bodies: list[delay_log.Body]
    frames: bytes  # the delay log after its header
    slots: dict[int, tuple[int, int]]  # second -> (last_global_index, count)


def text_hash(text: str) -> int:
    return zlib.crc32(text.encode())


def lay_out(msgs: list[Msg]) -> Layout:
    entries, bodies, frames, slots = [], [], bytearray(), {}
    for gi, m in enumerate(msgs):
        last, count = slots.get(m.second, (-1, 0))
        body = delay_log.pack_body(m.topic, m.msg_id, m.msg, m.produce_ms, m.ttl_ms, m.max_retry, m.tag)
        frame = encode_frame(body)
        offset8 = len(frames) // delay_log.ALIGN_BYTES
        frames += frame + bytes(delay_log.padded_bytes(len(frame)) - len(frame))
        entry = IndexEntry(HOUR, m.second, count, gi, last, m.trigger_ms, m.priority, text_hash(m.topic),
                           text_hash(m.tag), Status(m.status), m.retry)
        entries.append((entry, offset8, len(frame), m.flags))
        bodies.append(delay_log.Body(m.topic, m.msg_id, m.msg, m.produce_ms, m.ttl_ms, m.max_retry, m.tag))
        slots[m.second] = (gi, count + 1)
    return Layout(entries, bodies, bytes(frames), slots)


def write_hour(directory: str, layout: Layout, mapped: bool) -> None:
    files = HourFiles(directory, HOUR, mapped, create=True)
    packed = []
    for entry, offset8, size, _ in layout.entries:
        packed.append(delay_index.pack_entry(entry.trigger_ms, offset8, size, entry.local_index, entry.global_index,
                                             entry.pre_global_index, entry.topic_hash, entry.tag_hash,
                                             entry.priority, entry.second))
    files.write_frames(0, layout.frames)
    files.write_entries(0, b"".join(packed))
    for second, (last, count) in layout.slots.items():
        files.write_slot(second, last, count)
    for entry, _, _, flags in layout.entries:  # the mutable part, changed in place
        files.write_state_bytes(entry.global_index, delay_index.MUTABLE.pack(int(entry.status), flags, entry.retry))
    files.close(len(layout.entries), len(layout.frames))


@contextmanager
def hour_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        yield directory


@contextmanager
def opened(directory: str, mapped: bool, create: bool = False) -> Iterator[HourFiles]:
    files = HourFiles(directory, HOUR, mapped, create=create)
    try:
        yield files
    finally:
        # Not HourFiles.close: it would cut the files to the sizes it is given.
        for f in (files.log, files.idx, files.sec):
            f.close()


def body_position(offset8: int) -> int:
    return delay_log.HEADER_BYTES + offset8 * delay_log.ALIGN_BYTES


masks = st.integers(1, 255)


# -- round trip -------------------------------------------------------------


@SETTINGS
@given(hours, st.booleans(), st.booleans())
def test_round_trip(msgs, write_mapped, read_mapped):
    layout = lay_out(msgs)
    with hour_dir() as directory:
        write_hour(directory, layout, write_mapped)
        log_path, idx_path, _ = hour_paths(directory, HOUR)
        assert os.path.getsize(log_path) == delay_log.HEADER_BYTES + len(layout.frames)
        assert os.path.getsize(idx_path) == delay_index.entry_offset(len(msgs))
        with opened(directory, read_mapped) as files:
            for gi, (expected, body) in enumerate(zip(layout.entries, layout.bodies)):
                assert files.read_entry(gi) == expected
                _, offset8, size, _ = expected
                assert delay_log.unpack_body(files.read_body(offset8, size)) == body
            for second, (last, count) in layout.slots.items():
                assert files.read_slot(second) == (last, count)
                gi = last
                for local_index in range(count - 1, -1, -1):
                    entry = files.read_entry(gi)[0]
                    assert (entry.second, entry.local_index) == (second, local_index)
                    gi = entry.pre_global_index
                assert gi == -1
            counts = [0] * second_table.SECONDS
            for second, (_, count) in layout.slots.items():
                counts[second] = count
            assert list(files.counts()) == counts
            empty = next(s for s in range(second_table.SECONDS) if s not in layout.slots)
            assert files.read_slot(empty) == (-1, 0)


@SETTINGS
@given(st.integers(0, 2**64 - 1), u32, u32, u32, st.integers(0, 2**32 - 2), st.integers(-1, 2**32 - 2), u32, u32,
       st.integers(-(2**15), 2**15 - 1), st.integers(0, 3599), st.integers(1, 7), st.integers(0, 255),
       st.integers(0, 2**16 - 1))
def test_entry_codec_round_trip(trigger_ms, offset8, size, local, gi, pre, topic_hash, tag_hash, priority, second,
                                status, flags, retry):
    raw = delay_index.pack_entry(trigger_ms, offset8, size, local, gi, pre, topic_hash, tag_hash, priority, second,
                                 status, flags, retry)
    assert len(raw) == delay_index.ENTRY_BYTES
    entry = IndexEntry(HOUR, second, local, gi, pre, trigger_ms, priority, topic_hash, tag_hash, Status(status), retry)
    assert delay_index.unpack_entry("idx", HOUR, gi, raw) == (entry, offset8, size, flags)
    with pytest.raises(CorruptionError):  # an entry read at another globalIndex
        delay_index.unpack_entry("idx", HOUR, gi + 1, raw)


@SETTINGS
@given(st.integers(0, 3599), st.integers(1, 2**32 - 1), st.data())
def test_slot_codec_round_trip(second, count, data):
    last = data.draw(st.integers(count - 1, 2**32 - 1), label="last_global_index")
    raw = second_table.pack_slot(second, last, count)
    assert second_table.unpack_slot("sec", second, raw) == (last, count)
    other = data.draw(st.integers(0, 3599).filter(lambda s: s != second), label="other second")
    with pytest.raises(CorruptionError):  # a slot read at another second
        second_table.unpack_slot("sec", other, raw)


# -- truncated files ----------------------------------------------------------


@SETTINGS
@given(hours, st.booleans(), st.booleans(), st.data())
def test_truncated_index_refuses_the_cut_entries(msgs, write_mapped, read_mapped, data):
    layout = lay_out(msgs)
    with hour_dir() as directory:
        write_hour(directory, layout, write_mapped)
        _, idx_path, _ = hour_paths(directory, HOUR)
        cut = data.draw(st.integers(delay_index.HEADER_BYTES, delay_index.entry_offset(len(msgs)) - 1), label="cut")
        os.truncate(idx_path, cut)
        with opened(directory, read_mapped) as files:
            for gi, expected in enumerate(layout.entries):
                kept = cut - delay_index.entry_offset(gi)
                if kept >= delay_index.ENTRY_BYTES:
                    assert files.read_entry(gi) == expected
                elif read_mapped and kept > delay_index.MUTABLE_OFFSET:
                    # A mapped open grows the file with zeros, so flags and
                    # retry past the cut read as 0; the store refuses an index
                    # shorter than its checkpoint says before mapping it.
                    entry, offset8, size, _ = files.read_entry(gi)
                    assert (entry._replace(retry=0), offset8, size) == (
                        expected[0]._replace(retry=0), expected[1], expected[2])
                else:
                    with pytest.raises(CorruptionError) as caught:
                        files.read_entry(gi)
                    assert (caught.value.path, caught.value.offset) == (idx_path, delay_index.entry_offset(gi))


@SETTINGS
@given(hours, st.booleans(), st.booleans(), st.data())
def test_truncated_delay_log_refuses_the_cut_frames(msgs, write_mapped, read_mapped, data):
    layout = lay_out(msgs)
    with hour_dir() as directory:
        write_hour(directory, layout, write_mapped)
        log_path, _, _ = hour_paths(directory, HOUR)
        cut = data.draw(st.integers(delay_log.HEADER_BYTES, delay_log.HEADER_BYTES + len(layout.frames) - 1))
        os.truncate(log_path, cut)
        with opened(directory, read_mapped) as files:
            for (_, offset8, size, _), body in zip(layout.entries, layout.bodies):
                frame = layout.frames[offset8 * delay_log.ALIGN_BYTES:][:size]
                lost = frame[max(0, cut - body_position(offset8)):]
                # A mapped open grows the file with zeros: a frame that lost
                # only zero bytes reads back whole.
                if not lost or (read_mapped and not any(lost)):
                    assert delay_log.unpack_body(files.read_body(offset8, size)) == body
                else:
                    with pytest.raises(CorruptionError) as caught:
                        files.read_body(offset8, size)
                    assert (caught.value.path, caught.value.offset) == (log_path, body_position(offset8))


@SETTINGS
@given(hours, st.sampled_from(["log", "idx", "sec"]), st.booleans(), st.booleans(), st.data())
def test_truncated_file_is_refused_on_open(msgs, which, read_mapped, create, data):
    """A header cut short, or a second table shorter than its fixed size:
    opening refuses, whether or not the caller asked to create missing files."""
    with hour_dir() as directory:
        write_hour(directory, lay_out(msgs), mapped=False)
        path = dict(zip(["log", "idx", "sec"], hour_paths(directory, HOUR)))[which]
        longest = second_table.FILE_BYTES - 1 if which == "sec" else delay_log.HEADER_BYTES - 1
        os.truncate(path, data.draw(st.integers(0, longest), label="cut"))
        with pytest.raises(CorruptionError) as caught, opened(directory, read_mapped, create=create):
            pass
        assert caught.value.path == path


@SETTINGS
@given(st.integers(0, 3599), st.integers(1, 100), st.integers(0, delay_index.ENTRY_BYTES - 1),
       st.integers(0, second_table.SLOT_BYTES - 1))
def test_short_entry_or_slot_bytes_are_refused(second, count, entry_cut, slot_cut):
    entry = delay_index.pack_entry(1, 2, 3, 0, 5, -1, 7, 8, 9, second)
    with pytest.raises(CorruptionError):
        delay_index.unpack_entry("idx", HOUR, 5, entry[:entry_cut])
    slot = second_table.pack_slot(second, count - 1, count)
    with pytest.raises(CorruptionError):
        second_table.unpack_slot("sec", second, slot[:slot_cut])


# -- corrupted bytes ----------------------------------------------------------


@SETTINGS
@given(hours, st.booleans(), st.data())
def test_corrupt_index_entry_is_refused(msgs, read_mapped, data):
    layout = lay_out(msgs)
    with hour_dir() as directory:
        write_hour(directory, layout, mapped=False)
        _, idx_path, _ = hour_paths(directory, HOUR)
        victim = data.draw(st.integers(0, len(msgs) - 1), label="entry")
        # Bytes 0..43: the fixed part and its crc. Status, flags and retry
        # change in place and are not checksummed.
        position = data.draw(st.integers(0, delay_index.MUTABLE_OFFSET - 1), label="byte")
        xor_byte(idx_path, delay_index.entry_offset(victim) + position, data.draw(masks, label="mask"))
        with opened(directory, read_mapped) as files:
            with pytest.raises(CorruptionError) as caught:
                files.read_entry(victim)
            assert (caught.value.path, caught.value.offset) == (idx_path, delay_index.entry_offset(victim))
            for gi, expected in enumerate(layout.entries):
                if gi != victim:
                    assert files.read_entry(gi) == expected


@SETTINGS
@given(hours, st.booleans(), st.data())
def test_status_out_of_range_is_refused(msgs, read_mapped, data):
    layout = lay_out(msgs)
    with hour_dir() as directory:
        write_hour(directory, layout, mapped=False)
        _, idx_path, _ = hour_paths(directory, HOUR)
        victim = data.draw(st.integers(0, len(msgs) - 1), label="entry")
        status = data.draw(st.integers(0, 255).filter(lambda s: not 1 <= s <= 7), label="status")
        with open(idx_path, "r+b") as f:
            f.seek(delay_index.entry_offset(victim) + delay_index.MUTABLE_OFFSET)
            f.write(bytes([status]))
        with opened(directory, read_mapped) as files, pytest.raises(CorruptionError):
            files.read_entry(victim)


@SETTINGS
@given(hours, st.booleans(), st.data())
def test_corrupt_second_table_slot_is_refused(msgs, read_mapped, data):
    layout = lay_out(msgs)
    with hour_dir() as directory:
        write_hour(directory, layout, mapped=False)
        _, _, sec_path = hour_paths(directory, HOUR)
        # A used second or any other (an empty slot is all zeros and must stay so).
        second = data.draw(st.sampled_from(sorted(layout.slots)) | st.integers(0, 3599), label="second")
        # Bytes 0..11: last, count, crc. Bytes 12..15 are reserved and carry nothing.
        position = data.draw(st.integers(0, 11), label="byte")
        xor_byte(sec_path, second_table.slot_offset(second) + position, data.draw(masks, label="mask"))
        with opened(directory, read_mapped) as files:
            with pytest.raises(CorruptionError) as caught:
                files.read_slot(second)
            assert (caught.value.path, caught.value.offset) == (sec_path, second_table.slot_offset(second))
            for other, slot in layout.slots.items():
                if other != second:
                    assert files.read_slot(other) == slot


@SETTINGS
@given(hours, st.booleans(), st.data())
def test_corrupt_delay_log_frame_is_refused(msgs, read_mapped, data):
    layout = lay_out(msgs)
    with hour_dir() as directory:
        write_hour(directory, layout, mapped=False)
        log_path, _, _ = hour_paths(directory, HOUR)
        victim = data.draw(st.integers(0, len(msgs) - 1), label="frame")
        _, offset8, size, _ = layout.entries[victim]
        position = body_position(offset8) + data.draw(st.integers(0, size - 1), label="byte")
        xor_byte(log_path, position, data.draw(masks, label="mask"))
        with opened(directory, read_mapped) as files:
            with pytest.raises(CorruptionError) as caught:
                files.read_body(offset8, size)
            assert (caught.value.path, caught.value.offset) == (log_path, body_position(offset8))
            for (_, other8, other_size, _), body in zip(layout.entries, layout.bodies):
                if other8 != offset8:
                    assert delay_log.unpack_body(files.read_body(other8, other_size)) == body


@SETTINGS
@given(hours, st.sampled_from(["log", "idx", "sec"]), st.booleans(), st.booleans(), st.data())
def test_corrupt_header_is_refused_on_open(msgs, which, read_mapped, create, data):
    with hour_dir() as directory:
        write_hour(directory, lay_out(msgs), mapped=False)
        path = dict(zip(["log", "idx", "sec"], hour_paths(directory, HOUR)))[which]
        # magic, version, hour; bytes 6-7 are reserved and carry nothing.
        position = data.draw(st.sampled_from([0, 1, 2, 3, 4, 5, *range(8, 16)]), label="byte")
        xor_byte(path, position, data.draw(masks, label="mask"))
        with pytest.raises(CorruptionError) as caught, opened(directory, read_mapped, create=create):
            pass
        assert caught.value.path == path


@given(st.binary(min_size=0, max_size=64), st.binary(min_size=1, max_size=300))
def test_append_frame_writes_the_padded_frame_in_place(before, body):
    """The apply path's in-place writer gives the frame storage.framing
    encodes, zero-padded to padded_bytes, and the size _place reserves for
    it with (size + 7) & ~7."""
    buf = bytearray(before)
    taken = delay_log.append_frame(buf, body)
    frame = encode_frame(body)
    assert bytes(buf) == before + frame + bytes(delay_log.padded_bytes(len(frame)) - len(frame))
    assert bytes(buf[len(before):len(before) + len(frame)]) == frame
    assert taken == len(buf) - len(before) == delay_log.padded_bytes(len(frame)) == (len(frame) + 7) & ~7
    assert taken % delay_log.ALIGN_BYTES == 0 and not any(buf[len(before) + len(frame):])
