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
def test_keys_of_a_batch_and_the_keys_present_are_those_one_at_a_time(pairs, data):
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        index = IdIndex.open(directory, 16, lambda hour: True)
        try:
            keys = index.keys_of(pairs)
            assert keys == [index.key(topic, msg_id) for topic, msg_id in pairs]
            stored = data.draw(st.sets(st.sampled_from(keys))) if keys else set()
            for n, key in enumerate(sorted(stored)):
                index.put(key, 490_000, n)
            assert index.present(keys) == stored
            assert {k for k in keys if index.candidates(k)} == stored
        finally:
            index.close()
