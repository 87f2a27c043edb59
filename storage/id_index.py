"""On-disk hash index from (topic, msgId) to a message's location.

Dedup and lookup by id must not keep every id in RAM (10 million ids in a
dict is over a gigabyte), so the index is a set of memory-mapped open-
addressing tables on disk, 64 shards, each doubling on its own when 70%
full (one shard's rebuild is a short pause, not the whole table's).

Clients choose the ids, so the hash is keyed: an id's 64-bit key is
BLAKE2b(topic, msgId) under a random secret made with the index and kept in
its directory. Without the secret nobody can choose ids that share a shard
or a probe sequence, so nobody can make inserts cost more than their share.
(BLAKE2b is a keyed PRF, about 0.7 us an id here; seeded XXH3 is ten times
faster but its seed does not hide collisions: fixed input pairs are known
that collide for about one seed in 1,400, xxHash issue 1127.)

Directory `ids/`:

    secret            the hash key; written last, so its presence means
                      every shard is there
    <shard:02x>.hix   shard n holds the keys whose top 6 bits are n

File `ids/secret`, written once, atomically (write, fsync, rename):

    offset  size  field
    0       4     magic     b"HGIS"
    4       2     version   u16 = 1
    6       2     reserved  0
    8       32    secret    random bytes, the BLAKE2b key
    40      4     crc32     of bytes 0..39

File `ids/<shard:02x>.hix` (version 2):

    offset  size  field
    0       4     magic       b"HGID"
    4       2     version     u16 = 2
    6       2     reserved    0
    8       4     slot_count  u32, a power of two >= 16
    12      4     secret_tag  u32, crc32 of the secret: a shard of another
                              index (another secret) is refused
    16      44    zero
    60      4     crc32       of bytes 0..59
    64 + 16*i     slot i:
                    0  8  key   u64  IdIndex.key(topic, msgId); 0 = empty
                    8  8  loc   u64  hour << 40 | globalIndex << 8 | check
                  check = crc32(key, hour, globalIndex) & 0xFF

Probing: slots come in groups of 4 (64 bytes, one cache line). A key's
probe sequence visits group `key & mask`, then steps by an odd stride taken
from the key's bits 32 and up (double hashing: two keys that start in the
same group part ways after it), reading each group's 4 slots in order. A
lookup stops at the first empty slot. An insert takes the first slot of its
sequence that is empty or dead: of a retired hour, or of a released message
under the same key (an id deleted and sent again reuses its slot, so
sending and deleting one id over and over does not grow a run of equal
keys). Slots are never emptied; dead ones are dropped when the shard
doubles.

Bounded probing: an insert that has read MAX_PROBE_SLOTS slots without
reaching an empty one doubles its shard (dropping dead slots) and tries
again, whatever the load. Only equal keys can defeat that (a doubling
cannot part them; without the secret nobody can make them); a shard less
than a quarter full therefore probes on instead of doubling: its long run
is of one key, whose messages are all candidates of a lookup anyway. On a
full disk a doubling is skipped (the shard keeps working, at most 70% full)
and tried again by the next insert.

A key is a hash, so several slots may share one; the store confirms a
candidate against the message body it points to. The index is derived
data: after a crash the commit log replays its inserts, which are
idempotent. An index that is missing or older than the keyed hash (version
1 shards, no `secret`: CRC32 keys, linear probing) is rebuilt by the store
from its delay logs: made in `ids.new/`, its secret written last, then
swapped in by rename (`IdIndex.build`, `publish`).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence

from .disk import DISK, Disk
from .entry import Location
from .errors import ContractError, CorruptionError, InvariantError, NewerFormatError
from .fileutil import atomic_write, check_header, create_file, fsync_dir, make_dir, map_file, write_in_pieces

HEADER = struct.Struct("<4sHHII44xI")
MAGIC = b"HGID"
VERSION = 2
HEADER_BYTES = HEADER.size
SLOT = struct.Struct("<QQ")
SLOT_BYTES = SLOT.size
GROUP_SLOTS = 4
# Bytes a shard's opening reads at a time to count its slots in use (whole slots).
OPEN_READ_BYTES = 1 << 20
GROUP = struct.Struct("<8Q")
GROUP_BYTES = GROUP.size
SHARDS = 64
SHARD_SHIFT = 58  # 64 - log2(SHARDS)
MAX_LOAD = 0.7
MAX_PROBE_SLOTS = 64
MIN_LOAD_TO_GROW = 0.25  # below it, a run too long is of equal keys: probing on beats doubling
# A doubling fills its new shard a slice of this many bytes of groups at a
# time (`_fill_in_slices`), and reads the old one so many bytes at a time:
# the RAM it holds.
DOUBLING_SLICE_BYTES = 2 << 20
DOUBLING_READ_BYTES = 256 << 10
# Resident pages between sheds: a store's indexes (id, key, end) share one
# budget, SHED_ABOVE_BYTES (--index-resident-mb; `Residency`). Once their
# files together are larger, each index sheds its mapped pages (`shed`)
# once it made as many lookups and inserts since the last shed as half its
# share of the budget (a third of it) has pages, at most SHED_EVERY_CALLS
# and at least SHED_MIN_CALLS (a shed is a madvise a shard, 64 system
# calls) -- each touches a page or two. A batch's look-ups (`keys_present`)
# shed first when they would pass that count, and its inserts (`put_many`,
# of the same keys: their pages still resident) after: so about one
# batch's pages, or that count's, stay resident however fast ids come (a
# checkpoint's shed, every second, would let a busy index hold a second's
# pages: 100s of MB at 10,000 ids a second). Smaller indexes stay
# resident: their pages cost at most SHED_ABOVE_BYTES together.
SHED_EVERY_CALLS = 1024
SHED_MIN_CALLS = 256
SHED_ABOVE_BYTES = 8 << 20
RESIDENCY_SHARES = 3  # the indexes a store may have: ids, keys, ends
# A read of a page not mapped yet maps its neighbours too (the kernel's
# fault-around: 64 kB a read on Linux), so a large index's random probes
# would each make 16 pages resident. Above SHED_ABOVE_BYTES each probe
# first maps its group's page alone, writable (madvise MADV_POPULATE_WRITE,
# Linux 5.14+; a write fault maps one page): some 1 us a probe, paid only
# by an index that large. Elsewhere (or refused) probes read as they are.
MADV_POPULATE_WRITE = 23
PAGE_BYTES = mmap.PAGESIZE
PAGE_MASK = ~(PAGE_BYTES - 1)
_CHECK = struct.Struct("<QII")
_TOPIC_LENGTH = struct.Struct("<I")

SECRET = struct.Struct("<4sHH32sI")
SECRET_MAGIC = b"HGIS"
SECRET_VERSION = 1
SECRET_BYTES = 32
SECRET_FILE = "secret"

if not (HEADER_BYTES == 64 and GROUP_BYTES == GROUP_SLOTS * SLOT_BYTES):
    raise InvariantError(f"id index layout: header {HEADER_BYTES} bytes, group {GROUP_BYTES}")


def pack_loc(key: int, hour: int, global_index: int) -> int:
    check = zlib.crc32(_CHECK.pack(key, hour, global_index)) & 0xFF
    return hour << 40 | global_index << 8 | check


def unpack_loc(path: str, offset: int, key: int, loc: int) -> Location:
    hour, global_index, check = loc >> 40, (loc >> 8) & 0xFFFFFFFF, loc & 0xFF
    if zlib.crc32(_CHECK.pack(key, hour, global_index)) & 0xFF != check:
        raise CorruptionError(path, offset, "id-index slot checksum mismatch")
    return Location(hour, global_index)


def probe_start(key: int, group_mask: int) -> tuple[int, int]:
    """(first group, stride) of `key`'s probe sequence in a shard of
    group_mask + 1 groups. The stride is odd, so the sequence visits every
    group (the group count is a power of two). Keys whose low bits are 0
    all start in group 0: the tests' worst keys."""
    return key & group_mask, ((key >> 32) & group_mask) | 1


# -- the secret -------------------------------------------------------------------


def encode_secret(secret: bytes) -> bytes:
    head = SECRET.pack(SECRET_MAGIC, SECRET_VERSION, 0, secret, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


def read_secret(path: str) -> bytes:
    """The secret stored at `path`; refuses a damaged file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != SECRET.size:
        raise CorruptionError(path, 0, f"file is {len(data)} bytes, expected {SECRET.size}")
    secret: bytes
    _, _, _, secret, crc = check_header(path, data, SECRET, SECRET_MAGIC, SECRET_VERSION)
    if zlib.crc32(data[:-4]) != crc:
        raise CorruptionError(path, SECRET.size - 4, "secret checksum mismatch")
    return secret


def _secret_is_whole(path: str) -> bool:
    try:
        read_secret(path)
    except NewerFormatError:  # not damage: refused, never rebuilt
        raise
    except (OSError, CorruptionError):
        return False
    return True


# -- one shard ----------------------------------------------------------------------


class Shard:
    """One shard file, mapped. It keeps no descriptor open (a mapping
    outlives the descriptor it was made from): a data directory's indexes
    cost no descriptors the node could give connections; `fsync` opens
    one for the moment it takes."""

    def __init__(self, path: str, mm: mmap.mmap, slot_count: int) -> None:
        self.path = path
        self.mm = mm
        self.slot_count = slot_count
        self.group_mask = slot_count // GROUP_SLOTS - 1
        self.used = 0

    @classmethod
    def create(cls, path: str, slot_count: int, secret_tag: int, disk: Disk) -> Shard:
        """A new, empty shard at `path`.new (see `publish`), its blocks
        reserved through `disk`. A full disk raises OSError and leaves no
        file."""
        tmp = path + ".new"
        fd = create_file(tmp, os.O_RDWR | os.O_TRUNC)
        size = HEADER_BYTES + slot_count * SLOT_BYTES
        try:
            disk.preallocate(fd, size)
            mm = map_file(fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        head = HEADER.pack(MAGIC, VERSION, 0, slot_count, secret_tag, 0)[:-4]
        mm[:HEADER_BYTES] = head + struct.pack("<I", zlib.crc32(head))
        return cls(tmp, mm, slot_count)

    @classmethod
    def open(cls, path: str, secret_tag: int) -> Shard:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
            size = os.fstat(f.fileno()).st_size
            _, _, _, slot_count, tag, crc = check_header(path, head, HEADER, MAGIC, VERSION)
            if zlib.crc32(head[:-4]) != crc:
                raise CorruptionError(path, HEADER_BYTES - 4, "id-index header checksum mismatch")
            if tag != secret_tag:
                raise CorruptionError(path, 12, "shard was made under another secret")
            if slot_count < 16 or slot_count & (slot_count - 1) or size != HEADER_BYTES + slot_count * SLOT_BYTES:
                raise CorruptionError(path, 8, f"{slot_count} slots do not fit a file of {size} bytes")
            # The slots in use, counted from the file read a slice at a time,
            # not through the mapping: the pages stay in the page cache, out
            # of the process's RSS, until a look-up touches them (10,000,000
            # ids: 240 MB of mapped pages otherwise resident after a restart).
            # (read without read-ahead: a cold file's pages come in as small
            # folios, not large ones a probe would later map whole: map_file)
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
            empty = 0
            while chunk := f.read(OPEN_READ_BYTES):
                empty += array("Q", chunk)[::2].count(0)
        fd = os.open(path, os.O_RDWR)
        try:
            mm = map_file(fd, size)
        finally:
            os.close(fd)
        shard = cls(path, mm, slot_count)
        shard.used = slot_count - empty
        return shard

    def publish(self, final_path: str, durable: bool = True) -> None:
        """Make a freshly built shard the live one, atomically (`durable`:
        fsync'ed first, and its directory after)."""
        if durable:
            self.fsync()
        os.replace(self.path, final_path)
        if durable:
            fsync_dir(os.path.dirname(final_path))
        self.path = final_path

    def fsync(self) -> None:
        """Its mapped pages written, and the file made durable."""
        self.mm.flush()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.mm.close()


# -- the index -----------------------------------------------------------------------


class Residency:
    """The budget of resident index pages a store's indexes share
    (--index-resident-mb): while their files together are no larger, every
    page they touch stays resident (shed at each checkpoint); once larger,
    each of them sheds its pages as it works (`IdIndex._touched`). An index
    made alone has a budget of its own."""

    def __init__(self, budget_bytes: int = SHED_ABOVE_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._indexes: list[IdIndex] = []

    def join(self, index: IdIndex) -> None:
        self._indexes.append(index)

    def leave(self, index: IdIndex) -> None:
        self._indexes = [i for i in self._indexes if i is not index]

    def over(self) -> bool:
        """Whether the indexes' files together are larger than the budget."""
        return sum(index.disk_bytes() for index in self._indexes) > self.budget_bytes

    def shed_every_calls(self) -> int:
        """An index's calls between sheds: half its share's pages, within bounds."""
        share = self.budget_bytes // RESIDENCY_SHARES
        return min(SHED_EVERY_CALLS, max(SHED_MIN_CALLS, share // PAGE_BYTES // 2))


class IdIndex:
    """Maps a 64-bit id key to the locations of messages that may hold it.

    Worked example: put(k, 490000, 7) writes the first free slot of k's
    probe sequence; candidates(k) then yields Location(490000, 7) and any
    other location stored under k (another message whose id hashes alike, or
    an older, released message with the same id whose slot was not reused
    yet). `is_live(hour)` tells which hours still exist; slots of other hours
    are dead. `is_released(hour, global_index)` tells whether a message was
    deleted for good (read only for slots of the key being inserted).

    Cost: O(1) expected per call, at most MAX_PROBE_SLOTS slots read per
    insert before the shard grows; `probes` counts every slot read. Memory
    is the mapped pages touched, which `shed()` returns to the page cache
    after each checkpoint, and every `shed_every_calls` calls once the
    store's indexes are larger than their `residency`'s budget (`_touched`).
    """

    def __init__(self, directory: str, initial_slots: int, is_live: Callable[[int], bool], secret: bytes,
                 is_released: Callable[[int, int], bool] | None = None, disk: Disk = DISK,
                 residency: Residency | None = None) -> None:
        self.directory = directory
        self.disk = disk  # what a new shard reserves its blocks through (storage.disk)
        self.initial_slots = initial_slots
        self.is_live = is_live
        self.is_released = is_released or (lambda hour, global_index: False)
        self._checks_released = is_released is not None  # (the key index does not: storage.key_index)
        self.shards: list[Shard] = []
        self.probes = 0  # slots read by put and candidates, for tests and metrics
        self.sheds = 0  # sheds of its pages, for tests
        # (--index-resident-mb: the budget above which the store's indexes keep their pages out of RSS)
        self.residency = Residency() if residency is None else residency
        self.residency.join(self)
        self.shed_every_calls = self.residency.shed_every_calls()
        self._calls = 0  # lookups and inserts since the last shed
        self._paged = False  # each probe maps its page alone first (large: MADV_POPULATE_WRITE)
        self._can_page = sys.platform.startswith("linux")  # (False once the kernel refused it)
        self._secret = secret
        self._secret_tag = zlib.crc32(secret)
        self._hasher = hashlib.blake2b(key=secret, digest_size=8)

    # -- keys ---------------------------------------------------------------------

    def key(self, topic: str, msg_id: str) -> int:
        """The 64-bit key of (topic, msgId) under this index's secret (never 0)."""
        return self.key_of_bytes(topic.encode(), msg_id.encode())


    def key_of_bytes(self, topic: bytes, msg_id: bytes) -> int:
        """As `key`, from the UTF-8 bytes (the topic's length is hashed too,
        so ("ab", "c") and ("a", "bc") differ)."""
        h = self._hasher.copy()
        h.update(_TOPIC_LENGTH.pack(len(topic)) + topic + msg_id)
        return int.from_bytes(h.digest(), "little") or 1

    # -- opening, building, publishing ------------------------------------------------

    @staticmethod
    def is_current(directory: str) -> bool:
        """True if `directory` holds a complete index of this version (after
        finishing a swap a crash interrupted); False if it is missing or
        older (the store then rebuilds it, see `build`)."""
        _finish_publish(directory)
        return os.path.exists(os.path.join(directory, SECRET_FILE))

    @classmethod
    def open(cls, directory: str, initial_slots: int, is_live: Callable[[int], bool],
             is_released: Callable[[int, int], bool] | None = None, disk: Disk = DISK,
             residency: Residency | None = None) -> IdIndex:
        """Open the index in `directory`, creating an empty one if there is
        none. Refuses an index older than the keyed hash (rebuild it with
        `build` from the messages it should hold)."""
        if not cls.is_current(directory):
            if os.path.isdir(directory) and any(n.endswith(".hix") for n in os.listdir(directory)):
                raise CorruptionError(directory, 0, "id index from before the keyed hash (no secret): rebuild it")
            index = cls.build(directory, initial_slots, is_live, is_released, disk, residency)
            index.publish()
            return index
        secret = read_secret(os.path.join(directory, SECRET_FILE))
        index = cls(directory, initial_slots, is_live, secret, is_released, disk, residency)
        try:
            for n in range(SHARDS):
                path = index._path(n)
                if not os.path.exists(path):
                    raise CorruptionError(path, 0, "id-index shard is missing")
                index.shards.append(Shard.open(path, index._secret_tag))
        except BaseException:
            index.close()
            raise
        return index

    @classmethod
    def build(cls, directory: str, initial_slots: int, is_live: Callable[[int], bool],
              is_released: Callable[[int, int], bool] | None = None, disk: Disk = DISK,
             residency: Residency | None = None) -> IdIndex:
        """A new, empty index with a new secret, made in `directory`.new:
        fill it with `put`, then `publish()` it in place of `directory`."""
        building = directory + ".new"
        if os.path.exists(building):
            shutil.rmtree(building)
        make_dir(building)
        index = cls(building, initial_slots, is_live, os.urandom(SECRET_BYTES), is_released, disk, residency)
        try:
            for n in range(SHARDS):
                shard = Shard.create(index._path(n), initial_slots, index._secret_tag, disk)
                shard.publish(index._path(n), durable=False)  # made durable by `publish`
                index.shards.append(shard)
        except BaseException:
            index.close()
            raise
        return index

    def publish(self) -> None:
        """Make a built index durable and the live one: fsync every shard,
        write the secret last (its presence means complete), then swap the
        directory in by rename; a crash at any point leaves the old index or
        the new one (`is_current` finishes an interrupted swap)."""
        if not self.directory.endswith(".new"):
            raise ContractError(f"{self.directory} is not an index being built")
        final = self.directory[:-len(".new")]
        for shard in self.shards:
            shard.fsync()
        fsync_dir(self.directory)
        atomic_write(os.path.join(self.directory, SECRET_FILE), encode_secret(self._secret))
        _finish_publish(final)
        self.directory = final
        for n, shard in enumerate(self.shards):
            shard.path = self._path(n)

    def _path(self, n: int) -> str:
        return os.path.join(self.directory, f"{n:02x}.hix")

    def _shard(self, key: int) -> Shard:
        return self.shards[key >> SHARD_SHIFT]

    # -- lookups and inserts ------------------------------------------------------------

    def candidates(self, key: int) -> list[Location]:
        """The live locations stored under `key` (another message's whose id
        hashes alike among them: the caller compares the ids)."""
        self._touched(1)
        shard = self.shards[key >> SHARD_SHIFT]
        found: list[Location] = []
        mm, unpack, is_live, mask = shard.mm, GROUP.unpack_from, self.is_live, shard.group_mask
        paged = self._paged
        group, stride = probe_start(key, mask)
        probes = 0
        while True:
            base = HEADER_BYTES + group * GROUP_BYTES
            if paged:
                mm.madvise(MADV_POPULATE_WRITE, base & PAGE_MASK, PAGE_BYTES)
            slots = unpack(mm, base)
            for i in range(0, 8, 2):
                probes += 1
                k = slots[i]
                if k == 0:
                    self.probes += probes
                    return found
                if k == key:
                    where = unpack_loc(shard.path, base + i * 8, k, slots[i + 1])
                    if is_live(where.hour):
                        found.append(where)
            group = (group + stride) & shard.group_mask

    def keys_present(self, ids: Sequence[tuple[str, str]]) -> tuple[list[int], set[int]]:
        """A batch's ids, in one call: `key(topic, msg_id)` of each (topic,
        msg_id), and those of the keys stored at least once (live or not),
        for which a send looks up `candidates` (a new id's probe)."""
        copy = self._hasher.copy
        keys = []
        topic, prefix = None, b""
        for t, msg_id in ids:
            if t != topic:
                topic, topic_b = t, t.encode()
                prefix = _TOPIC_LENGTH.pack(len(topic_b)) + topic_b
            h = copy()
            h.update(prefix + msg_id.encode())
            keys.append(int.from_bytes(h.digest(), "little") or 1)
        found: set[int] = set()
        unpack, shards, paged = GROUP.unpack_from, self.shards, self._paged
        probes = 0
        if self._calls and self._calls + len(keys) > self.shed_every_calls:
            self._shed_if_large()  # first: the batch's inserts then find its look-ups' pages resident
            paged = self._paged
        for key in keys:
            shard = shards[key >> SHARD_SHIFT]
            mm, mask = shard.mm, shard.group_mask
            group, stride = probe_start(key, mask)
            searching = True
            while searching:
                base = HEADER_BYTES + group * GROUP_BYTES
                if paged:
                    mm.madvise(MADV_POPULATE_WRITE, base & PAGE_MASK, PAGE_BYTES)
                slots = unpack(mm, base)
                for i in range(0, 8, 2):
                    probes += 1
                    k = slots[i]
                    if k == 0:
                        searching = False
                        break
                    if k == key:
                        found.add(key)
                        searching = False
                        break
                group = (group + stride) & mask
        self.probes += probes
        self._calls += len(keys)
        return keys, found

    # -- counters (the key index's buckets: storage.key_index) --------------------------

    def count(self, key: int, hour: int) -> int:
        """The counter stored under `key` for the live file `hour` (0: none).
        A counter is a slot whose location's globalIndex field holds the
        count: it dies with its file as the slots it counts do."""
        found = self._counter(key, hour)
        return 0 if found is None else found[1]

    def add(self, key: int, hour: int, n: int = 1) -> int:
        """The counter under (`key`, `hour`) plus `n`, stored; the count
        before (0 for a new counter, whose slot is then inserted). O(1)
        expected: one probe sequence."""
        found = self._counter(key, hour)
        if found is None:
            self.put(key, hour, n)
            return 0
        offset, before = found
        SLOT.pack_into(self._shard(key).mm, offset, key, pack_loc(key, hour, before + n))
        return before

    def _counter(self, key: int, hour: int) -> tuple[int, int] | None:
        """(offset, count) of the first slot of `key` whose file is `hour`."""
        self._touched(1)
        shard = self._shard(key)
        mm, unpack = shard.mm, GROUP.unpack_from
        group, stride = probe_start(key, shard.group_mask)
        probes = 0
        paged = self._paged
        while True:
            base = HEADER_BYTES + group * GROUP_BYTES
            if paged:
                mm.madvise(MADV_POPULATE_WRITE, base & PAGE_MASK, PAGE_BYTES)
            slots = unpack(mm, base)
            for i in range(0, 8, 2):
                probes += 1
                k = slots[i]
                if k == 0:
                    self.probes += probes
                    return None
                if k == key and slots[i + 1] >> 40 == hour:
                    self.probes += probes
                    where = unpack_loc(shard.path, base + i * 8, k, slots[i + 1])
                    return base + i * 8, where.global_index
            group = (group + stride) & shard.group_mask

    def move(self, key: int, old: tuple[int, int], hour: int, global_index: int) -> None:
        """`key`'s slot pointing at `old` points at (hour, global_index) now
        (a message filed anew: its old place released, storage.refile);
        `put` when no slot points at `old` (a replay that finds the index
        moved already, or a slot dropped when its shard doubled)."""
        self._touched(1)
        shard = self._shard(key)
        mm, unpack = shard.mm, GROUP.unpack_from
        old_loc = pack_loc(key, old[0], old[1])
        group, stride = probe_start(key, shard.group_mask)
        probes = 0
        paged = self._paged
        while True:
            base = HEADER_BYTES + group * GROUP_BYTES
            if paged:
                mm.madvise(MADV_POPULATE_WRITE, base & PAGE_MASK, PAGE_BYTES)
            slots = unpack(mm, base)
            for i in range(0, 8, 2):
                probes += 1
                k = slots[i]
                if k == 0:
                    self.probes += probes
                    self.put(key, hour, global_index)
                    return
                if k == key and slots[i + 1] == old_loc:
                    self.probes += probes
                    SLOT.pack_into(mm, base + i * 8, key, pack_loc(key, hour, global_index))
                    return
            group = (group + stride) & shard.group_mask

    def put(self, key: int, hour: int, global_index: int) -> None:
        """Add (hour, global_index) under `key`; a no-op if that pair is
        already there (replaying the commit log calls this again)."""
        self.put_many(((key, hour, global_index),))

    def put_many(self, entries: Iterable[tuple[int, int, int]]) -> None:
        """`put` each (key, hour, global_index), in order (a commit's sends:
        a Python call each, the probe's)."""
        shards, crc, check, free_slot = self.shards, zlib.crc32, _CHECK.pack, self._free_slot
        n = 0
        for key, hour, global_index in entries:
            n += 1
            loc = hour << 40 | global_index << 8 | crc(check(key, hour, global_index)) & 0xFF  # pack_loc
            bounded = True
            while True:
                shard = shards[key >> SHARD_SHIFT]
                offset = free_slot(shard, key, loc, bounded)
                if offset is None:  # there already
                    break
                if offset >= 0:
                    if SLOT.unpack_from(shard.mm, offset)[0] == 0:
                        shard.used += 1
                    SLOT.pack_into(shard.mm, offset, key, loc)
                    if shard.used > shard.slot_count * MAX_LOAD:
                        self._double(shard)
                    break
                # The run was too long: a bigger shard parts it (on a full
                # disk, probe on: correct, only slower).
                bounded = self._double(shard)
        self._touched(n)

    def _free_slot(self, shard: Shard, key: int, loc: int, bounded: bool) -> int | None:
        """Where (key, loc) goes: the offset of the first empty or dead slot
        of key's sequence; None if the pair is there already; -1 if
        `bounded` and no empty slot came within MAX_PROBE_SLOTS: the shard
        should grow. (The shard always has an empty slot, see `_double`.)"""
        mm, unpack, is_live, mask = shard.mm, GROUP.unpack_from, self.is_live, shard.group_mask
        group, stride = probe_start(key, mask)
        may_grow = bounded and shard.used >= shard.slot_count * MIN_LOAD_TO_GROW
        reuse = None
        probes = 0
        paged = self._paged
        while True:
            base = HEADER_BYTES + group * GROUP_BYTES
            if paged:
                mm.madvise(MADV_POPULATE_WRITE, base & PAGE_MASK, PAGE_BYTES)
            slots = unpack(mm, base)
            for i in range(0, 8, 2):
                probes += 1
                k, slot_loc = slots[i], slots[i + 1]
                if k == 0:
                    self.probes += probes
                    return base + i * 8 if reuse is None else reuse
                if k == key:
                    if slot_loc == loc:
                        self.probes += probes
                        return None
                    if reuse is None and self._same_key_dead(shard, base + i * 8, k, slot_loc):
                        reuse = base + i * 8
                elif reuse is None and not is_live(slot_loc >> 40):
                    reuse = base + i * 8
            if probes >= MAX_PROBE_SLOTS and may_grow:  # (the pair may lie further on: no early reuse)
                self.probes += probes
                return -1
            group = (group + stride) & shard.group_mask

    def _same_key_dead(self, shard: Shard, offset: int, key: int, loc: int) -> bool:
        """Is this slot of `key` free to reuse: its hour retired, or (an index
        that checks) its message released? Without that check, a long run of
        one key's slots (the key index) costs no decoding."""
        if not self.is_live(loc >> 40):
            return True
        if not self._checks_released:
            return False
        where = unpack_loc(shard.path, offset, key, loc)
        return self.is_released(where.hour, where.global_index)

    def _double(self, old: Shard) -> bool:
        """Replace `old` by a shard twice its size holding its live slots.
        On a full disk the old shard stays while it has two empty slots or
        more (False; the next insert tries again), so every probe sequence
        still ends at an empty slot; with fewer, the OSError is raised."""
        n = self.shards.index(old)
        try:
            new = Shard.create(self._path(n), old.slot_count * 2, self._secret_tag, self.disk)
        except OSError:
            if old.used < old.slot_count - 1:
                return False
            raise
        self.shed()  # (the pages the last calls mapped: not resident beside the doubling's own)
        used, overflow = _fill_in_slices(old, new, self.is_live)
        used += _place_overflow(new, overflow)
        new.used = used
        new.publish(self._path(n))
        old.close()
        self.shards[n] = new
        return True

    # -- lifetime ----------------------------------------------------------------------

    def flush(self) -> None:
        for shard in self.shards:
            shard.mm.flush()

    def shed(self) -> None:
        """Every shard's resident pages dropped: the slots stay in the files
        and the page cache, and the next touch faults its page back in."""
        self._calls = 0
        self.sheds += 1
        for shard in self.shards:
            shard.mm.madvise(mmap.MADV_DONTNEED)

    def _touched(self, calls: int) -> None:
        """`calls` lookups or inserts made: the pages shed when enough were
        since the last shed and the index is large (SHED_EVERY_CALLS)."""
        self._calls += calls
        if self._calls >= self.shed_every_calls:
            self._shed_if_large()

    def _shed_if_large(self) -> None:
        self._calls = 0
        if self.residency.over():
            self._page_probes()
            self.shed()

    def _page_probes(self) -> None:
        """From now on each probe maps its page alone first (the index is
        large: MADV_POPULATE_WRITE), unless the kernel refuses it."""
        if self._paged or not self._can_page or not self.shards:
            return
        try:
            self.shards[0].mm.madvise(MADV_POPULATE_WRITE, 0, PAGE_BYTES)
        except (OSError, ValueError):
            self._can_page = False
            return
        self._paged = True

    def disk_bytes(self) -> int:
        return sum(HEADER_BYTES + s.slot_count * SLOT_BYTES for s in self.shards)

    def close(self) -> None:
        for shard in self.shards:
            shard.mm.flush()
            shard.close()
        self.shards.clear()
        self.residency.leave(self)

    def __repr__(self) -> str:
        used = sum(s.used for s in self.shards)
        slots = sum(s.slot_count for s in self.shards)
        return f"IdIndex({self.directory!r}, used={used}, slots={slots})"


def _slot_words(path: str, slot_count: int, read_bytes: int = OPEN_READ_BYTES) -> Iterator[array[int]]:
    """A shard file's slots as words (key, location, ...), read from the
    file, not through a mapping, `read_bytes` at a time."""
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # (small folios: Shard.open)
        f.seek(HEADER_BYTES)
        left = slot_count * 2
        while left:
            words = array("Q")
            words.fromfile(f, min(left, read_bytes // 8))
            left -= len(words)
            yield words


def _fill_in_slices(old: Shard, new: Shard, is_live: Callable[[int], bool]) -> tuple[int, array[int]]:
    """Write `old`'s live slots into `new` (twice its groups) through the
    file, a slice of DOUBLING_SLICE_BYTES of the new groups at a time: each
    slot whose home group (probe_start) lies in the slice goes there while
    the group has room. Returns the slots placed and the others' words
    (key, location, ...): those whose home group was full, for
    `_place_overflow`. A doubling holds in RAM one slice of the new words
    and DOUBLING_READ_BYTES of the old (some 3 MB), not the whole new
    shard's and a MB of the old (9 MB for a shard of 4 MB), and maps no page
    of either shard into the node's RSS."""
    group_mask = new.group_mask
    groups = group_mask + 1
    slice_groups = max(1, min(groups, DOUBLING_SLICE_BYTES // GROUP_BYTES))
    live: dict[int, bool] = {}  # hour -> is_live, asked once an hour
    overflow = array("Q")
    used = 0
    fd = os.open(new.path, os.O_RDWR)
    try:
        for first in range(0, groups, slice_groups):
            past = first + slice_groups
            words = array("Q", [0]) * (slice_groups * GROUP_SLOTS * 2)
            for pairs in _slot_words(old.path, old.slot_count, DOUBLING_READ_BYTES):
                for i in range(0, len(pairs), 2):
                    key = pairs[i]
                    if key == 0:
                        continue
                    group = key & group_mask
                    if group < first or group >= past:
                        continue
                    loc = pairs[i + 1]
                    hour = loc >> 40
                    alive = live.get(hour)
                    if alive is None:
                        alive = live[hour] = is_live(hour)
                    if not alive:
                        continue
                    at = (group - first) << 3  # 4 slots of 2 words a group
                    if words[at] != 0:
                        if words[at + 2] == 0:
                            at += 2
                        elif words[at + 4] == 0:
                            at += 4
                        elif words[at + 6] == 0:
                            at += 6
                        else:
                            overflow.append(key)
                            overflow.append(loc)
                            continue
                    words[at] = key
                    words[at + 1] = loc
                    used += 1
            write_in_pieces(fd, memoryview(words).cast("B"), HEADER_BYTES + first * GROUP_BYTES)
            del words  # (before the next slice's: one slice's words at a time)
    finally:
        os.close(fd)
    return used, overflow


def _place_overflow(new: Shard, overflow: array[int]) -> int:
    """Each (key, location) of `overflow`, whose home group in `new` is full,
    put in the first free slot along its probe sequence past it (read and
    written through the file: a few percent of a doubling's slots). Every
    slot `_fill_in_slices` placed sits in its home group and a group never
    loses a slot, so each probe sequence still meets its key before any
    empty slot (the lookup's rule: `candidates`). Returns the slots placed."""
    if not overflow:
        return 0
    group_mask = new.group_mask
    fd = os.open(new.path, os.O_RDWR)
    try:
        for j in range(0, len(overflow), 2):
            key, loc = overflow[j], overflow[j + 1]
            group, stride = probe_start(key, group_mask)
            while True:
                group = (group + stride) & group_mask
                base = HEADER_BYTES + group * GROUP_BYTES
                slots = GROUP.unpack(os.pread(fd, GROUP_BYTES, base))
                free = -1
                for i in range(0, 8, 2):
                    if slots[i] == 0:
                        free = i
                        break
                if free >= 0:
                    os.pwrite(fd, SLOT.pack(key, loc), base + free * 8)
                    break
    finally:
        os.close(fd)
    return len(overflow) // 2


def _finish_publish(directory: str) -> None:
    """Complete or undo a swap of `directory`.new in for `directory`: a
    complete new index (its secret written) replaces the old one; an
    incomplete one is deleted."""
    building, old = directory + ".new", directory + ".old"
    if os.path.isdir(building):
        if _secret_is_whole(os.path.join(building, SECRET_FILE)):
            if os.path.exists(directory):
                if os.path.exists(old):
                    shutil.rmtree(old)
                os.rename(directory, old)
            os.rename(building, directory)
            fsync_dir(os.path.dirname(os.path.abspath(directory)))
        else:
            shutil.rmtree(building)
    if os.path.isdir(old):
        shutil.rmtree(old)
