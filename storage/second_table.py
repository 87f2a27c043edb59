"""Hour second table: for each second of the hour, its last entry and count.

File `delay/<hour:010d>.sec`, fixed size 16 + 3600 * 16 bytes:

    offset  size  field
    0       4     magic     b"HGST"
    4       2     version   u16 = 1
    6       2     reserved  0
    8       8     hour      u64
    16 + 16*s     slot of second s:
                    0   4  last_global_index  u32  newest entry of second s
                    4   4  count              u32  entries in second s
                    8   4  crc32              u32  of bytes 0..7 and s
                    12  4  reserved           0
                  an all-zero slot means an empty second.

Reading second s walks preGlobalIndex back from last_global_index, `count`
steps: cost proportional to that second's messages, never a sort.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Iterable

from .errors import CorruptionError

HEADER = struct.Struct("<4sHHQ")
MAGIC = b"HGST"
VERSION = 1
HEADER_BYTES = HEADER.size
SLOT = struct.Struct("<IIII")
SLOT_BYTES = SLOT.size
SECONDS = 3600
FILE_BYTES = HEADER_BYTES + SECONDS * SLOT_BYTES
_CRC_INPUT = struct.Struct("<IIH")


def header_bytes(hour: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, hour)


def slot_offset(second: int) -> int:
    return HEADER_BYTES + second * SLOT_BYTES


def pack_slot(second: int, last_global_index: int, count: int) -> bytes:
    return packed_slots(((second, (last_global_index, count)),))[0][1]


def packed_slots(slots: Iterable[tuple[int, tuple[int, int]]]) -> list[tuple[int, bytes]]:
    """(slot_offset, pack_slot) of each (second, (last_global_index,
    count)): a flush's writes, in one call."""
    crc, crc_input, pack = zlib.crc32, _CRC_INPUT.pack, SLOT.pack
    packed = []  # (a loop, not a comprehension: one call less a flush)
    for second, (last, count) in slots:
        packed.append((HEADER_BYTES + second * SLOT_BYTES, pack(last, count, crc(crc_input(last, count, second)), 0)))
    return packed


def unpack_slot(path: str, second: int, raw: bytes) -> tuple[int, int]:
    """(last_global_index, count) of second `second`; (-1, 0) when empty."""
    if len(raw) != SLOT_BYTES:
        raise CorruptionError(path, slot_offset(second), f"second-table slot {second} is {len(raw)} bytes")
    last, count, crc, _ = SLOT.unpack(raw)
    if count == 0 and last == 0 and crc == 0:
        return -1, 0
    if zlib.crc32(_CRC_INPUT.pack(last, count, second)) != crc or count == 0 or last + 1 < count:
        raise CorruptionError(path, slot_offset(second), f"second-table slot {second} is corrupt")
    return last, count


def counts(table_bytes: bytes) -> array[int]:
    """Entries per second, 3600 values, straight from the table's bytes."""
    slots = array("I", table_bytes[HEADER_BYTES:FILE_BYTES])
    return slots[1::4]
