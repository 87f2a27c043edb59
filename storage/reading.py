"""Reading the store: by id, by place, by second, and by topic and status.

Every read sees the changes appended but not yet committed (the pending
overlays: ids sent in this batch, statuses changed in it), so a batch can
build on itself, except where a method says it reads committed state
only (the per-topic counts).

    get(topic, msgId)        id index -> candidates -> entry and body
    read_second(hour, s)     the second table's last entry of s, then the
                             preGlobalIndex chain back: O(s's entries)
    scan_status / scan_ready a topic's entries in given statuses, hour by
                             hour, skipping hours whose counts hold none,
                             SCAN_SLICE raw entries per read
    topic_hours, file_counts per-hour counts kept in RAM: O(hours)
    hour_topic_counts        the same counts of every topic, an hour at a
                             time: O((hour, topic) pairs) for all topics

Nothing here writes, except that reading an hour first writes what is
staged for it (`_readable`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import cast

from . import delay_index, delay_log, records, spans
from .applying import Applying
from .delay_index import FLAG_RELEASED
from .entry import SECONDS_PER_HOUR, IndexEntry, Location, Message, Status
from .errors import CorruptionError, InvalidRequest, InvariantError
from .hour import Hour
from .hour_table import NO_HOUR
from .types import text_hash, total_counts

# Index entries read at once by a scan (scan_ready): 192 KiB.
SCAN_SLICE = 4096


class Reading(Applying):
    """Lookups and scans (see the module docstring)."""

    def get(self, topic: str, msg_id: str) -> Message | None:
        """The message stored under (topic, msgId), or None (never stored,
        released, or its hour retired)."""
        self._check_open()
        return self._find(self.ids.key(topic, msg_id), topic, msg_id)

    def _find(self, key: int, topic: str, msg_id: str) -> Message | None:
        for pending in self._pending_ids.get(key, ()):
            if pending.topic == topic and pending.msg_id == msg_id:
                found = self.read_message(pending.location, pending)
                if found is not None:  # released in this batch: a later resend may follow
                    return found
        for where in self.ids.candidates(key):
            h = self._hours[where.hour]
            if where.global_index >= h.applied:
                continue
            message = self.read_message(where)
            if message is not None and message.topic == topic and message.msg_id == msg_id:
                return message
        return None

    def read_entry(self, where: Location) -> IndexEntry:
        """The index entry at `where`, with any pending status change."""
        entry, _, _, _ = self._readable(self._hours[where.hour]).read_entry(where.global_index)
        pending = self._pending_state.get(where)
        if pending is not None:
            entry = entry._replace(status=Status(pending[0]), retry=pending[2])
        return entry

    def status(self, where: Location) -> Status:
        """The status at `where`, pending changes included (no body read)."""
        return Status(self._state(where)[0])

    def ack_deadline(self, where: Location) -> int | None:
        """The ack deadline of a CONSUMING message, if its pull's record gave
        one (records since version 2 of the checkpoint all do)."""
        return self._consuming.get(where) or None

    def consuming(self) -> dict[Location, int]:
        """Every CONSUMING message (as of the records applied) and its ack
        deadline, 0 where unknown: found without a scan, from the checkpoint
        and the records replayed after it (a checkpoint written before the
        set was kept costs one scan of the hours holding any, at open)."""
        return dict(self._consuming)

    def scan_ready(self, topic_hash: int, start: Location, until_hour: int, max_scan: int,
                   max_found: int) -> tuple[list[IndexEntry], Location | None]:
        """READY entries of a topic (pending changes included), in filing
        order -- hour ascending, then globalIndex -- from `start`, in hours up
        to `until_hour`: at most `max_found` of them, reading at most about
        `max_scan` entries. Returns them and where to go on (None: nothing
        more up to `until_hour` now). Only hours whose counts hold live
        messages of the topic are read, a slice of raw entries at a time."""
        return self.scan_status(topic_hash, (Status.READY,), start, until_hour, max_scan, max_found,
                                worth_reading=(Status.WAITING, Status.READY, Status.CONSUMING))

    def scan_status(self, topic_hash: int, statuses: Sequence[Status], start: Location, until_hour: int,
                    max_scan: int, max_found: int, worth_reading: Sequence[Status] = ()
                    ) -> tuple[list[IndexEntry], Location | None]:
        """As `scan_ready`, for entries in any of `statuses` (dead letters:
        EXPIRED and ENDED), released ones left out. An hour is read only if
        its committed counts hold the topic in one of `worth_reading`
        (default: `statuses`; a change to them still pending is seen only
        in hours read)."""
        self._check_open()
        found: list[IndexEntry] = []
        scanned = 0
        pending = self._pending_state
        wanted = frozenset(int(s) for s in statuses)
        worth = tuple(worth_reading or statuses)
        i = self._hour_order.bisect_left(start.hour)
        # `start` may lie in an hour no longer held (retired since): then the
        # next hour is read from its first entry
        first = start.global_index if i < len(self._hour_order) and self._hour_order[i] == start.hour else 0
        while i < len(self._hour_order):
            hour = self._hour_order[i]
            if hour > until_hour:
                break
            h = self._hours[hour]
            counts = h.topics.get(topic_hash)
            if counts is None or not any(counts[s] for s in worth):
                i, first = i + 1, 0
                continue
            files = self._readable(h)
            while first < h.applied:
                if scanned >= max_scan or len(found) >= max_found:
                    return found, Location(hour, first)
                n = min(SCAN_SLICE, h.applied - first)
                raw = files.idx.read(delay_index.entry_offset(first), n * delay_index.ENTRY_BYTES)
                gi = first
                for fields in delay_index.ENTRY.iter_unpack(raw):
                    if fields[6] == topic_hash:
                        status = fields[11]
                        if pending:
                            p = pending.get((hour, gi))
                            if p is not None:
                                status = p[0]
                        if status in wanted and not fields[12] & FLAG_RELEASED:
                            at = (gi - first) * delay_index.ENTRY_BYTES
                            entry = delay_index.unpack_entry(files.idx.path, hour, gi,
                                                             raw[at:at + delay_index.ENTRY_BYTES])[0]
                            found.append(entry._replace(status=Status(status)) if entry.status != status else entry)
                            if len(found) >= max_found:
                                gi += 1
                                break
                    gi += 1
                scanned += gi - first
                first = gi
            i, first = i + 1, 0
        return found, None

    def read_message(self, where: Location, pending_message: Message | None = None) -> Message | None:
        """The whole message at `where`; None once it has been released."""
        h = self._hours.get(where.hour)
        if pending_message is not None or h is None or not 0 <= where.global_index < h.applied:
            status, flags, retry, _ = self._state(where)
            if flags & FLAG_RELEASED:
                return None
            if pending_message is not None:
                return pending_message._replace(status=Status(status), retry=retry)
        if h is None:
            raise InvariantError(f"{where}: pending in an hour the store does not hold")
        files = self._readable(h)
        entry, offset8, size, flags = files.read_entry(where.global_index)
        pending = self._pending_state.get(where)
        if pending is None:
            status, retry = entry.status, entry.retry
        else:
            status, flags, retry = pending[0], pending[1], pending[2]
        if flags & FLAG_RELEASED:
            return None
        body = delay_log.unpack_body(files.read_body(offset8, size))
        return Message(body.topic, body.msg_id, body.msg, body.produce_ms, entry.trigger_ms, body.ttl_ms,
                       body.max_retry, entry.priority, body.tag, Status(status), retry, where, body.key)

    def _state(self, where: Location) -> tuple[int, int, int, int]:
        """(status, flags, retry, topic hash) at `where`, pending changes included."""
        pending = self._pending_state.get(where)
        if pending is not None:
            return pending
        h = self._hours.get(where.hour)
        if h is None or not 0 <= where.global_index < h.entries:
            raise InvalidRequest("location", f"no message at {where}")
        if where.global_index >= h.applied:  # sent in this batch, not applied yet
            return Status.WAITING, 0, 0, -1  # topic hash: see _pending_topic_hash
        entry, _, _, flags = self._readable(h).read_entry(where.global_index)
        return int(entry.status), flags, entry.retry, entry.topic_hash

    def _pending_topic_hash(self, where: Location) -> int:
        for kind, _, items in self._pending:
            if kind is records.Kind.SEND:
                for item in cast(Sequence[records.SendItem], items):
                    if item.hour == where.hour and item.global_index == where.global_index:
                        return item.topic_hash
        raise InvariantError(f"{where} is neither applied nor pending")

    def _slot(self, h: Hour, second: int) -> tuple[int, int]:
        """(last, count) of a second for the next send: staged or on disk
        (the caller has looked at the not-yet-durable ones)."""
        staged = h.slot(second)
        if staged is not None:
            return staged
        if h.applied == 0:
            return -1, 0  # nothing of this hour is on disk yet
        slot = self._files(h).read_slot(second)
        h.know_slot(second, slot)
        return slot

    def read_second(self, hour: int, second: int) -> list[IndexEntry]:
        """Every applied entry filed under `second` of `hour`, localIndex
        ascending, found by walking preGlobalIndex back from the second
        table: cost proportional to that second's entries."""
        self._check_open()
        h = self._hours.get(hour)
        if h is None:
            return []
        files = self._readable(h)
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
        """Entries per second of `hour` (3600 values)."""
        h = self._hours.get(hour)
        if h is None:
            return [0] * SECONDS_PER_HOUR
        return self._readable(h).counts()

    def next_hour(self, from_hour: int) -> int | None:
        """The first hour >= `from_hour` that holds any entry (spans, which
        sort after every hour, are not hours)."""
        i = self._hour_order.bisect_left(from_hour)
        if i < len(self._hour_order):
            hour: int = self._hour_order[i]
            if not spans.is_span(hour):
                return hour
        return None  # (spans are for refile(), never for the wheel)

    def file_hours(self, file_id: int) -> tuple[int, int]:
        """[first, last] hour a file covers: the hour itself, or a span's
        hours (storage.spans)."""
        h = self._hours.get(file_id)
        if h is None or not spans.is_span(file_id):
            return file_id, file_id
        start = self._span_start(h)
        if start is None:  # nothing applied yet: a span starts at least its size from now
            start = 0 if self._now_hour == NO_HOUR else self._now_hour
        return start, start + (1 << spans.span_shift(file_id)) - 1

    def hours(self) -> list[tuple[int, int, int]]:
        """(hour, entries, ended) of every live hour, ascending."""
        return [(hour, self._hours[hour].entries, self._hours[hour].ended) for hour in self._hour_order]

    # == per-topic counts (committed changes only) ==============================

    def topic_names(self) -> dict[int, str]:
        """topic hash -> topic, for every topic with a message in a live hour."""
        return dict(self._topic_names)

    def has_topic(self, topic: str) -> bool:
        """`topic` has a message in a live hour (as `topic_names`, O(1))."""
        return self._topic_names.get(text_hash(topic)) == topic

    def topic_count(self) -> int:
        """How many topics `topic_names` holds, O(1)."""
        return len(self._topic_names)

    def hour_topic_counts(self) -> Iterator[list[tuple[int, list[int]]]]:
        """For each live hour, ascending: (topic hash, messages per status)
        of every topic with messages in it (committed changes). Summed, they
        are each topic's `topic_counts`, for every topic in one pass instead
        of a pass over the hours per topic. Each hour's list is a copy, so
        the caller may pause between hours while the store changes (an hour
        retired meanwhile is skipped)."""
        for hour in list(self._hour_order):
            h = self._hours.get(hour)
            if h is not None:
                yield [(topic_hash, list(counts)) for topic_hash, counts in h.topics.items() if any(counts)]

    def topic_hours(self, topic_hash: int) -> list[tuple[int, list[int]]]:
        """(hour, counts) of every live hour holding messages of the topic,
        ascending; counts[s] is how many are in status s (index 0 unused)."""
        out = []
        for hour in self._hour_order:
            counts = self._hours[hour].topics.get(topic_hash)
            if counts is not None and any(counts):
                out.append((hour, list(counts)))
        return out

    def file_counts(self) -> list[tuple[int, list[int]]]:
        """(file id, messages per status over all topics) of every live
        hour and span, ascending: O(files), from totals kept with the
        per-topic counts."""
        return [(hour, list(self._hours[hour].totals)) for hour in self._hour_order]

    def first_hours(self, status: Status) -> dict[int, int]:
        """topic hash -> the first live hour holding a message of the topic
        in `status` (committed changes): one pass over the hours' counts."""
        first: dict[int, int] = {}
        for hour in self._hour_order:
            for topic_hash, counts in self._hours[hour].topics.items():
                if counts[status] and topic_hash not in first:
                    first[topic_hash] = hour
        return first

    def topic_counts(self, topic_hash: int) -> list[int]:
        """The topic's messages per status over all live hours (index 0 unused)."""
        return total_counts(self.topic_hours(topic_hash))

    def hour_entries(self, hour: int, first: int = 0, count: int | None = None) -> list[IndexEntry]:
        """Applied entries of `hour` from globalIndex `first` (`count` of them,
        default all), ascending: a sequential read of the hour's index, for
        scans (recovery of ready and consuming messages, delay histograms);
        O(the entries read). [] once past the end or for an unknown hour."""
        self._check_open()
        h = self._hours.get(hour)
        if h is None:
            return []
        files = self._readable(h)
        stop = h.applied if count is None else min(h.applied, first + count)
        out = [files.read_entry(gi)[0] for gi in range(first, stop)]
        pending = self._pending_state
        if pending:
            out = [e if (s := pending.get(e.location)) is None else e._replace(status=Status(s[0]), retry=s[2])
                   for e in out]
        return out
