"""On-disk hash index from (topic, msgId) to a message's location.

Dedup and lookup by id must not keep every id in RAM (10 million ids in a
dict is over a gigabyte), so the index is a set of memory-mapped open-
addressing tables on disk, 64 shards chosen by the key's low bits, each
doubling on its own when 70% full (one shard's rebuild is a short pause,
not the whole table's).

File `ids/<shard:02x>.hix`:

    offset  size  field
    0       4     magic       b"HGID"
    4       2     version     u16 = 1
    6       2     reserved    0
    8       4     slot_count  u32, a power of two
    12      4     crc32       of bytes 0..11
    16 + 16*i     slot i:
                    0  8  key   u64  storage.id_index.key_hash of (topic, msgId); 0 = empty
                    8  8  loc   u64  hour << 40 | globalIndex << 8 | check
                  check = crc32(key, hour, globalIndex) & 0xFF

Linear probing from key & (slot_count - 1). Slots are never emptied: a slot
whose hour has been retired is dead and is reused by the next insert that
passes it (and dropped when the shard doubles). A key is a hash, so several
slots may share one; the store confirms a candidate against the message
body it points to. The index is derived data: after a crash the commit log
replays its inserts, which are idempotent.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from array import array
from collections.abc import Callable

from .entry import Location
from .errors import CorruptionError
from .fileutil import check_header, fsync_dir, preallocate

HEADER = struct.Struct("<4sHHII")
MAGIC = b"HGID"
VERSION = 1
HEADER_BYTES = HEADER.size
SLOT = struct.Struct("<QQ")
SLOT_BYTES = SLOT.size
SHARDS = 64
MAX_LOAD = 0.7
_CHECK = struct.Struct("<QII")


def key_hash(topic: str, msg_id: str) -> int:
    """64-bit key of an id: crc32 in the low half (it picks the slot and
    the shard, and spreads well), adler32 in the high half (so two ids
    rarely share all 64 bits). Not cryptographic: candidates are always
    confirmed against the stored message."""
    data = f"{topic}\0{msg_id}".encode()
    return (zlib.adler32(data) << 32 | zlib.crc32(data)) or 1


def pack_loc(key: int, hour: int, global_index: int) -> int:
    check = zlib.crc32(_CHECK.pack(key, hour, global_index)) & 0xFF
    return hour << 40 | global_index << 8 | check


def unpack_loc(path: str, offset: int, key: int, loc: int) -> Location:
    hour, global_index, check = loc >> 40, (loc >> 8) & 0xFFFFFFFF, loc & 0xFF
    if zlib.crc32(_CHECK.pack(key, hour, global_index)) & 0xFF != check:
        raise CorruptionError(path, offset, "id-index slot checksum mismatch")
    return Location(hour, global_index)


class Shard:
    def __init__(self, path: str, fd: int, mm: mmap.mmap, slot_count: int) -> None:
        self.path = path
        self._fd = fd
        self.mm = mm
        self.slot_count = slot_count
        self.used = 0

    @classmethod
    def create(cls, path: str, slot_count: int) -> Shard:
        tmp = path + ".new"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        size = HEADER_BYTES + slot_count * SLOT_BYTES
        preallocate(fd, size)
        mm = mmap.mmap(fd, size)
        head = struct.pack("<4sHHI", MAGIC, VERSION, 0, slot_count)
        mm[:HEADER_BYTES] = head + struct.pack("<I", zlib.crc32(head))
        return cls(tmp, fd, mm, slot_count)

    @classmethod
    def open(cls, path: str) -> Shard:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            size = os.fstat(f.fileno()).st_size
        _, _, _, slot_count, crc = check_header(path, head, HEADER, MAGIC, VERSION)
        if zlib.crc32(head[:12]) != crc:
            raise CorruptionError(path, 12, "id-index header checksum mismatch")
        if slot_count & (slot_count - 1) or size != HEADER_BYTES + slot_count * SLOT_BYTES:
            raise CorruptionError(path, 8, f"{slot_count} slots do not fit a file of {size} bytes")
        fd = os.open(path, os.O_RDWR)
        shard = cls(path, fd, mmap.mmap(fd, size), slot_count)
        keys = array("Q", shard.mm[HEADER_BYTES:])[::2]
        shard.used = slot_count - keys.count(0)
        return shard

    def publish(self, final_path: str) -> None:
        """Make a freshly built shard the live one, atomically."""
        self.mm.flush()
        os.fsync(self._fd)
        os.replace(self.path, final_path)
        fsync_dir(os.path.dirname(final_path))
        self.path = final_path

    def close(self) -> None:
        self.mm.close()
        os.close(self._fd)


class IdIndex:
    """Maps a 64-bit id key to the locations of messages that may hold it.

    Worked example: put(k, 490000, 7) writes slot k & mask (or the next free
    one); candidates(k) then yields Location(490000, 7) and any other
    location stored under k (another message whose id hashes alike, or an
    older, released message with the same id). `is_live(hour)` tells which
    hours still exist; slots of other hours are dead.

    Cost: O(1) expected per call; memory is the mapped pages touched, which
    `shed()` returns to the page cache after each checkpoint.
    """

    def __init__(self, directory: str, initial_slots: int, is_live: Callable[[int], bool]) -> None:
        self.directory = directory
        self.initial_slots = initial_slots
        self.is_live = is_live
        self.shards: list[Shard] = []

    @classmethod
    def open(cls, directory: str, initial_slots: int, is_live: Callable[[int], bool]) -> IdIndex:
        os.makedirs(directory, exist_ok=True)
        index = cls(directory, initial_slots, is_live)
        existing = [os.path.exists(index._path(n)) for n in range(SHARDS)]
        if any(existing) and not all(existing):
            missing = index._path(existing.index(False))
            raise CorruptionError(missing, 0, "id-index shard is missing while others exist")
        try:
            for n in range(SHARDS):
                path = index._path(n)
                if os.path.exists(path):
                    shard = Shard.open(path)
                else:
                    shard = Shard.create(path, initial_slots)
                    shard.publish(path)
                index.shards.append(shard)
        except BaseException:
            index.close()
            raise
        return index

    def _path(self, n: int) -> str:
        return os.path.join(self.directory, f"{n:02x}.hix")

    def _shard(self, key: int) -> Shard:
        # Bits 26..31: the probe start uses the low bits of a shard of at
        # most 2**26 slots, so the two choices stay independent.
        return self.shards[(key >> 26) & (SHARDS - 1)]

    def candidates(self, key: int) -> list[Location]:
        shard = self._shard(key)
        found = []
        mm, mask, unpack = shard.mm, shard.slot_count - 1, SLOT.unpack_from
        i = key & mask
        while True:
            offset = HEADER_BYTES + i * SLOT_BYTES
            k, loc = unpack(mm, offset)
            if k == 0:
                return found
            if k == key:
                where = unpack_loc(shard.path, offset, k, loc)
                if self.is_live(where.hour):
                    found.append(where)
            i = (i + 1) & mask

    def put(self, key: int, hour: int, global_index: int) -> None:
        """Add (hour, global_index) under `key`; a no-op if that pair is
        already there (replaying the commit log calls this again)."""
        shard = self._shard(key)
        loc = pack_loc(key, hour, global_index)
        mm, mask, unpack = shard.mm, shard.slot_count - 1, SLOT.unpack_from
        reuse = None
        i = key & mask
        while True:
            offset = HEADER_BYTES + i * SLOT_BYTES
            k, slot_loc = unpack(mm, offset)
            if k == 0:
                break
            if k == key and slot_loc == loc:
                return
            if reuse is None and not self.is_live(slot_loc >> 40):
                reuse = offset
            i = (i + 1) & mask
        if reuse is None:
            reuse = offset
            shard.used += 1
        SLOT.pack_into(mm, reuse, key, loc)
        if shard.used > shard.slot_count * MAX_LOAD:
            self._double(shard)

    def _double(self, old: Shard) -> None:
        n = self.shards.index(old)
        new = Shard.create(self._path(n), old.slot_count * 2)
        mask = new.slot_count - 1
        mm = new.mm
        pairs = memoryview(old.mm)[HEADER_BYTES:].cast("Q").tolist()
        for i in range(0, len(pairs), 2):
            key, loc = pairs[i], pairs[i + 1]
            if key == 0 or not self.is_live(loc >> 40):
                continue
            j = key & mask
            while SLOT.unpack_from(mm, HEADER_BYTES + j * SLOT_BYTES)[0]:
                j = (j + 1) & mask
            SLOT.pack_into(mm, HEADER_BYTES + j * SLOT_BYTES, key, loc)
            new.used += 1
        new.publish(self._path(n))
        old.close()
        self.shards[n] = new

    def flush(self) -> None:
        for shard in self.shards:
            shard.mm.flush()

    def shed(self) -> None:
        for shard in self.shards:
            shard.mm.madvise(mmap.MADV_DONTNEED)

    def disk_bytes(self) -> int:
        return sum(HEADER_BYTES + s.slot_count * SLOT_BYTES for s in self.shards)

    def close(self) -> None:
        for shard in self.shards:
            shard.mm.flush()
            shard.close()
        self.shards.clear()

    def __repr__(self) -> str:
        used = sum(s.used for s in self.shards)
        slots = sum(s.slot_count for s in self.shards)
        return f"IdIndex({self.directory!r}, used={used}, slots={slots})"
