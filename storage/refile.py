"""Filing messages again: `move` (a new trigger time) and `refile` (spans).

A message more than 32 hours ahead is filed in a span of hours
(storage.spans), which the wheel never reads. As a span comes near,
`refile()` files its waiting messages again by the same rule at the new
`now_ms`: into smaller spans or their own hours, or, when overdue, into
the second of `now_ms` as a late send. `move()` does the same for chosen
messages with new trigger times (a reschedule, a re-drive).

Either way one MOVE record is appended: for each message, where it was
and its new coordinates (assigned by `Placement.place`, as a send's).
Applied (storage.applying), the old entry ends -- released, flagged
moved -- and the message is staged at its new place under the same id,
body, priority and tag. A `_Moves` collects the record and what to undo
if the append fails (`Placement.undo`).

`refile` reads each due span from where it stopped last (`Hour.refiled`),
so repeated calls cost O(messages moved), not O(span); at most
REFILE_STEP moves per record.

`Refiler` owns nothing but that rule: the cursors are the spans' own
(storage.hour), and it places, undoes and makes room through the
`Placement` it is given, as a send does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from . import delay_log, records, spans
from .delay_index import FLAG_MOVED, FLAG_RELEASED
from .entry import MS_PER_HOUR, IndexEntry, Location, Message, Status
from .errors import InvalidRequest
from .hour import Hour
from .hour_table import HourTable
from .id_index import IdIndex
from .pending import Pending, State
from .placement import Placement, UndoHours, UndoSlots
from .types import MAX_RETRY_COUNT

_new = tuple.__new__  # NamedTuples made without their Python-level __new__ (a move of many messages)

WAITING = Status.WAITING
# Waiting messages of due spans moved by one refile() record.
REFILE_STEP = 1024


@dataclass
class _Moves:
    """A MOVE record being built, and what to put back if it is not appended."""
    moves: list[records.MoveItem] = field(default_factory=list)
    states: dict[tuple[int, int], State] = field(default_factory=dict)  # old entries' new state
    undo_hours: UndoHours = field(default_factory=dict)
    undo_slots: UndoSlots = field(default_factory=dict)
    undo_ids: list[int] = field(default_factory=list)


class Refiler:
    """Moves and span refiling (see the module docstring; each call's
    contract is on `storage.store.Store`). One thread calls it."""

    def __init__(self, hours: HourTable, pending: Pending, ids: IdIndex, placement: Placement) -> None:
        self._hours = hours
        self._pending = pending
        self._ids = ids
        self._placement = placement

    def refile(self, now_ms: int, max_moves: int = REFILE_STEP) -> int:
        self._hours.advance(now_ms)
        batch = _Moves()
        cursors: dict[Hour, int] = {}
        try:
            for h in self._due_spans(now_ms):
                files = self._hours.readable(h)
                gi = h.refiled
                while gi < h.applied and len(batch.moves) < max_moves:
                    entry, offset8, size, flags = files.read_entry(gi)
                    where = Location(h.hour, gi)
                    status, flags, retry, _ = self._pending.states.get(where) or (entry.status, flags, entry.retry, 0)
                    gi += 1
                    if status != WAITING or flags & FLAG_RELEASED:
                        continue
                    self._move_one(batch, entry, files.read_body(offset8, size), flags, status, retry,
                                   entry.trigger_ms, now_ms)
                cursors[h] = gi
                if len(batch.moves) >= max_moves:
                    break
            self._append_moves(batch, now_ms)
        except BaseException:
            self._placement.undo(batch.undo_hours, batch.undo_slots, batch.undo_ids)
            raise
        self._pending.set_states(batch.states)
        for h, gi in cursors.items():
            h.refiled = gi
        return len(batch.moves)

    def next_refile_ms(self) -> int | None:
        first = None
        for h in self._spans_to_move():
            start = self._hours.span_start(h)
            due_ms = 0 if start is None else (start - (1 << spans.span_shift(h.hour)) + 1) * MS_PER_HOUR
            first = due_ms if first is None else min(first, due_ms)
        return first

    def move(self, changes: Sequence[tuple[Location, int, int]], now_ms: int, redrive: bool = False) -> list[Message]:
        self._hours.advance(now_ms)
        batch = _Moves()
        moved: list[Message] = []
        try:
            for i, (where, trigger_ms, retry) in enumerate(changes):
                h = self._hours.get(where.hour)
                if h is None or not 0 <= where.global_index < h.entries or where in batch.states:
                    raise InvalidRequest(f"[{i}].location", f"no movable message at {where}")
                if not 0 <= retry <= MAX_RETRY_COUNT:
                    raise InvalidRequest(f"[{i}].retry", f"must be in 0..{MAX_RETRY_COUNT}, got {retry}")
                placed = self._placed(h, where)
                if placed is None:
                    raise InvalidRequest(f"[{i}].location", f"no movable message at {where}")
                entry, raw, flags = placed
                status, flags, _, _ = self._pending.states.get(where) or (entry.status, flags, entry.retry, 0)
                if flags & FLAG_RELEASED:
                    raise InvalidRequest(f"[{i}].location", f"the message at {where} was released")
                if redrive:  # (a redriveMsgs job's: the body it is filed with counts it)
                    raw = delay_log.redriven(raw)
                moved.append(self._move_one(batch, entry, raw, flags, status, retry, max(0, trigger_ms), now_ms))
            self._append_moves(batch, now_ms)
        except BaseException:
            self._placement.undo(batch.undo_hours, batch.undo_slots, batch.undo_ids)
            raise
        self._pending.set_states(batch.states)
        return moved

    def _append_moves(self, batch: _Moves, now_ms: int) -> None:
        if batch.moves:
            body = records.encode(records.Kind.MOVE, now_ms, batch.moves)
            far_bytes = self._placement.make_room([m.to for m in batch.moves], batch.undo_hours, len(body))
            self._pending.append(body, records.Kind.MOVE, now_ms, batch.moves, far_bytes)

    def _placed(self, h: Hour, where: Location) -> tuple[IndexEntry, bytes, int] | None:
        """The entry at `where`, its raw body and its flags: from the hour's
        files once applied, else from the pending record that placed it (a
        message sent or moved moments ago, its record not yet committed:
        a second reschedule of it moves it again). None: nothing there."""
        if where.global_index < h.applied:
            files = self._hours.readable(h)
            entry, offset8, size, flags = files.read_entry(where.global_index)
            return entry, files.read_body(offset8, size), flags
        found = self._pending.item_at(where)
        if found is None:
            return None
        item, retry = found
        entry = IndexEntry(item.hour, item.second, item.local_index, item.global_index, item.pre_global_index,
                           item.trigger_ms, item.priority, item.topic_hash, item.tag_hash, WAITING, retry)
        return entry, item.body, 0

    def _move_one(self, batch: _Moves, entry: IndexEntry, raw: bytes, flags: int, status: int, retry: int,
                  trigger_ms: int, now_ms: int) -> Message:
        """Place one message anew (see `move`), into `batch`."""
        body = delay_log.unpack_body(raw)
        key = self._ids.key_of_bytes(body.topic.encode(), body.msg_id.encode())
        to = self._placement.place(max(trigger_ms, now_ms), trigger_ms, entry.priority, entry.topic_hash, entry.tag_hash, key,
                         raw, batch.undo_hours, batch.undo_slots)
        where = _new(Location, (entry.hour, entry.global_index))
        batch.moves.append(_new(records.MoveItem, (entry.hour, entry.global_index, status, retry, to)))
        batch.states[where] = (Status.DELETED, flags | FLAG_RELEASED | FLAG_MOVED, retry, entry.topic_hash)
        message = _new(Message, (body.topic, body.msg_id, body.msg, body.produce_ms, trigger_ms, body.ttl_ms,
                                 body.max_retry, entry.priority, body.tag, Status.WAITING, retry,
                                 _new(Location, (to.hour, to.global_index)), body.key, body.traceparent,
                                 body.tracestate, body.redrive_count, body.fair_key, "", 0))
        self._placement.pend_id(key, message, batch.undo_ids)
        return message

    def _due_spans(self, now_ms: int) -> list[Hour]:
        """Spans that are due and hold waiting messages not yet moved."""
        now_hour = now_ms // MS_PER_HOUR
        due = [(start, h) for h in self._spans_to_move()
               if (start := self._hours.span_start(h)) is not None and spans.is_due(h.hour, start, now_hour)]
        due.sort(key=lambda start_and_span: start_and_span[0])
        return [h for _, h in due]

    def _spans_to_move(self) -> Iterable[Hour]:
        for h in self._hours.ascending(spans.SPAN_FLAG):
            if h.refiled < h.entries and any(counts[WAITING] for counts in h.topics.values()):
                yield h
