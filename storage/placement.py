"""Placing new messages: the coordinates a send assigns, and their undo.

A send does not write the message anywhere but the commit log. It assigns
the message's coordinates at once, so the record can name them and every
later call of the same batch sees them:

    file      storage.spans.file_for(hour of max(trigger, now)): the hour
              itself, or a span of hours for one more than 32 h ahead
    globalIndex      the file's entry count, then +1
    second, localIndex, preGlobalIndex
                     the second's (last, count) -- from the pending
                     overlay, the hour's stage, or its second table --
                     then (this entry, count + 1) in the overlay
    delay-log offset the file's byte count / 8, then + the padded frame

Worked example: two sends for second 5 of hour h, nothing there yet:
the first gets globalIndex 0, localIndex 0, preGlobalIndex -1; the second
globalIndex 1, localIndex 1, preGlobalIndex 0; the overlay holds (1, 2).

If the append fails (a full disk, a record too large), `undo` puts every
counter and overlay back from what `place` and `pend_id` noted, so the
next send numbers on without a gap. `update` appends status changes the
same way, through the pending states (storage.pending).

`Placement` owns only the disk-room check (storage.disk_room); the
counters it moves are the hours' (storage.hour_table), the overlays are
`Pending`'s, and what a send must not duplicate it asks the `Reader`.
storage.refile places moved messages through it too.

The loop of `_send_items` and `place` is the ingest path's hottest code:
it binds what it calls to locals and builds its NamedTuples with
`tuple.__new__`; keep it that way.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

from . import delay_index, delay_log, records, spans
from .commit_log import CommitLog
from .delay_index import FLAG_END_TIME, FLAG_RELEASED
from .disk import DISK, Disk
from .disk_room import DiskRoom
from .entry import MS_PER_HOUR, MS_PER_SECOND, Fields, Location, Message, Status
from .errors import InvalidRequest, InvariantError, StoreClosedError
from .fileutil import PAGE_BYTES
from .framing import FRAME_HEADER_BYTES
from .hour import Hour
from .hour_table import HourTable
from .id_index import IdIndex
from .pending import Pending, State
from .reading import Reader
from .types import (
    DUPLICATE,
    MAX_RECORD_CHARS,
    MAX_RETRY_COUNT,
    STORED,
    NewMessage,
    SendResult,
    StateChange,
    text_hash,
    validate_message,
)

WAITING = Status.WAITING
ACKED = int(Status.ACKED)
NOT_END_TIME = 0xFF ^ FLAG_END_TIME  # a change's flags without FLAG_END_TIME (the entry's, or an earlier change's)
_TOPIC_AND_ID = operator.itemgetter(0, 1)  # a NewMessage's (topic, msg_id)
if NewMessage._fields[:2] != ("topic", "msg_id"):
    raise InvariantError(f"placement reads (topic, msg_id) as a NewMessage's first fields: {NewMessage._fields}")
# Topic and tag hashes kept across sends, up to this many texts (then forgotten, and kept anew).
HASHES_KEPT = 4096
# What a record's placements moved, to put back if it is not appended:
# file id -> (entries, log_bytes, created by this record) before it ...
UndoHours = dict[int, tuple[int, int, bool]]
# ... and (file id, second) -> the pending (last, count) before it (None: none).
UndoSlots = dict[tuple[int, int], tuple[int, int] | None]


class Placement:
    """Sends and status changes (see the module docstring; each call's
    contract is on `storage.store.Store`). One thread calls it."""

    def __init__(self, directory: str, hours: HourTable, pending: Pending, ids: IdIndex, log: CommitLog,
                 reader: Reader, disk: Disk = DISK) -> None:
        self._hours = hours
        self._pending = pending
        self._ids = ids
        self._log = log
        self._reader = reader
        self._disk_room = DiskRoom(directory, disk)
        self._hashes: dict[str, int] = {}  # topic or tag -> text_hash, at most HASHES_KEPT
        # pending's overlays themselves (the send loop reads and extends them)
        self._directory = directory
        self.closed = False  # the store closed (`Store.close`): sends refuse
        # The hashes of the topics whose messages' ends storage.end_index
        # keeps (a dedup window: the broker sets them, `Store.keep_ends`):
        # a change that ends one of their messages carries FLAG_END_TIME.
        self.end_topics: set[int] = set()

    def send(self, batch: Sequence[NewMessage], now_ms: int, checked: bool = False) -> list[SendResult]:
        """Append a batch of new messages as one commit-log record (the
        store's `send` is this method).

        A message whose (topic, msgId) exists (stored, or earlier in this
        batch) is not stored again: its result is DUPLICATE with the stored
        message. Durable, and visible to readers, after `commit()`.
        Raises InvalidRequest (nothing appended) for out-of-range fields,
        and OSError(ENOSPC) (nothing appended) if the disk lacks room for
        what the batch will write (see `make_room`); if the append itself
        fails, every counter and overlay it touched is put back, so the
        next send numbers on without a gap; StoreClosedError once the
        store closed. `checked`: the caller has checked every message's
        fields already (the broker's parsing does, broker.core.params;
        storage.types.validate_message's rules), so they are not checked
        again."""
        if self.closed:
            raise StoreClosedError(f"store {self._directory!r} is closed")
        if not checked:
            for i, m in enumerate(batch):
                validate_message(m, i)
        if now_ms // MS_PER_HOUR != self._hours.now_hour:  # (the hour moved on: else no call)
            self._hours.advance(now_ms)
        results: list[SendResult] = []
        items: list[records.SendItem] = []
        undo_hours: UndoHours = {}
        undo_slots: UndoSlots = {}
        undo_ids: list[int] = []
        near: list[Hour] = []  # the near hours' files it writes to
        try:
            far_bytes = self._send_items(batch, now_ms, results, items, undo_hours, undo_slots, undo_ids, near)
            if items:
                body = records.encode(records.Kind.SEND, now_ms, items)
                self.reserve_room(near, far_bytes, len(body))
                self._pending.append(body, records.Kind.SEND, now_ms, items, far_bytes)
        except BaseException:
            self.undo(undo_hours, undo_slots, undo_ids)
            raise
        return results

    def undo(self, undo_hours: UndoHours, undo_slots: UndoSlots, undo_ids: list[int]) -> None:
        """Put back every counter and overlay `place` and `pend_id` moved
        for a record that was not appended."""
        for hour, (entries, log_bytes, created) in undo_hours.items():
            if created:
                self._hours.discard_unapplied(hour)
            else:
                h = self._hours[hour]
                h.entries, h.log_bytes = entries, log_bytes
        for slot, before in undo_slots.items():
            self._pending.set_slot(slot, before)
        for key in reversed(undo_ids):
            self._pending.drop_last_message(key)

    def _send_items(self, batch: Sequence[NewMessage], now_ms: int, results: list[SendResult],
                    items: list[records.SendItem], undo_hours: UndoHours, undo_slots: UndoSlots,
                    undo_ids: list[int], near: list[Hour]) -> int:
        """Place each message of `batch` not stored already (`_place_in` and
        `pend_id` of each); returns the bytes the batch will write to far
        hours, and adds the near hours' files it writes to to `near`."""
        reader, pending = self._reader, self._pending
        # keys, and those with a slot in the id index: maybe stored (no comprehension: one call less)
        keys, known = self._ids.keys_present(list(map(_TOPIC_AND_ID, batch)))
        find, pack_body, file_of = reader.find, delay_log.pack_body, self._file_of
        append_result, append_item = results.append, items.append
        new = tuple.__new__  # NamedTuples built without their Python-level __new__
        hashes = self._hashes  # topic and tag hashes, kept across sends
        if len(hashes) > HASHES_KEPT:
            hashes.clear()
        files: dict[int, tuple[Hour, bool]] = {}  # filing hour -> (its file's Hour, near), once per batch
        far_bytes = chars = 0
        for m, key in zip(batch, keys):
            topic, msg_id = m.topic, m.msg_id
            if key in known or pending.messages(key):
                existing = find(key, topic, msg_id)
                if existing is not None:
                    append_result(new(SendResult, (DUPLICATE, existing)))
                    continue
            msg, tag = m.msg, m.tag
            chars += len(msg)
            body = pack_body(topic, msg_id, msg, m.produce_ms, m.ttl_ms, m.max_retry, tag, m.key, m.traceparent,
                             m.tracestate, 0, m.fair_key)
            topic_hash = hashes.get(topic)
            if topic_hash is None:
                topic_hash = hashes[topic] = text_hash(topic)
            if tag:
                tag_hash = hashes.get(tag)
                if tag_hash is None:
                    tag_hash = hashes[tag] = text_hash(tag)
            else:
                tag_hash = 0
            trigger_ms = m.trigger_ms
            filing_ms = trigger_ms if trigger_ms > now_ms else now_ms
            hour = filing_ms // MS_PER_HOUR
            filed = files.get(hour)
            if filed is None:
                filed = files[hour] = file_of(hour, undo_hours)
                if filed[1] and filed[0] not in near:
                    near.append(filed[0])
            h, is_near = filed
            item = self._place_in(h, filing_ms, trigger_ms, m.priority, topic_hash, tag_hash, key, body, undo_slots)
            if not is_near:
                far_bytes += item.frame_size + delay_index.ENTRY_BYTES + 16
            append_item(item)
            message = new(Message, (topic, msg_id, msg, m.produce_ms, trigger_ms, m.ttl_ms, m.max_retry,
                                    m.priority, tag, WAITING, 0, new(Location, (h.hour, item.global_index)), m.key,
                                    m.traceparent, m.tracestate, 0, m.fair_key, "", 0))
            self.pend_id(key, message, undo_ids)
            append_result(new(SendResult, (STORED, message)))
        if chars > MAX_RECORD_CHARS:
            raise InvalidRequest("batch", f"messages total more than {MAX_RECORD_CHARS} characters; split it")
        return far_bytes

    def _file_of(self, hour: int, undo_hours: UndoHours) -> tuple[Hour, bool]:
        """The Hour of the file storage.spans names for filing hour `hour`
        now (made if new, its counters noted in `undo_hours`), and whether
        it is a near hour's (mapped)."""
        hours = self._hours
        file_id = spans.file_for(hour, hours.now_hour)
        h = hours.get(file_id)
        if file_id not in undo_hours:
            undo_hours[file_id] = (h.entries, h.log_bytes, False) if h is not None else (0, 0, True)
        if h is None:
            h = hours.get_or_add(file_id)
        return h, file_id in hours.near

    def place(self, filing_ms: int, trigger_ms: int, priority: int, topic_hash: int, tag_hash: int, key: int,
               body: bytes, undo_hours: UndoHours, undo_slots: UndoSlots) -> records.SendItem:
        """The coordinates of a new entry filed under the hour and second of
        `filing_ms`, in the file storage.spans names for that hour now; the
        file's counters and the pending second-table tail move on (their
        previous values noted in `undo_hours` and `undo_slots`)."""
        h, _ = self._file_of(filing_ms // MS_PER_HOUR, undo_hours)
        return self._place_in(h, filing_ms, trigger_ms, priority, topic_hash, tag_hash, key, body, undo_slots)

    def _place_in(self, h: Hour, filing_ms: int, trigger_ms: int, priority: int, topic_hash: int, tag_hash: int,
                  key: int, body: bytes, undo_slots: UndoSlots) -> records.SendItem:
        """`place` in `h`, the file `_file_of` named for `filing_ms`'s hour."""
        second = filing_ms % MS_PER_HOUR // MS_PER_SECOND
        pending = self._pending
        gi = h.entries
        h.entries = gi + 1
        slot = (h.hour, second)
        before = pending.slot(slot)
        last, count = before or self._reader.slot(h, second)
        frame_size = FRAME_HEADER_BYTES + len(body)
        offset8 = h.log_bytes >> 3
        h.log_bytes += delay_log.padded_bytes(frame_size)
        if slot not in undo_slots:
            undo_slots[slot] = before
        pending.set_slot(slot, (gi, count + 1))
        return tuple.__new__(records.SendItem, (h.hour, gi, last, count, second, offset8, frame_size, trigger_ms,
                                                priority, topic_hash, tag_hash, key, body))

    def pend_id(self, key: int, message: Message, undo_ids: list[int]) -> None:
        """Make a message appended but not applied findable by its id."""
        self._pending.add_message(key, message)
        undo_ids.append(key)

    def update(self, changes: Iterable[StateChange], now_ms: int, part_of: int = 0) -> None:
        if now_ms // MS_PER_HOUR != self._hours.now_hour:
            self._hours.advance(now_ms)
        items = []
        staged: dict[tuple[int, int], State] = {}  # published only if every change is valid
        new_item = tuple.__new__  # a StateItem made without its generated (Python-level) __new__
        item_type = records.StateItem
        end_topics = self.end_topics
        for change in changes:
            where, new_status, retry, released, _, prev_status, known_topic, more_flags, _ = change
            # (its place, deadline and delivery read by index, as objects: they go into the item as
            # they are; read as ints, the compiled build would box each large one anew)
            w: Fields = where
            f: Fields = change
            known = staged.get(where)
            if known is None and prev_status:
                known = (prev_status, 0, retry, known_topic)
            status, flags, _retry, topic_hash = known or self._reader.state(where)
            if topic_hash < 0:
                topic_hash = self._pending.topic_hash_of(where)
            if retry < 0 or retry > MAX_RETRY_COUNT:
                raise InvalidRequest("retry", f"must be in 0..{MAX_RETRY_COUNT}, got {retry}")
            new_flags = ((flags | FLAG_RELEASED if released else flags) & NOT_END_TIME) | more_flags
            to = int(new_status)
            if end_topics and to >= ACKED > status and topic_hash in end_topics:
                new_flags |= FLAG_END_TIME  # its end kept (storage.end_index)
            items.append(new_item(item_type, (w[0], w[1], to, retry, new_flags, status, topic_hash, f[4], f[8])))
            staged[where] = (to, new_flags, retry, topic_hash)
        if items and part_of:
            part = [records.PartItem(part_of, items)]
            self._pending.append(records.encode(records.Kind.PART, now_ms, part), records.Kind.PART, now_ms, part)
        elif items:
            self._pending.append(records.encode(records.Kind.STATE, now_ms, items), records.Kind.STATE, now_ms, items)
        self._pending.set_states(staged)  # only once the record is in the log

    def seen_again(self, places: Iterable[Location], now_ms: int) -> None:
        """One STATE record moving the time storage.end_index keeps for each
        ended message at `places` on to `now_ms` (a duplicate send its
        topic's dedup window answered): status, retry and flags as they
        are, FLAG_END_TIME added."""
        if now_ms // MS_PER_HOUR != self._hours.now_hour:
            self._hours.advance(now_ms)
        items: list[records.StateItem] = []
        staged: dict[tuple[int, int], State] = {}
        for where in places:
            if where in staged:
                continue
            status, flags, retry, topic_hash = self._reader.state(where)
            if status < ACKED:
                raise InvariantError(f"{where} has not ended (status {status}): no end time to move on")
            if topic_hash < 0:
                topic_hash = self._pending.topic_hash_of(where)
            flags |= FLAG_END_TIME
            items.append(records.StateItem(where[0], where[1], status, retry, flags, status, topic_hash, 0))
            staged[where] = (status, flags, retry, topic_hash)
        if items:
            self._pending.append(records.encode(records.Kind.STATE, now_ms, items), records.Kind.STATE, now_ms, items)
            self._pending.set_states(staged)

    def make_room(self, items: list[records.SendItem], hours: Iterable[int], record_bytes: int) -> int:
        """`reserve_room` for a record of `items` (a move's new places);
        returns their far-hour bytes."""
        table = self._hours
        far_bytes = sum(item.frame_size + delay_index.ENTRY_BYTES + 16 for item in items if not table.is_near(item.hour))
        self.reserve_room([table[hour] for hour in hours if table.is_near(hour)], far_bytes, record_bytes)
        return far_bytes

    def reserve_room(self, near: Iterable[Hour], far_bytes: int, record_bytes: int) -> None:
        """Make sure the writes a record commits the store to will find disk
        room, or refuse it (OSError ENOSPC) before anything is appended: the
        mapped files of near hours are grown now to hold the batch (a write
        through a mapping cannot fail cleanly: it would be SIGBUS), and the
        file system must have room for everything else still to be written
        -- far hours' staged bytes, sends appended but not applied, this
        record's `far_bytes` (bytes it writes to far hours), the commit
        log's next reservation -- plus DISK_HEADROOM_BYTES (storage.disk_room).
        `near`: the near hours' files the record writes to."""
        table = self._hours
        grown = 0  # bytes the near hours' files took now (a growth doubles a file)
        for h in near:
            files = h.files if h.files is not None else table.files(h)
            if h.entries > files.room_entries or h.log_bytes > files.room_log_bytes:  # (else: no call)
                grown += files.reserve(h.entries, h.log_bytes)
        need = (table.staged_bytes + self._pending.far_bytes + far_bytes + self._log.allocation_for(record_bytes)
                + 3 * PAGE_BYTES * (len(table.dirty) + 1))
        self._disk_room.check(need, record_bytes + far_bytes + grown)

    def __repr__(self) -> str:
        return f"Placement({self._disk_room!r})"
