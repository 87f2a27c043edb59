"""Property tests of the checkpoint file format (storage.checkpoint).

The checkpoint is replaced whole and atomically, so it has no torn tail: a
file of any other length than its header says is refused, and so is any
changed byte of its header or body.
"""

from __future__ import annotations

import os
import tempfile
import zlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.checkpoint import HEADER, MAGIC, VERSION, Checkpoint, HourRecord
from storage.errors import CorruptionError

SETTINGS = settings(max_examples=100, deadline=None)
# RAM-backed where there is one: these tests are about formats, not fsync.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

u63 = st.integers(0, 2**63 - 1)
hour_records = st.builds(HourRecord, hour=st.integers(0, 2**24 - 1), entries=st.integers(0, 2**32 - 1),
                         log_bytes=u63, ended=st.integers(0, 2**32 - 1), last_end_ms=u63)
consuming = st.lists(st.tuples(st.integers(0, 2**24 - 1), st.integers(0, 2**32 - 1), u63, st.integers(0, 2**64 - 1)),
                     max_size=20).map(tuple)
checkpoints = st.builds(Checkpoint, commit_offset=st.integers(0, 2**64 - 1),
                        hours=st.lists(hour_records, max_size=20).map(tuple), written_ms=u63,
                        consuming=st.none() | consuming)


@SETTINGS
@given(checkpoints)
def test_round_trip_through_a_file(checkpoint):
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        path = os.path.join(directory, "checkpoint")
        checkpoint.save(path)
        assert Checkpoint.load(path) == checkpoint
        checkpoint.save(path)  # replacing an existing one
        assert Checkpoint.load(path) == checkpoint
        assert os.listdir(directory) == ["checkpoint"]


@SETTINGS
@given(consuming)
def test_a_checkpoint_written_before_deliveries_reads_them_as_0(rows):
    """A file of an older node keeps (hour, globalIndex, deadline) a consuming
    message and no `deliveries`: each one's delivery reads as 0, unknown."""
    checkpoint = Checkpoint(7, (), 9, {}, rows)
    fields = msgpack.unpackb(checkpoint.encode()[HEADER.size:], strict_map_key=False)
    del fields["deliveries"]
    body = msgpack.packb(fields)
    old = HEADER.pack(MAGIC, VERSION, 0, len(body), zlib.crc32(body)) + body
    assert Checkpoint.decode("checkpoint", old).consuming == tuple((h, gi, d, 0) for h, gi, d, _ in rows)


@SETTINGS
@given(checkpoints, st.data())
def test_truncated_checkpoint_is_refused(checkpoint, data):
    encoded = checkpoint.encode()
    cut = data.draw(st.integers(0, len(encoded) - 1), label="bytes kept")
    with pytest.raises(CorruptionError) as caught:
        Checkpoint.decode("checkpoint", encoded[:cut])
    assert caught.value.path == "checkpoint"


@SETTINGS
@given(checkpoints, st.binary(min_size=1, max_size=16))
def test_trailing_bytes_are_refused(checkpoint, extra):
    with pytest.raises(CorruptionError):
        Checkpoint.decode("checkpoint", checkpoint.encode() + extra)


@SETTINGS
@given(checkpoints, st.data())
def test_corrupt_byte_is_refused(checkpoint, data):
    encoded = bytearray(checkpoint.encode())
    # Everything but bytes 6-7, the reserved field, which carries nothing.
    position = data.draw(st.integers(0, len(encoded) - 1).filter(lambda p: p not in (6, 7)), label="byte")
    encoded[position] ^= data.draw(st.integers(1, 255), label="mask")
    with pytest.raises(CorruptionError) as caught:
        Checkpoint.decode("checkpoint", bytes(encoded))
    expected_offset = 0 if position < 4 else 4 if position < 8 else HEADER.size
    assert caught.value.offset == expected_offset
