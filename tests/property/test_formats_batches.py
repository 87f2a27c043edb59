"""Property tests of the batch forms of the on-disk formats a send uses:
each must write exactly the bytes, and find exactly the keys, that its
one-at-a-time form does (storage.delay_index, storage.delay_log,
storage.id_index)."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from storage import delay_index, delay_log, framing
from storage.id_index import IdIndex

SETTINGS = settings(max_examples=60, deadline=None)
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

u32 = st.integers(0, 2**32 - 2)  # (2**32 - 1 is NO_ENTRY)
rows = st.lists(st.tuples(
    st.integers(0, 2**63 - 1),     # trigger_ms
    u32, u32, u32, u32,            # log_offset8, size, local_index, global_index
    st.integers(-1, 2**32 - 2),    # pre_global_index (-1: none)
    u32, u32,                      # topic_hash, tag_hash
    st.integers(-2**15, 2**15 - 1),  # priority
    st.integers(0, 3599)),         # second
    max_size=20)


@SETTINGS
@given(rows)
def test_waiting_entries_packed_together_are_the_entries_packed_one_by_one(batch):
    assert delay_index.pack_waiting_entries(iter(batch)) == b"".join(delay_index.pack_entry(*row) for row in batch)


@SETTINGS
@given(st.lists(st.binary(max_size=40), max_size=20), st.binary(max_size=9))
def test_frames_appended_together_are_each_body_framed_and_padded(bodies, before):
    """Against storage.framing's own encoding, padded to the log's alignment."""
    together = bytearray(before)
    last = delay_log.append_frames(together, iter(bodies))
    expected, taken = bytearray(before), 0
    for body in bodies:
        frame = framing.encode_frame(body) if body else framing.FRAME_HEADER.pack(0, 0)
        taken = len(frame) + (-len(frame) % delay_log.ALIGN_BYTES)
        expected += frame.ljust(taken, b"\0")
    assert together == expected
    assert last == taken


ids = st.lists(st.tuples(st.sampled_from(["t", "topic-2", "é"]), st.text(min_size=1, max_size=8)), max_size=30)


@SETTINGS
@given(ids, st.data())
def test_keys_of_a_batch_and_those_present_are_those_one_at_a_time(pairs, data):
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        index = IdIndex.open(directory, 16, lambda hour: True)
        try:
            keys, present = index.keys_present(pairs)
            assert keys == [index.key(topic, msg_id) for topic, msg_id in pairs]
            assert present == set()
            stored = data.draw(st.sets(st.sampled_from(keys))) if keys else set()
            for n, key in enumerate(sorted(stored)):
                index.put(key, 490_000, n)
            assert index.keys_present(pairs) == (keys, stored)
            assert {k for k in keys if index.candidates(k)} == stored
        finally:
            index.close()


entries = st.lists(st.tuples(
    st.integers(0, 2**40),            # trigger_ms
    st.sampled_from([7, 8, 9]),       # topic_hash: a few topics
    st.integers(1, 7),                # status
    st.integers(0, 3599)),            # second
    max_size=40)


@SETTINGS
@given(entries, st.lists(st.integers(0, 2**40), max_size=6), st.sets(st.sampled_from([7, 8, 9]), min_size=1),
       st.data())
def test_waiting_entries_counted_by_edges_are_those_unpacked_one_by_one(rows, edges, wanted, data):
    """delay_index.count_waiting against unpack_entry of each entry: the
    WAITING entries of the wanted topics (a pending status overriding the
    file's), each at the number of edges at or before its trigger time."""
    edges = sorted(edges)
    first = data.draw(st.integers(0, 1000))
    raw = b"".join(delay_index.pack_entry(trigger, 0, 0, 0, first + i, -1, topic, 0, 0, second, status)
                   for i, (trigger, topic, status, second) in enumerate(rows))
    statuses = data.draw(st.dictionaries(st.integers(first, first + max(len(rows), 1)), st.integers(1, 7), max_size=5))
    counts = {topic: [0] * (len(edges) + 1) for topic in wanted}
    delay_index.count_waiting("idx", first, raw, counts, edges, statuses)
    expected = {topic: [0] * (len(edges) + 1) for topic in wanted}
    for i in range(len(rows)):
        entry, _, _, _ = delay_index.unpack_entry("idx", 0, first + i, raw[i * 48:(i + 1) * 48])
        status = statuses.get(first + i, int(entry.status))
        if entry.topic_hash in wanted and status == 1:
            expected[entry.topic_hash][sum(1 for edge in edges if edge <= entry.trigger_ms)] += 1
    assert counts == expected


@SETTINGS
@given(st.sampled_from([*range(0, 28), *range(32, 44)]), st.integers(1, 255))
def test_a_counted_entry_with_a_damaged_byte_is_refused(at, flip):
    """A wanted topic's entry with a byte the checksum covers (or the
    checksum itself) damaged is corruption, as unpack_entry says."""
    import pytest

    from storage.errors import CorruptionError
    raw = bytearray(delay_index.pack_entry(123, 0, 0, 0, 0, -1, 7, 0, 0, 5))
    raw[at] ^= flip
    with pytest.raises(CorruptionError):
        delay_index.count_waiting("idx", 0, bytes(raw), {7: [0]}, [], {})
