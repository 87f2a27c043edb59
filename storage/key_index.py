"""On-disk index from (topic, key) to the locations of the messages sent
with that serial key, so a lookup by key (listMsg, deleteMsgs and
rescheduleMsgs with `key`: docs/api.md, Bulk calls) reads its own
messages, not the topic's, a put costs the same for a key with one
message as for a key with a million, and RAM does not grow with messages
or keys.

Directory `keys/`, in the id index's format (storage.id_index: the same
`secret` file and `<shard:02x>.hix` shards, byte for byte, 64 shards of
open-addressing slots, each doubling on its own), with its own secret,
plus an empty file `runs` that marks this layout of the slots (an index
without it is rebuilt). A key's messages are counted in buckets, and
held as runs: messages of one key, file and part put together whose
globalIndexes follow each other (a batch of one key's sends, appended to
its file in one go) are one run, one slot, whatever their number:

    H        = BLAKE2b(topic, key) under the secret        (IdIndex.key)
    file     = the delay file the message is in (its Location's hour)
    part     = which of PARTS equal slices of the file's time range its
               trigger time falls in; LATE if it triggers before the
               file begins (sent due: filed at the hour it was sent in)

    slot key                     slot holds (file = the slot's hour)
    derive(H, file<<8 | 0xFF)    counter: the key's runs in the file
    derive(H, file<<8 | part)    counter: the key's runs in the part
    slot_key(partkey, n)         the n-th run put in the part: its first
                                 message's globalIndex, n = 0, 1, ...
    derive(slot_key(..), RUN)    counter: that run's length, when over 1
                                 (absent: a run of one message)

`derive(k, x)` and `slot_key` are 64-bit mixes (splitmix64's finaliser) of k and x: they
cost no hashing of text, and without the secret nobody can choose keys
whose slots collide. A counter is a slot whose globalIndex field holds
the count (IdIndex.add). Every slot of a file dies with the file (a
retired file's slots are dead, reused or dropped when a shard doubles),
so the index holds live files only.

Worked example: key "order-42" sent three times into hour 490,000 at
minutes 5, 5 and 50, the first two in one batch (globalIndexes 7 and 8),
the third alone (globalIndex 40), puts counters file = 2 runs, part 5 =
1 run, part 55 = 1 run, the run slots (part 5, n=0) -> 7 with a length
counter of 2 and (part 55, n=0) -> 40; a page of listMsg by that key
probes the file counter of each live file (1 probe a file), then the
part counters of the files that hold the key, and reads the parts in
order of their time ranges, stopping once the page is full and the next
part starts after its last message (LATE parts first: their trigger
times are unbounded below).

Cost: a put is one BLAKE2b and a few probe sequences a run, O(1) whatever
the key's count, and a batch of one key's sends into one part is one
run: its counters and its slots are moved once, not once a message; a
lookup is O(live files) probes plus two a run of the parts it reads.

What is put, and when (storage.applying): every message whose body has a
serial key (an 8-item delay-log body, storage.delay_log) when its SEND is
applied, and the new place of a moved one when its MOVE is applied (the
old place is released: the reader skips it). Nothing is removed: a
released message's slot stays until its file retires.

Derived data, as the id index: a crash replays the commit log's puts (a
replayed put counts the message again under a new n: a lookup drops the
duplicate location); an index that is missing -- deleted, or a data
directory from before it -- is rebuilt from the delay logs of the
checkpointed files (`open_key_index`) in `keys.new/` and swapped in, then
the log replays the rest; so is one whose shard is torn or damaged (its
header refused on opening), and a slot whose check byte fails at a lookup
makes that lookup fall back to a scan (`Store.keyed` answers None). A
lookup's candidates are confirmed against the message bodies they point
at, so a hash collision costs a read, never a wrong answer.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from . import delay_log, spans
from .config import StoreConfig
from .delay_index import FLAG_RELEASED
from .disk import Disk
from .entry import MS_PER_HOUR, Location
from .errors import CorruptionError
from .fileutil import atomic_write
from .hour_table import HourTable
from .id_index import IdIndex

# The first byte of a delay-log body with a serial key: a msgpack fixarray of 8.
KEYED_BODY = 0x98
PARTS = 64  # slices of a file's time range
LATE = PARTS  # the part of messages that trigger before their file begins
FILE_COUNTER = 0xFF
REBUILD_SLICE = 65_536  # keyed messages put in one call by a rebuild
RUN = 0x52554E  # derive(run slot key, RUN): the run's length counter
LAYOUT_FILE = "runs"  # its presence: this layout of the slots (absent: rebuild)
_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit words."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def derive(key: int, x: int) -> int:
    """The slot key derived from `key` and `x` (never 0, the empty slot)."""
    return _mix(key ^ _mix(x)) or 1


def slot_key(part_key: int, n: int) -> int:
    """The key of the slot of the n-th message put in a part."""
    return _mix(part_key + n * 0x9E3779B97F4A7C15 & _M64) or 1


def part_of(file_id: int, trigger_ms: int) -> int:
    """Which part of its file a message triggering at `trigger_ms` is counted in."""
    shift = spans.span_shift(file_id)
    start_ms = (file_id if shift == 0 else spans.start_hour(file_id, trigger_ms)) * MS_PER_HOUR
    if trigger_ms < start_ms:
        return LATE
    return min((trigger_ms - start_ms) * PARTS // (MS_PER_HOUR << shift), PARTS - 1)


def part_range(file_id: int, trigger_ms: int, part: int) -> tuple[int, int]:
    """[low, high) of the trigger times counted in `part` of the file a
    message triggering at `trigger_ms` is in (LATE: [0, the file's start))."""
    shift = spans.span_shift(file_id)
    start_ms = (file_id if shift == 0 else spans.start_hour(file_id, trigger_ms)) * MS_PER_HOUR
    if part == LATE:
        return 0, start_ms
    slice_ms = (MS_PER_HOUR << shift) // PARTS
    return start_ms + part * slice_ms, start_ms + (part + 1) * slice_ms


class KeyPart(NamedTuple):
    """One non-empty part of a key's messages: trigger times in
    [low_ms, high_ms) (LATE: low_ms 0), `entries` runs put (their
    released messages and replayed duplicates included)."""
    low_ms: int
    high_ms: int
    file_id: int
    part: int
    entries: int


class KeyIndex:
    """(topic, key) -> its messages' locations, bucketed by file and part
    (see the module docstring for the layout, cost and a worked example).
    One thread calls it: the store's."""

    def __init__(self, slots: IdIndex) -> None:
        self.slots = slots  # the shards, in the id index's format

    def key(self, topic: str, key: str) -> int:
        return self.slots.key(topic, key)

    def put(self, key: int, file_id: int, trigger_ms: int, global_index: int) -> None:
        """Add the message at (file_id, global_index) under `key`: O(1)."""
        self.put_many([(key, file_id, trigger_ms, global_index)])

    def put_many(self, items: Sequence[tuple[int, int, int, int]]) -> None:
        """`put` each (key, file id, trigger time, globalIndex); items of one
        key and part whose globalIndexes follow each other are one run (a
        batch of one key's sends: one slot, the counters moved once)."""
        slots, i, end = self.slots, 0, len(items)
        puts: list[tuple[int, int, int]] = []  # (slot key, file, globalIndex or length): the id index's, in one call
        while i < end:
            key, file_id, trigger_ms, first = items[i]
            part = part_of(file_id, trigger_ms)
            low_ms, high_ms = part_range(file_id, trigger_ms, part)
            runs: list[tuple[int, int]] = []  # (first globalIndex, length)
            last = first
            j = i + 1
            while j < end:
                k, f, t, gi = items[j]
                if k != key or f != file_id or not low_ms <= t < high_ms:
                    break
                if gi != last + 1:
                    runs.append((first, last - first + 1))
                    first = gi
                last = gi
                j += 1
            runs.append((first, last - first + 1))
            slots.add(derive(key, file_id << 8 | FILE_COUNTER), file_id, len(runs))
            part_key = derive(key, file_id << 8 | part)
            n = slots.add(part_key, file_id, len(runs))
            for first, length in runs:
                x = (part_key + n * 0x9E3779B97F4A7C15) & _M64  # slot_key(part_key, n), written out
                x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
                x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
                run_key = (x ^ (x >> 31)) or 1
                puts.append((run_key, file_id, first))
                if length > 1:
                    puts.append((derive(run_key, RUN), file_id, length))
                n += 1
            i = j
        slots.put_many(puts)

    def parts(self, key: int, files: Iterable[tuple[int, int]]) -> list[KeyPart]:
        """The non-empty parts of `key` in `files` ((file id, first hour)
        pairs), LATE ones first, then by the start of their time range."""
        slots = self.slots
        found: list[KeyPart] = []
        for file_id, start_hour in files:
            in_file = slots.count(derive(key, file_id << 8 | FILE_COUNTER), file_id)
            if not in_file:
                continue
            start_ms = start_hour * MS_PER_HOUR
            slice_ms = (MS_PER_HOUR << spans.span_shift(file_id)) // PARTS
            for part in (LATE, *range(PARTS)):
                n = slots.count(derive(key, file_id << 8 | part), file_id)
                if n:
                    if part == LATE:
                        found.append(KeyPart(0, start_ms, file_id, part, n))
                    else:
                        low = start_ms + part * slice_ms
                        found.append(KeyPart(low, low + slice_ms, file_id, part, n))
                    in_file -= n
                    if in_file <= 0:
                        break
        found.sort()
        return found

    def locations(self, key: int, part: KeyPart) -> list[Location]:
        """The places put under `key` in `part`, each once (none released
        left out: the reader skips those). Raises CorruptionError for a
        slot whose check byte fails."""
        slots, file_id = self.slots, part.file_id
        part_key = derive(key, file_id << 8 | part.part)
        found: dict[Location, None] = {}
        new = tuple.__new__
        for n in range(part.entries):
            run_key = slot_key(part_key, n)
            for where in slots.candidates(run_key):
                if where.hour == file_id:
                    length = slots.count(derive(run_key, RUN), file_id) or 1
                    if length == 1:
                        found[where] = None
                    else:
                        for gi in range(where.global_index, where.global_index + length):
                            found[new(Location, (file_id, gi))] = None
        return list(found)

    @property
    def probes(self) -> int:
        return self.slots.probes

    def flush(self) -> None:
        self.slots.flush()

    def shed(self) -> None:
        self.slots.shed()

    def disk_bytes(self) -> int:
        return self.slots.disk_bytes()

    def close(self) -> None:
        self.slots.close()

    def __repr__(self) -> str:
        return f"KeyIndex({self.slots!r})"


def key_of_body(index: KeyIndex, body: bytes | memoryview, known: dict[tuple[str, str], int] | None = None) -> int | None:
    """The key H of a delay-log body's (topic, serial key); None when it
    has no key. `known`: the H of pairs met before (a batch of one key's
    sends hashes it once)."""
    if body[0] != KEYED_BODY:
        return None
    pair = delay_log.serial_key(body)
    if not pair[1]:
        return None
    if known is None:
        return index.key(*pair)
    key = known.get(pair)
    if key is None:
        key = known[pair] = index.key(*pair)
    return key


def open_key_index(directory: str, config: StoreConfig, hours: HourTable, disk: Disk) -> KeyIndex:
    """The key index in `directory` (on `disk`), or a new one (new secret) holding every
    keyed, unreleased message of the checkpointed files when it is
    missing, damaged or of an older layout: every entry and every keyed
    body read once; replaying the log adds the rest."""
    if IdIndex.is_current(directory):
        if os.path.exists(os.path.join(directory, LAYOUT_FILE)):
            try:
                return KeyIndex(IdIndex.open(directory, config.id_shard_initial_slots, hours.__contains__, disk=disk))
            except CorruptionError:  # a torn or damaged shard: derived data, made again
                pass
        shutil.rmtree(directory)
    slots = IdIndex.build(directory, config.id_shard_initial_slots, hours.__contains__, disk=disk)
    keys = KeyIndex(slots)
    try:
        atomic_write(os.path.join(slots.directory, LAYOUT_FILE), b"")
        known: dict[tuple[str, str], int] = {}
        for h in hours.ascending():
            files = hours.files(h)
            found: list[tuple[int, int, int, int]] = []  # put a slice at a time: runs form as when sent
            for gi in range(h.entries):
                entry, offset8, size, flags = files.read_entry(gi)
                if not flags & FLAG_RELEASED:
                    key = key_of_body(keys, files.read_body(offset8, size), known)
                    if key is not None:
                        found.append((key, h.hour, entry.trigger_ms, gi))
                if len(found) >= REBUILD_SLICE:
                    keys.put_many(found)
                    found.clear()
                    if len(known) >= REBUILD_SLICE:
                        known.clear()  # RAM bounded whatever the number of keys
            keys.put_many(found)
        slots.publish()
    except BaseException:
        keys.close()
        raise
    return keys


def key_dir(directory: str) -> str:
    """Where a data directory keeps its key index."""
    return os.path.join(directory, "keys")
