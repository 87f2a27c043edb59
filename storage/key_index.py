"""On-disk index from (topic, key) to the locations of the messages sent
with that serial key, so a lookup by key (listMsg, deleteMsgs and
rescheduleMsgs with `key`: docs/api.md, Bulk calls) reads its own
messages, not the topic's, a put costs the same for a key with one
message as for a key with a million, and RAM does not grow with messages
or keys.

Directory `keys/`, in the id index's format (storage.id_index: the same
`secret` file and `<shard:02x>.hix` shards, byte for byte, 64 shards of
open-addressing slots, each doubling on its own), with its own secret,
plus an empty file `buckets` that marks this layout of the slots (an
index without it -- none, or `runs`, the layout before buckets -- is
rebuilt from the delay logs at the next open, as a missing one is). A
key's messages are counted in buckets, and held as runs: messages of one
key, file and part put together whose globalIndexes follow each other (a
batch of one key's sends, appended to its file in one go) are one run,
one slot, whatever their number:

    H        = BLAKE2b(topic, key) under the secret        (IdIndex.key)
    file     = the delay file the message is in (its Location's hour)
    pos      = where in its file's time range a trigger time falls, in
               2**18 equal steps: part = pos >> 12 (PARTS = 64 of them),
               sub = pos >> 6 & 63, fine = pos & 63 (a fine step of an
               hour's file is 13.7 ms); LATE if it triggers before the
               file begins (sent due: filed at the hour it was sent in)
    bucket   = where a run is held: the fine step of its EARLIEST
               message (a run may reach on to the end of its part, never
               past it); a LATE run, in the LATE part itself

    slot key                        slot holds (file = the slot's hour)
    derive(H, file<<8 | 0xFF)       counter: the key's runs in the file
    P = derive(H, file<<8 | part)   counter: the key's runs in the part
    S = derive(P, SUB<<8 | sub)     counter: the part's runs in the sub
    B = derive(S, FINE<<8 | fine)   counter: the sub's runs in the fine
                                    step (B = P for a LATE run)
    slot_key(B, n)                  the n-th run put in bucket B: its
                                    first message's globalIndex, n = 0, 1, ...
    derive(slot_key(..), RUN)       counter: that run's length, when over 1
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
1 run, part 55 = 1 run, one sub and one fine counter of 1 under each,
the run slots (fine of minute 5, n=0) -> 7 with a length counter of 2
and (fine of minute 50, n=0) -> 40. A page of listMsg by that key probes
the file counter of each live file (1 probe a file), then the part
counters of the files that hold the key, and reads the parts in order of
their time ranges (LATE parts first: their trigger times are unbounded
below); a part's buckets are found by its sub counters and the fine
counters of its non-empty subs (at most 64 + 64 x 64 probes, whatever
the key's count), and read in order of their steps, stopping once the
page is full and the next bucket starts after its last message. So 100
batches of 1,000 sends of one key due now, all in one part, are 100
buckets of one run each: the first page reads the first run, not the
100,000 messages. Only messages of one key whose trigger times lie in
one fine step (or in a LATE part) are read together, whatever their
number: a page orders them by msgId, which no slot holds.

Cost: a put is one BLAKE2b and a few probe sequences a run, O(1) whatever
the key's count, and a batch of one key's sends into one part is one run
(or a few: split at the part's bounds): its counters and its slots are
moved once, not once a message; a lookup is O(live files) probes plus
the buckets of the parts it reads and two probes a run of the buckets it
reads. `BucketPlaces` hands a bucket's places out a slice at a time
(`take`: at most so many places, and so many runs read), each once in
its part (a replay may put a place again under another bucket of the
part: the earliest trigger time of the run it replays in), so a caller
on the event loop lets it turn between slices however large the key.

What is put, and when (storage.applying): every message whose body has a
serial key (an 8-item delay-log body, storage.delay_log) when its SEND is
applied, and the new place of a moved one when its MOVE is applied (the
old place is released: the reader skips it). Nothing is removed: a
released message's slot stays until its file retires.

Derived data, as the id index: a crash replays the commit log's puts (a
replayed put counts the message again under a new n: a lookup drops the
places already handed out); an index that is missing -- deleted, or a data
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
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from . import delay_log, spans
from .config import StoreConfig
from .delay_index import FLAG_RELEASED
from .disk import Disk
from .entry import MS_PER_HOUR, Location
from .errors import CorruptionError, NewerFormatError
from .fileutil import atomic_write
from .hour_table import HourTable
from .id_index import IdIndex, Residency

# The first byte of a delay-log body with a serial key: a msgpack fixarray of 8.
KEYED_BODY = 0x98
PARTS = 64  # slices of a file's time range
SUBS = 64  # slices of a part
FINES = 64  # slices of a sub: the steps runs are held in
STEP_BITS = 18  # log2(PARTS * SUBS * FINES): a position's bits
LATE = PARTS  # the part of messages that trigger before their file begins
FILE_COUNTER = 0xFF
REBUILD_SLICE = 65_536  # keyed messages put in one call by a rebuild
RUN = 0x52554E  # derive(run slot key, RUN): the run's length counter
SUB = 0x535542  # derive(part counter's key, SUB << 8 | sub): the sub's counter
FINE = 0x46494E  # derive(sub counter's key, FINE << 8 | fine): the fine step's counter
LAYOUT_FILE = "buckets"  # its presence: this layout of the slots (absent: rebuild)
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
    """The key of the slot of the n-th run put in a bucket."""
    return _mix(part_key + n * 0x9E3779B97F4A7C15 & _M64) or 1


def _start_ms(file_id: int, trigger_ms: int) -> int:
    shift = spans.span_shift(file_id)
    return (file_id if shift == 0 else spans.start_hour(file_id, trigger_ms)) * MS_PER_HOUR


def position(file_id: int, trigger_ms: int) -> int:
    """Where in its file's time range a message triggering at `trigger_ms`
    falls, in 2**STEP_BITS steps; -1 before the file begins (LATE)."""
    start_ms = _start_ms(file_id, trigger_ms)
    if trigger_ms < start_ms:
        return -1
    span_ms = MS_PER_HOUR << spans.span_shift(file_id)
    return min((trigger_ms - start_ms << STEP_BITS) // span_ms, (1 << STEP_BITS) - 1)


def part_of(file_id: int, trigger_ms: int) -> int:
    """Which part of its file a message triggering at `trigger_ms` is counted in."""
    pos = position(file_id, trigger_ms)
    return LATE if pos < 0 else pos >> STEP_BITS - 6


def part_range(file_id: int, trigger_ms: int, part: int) -> tuple[int, int]:
    """[low, high) of the trigger times counted in `part` of the file a
    message triggering at `trigger_ms` is in (LATE: [0, the file's start))."""
    start_ms = _start_ms(file_id, trigger_ms)
    if part == LATE:
        return 0, start_ms
    slice_ms = (MS_PER_HOUR << spans.span_shift(file_id)) // PARTS
    return start_ms + part * slice_ms, start_ms + (part + 1) * slice_ms


def step_low(start_ms: int, span_ms: int, pos: int) -> int:
    """The earliest trigger time whose position is `pos` or later, in a file
    starting at `start_ms` that covers `span_ms`."""
    return start_ms + (pos * span_ms + (1 << STEP_BITS) - 1 >> STEP_BITS)


class KeyPart(NamedTuple):
    """One non-empty part of a key's messages: trigger times in
    [low_ms, high_ms) (LATE: low_ms 0), `entries` runs put (their
    released messages and replayed duplicates included)."""
    low_ms: int
    high_ms: int
    file_id: int
    part: int
    entries: int


class KeyBucket(NamedTuple):
    """One non-empty bucket of a part (a fine step, or a LATE part whole):
    its runs' messages trigger in [low_ms, high_ms) -- from the step's
    start to the end of its part --, `runs` of them put under the slot
    key `counter` (slot_key(counter, n))."""
    low_ms: int
    high_ms: int
    file_id: int
    counter: int
    runs: int


class KeyIndex:
    """(topic, key) -> its messages' locations, bucketed by file, part and
    fine step (see the module docstring for the layout, cost and a worked
    example). One thread calls it: the store's."""

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
        batch of one key's sends: one slot, the counters moved once), held
        in the fine step of its earliest trigger time."""
        slots, i, end = self.slots, 0, len(items)
        puts: list[tuple[int, int, int]] = []  # (slot key, file, globalIndex or length): the id index's, in one call
        while i < end:
            key, file_id, trigger_ms, first = items[i]
            part = part_of(file_id, trigger_ms)
            low_ms, high_ms = part_range(file_id, trigger_ms, part)
            runs: list[tuple[int, int, int]] = []  # (first globalIndex, length, earliest trigger time)
            last, earliest = first, trigger_ms
            j = i + 1
            while j < end:
                k, f, t, gi = items[j]
                if k != key or f != file_id or not low_ms <= t < high_ms:
                    break
                if gi != last + 1:
                    runs.append((first, last - first + 1, earliest))
                    first, earliest = gi, t
                elif t < earliest:
                    earliest = t
                last = gi
                j += 1
            runs.append((first, last - first + 1, earliest))
            slots.add(derive(key, file_id << 8 | FILE_COUNTER), file_id, len(runs))
            part_key = derive(key, file_id << 8 | part)
            n = slots.add(part_key, file_id, len(runs))
            for first, length, earliest in runs:
                if part == LATE:
                    bucket = part_key
                else:
                    pos = position(file_id, earliest)
                    sub_key = derive(part_key, SUB << 8 | pos >> 6 & SUBS - 1)
                    slots.add(sub_key, file_id, 1)
                    bucket = derive(sub_key, FINE << 8 | pos & FINES - 1)
                    n = slots.add(bucket, file_id, 1)
                run_key = slot_key(bucket, n)
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

    def buckets(self, key: int, part: KeyPart) -> list[KeyBucket]:
        """The non-empty buckets of `key` in `part`, by the start of their
        step: at most SUBS + SUBS * FINES probes, whatever the key's count
        (a sub's or the part's counters summed up: the rest not probed)."""
        slots, file_id = self.slots, part.file_id
        part_key = derive(key, file_id << 8 | part.part)
        if part.part == LATE:
            return [KeyBucket(part.low_ms, part.high_ms, file_id, part_key, part.entries)]
        span_ms = (part.high_ms - part.low_ms) * PARTS
        start_ms = part.low_ms - part.part * (span_ms // PARTS)
        found: list[KeyBucket] = []
        left = part.entries
        for sub in range(SUBS):
            sub_key = derive(part_key, SUB << 8 | sub)
            in_sub = slots.count(sub_key, file_id)
            if not in_sub:
                continue
            left -= in_sub
            base = (part.part * SUBS + sub) * FINES
            for fine in range(FINES):
                bucket = derive(sub_key, FINE << 8 | fine)
                n = slots.count(bucket, file_id)
                if n:
                    found.append(KeyBucket(step_low(start_ms, span_ms, base + fine), part.high_ms, file_id, bucket, n))
                    in_sub -= n
                    if in_sub <= 0:
                        break
            if left <= 0:
                break
        return found

    def runs(self, bucket: KeyBucket, first_n: int, count: int) -> list[tuple[int, int]]:
        """(first globalIndex, length) of the runs n = first_n .. first_n +
        count - 1 put in `bucket` (fewer past its last); a run whose slot
        is missing (a put cut short by a crash, replayed under a later n)
        is left out. Raises CorruptionError for a slot whose check byte fails."""
        slots, file_id = self.slots, bucket.file_id
        found: list[tuple[int, int]] = []
        for n in range(first_n, min(first_n + count, bucket.runs)):
            run_key = slot_key(bucket.counter, n)
            for where in slots.candidates(run_key):
                if where.hour == file_id:
                    found.append((where.global_index, slots.count(derive(run_key, RUN), file_id) or 1))
        return found

    def locations(self, key: int, part: KeyPart) -> list[Location]:
        """Every place put under `key` in `part`, each once, in one go (a
        caller on the event loop reads a bucket at a time: `BucketPlaces`).
        Raises CorruptionError for a slot whose check byte fails."""
        found: list[Location] = []
        new = tuple.__new__
        handed: list[int] = []
        for bucket in self.buckets(key, part):
            places = BucketPlaces(self, bucket, handed)
            while not places.done:
                for first, length in places.take(1 << 20):
                    found += [new(Location, (bucket.file_id, gi)) for gi in range(first, first + length)]
        return found

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


class BucketPlaces:
    """The places of one bucket's runs, handed out a slice at a time, each
    once in its part: `take(limit)` answers spans (first globalIndex,
    length) of at most `limit` places not handed out before, having read
    at most `limit` runs, until `done`. `handed` holds what
    was handed out: the same list for every bucket of one part, so that a
    place a replay put again under another bucket comes out once.

    Worked example: runs [7, 8] (n=0), [40] (n=1) and [7, 8] again (n=2, a
    replayed put): take(2) -> [(7, 2)]; take(2) -> [(40, 1)] (then reads
    n=2, all handed out already); done. A run longer than `limit` is
    handed out over several calls; take(1) on the runs above answers
    [(7, 1)], [(8, 1)], [(40, 1)], then [] (n=2 read), and is done.

    Cost: two probes a run read, and O(log spans) to leave out what was
    handed out (`handed`: the disjoint [start, end) spans handed out,
    merged -- one span for a key whose runs follow each other)."""

    __slots__ = ("_bucket", "_handed", "_index", "_left", "_next_n")

    def __init__(self, index: KeyIndex, bucket: KeyBucket, handed: list[int]) -> None:
        self._index = index
        self._bucket = bucket
        self._next_n = 0  # the next run to read
        self._left: list[tuple[int, int]] = []  # (start, end) read, not handed out yet, last one first
        self._handed = handed  # start0, end0, start1, end1, ...: ascending, disjoint

    @property
    def file_id(self) -> int:
        return self._bucket.file_id

    @property
    def done(self) -> bool:
        """Every run read and every place handed out."""
        return not self._left and self._next_n >= self._bucket.runs

    def finish(self) -> None:
        """Hand out nothing more (its file retired)."""
        self._left.clear()
        self._next_n = self._bucket.runs

    def take(self, limit: int) -> list[tuple[int, int]]:
        """Spans of at most `limit` places not handed out yet, at most `limit`
        runs read for them: [] when the runs read held none (`done` says
        whether any are left)."""
        out: list[tuple[int, int]] = []
        taken = read = 0
        while taken < limit:
            if not self._left:
                if self._next_n >= self._bucket.runs or read >= limit:
                    break
                runs = self._index.runs(self._bucket, self._next_n, 1)
                self._next_n += 1
                read += 1
                for first, length in runs:
                    self._left += reversed(self._unhanded(first, first + length))
                continue
            start, end = self._left.pop()
            if end - start > limit - taken:
                self._left.append((start + limit - taken, end))
                end = start + limit - taken
            out.append((start, end - start))
            taken += end - start
        return out

    def _unhanded(self, start: int, end: int) -> list[tuple[int, int]]:
        """The spans of [start, end) not handed out yet, ascending; from now
        on they count as handed out."""
        handed = self._handed
        if not handed or start >= handed[-1]:  # after every span handed out: the usual case
            if handed and handed[-1] == start:
                handed[-1] = end
            else:
                handed += (start, end)
            return [(start, end)]
        i = bisect_right(handed, start)
        j = i - 1 if i % 2 else i  # the first span that may overlap [start, end)
        gaps: list[tuple[int, int]] = []
        at, k = start, j
        while k < len(handed) and handed[k] < end:
            if handed[k] > at:
                gaps.append((at, handed[k]))
            at = max(at, handed[k + 1])
            k += 2
        if at < end:
            gaps.append((at, end))
        low = min(start, handed[j]) if k > j else start
        high = max(end, handed[k - 1]) if k > j else end
        if j >= 2 and handed[j - 1] == low:  # touching the span before: one span
            j -= 2
            low = handed[j]
        if k < len(handed) and handed[k] == high:  # touching the span after
            high = handed[k + 1]
            k += 2
        handed[j:k] = [low, high]
        return gaps

    def __repr__(self) -> str:
        return (f"BucketPlaces(file={self._bucket.file_id}, runs={self._bucket.runs}, next={self._next_n}, "
                f"spans={len(self._handed) // 2})")


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


def open_key_index(directory: str, config: StoreConfig, hours: HourTable, disk: Disk,
                   residency: Residency | None = None) -> KeyIndex:
    """The key index in `directory` (on `disk`), or a new one (new secret) holding every
    keyed, unreleased message of the checkpointed files when it is
    missing, damaged or of an older layout: every entry and every keyed
    body read once; replaying the log adds the rest."""
    if IdIndex.is_current(directory):
        if os.path.exists(os.path.join(directory, LAYOUT_FILE)):
            try:
                return KeyIndex(IdIndex.open(directory, config.id_shard_initial_slots, hours.__contains__,
                                             disk=disk, residency=residency))
            except NewerFormatError:  # not damage: refused, never rebuilt
                raise
            except CorruptionError:  # a torn or damaged shard: derived data, made again
                pass
        shutil.rmtree(directory)
    slots = IdIndex.build(directory, config.id_shard_initial_slots, hours.__contains__, disk=disk,
                          residency=residency)
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
