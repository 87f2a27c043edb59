"""One hour's live state: counters in RAM, files on disk, and a write stage.

Applying a record does not write each message to the hour's files at once:
it *stages* the bytes (index entries, delay-log frames, second-table slots)
in the hour's buffers, and `flush()` writes each buffer with one call. Near
(memory-mapped) hours are flushed after every commit; far hours are flushed
when the store's staged total grows past a limit, at a checkpoint, or
before anything reads them, so a backlog spread over thousands of hours
costs a few large writes per hour instead of several small ones per
message. Reads of an hour look at its stage first, so staging is invisible.

Only durable records are staged: staged bytes are derived data that a
crash may lose, and replaying the log from the checkpoint recreates them.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from . import delay_index, delay_log, spans
from .checkpoint import HourRecord
from .errors import InvariantError
from .hour_files import HourFiles
from .records import SendItem

# A SendItem's fields in delay_index.pack_entry's order, and its body
_ENTRY_FIELDS = operator.itemgetter(7, 5, 6, 3, 1, 2, 9, 10, 8, 4)
_BODY = operator.attrgetter("body")


class Hour:
    __slots__ = ("_entries_buf", "_frames_buf", "_known_slots", "_slots", "_states", "applied", "ended", "entries",
                 "files", "hour", "last_end_ms", "log_bytes", "refiled", "start", "topics", "totals", "written",
                 "written_log_bytes")

    def __init__(self, hour: int, entries: int = 0, log_bytes: int = 0, ended: int = 0, last_end_ms: int = 0,
                 topics: dict[int, list[int]] | None = None):
        self.hour = hour
        self.entries = entries  # globalIndexes assigned (written + staged + not yet durable)
        self.written = entries  # globalIndexes whose entries are in the files
        self.applied = entries  # globalIndexes durable and readable (files + stage)
        self.log_bytes = log_bytes  # delay-log bytes assigned after the header
        self.written_log_bytes = log_bytes
        self.ended = ended  # entries in a final status (4..7)
        self.last_end_ms = last_end_ms
        # topic_hash -> [0, count of status 1, ..., count of status 7]
        self.topics: dict[int, list[int]] = {th: [0, *counts] for th, counts in (topics or {}).items()}
        self.totals = [sum(column) for column in zip(*self.topics.values())] if self.topics else [0] * 8  # all topics
        self.files: HourFiles | None = None
        # A span's first hour (storage.spans), known once an entry is read;
        # and how far re-filing its messages has read (RAM only).
        self.start: int | None = None if spans.is_span(hour) else hour
        self.refiled = 0
        self._entries_buf = bytearray()  # entries [written, applied)
        self._frames_buf = bytearray()  # delay-log bytes [written_log_bytes, ...)
        self._slots: dict[int, tuple[int, int]] = {}  # second -> (last, count) not yet written
        # second -> (last, count) as in the file, while its files are open:
        # a send to a second already seen reads no slot (at most 3,600).
        self._known_slots: dict[int, tuple[int, int]] = {}
        self._states: dict[int, bytes] = {}  # globalIndex < written -> mutable bytes not yet written

    # -- counters ----------------------------------------------------------------

    @property
    def staged_bytes(self) -> int:
        return len(self._entries_buf) + len(self._frames_buf) + 16 * (len(self._slots) + len(self._states))

    def record(self) -> HourRecord:
        return HourRecord(self.hour, self.entries, self.log_bytes, self.ended, self.last_end_ms,
                          {th: counts[1:] for th, counts in self.topics.items()})

    def count(self, topic_hash: int, status: int, delta: int) -> None:
        counts = self.topics.get(topic_hash)
        if counts is None:
            counts = self.topics[topic_hash] = [0] * 8
        counts[status] += delta
        self.totals[status] += delta

    # -- staging -----------------------------------------------------------------

    def stage_send(self, item: SendItem) -> bool:
        """Stage one durable send. Items of an hour arrive in globalIndex
        order; one already staged (a record replayed twice) is skipped
        (returns False)."""
        return bool(self.stage_sends((item,)))

    def stage_sends(self, items: Sequence[SendItem]) -> Sequence[SendItem]:
        """`stage_send` of a run of this hour's items, in globalIndex order,
        in three calls whatever its length; returns those staged (without
        the ones staged already: a record replayed twice)."""
        applied = self.applied
        skip = 0
        for item in items:
            if item.global_index >= applied:
                break
            skip += 1
        run = items[skip:] if skip else items
        if not run:
            return run
        slots = self._slots
        for item in run:
            if item.global_index != applied:
                raise InvariantError(f"hour {self.hour}: entry {item.global_index} staged after {applied}")
            slots[item.second] = (applied, item.local_index + 1)
            applied += 1
        self._entries_buf += delay_index.pack_waiting_entries(map(_ENTRY_FIELDS, run))
        taken = delay_log.append_frames(self._frames_buf, map(_BODY, run))
        self.applied = applied
        last = run[-1]
        if last.global_index >= self.entries:  # replay: counters follow the records
            self.entries = last.global_index + 1
            self.log_bytes = (last.log_offset8 << 3) + taken
        return run

    def stage_state(self, global_index: int, status: int, flags: int, retry: int) -> None:
        mutable = delay_index.MUTABLE.pack(status, flags, retry)
        if global_index >= self.written:
            pos = (global_index - self.written) * delay_index.ENTRY_BYTES + delay_index.MUTABLE_OFFSET
            self._entries_buf[pos:pos + len(mutable)] = mutable
        else:
            self._states[global_index] = mutable

    def flush(self, files: HourFiles) -> None:
        """Write everything staged: frames, entries and slots in one call,
        the states of written entries in another."""
        frames, entries, slots = self._frames_buf, self._entries_buf, self._slots
        if frames or entries or slots:
            files.write_staged(self.written_log_bytes // delay_log.ALIGN_BYTES, frames, self.written, entries,
                               slots.items() if slots else None)
            if frames:
                self.written_log_bytes += len(frames)
                self._frames_buf = bytearray()
            if entries:
                self.written = self.applied
                self._entries_buf = bytearray()
            if slots:
                self._known_slots.update(slots)
                slots.clear()
        if self._states:
            files.write_states(self._states.items())
            self._states.clear()

    @property
    def dirty(self) -> bool:
        return bool(self._entries_buf or self._slots or self._states)

    # -- reads that see the stage -------------------------------------------------

    def staged_flags(self, global_index: int) -> int | None:
        """The flags of an entry whose state is staged, else None (read the file)."""
        if global_index >= self.written:
            at = (global_index - self.written) * delay_index.ENTRY_BYTES + delay_index.MUTABLE_OFFSET + 1
            return self._entries_buf[at] if at < len(self._entries_buf) else None
        mutable = self._states.get(global_index)
        return None if mutable is None else mutable[1]

    def slot(self, second: int) -> tuple[int, int] | None:
        """The staged or known (last, count) of `second`, or None to read the file."""
        return self._slots.get(second) or self._known_slots.get(second)

    def know_slot(self, second: int, slot: tuple[int, int]) -> None:
        """`slot` was read from the file (see `slot`)."""
        self._known_slots[second] = slot

    def forget_slots(self) -> None:
        """The files are closed: what they hold is read again when needed."""
        self._known_slots.clear()

    def __repr__(self) -> str:
        return (f"Hour({self.hour}, entries={self.entries}, written={self.written}, "
                f"ended={self.ended}, staged_bytes={self.staged_bytes})")
