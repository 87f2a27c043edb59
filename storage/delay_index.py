"""Hour index: one fixed-size entry per message of the hour, in arrival order.

File `delay/<hour:010d>.idx`:

    offset  size  field
    0       4     magic     b"HGIX"
    4       2     version   u16 = 1
    6       2     reserved  0
    8       8     hour      u64
    16 + 48*g     entry g (g = globalIndex, 0-based)

An entry (48 bytes, little-endian):

    offset  size  field
    0       8     trigger_ms        u64  exact trigger time
    8       4     log_offset8       u32  frame offset in the delay log / 8
    12      4     size              u32  frame length in bytes
    16      4     local_index       u32  ordinal within its second
    20      4     global_index      u32  ordinal within the hour (= g)
    24      4     pre_global_index  u32  previous entry of the same second,
                                         0xFFFFFFFF for the first
    28      4     topic_hash        u32  crc32 of the topic
    32      4     tag_hash          u32  crc32 of the tag, 0 = no tag
    36      2     priority          i16
    38      2     second            u16  second of the hour it is filed under
    40      4     crc32             u32  of bytes 0..39 (they never change)
    44      1     status            u8   1..7 (docs/api.md); changed in place
    45      1     flags             u8   bit 0: released (deleted for good),
                                         bit 1: moved (filed again in a
                                         smaller file, see storage.spans),
                                         bit 2: ended by a pause (status 5,
                                         end reason `paused`: docs/api.md,
                                         "Flow"); 0 in every older entry;
                                         bit 3 (FLAG_END_TIME) is never
                                         in a file: see below
    46      2     retry             u16  changed in place

FLAG_END_TIME marks a status change in a STATE or PART record (and the
pending state it makes) whose time storage.end_index keeps: the end of a
message of a topic with a dedup window, or a duplicate send that window
answered. Applying the change puts the time and stages the entry's flags
without it.

The second is stored because a message sent after its trigger time is filed
under the second it arrived in, not the one its trigger_ms names.
"""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence

from .entry import STATUS_BY_VALUE, IndexEntry, Status
from .errors import CorruptionError, InvariantError

HEADER = struct.Struct("<4sHHQ")
MAGIC = b"HGIX"
VERSION = 1
HEADER_BYTES = HEADER.size

FIXED = struct.Struct("<QIIIIIIIhH")  # bytes 0..39, covered by the crc
ENTRY = struct.Struct("<QIIIIIIIhHIBBH")
MUTABLE = struct.Struct("<BBH")
ENTRY_BYTES = ENTRY.size
MUTABLE_OFFSET = 44
NO_ENTRY = 0xFFFFFFFF
FLAG_RELEASED = 1
FLAG_MOVED = 2
FLAG_PAUSED = 4  # ended by a resume's `expire` (Message.end_reason "paused")
FLAG_END_TIME = 8  # records and pending states only (see the module docstring)

# The fields `count_waiting` reads of an entry (the rest skipped as padding):
# trigger_ms, global_index, topic_hash, second, crc32, status.
_COUNTED = struct.Struct("<Q12xI4xI6xHIB3x")

if not (ENTRY_BYTES == 48 and FIXED.size == 40 and _COUNTED.size == ENTRY_BYTES):
    raise InvariantError(f"index entry layout: {ENTRY_BYTES} bytes, fixed part {FIXED.size}")


def entry_offset(global_index: int) -> int:
    return HEADER_BYTES + global_index * ENTRY_BYTES


def header_bytes(hour: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, hour)


def pack_entry(trigger_ms: int, log_offset8: int, size: int, local_index: int, global_index: int,
               pre_global_index: int, topic_hash: int, tag_hash: int, priority: int, second: int,
               status: int = Status.WAITING, flags: int = 0, retry: int = 0) -> bytes:
    fixed = FIXED.pack(trigger_ms, log_offset8, size, local_index, global_index,
                       NO_ENTRY if pre_global_index < 0 else pre_global_index,
                       topic_hash, tag_hash, priority, second)
    return fixed + struct.pack("<IBBH", zlib.crc32(fixed), status, flags, retry)


def pack_waiting_entries(rows: Iterable[tuple[int, int, int, int, int, int, int, int, int, int]]) -> bytes:
    """`pack_entry` of each row (its first ten arguments, in order), WAITING,
    no flags, retry 0: a commit's new entries, joined, in one call."""
    out = bytearray()
    fixed_pack, tail_pack, crc, waiting = FIXED.pack, _TAIL.pack, zlib.crc32, int(Status.WAITING)
    for trigger_ms, log_offset8, size, local_index, global_index, pre, topic_hash, tag_hash, priority, second in rows:
        fixed = fixed_pack(trigger_ms, log_offset8, size, local_index, global_index, NO_ENTRY if pre < 0 else pre,
                           topic_hash, tag_hash, priority, second)
        out += fixed
        out += tail_pack(crc(fixed), waiting, 0, 0)
    return bytes(out)


_TAIL = struct.Struct("<IBBH")  # crc, status, flags, retry


def count_waiting(path: str, first_global_index: int, raw: bytes, counts: dict[int, list[int]], edges: Sequence[int],
                  statuses: Mapping[int, int]) -> None:
    """Count the WAITING entries of the topics `counts` names among the entries `raw` holds
    (whole entries from `first_global_index` on) by trigger time: entry
    with trigger t adds one to counts[topic][bisect_right(edges, t)].
    `statuses`: globalIndex -> status for changes not in the file yet (the
    pending overlay). Each entry's checksum and place are checked as
    `unpack_entry` checks them; no entry object is made (a topic's delay
    buckets scan spans of millions)."""
    if len(raw) % ENTRY_BYTES:
        raise CorruptionError(path, entry_offset(first_global_index), "a partial index entry")
    crc32, waiting, view = zlib.crc32, int(Status.WAITING), memoryview(raw)
    gi = first_global_index
    for at, (trigger_ms, own_gi, topic_hash, second, crc, status) in enumerate(_COUNTED.iter_unpack(raw)):
        if topic_hash in counts:
            start = at * ENTRY_BYTES
            if crc32(view[start:start + 40]) != crc:
                raise CorruptionError(path, entry_offset(gi), "index entry checksum mismatch")
            if own_gi != gi or not 1 <= status <= 7 or second >= 3600:
                raise CorruptionError(path, entry_offset(gi),
                                      f"index entry {gi} holds globalIndex {own_gi}, status {status}, second {second}")
            if statuses:
                status = statuses.get(gi, status)
            if status == waiting:
                counts[topic_hash][bisect_right(edges, trigger_ms)] += 1
        gi += 1


def unpack_entry(path: str, hour: int, global_index: int, raw: bytes) -> tuple[IndexEntry, int, int, int]:
    """Decode one entry; returns (entry, log_offset8, size, flags).
    Refuses a short entry, a bad checksum, or an entry that is not where it
    says it is."""
    if len(raw) != ENTRY_BYTES:
        raise CorruptionError(path, entry_offset(global_index), f"index entry is {len(raw)} bytes, not {ENTRY_BYTES}")
    (trigger_ms, log_offset8, size, local_index, gi, pre, topic_hash, tag_hash,
     priority, second, crc, status, flags, retry) = ENTRY.unpack(raw)
    if zlib.crc32(raw[:40]) != crc:
        raise CorruptionError(path, entry_offset(global_index), "index entry checksum mismatch")
    if gi != global_index or not 1 <= status <= 7 or second >= 3600:
        raise CorruptionError(path, entry_offset(global_index),
                              f"index entry {global_index} holds globalIndex {gi}, status {status}, second {second}")
    entry = tuple.__new__(IndexEntry, (hour, second, local_index, gi, -1 if pre == NO_ENTRY else pre, trigger_ms,
                                       priority, topic_hash, tag_hash, STATUS_BY_VALUE[status], retry))
    return entry, log_offset8, size, flags
