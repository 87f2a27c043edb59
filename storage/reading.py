"""Reading the store: by id, by place, by second, and by topic and status.

Every read sees the changes appended but not yet committed (the overlays
of storage.pending: ids sent in this batch, statuses changed in it), so a
batch can build on itself, except where a method says it reads committed
state only (the per-topic counts).

    get(topic, msgId)        id index -> candidates -> entry and body
    read_second(hour, s)     the second table's last entry of s, then the
                             preGlobalIndex chain back: O(s's entries)
    scan_status / scan_ready a topic's entries in given statuses, hour by
                             hour, skipping hours whose counts hold none,
                             read in slices sized to what is asked
                             (SCAN_FIRST_SLICE, doubling to SCAN_SLICE)
    scan_matches             the same for the bulk calls, with a tag and a
                             trigger time range tested on the raw entries
                             (files whose times lie outside the range not
                             read) and only (place, status, retry, trigger)
                             made of each match; each file from its floor
                             (`ScanFloors`: below it nothing matches)
    topic_hours, file_counts per-hour counts kept in RAM: O(hours)
    hour_topic_counts        the same counts of every topic, an hour at a
                             time: O((hour, topic) pairs) for all topics

`Reader` owns nothing: it reads the hours it is given (storage.hour_table),
the pending overlays and the id index. Nothing here writes, except that
reading an hour first writes what is staged for it (`HourTable.readable`)
and a second-table slot read for a send is remembered (`slot`).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence

from . import delay_index, delay_log, spans
from .delay_index import FLAG_PAUSED, FLAG_RELEASED
from .entry import END_PAUSED, MS_PER_HOUR, SECONDS_PER_HOUR, STATUS_BY_VALUE, IndexEntry, Location, Message, Status
from .errors import CorruptionError, InvalidRequest, InvariantError
from .hour import Hour
from .hour_table import NO_HOUR, HourTable
from .id_index import IdIndex
from .pending import Pending, State, unpack_state
from .types import total_counts

# Index entries read at once by a scan (scan_ready): 192 KiB at most. Its
# first read is sized to what it was asked for (twice `max_found`, at least
# SCAN_FIRST_SLICE), each next one twice the last, none past `max_scan`: a
# pull's refill of ten messages reads a few kB, not 192 (and maps only
# their pages).
SCAN_SLICE = 4096
SCAN_FIRST_SLICE = 64
# A look-up by id reads an entry and a body at random places of the mapped
# hours, and each read of a page not mapped maps the kernel's fault-around
# with it (64 kB): 2,000 look-ups of old ids between two checkpoints made
# 38 MB of the hours resident (bench/dedup.py's duplicate sends). So the
# reader sheds the hours' pages every FIND_SHED_EVERY look-ups (a few
# madvise calls): some 4 MB at most stay mapped by them.
FIND_SHED_EVERY = 32

# A bulk scan's match: where, its status and retry (pending changes
# included), and its trigger time.
Match = tuple[Location, int, int, int]
# An entry's topic hash and tag hash, adjacent (storage.delay_index): a scan
# for a tag looks for both at once in the raw bytes.
_TOPIC_TAG = struct.Struct("<II")
_TOPIC_TAG_OFFSET = 28
_TOPIC = struct.Struct("<I")


class ScanFloors:
    """Where a bulk scan of one filter begins in each file (`scan_matches`):
    below a file's floor no entry matches the filter. The scan raises the
    floor of each file it reads to where it read to, and of a file its
    counts let it skip to the file's end; only its caller knows whether
    what the scan passed stays unmatched once its call is done (broker.disk.bulk
    keeps a copy for the next call of the same filter, `cut` to the last
    match it took, when the call changes every match it took to a status
    the filter does not hold, and no message enters those statuses in
    place).

    A floor is of the file it was raised on: new entries are only ever
    appended to a file (at or past `applied`), so never below it; a file
    retired and made again under the same id (a span's id comes back
    after 2**16 spans of its size) is a new `Hour`, whose floor is 0.

    Worked example: a delete of 100,000 matches in files 10 (40,000
    entries), 11 and 12 (40,000 each): its scan passes 10 and 11 and stops
    in 12 at the entry after its 100,000th match, 20,000: floors {10:
    40,000, 11: 40,000, 12: 20,000}, and the next call's scan reads file
    12 from entry 20,000 (and files 10 and 11 from any entry sent to
    them since). Memory: one entry a file scanned."""

    __slots__ = ("_floors",)

    def __init__(self, floors: dict[int, tuple[Hour, int]] | None = None) -> None:
        self._floors = {} if floors is None else floors  # file id -> (the file, its floor)

    def copy(self) -> ScanFloors:
        return ScanFloors(dict(self._floors))

    def floor(self, h: Hour) -> int:
        """The first entry of `h` that may match (0: none known not to)."""
        held = self._floors.get(h.hour)
        if held is None or held[0] is not h:
            return 0
        if held[1] > h.applied:
            raise InvariantError(f"file {h.hour}: a scan floor of {held[1]} past its {h.applied} entries")
        return held[1]

    def raise_to(self, h: Hour, global_index: int) -> None:
        """No entry of `h` below `global_index` matches."""
        self._floors[h.hour] = (h, global_index)

    def cut(self, after: Location) -> None:
        """Keep only what lies before `after` in file order: files past
        its file forgotten, its file's floor at most its entry."""
        self._floors = {f: held for f, held in self._floors.items() if f <= after.hour}
        held = self._floors.get(after.hour)
        if held is not None and held[1] > after.global_index:
            self._floors[after.hour] = (held[0], after.global_index)

    def __repr__(self) -> str:
        return f"ScanFloors({ {f: floor for f, (_, floor) in sorted(self._floors.items())} })"


class Reader:
    """Lookups and scans (see the module docstring; each call's contract is
    on `storage.store.Store`). One thread calls it."""

    def __init__(self, hours: HourTable, pending: Pending, ids: IdIndex) -> None:
        self._hours = hours
        self._pending = pending
        self._ids = ids
        self._finds = 0  # look-ups by id since the hours were last shed

    # -- by id and by place ------------------------------------------------------------

    def get(self, topic: str, msg_id: str) -> Message | None:
        return self.find(self._ids.key(topic, msg_id), topic, msg_id)

    def find(self, key: int, topic: str, msg_id: str) -> Message | None:
        """The live message under (topic, msgId), whose id key is `key`:
        sent by a pending record (the newest that is not released), else
        among the id index's candidates."""
        for pending in self._pending.messages(key):
            if pending.topic == topic and pending.msg_id == msg_id:
                found = self.read_message(pending.location, pending)
                if found is not None:  # released in this batch: a later resend may follow
                    return found
        self._finds += 1
        if self._finds >= FIND_SHED_EVERY:
            self._finds = 0
            self._hours.shed()
        for where in self._ids.candidates(key):
            h = self._hours[where.hour]
            if where.global_index >= h.applied:
                continue
            message = self.read_message(where)
            if message is not None and message.topic == topic and message.msg_id == msg_id:
                return message
        return None

    def read_entry(self, where: Location) -> IndexEntry:
        entry, _, _, _ = self._hours.readable(self._hours[where.hour]).read_entry(where.global_index)
        pending = self._pending.states.get(where)
        if pending is not None:
            entry = tuple.__new__(IndexEntry, (*entry[:9], STATUS_BY_VALUE[pending[0]], pending[2]))
        return entry

    def live_entry(self, where: Location) -> IndexEntry | None:
        """The applied entry at `where` with any pending status change; None
        once it is released (moved, or its id freed)."""
        entry, _, _, flags = self._hours.readable(self._hours[where.hour]).read_entry(where.global_index)
        pending = self._pending.states.get(where)
        if pending is not None:
            flags = pending[1]
            entry = tuple.__new__(IndexEntry, (*entry[:9], STATUS_BY_VALUE[pending[0]], pending[2]))
        return None if flags & FLAG_RELEASED else entry

    def status(self, where: Location) -> Status:
        return STATUS_BY_VALUE[self.state(where)[0]]

    def read_message(self, where: Location, pending_message: Message | None = None) -> Message | None:
        """The whole message at `where`, None once released; `pending_message`:
        the message as a pending send made it (its status may have changed)."""
        h = self._hours.get(where.hour)
        if pending_message is not None or h is None or not 0 <= where.global_index < h.applied:
            status, flags, retry, _ = self.state(where)
            if flags & FLAG_RELEASED:
                return None
            if pending_message is not None:
                return pending_message.with_state(STATUS_BY_VALUE[status], retry)
        if h is None:
            raise InvariantError(f"{where}: pending in an hour the store does not hold")
        files = self._hours.readable(h)
        entry, offset8, size, flags = files.read_entry(where.global_index)
        pending = self._pending.states.get(where)
        if pending is None:
            status, retry = entry.status, entry.retry
        else:
            status, flags, retry = pending[0], pending[1], pending[2]
        if flags & FLAG_RELEASED:
            return None
        body = delay_log.unpack_body(files.read_body(offset8, size))
        return tuple.__new__(Message, (body.topic, body.msg_id, body.msg, body.produce_ms, entry.trigger_ms, body.ttl_ms,
                                       body.max_retry, entry.priority, body.tag, STATUS_BY_VALUE[status], retry, where,
                                       body.key, body.traceparent, body.tracestate, body.redrive_count,
                                       body.fair_key, END_PAUSED if flags & FLAG_PAUSED else "", 0))

    def state(self, where: Location) -> State:
        """(status, flags, retry, topic hash) at `where`, pending changes
        included; topic hash -1 for a message sent by a pending record
        (`Pending.topic_hash_of` finds it)."""
        pending = self._pending.states.get(where)
        if pending is not None:
            return pending
        h = self._hours.get(where.hour)
        if h is None or not 0 <= where.global_index < h.entries:
            raise InvalidRequest("location", f"no message at {where}")
        if where.global_index >= h.applied:  # sent in this batch, not applied yet
            return Status.WAITING, 0, 0, -1
        entry, _, _, flags = self._hours.readable(h).read_entry(where.global_index)
        return int(entry.status), flags, entry.retry, entry.topic_hash

    def slot(self, h: Hour, second: int) -> tuple[int, int]:
        """(last, count) of a second for the next send: staged or on disk
        (the caller has looked at the pending ones)."""
        staged = h.slot(second)
        if staged is not None:
            return staged
        if h.applied == 0:
            return -1, 0  # nothing of this hour is on disk yet
        slot = self._hours.files(h).read_slot(second)
        h.know_slot(second, slot)
        return slot

    # -- scans -------------------------------------------------------------------------

    def scan_ready(self, topic_hash: int, start: Location, until_hour: int, max_scan: int,
                   max_found: int) -> tuple[list[IndexEntry], Location | None]:
        return self.scan_status(topic_hash, (Status.READY,), start, until_hour, max_scan, max_found,
                                worth_reading=(Status.WAITING, Status.READY, Status.CONSUMING))

    def scan_status(self, topic_hash: int, statuses: Sequence[Status], start: Location, until_hour: int,
                    max_scan: int, max_found: int, worth_reading: Sequence[Status] = ()
                    ) -> tuple[list[IndexEntry], Location | None]:
        found: list[IndexEntry] = []
        scanned = 0
        pending = self._pending.states.packed  # (storage.pending.state_key -> pack_state)
        wanted = frozenset(int(s) for s in statuses)
        worth = tuple(worth_reading or statuses)
        # `start` may lie in an hour no longer held (retired since): then the
        # next hour is read from its first entry
        size = min(SCAN_SLICE, max(SCAN_FIRST_SLICE, 2 * max_found))
        for h in self._hours.ascending(start.hour, until_hour):
            hour = h.hour
            first = start.global_index if hour == start.hour else 0
            counts = h.topics.get(topic_hash)
            if counts is None or not any(counts[s] for s in worth):
                continue
            files = self._hours.readable(h)
            while first < h.applied:
                if scanned >= max_scan or len(found) >= max_found:
                    return found, Location(hour, first)
                n = min(size, h.applied - first, max_scan - scanned)  # (never past max_scan)
                size = min(SCAN_SLICE, 2 * size)
                raw = files.idx.read(delay_index.entry_offset(first), n * delay_index.ENTRY_BYTES)
                gi = first
                for fields in delay_index.ENTRY.iter_unpack(raw):
                    if fields[6] == topic_hash:
                        status = fields[11]
                        if pending:
                            p = pending.get(hour << 32 | gi)
                            if p is not None:
                                status = p & 0xFF
                        if status in wanted and not fields[12] & FLAG_RELEASED:
                            at = (gi - first) * delay_index.ENTRY_BYTES
                            entry = delay_index.unpack_entry(files.idx.path, hour, gi,
                                                             raw[at:at + delay_index.ENTRY_BYTES])[0]
                            found.append(entry._replace(status=STATUS_BY_VALUE[status]) if entry.status != status else entry)
                            if len(found) >= max_found:
                                gi += 1
                                break
                    gi += 1
                scanned += gi - first
                first = gi
        return found, None

    def scan_matches(self, topic_hash: int, statuses: Sequence[Status], start: Location, max_scan: int,
                     max_found: int, tag_hash: int | None, trigger_from: int | None, trigger_to: int | None,
                     now_ms: int, floors: ScanFloors | None = None, descending: bool = False
                     ) -> tuple[list[Match], Location | None]:
        """The topic's unreleased entries in `statuses` with tag hash
        `tag_hash` (None: any) and trigger time in [trigger_from,
        trigger_to) (None: unbounded), pending changes included, from
        `start` in file order (`descending`: the files from start's down,
        each still read from its first entry on): up to
        `max_found`, reading at most about `max_scan` entries; the place to
        go on from, None at the end. An entry is checked (its checksum, its
        globalIndex) only when it matches: a damaged one raises
        CorruptionError. `floors`: each file read from its floor, and the
        floors raised as the scan passes entries (`ScanFloors`).

        Files outside the time range are not read. Every message of an
        hour's file triggers before the hour ends (it is filed at the later
        of its trigger time and its send's time); only while the hour has
        not begun has none been filed late (its trigger before the hour), so
        an hour is left out below `trigger_from` always and at or above
        `trigger_to` only when it begins more than an hour from `now_ms`. A
        span's messages all trigger within the span (it is used only for
        trigger times far ahead)."""
        found: list[Match] = []
        scanned = 0
        pending = self._pending.states.packed  # (storage.pending.state_key -> pack_state)
        wanted = frozenset(int(s) for s in statuses)
        entry_bytes = delay_index.ENTRY_BYTES
        fixed_bytes = delay_index.FIXED.size
        unpack = delay_index.ENTRY.unpack_from
        crc32 = zlib.crc32
        # A file is searched for the entries' bytes (C) rather than walked
        # entry by entry when a tag is asked or the topic holds under half of it.
        tagged = None if tag_hash is None else _TOPIC_TAG.pack(topic_hash, tag_hash)
        topic_only = _TOPIC.pack(topic_hash)
        changing = self._pending.state_hours  # files whose counts a pending change may leave behind
        walk = self._hours.descending(start.hour) if descending else self._hours.ascending(start.hour, None)
        for h in walk:
            hour = h.hour
            if self._outside(h, trigger_from, trigger_to, now_ms):
                continue
            first = start.global_index if hour == start.hour else 0
            if floors is not None:
                first = max(first, floors.floor(h))
                if first >= h.applied:
                    continue
            counts = h.topics.get(topic_hash)
            if counts is None or not (any(counts[s] for s in wanted) or hour in changing):
                if floors is not None:
                    floors.raise_to(h, h.applied)
                continue
            pattern = tagged
            if pattern is None and counts is not None and 2 * sum(counts) < h.applied:
                pattern = topic_only
            files = self._hours.readable(h)
            path = files.idx.path
            while first < h.applied:
                if scanned >= max_scan or len(found) >= max_found:
                    return found, Location(hour, first)
                n = min(SCAN_SLICE, h.applied - first)
                raw = files.idx.read(delay_index.entry_offset(first), n * entry_bytes)
                if pattern is None:
                    ats: Iterator[int] = iter(range(0, n * entry_bytes, entry_bytes))
                else:
                    ats = _aligned(raw, pattern, _TOPIC_TAG_OFFSET, entry_bytes)
                stop = n
                for at in ats:
                    (trigger_ms, _, _, _, gi, _, topic, tag, _, second, crc, status, flags,
                     retry) = unpack(raw, at)
                    if topic != topic_hash or (tag_hash is not None and tag != tag_hash):
                        continue
                    if (trigger_from is not None and trigger_ms < trigger_from) or \
                            (trigger_to is not None and trigger_ms >= trigger_to):
                        continue
                    if pending:
                        p = pending.get(hour << 32 | gi)
                        if p is not None:
                            status, flags, retry = p & 0xFF, p >> 8 & 0xFF, p >> 16 & 0xFFFF
                    if status not in wanted or flags & FLAG_RELEASED:
                        continue
                    if crc32(raw[at:at + fixed_bytes]) != crc or gi != first + at // entry_bytes or second >= 3600:
                        raise CorruptionError(path, delay_index.entry_offset(first + at // entry_bytes),
                                              "index entry checksum mismatch, or not where it says it is")
                    found.append((tuple.__new__(Location, (hour, gi)), status, retry, trigger_ms))
                    if len(found) >= max_found:
                        stop = at // entry_bytes + 1
                        break
                scanned += stop
                first += stop
                if floors is not None:
                    floors.raise_to(h, first)
        return found, None

    @staticmethod
    def _outside(h: Hour, trigger_from: int | None, trigger_to: int | None, now_ms: int) -> bool:
        """Does no message of this file trigger in [trigger_from, trigger_to)? (scan_matches)"""
        if trigger_from is None and trigger_to is None:
            return False
        if spans.is_span(h.hour):
            if h.start is None:
                return False
            first_ms = h.start * MS_PER_HOUR
            end_ms = first_ms + (MS_PER_HOUR << spans.span_shift(h.hour))
            return (trigger_from is not None and end_ms <= trigger_from) or \
                (trigger_to is not None and first_ms >= trigger_to)
        first_ms = h.hour * MS_PER_HOUR
        if trigger_from is not None and first_ms + MS_PER_HOUR <= trigger_from:
            return True
        return trigger_to is not None and first_ms >= trigger_to and first_ms > now_ms + MS_PER_HOUR

    def hour_entries(self, hour: int, first: int = 0, count: int | None = None) -> list[IndexEntry]:
        h = self._hours.get(hour)
        if h is None:
            return []
        files = self._hours.readable(h)
        stop = h.applied if count is None else min(h.applied, first + count)
        out = [files.read_entry(gi)[0] for gi in range(first, stop)]
        pending = self._pending.states
        if pending:
            out = [e if (s := pending.get(e.location)) is None else e._replace(status=STATUS_BY_VALUE[s[0]], retry=s[2])
                   for e in out]
        return out

    def count_waiting(self, hour: int, first: int, count: int, topics: dict[int, list[int]],
                      edges: Sequence[int]) -> int:
        """Add the WAITING entries of `topics` among the file's entries
        `first` .. `first + count - 1` to topics[topic hash] by trigger
        time (storage.delay_index.count_waiting: one read, no entry
        objects; pending status changes counted as they will be). Returns
        how many entries it read: 0 past the end."""
        h = self._hours.get(hour)
        if h is None:
            return 0
        stop = min(h.applied, first + count)
        if stop <= first:
            return 0
        files = self._hours.readable(h)
        raw = files.idx.read(delay_index.entry_offset(first), (stop - first) * delay_index.ENTRY_BYTES)
        statuses: dict[int, int] = {}
        if hour in self._pending.state_hours:
            packed, base = self._pending.states.packed, hour << 32
            for gi in range(first, stop):
                state = packed.get(base | gi)
                if state is not None:
                    statuses[gi] = unpack_state(state)[0]
        delay_index.count_waiting(files.idx.path, first, raw, topics, edges, statuses)
        return stop - first

    # -- by second ----------------------------------------------------------------------

    def read_second(self, hour: int, second: int) -> list[IndexEntry]:
        h = self._hours.get(hour)
        if h is None:
            return []
        files = self._hours.readable(h)
        last, count = files.read_slot(second)
        if count and last >= h.applied:
            raise CorruptionError(files.sec.path, 0, f"second {second} points at entry {last}, past the end")
        out = []
        gi = last
        for expected_local in range(count - 1, -1, -1):
            entry, _, _, _ = files.read_entry(gi)
            if entry.local_index != expected_local or entry.second != second:
                raise CorruptionError(files.idx.path, delay_index.entry_offset(gi),
                                      f"chain of second {second} broken at entry {gi}")
            out.append(entry)
            gi = entry.pre_global_index
        out.reverse()
        return out

    def second_counts(self, hour: int) -> Sequence[int]:
        h = self._hours.get(hour)
        if h is None:
            return [0] * SECONDS_PER_HOUR
        return self._hours.readable(h).counts()

    # -- hours and their counts (committed changes only) ---------------------------------

    def next_hour(self, from_hour: int) -> int | None:
        h = next(self._hours.ascending(from_hour), None)
        if h is None or spans.is_span(h.hour):  # (spans are for refile(), never for the wheel)
            return None
        return h.hour

    def file_hours(self, file_id: int) -> tuple[int, int]:
        h = self._hours.get(file_id)
        if h is None or not spans.is_span(file_id):
            return file_id, file_id
        start = self._hours.span_start(h)
        if start is None:  # nothing applied yet: a span starts at least its size from now
            now_hour = self._hours.now_hour
            start = 0 if now_hour == NO_HOUR else now_hour
        return start, start + (1 << spans.span_shift(file_id)) - 1

    def hours(self) -> list[tuple[int, int, int]]:
        return [(h.hour, h.entries, h.ended) for h in self._hours.ascending()]

    def hour_topic_counts(self) -> Iterator[list[tuple[int, list[int]]]]:
        """For each live hour, ascending: (topic hash, messages per status)
        of every topic with messages in it (committed changes). Summed, they
        are each topic's `topic_counts`, for every topic in one pass instead
        of a pass over the hours per topic. Each hour's list is a copy, so
        the caller may pause between hours while the store changes (an hour
        retired meanwhile is skipped)."""
        for hour in [h.hour for h in self._hours.ascending()]:
            h = self._hours.get(hour)
            if h is not None:
                yield [(topic_hash, list(counts)) for topic_hash, counts in h.topics.items() if any(counts)]

    def topic_hours(self, topic_hash: int) -> list[tuple[int, list[int]]]:
        out = []
        for h in self._hours.ascending():
            counts = h.topics.get(topic_hash)
            if counts is not None and any(counts):
                out.append((h.hour, list(counts)))
        return out

    def file_counts(self) -> list[tuple[int, list[int]]]:
        return [(h.hour, list(h.totals)) for h in self._hours.ascending()]

    def first_hours(self, status: Status) -> dict[int, int]:
        first: dict[int, int] = {}
        for h in self._hours.ascending():
            for topic_hash, counts in h.topics.items():
                if counts[status] and topic_hash not in first:
                    first[topic_hash] = h.hour
        return first

    def topic_counts(self, topic_hash: int) -> list[int]:
        return total_counts(self.topic_hours(topic_hash))

    def __repr__(self) -> str:
        return f"Reader(hours={len(self._hours)}, pending={len(self._pending)})"


def _aligned(raw: bytes, pattern: bytes, offset: int, size: int) -> Iterator[int]:
    """The starts of the `size`-byte entries of `raw` holding `pattern` at
    `offset` within them, found by the byte search (C), not entry by entry."""
    pos = raw.find(pattern, offset)
    while pos >= 0:
        at = pos - offset
        if at % size == 0:
            yield at
            pos = raw.find(pattern, at + size + offset)
        else:
            pos = raw.find(pattern, pos + 1)
