"""Records appended to the commit log and not applied yet, and what later
calls of the same batch must see of them.

A send, an update or a move appends one record and returns; the derived
files change only when `commit()` applies it (storage.applying). Until
then `Pending` is the one place that knows about the record:

    records   (kind, now_ms, items) of every record appended, in log order
    ids       id key -> messages sent in them: a duplicate is found, and a
              get answers, before the send is applied
    slots     (file, second) -> (last globalIndex, count) after them: the
              next send to that second chains onto the last one
    states    (hour, globalIndex) -> (status, flags, retry, topic hash)
              after them: a read, and the next change, see the new status
              (held as ints, `PendingStates`: a bulk call's million are
              no work for the garbage collector)
    far_bytes bytes they will write to far hours (storage.placement counts
              them against the disk's room)

Apart from the overlays, `change_mark()` and `changed_since()` say whether a
record appended since a mark changed an existing entry of a file (a STATE
record, or a MOVE's old place): a bulk call that read many entries over
several turns of the event loop reads again only those of such files.

Worked example: send(m1) appends a SEND record; `ids` now holds m1 and
`slots` the tail of its second, so get(m1) finds it and the next send to
that second chains onto it. update(m1 -> READY) appends a STATE record,
and `states` holds READY for m1, so status(m1) says READY. commit()
applies both records, and with none left `applied(...)` empties every
overlay.

Invariant: the overlays describe exactly the records held. `ids` loses
each applied record's messages as it is applied (a node whose sends never
pause holds a sent message's form for one commit round); the others are
emptied only when no record is. One thread calls it; `CommitLog.sync` may
run in a worker thread meanwhile (storage.applying).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence, Set
from typing import cast

from . import records
from .commit_log import CommitLog
from .entry import Location, Message
from .errors import InvariantError

# A record item's first field (a StateItem's hour, a MoveItem's from_hour),
# a state's key's (its hour)
_FIRST = operator.itemgetter(0)
Record = tuple[records.Kind, int, Sequence[records.Item]]
# (status, flags, retry, topic hash) of an entry changed by a pending record.
State = tuple[int, int, int, int]


def state_key(hour: int, global_index: int) -> int:
    """An entry's key in `PendingStates.packed` (a globalIndex is below 2**32)."""
    return hour << 32 | global_index


def pack_state(state: State) -> int:
    """status, flags (a byte each), retry (below 2**16: MAX_RETRY_COUNT),
    topic hash, as one int; `unpack_state` undoes it."""
    status, flags, retry, topic_hash = state
    return status | flags << 8 | retry << 16 | topic_hash << 32


def unpack_state(packed: int) -> State:
    return packed & 0xFF, packed >> 8 & 0xFF, packed >> 16 & 0xFFFF, packed >> 32


class PendingStates:
    """(hour, globalIndex) -> the State pending records gave the entry, read
    as a mapping's `get`; held in `packed`, a dict of ints to ints
    (`state_key` -> `pack_state`) that scans look up directly.

    Why ints: a dict holding only ints is never tracked by the garbage
    collector, while one taking fresh tuples is tracked again and walked
    by every full collection -- a sliced bulk call holds a million states
    until its parts are applied, and a full collection walking them held
    the event loop 40-80 ms each time."""

    __slots__ = ("packed",)

    def __init__(self) -> None:
        self.packed: dict[int, int] = {}

    def get(self, where: tuple[int, int]) -> State | None:
        packed = self.packed.get(where[0] << 32 | where[1])
        return None if packed is None else unpack_state(packed)

    def __contains__(self, where: tuple[int, int]) -> bool:
        return (where[0] << 32 | where[1]) in self.packed

    def __len__(self) -> int:
        return len(self.packed)

    def __bool__(self) -> bool:
        return bool(self.packed)

    def __repr__(self) -> str:
        return f"PendingStates({len(self.packed)})"


class Pending:
    """Records appended and not applied, and their overlays (see the module docstring)."""

    def __init__(self, log: CommitLog) -> None:
        self._log = log
        # Read without a call by the store's commit round (`len`); only this part changes them:
        self.records: list[Record] = []  # (kind, now_ms, items) appended, in log order
        self.far_bytes = 0  # bytes they will write to far hours
        self._ids: dict[int, list[Message]] = {}
        self._slots: dict[tuple[int, int], tuple[int, int]] = {}
        self._states = PendingStates()
        self._state_hours: set[int] = set()  # the files `_states` names, kept as it grows and clears
        self._marks = 0  # records appended that changed existing entries
        self._changed: dict[int, int] = {}  # file id -> _marks after the last such record touching it

    # -- records -------------------------------------------------------------------

    def append(self, body: bytes, kind: records.Kind, now_ms: int, items: Sequence[records.Item],
               far_bytes: int = 0) -> None:
        """Append `body` (the record `kind, now_ms, items` encoded) to the
        commit log, and hold the record until it is applied."""
        self._log.append(body)
        self.records.append((kind, now_ms, items))
        self.far_bytes += far_bytes
        if kind is records.Kind.STATE or kind is records.Kind.MOVE:  # (the changed entry's file: item[0])
            self._mark({item[0] for item in items})
        elif kind is records.Kind.PART:
            self._mark({item.hour for part in cast(Sequence[records.PartItem], items) for item in part.items})

    def _mark(self, files: set[int]) -> None:
        self._marks += 1
        for file_id in files:
            self._changed[file_id] = self._marks

    def change_mark(self) -> int:
        """A mark to ask `changed_since` about later."""
        return self._marks

    def changed_since(self, file_id: int, mark: int) -> bool:
        """Has a record appended since `mark` changed an entry of this file?"""
        return self._changed.get(file_id, 0) > mark

    def __len__(self) -> int:
        return len(self.records)

    def take(self, count: int) -> list[Record]:
        """The first `count` records, no longer held: the caller applies them,
        then calls `applied(them)`."""
        batch, self.records = self.records[:count], self.records[count:]
        return batch

    def applied(self, taken: Sequence[Record], keep_states: bool = False) -> None:
        """The records `taken` were applied: with none left, nothing pends;
        else their messages leave `ids` (the id index finds them now), so a
        node never idle between commits holds each sent message's form for
        one round, not until the sends pause. `keep_states`: status changes
        of PART records are held, or applied later, still (storage.applying):
        the states stay, as the files do not hold them yet."""
        if not self.records:
            self.far_bytes = 0
            self._slots.clear()
            self._ids.clear()
            if not keep_states:
                self._states.packed.clear()
                self._state_hours.clear()
            return
        for kind, _, items in taken:
            if kind is records.Kind.SEND:
                for item in cast(Sequence[records.SendItem], items):
                    self._forget_message(item.key, item.hour, item.global_index)
            elif kind is records.Kind.MOVE:
                for move in cast(Sequence[records.MoveItem], items):
                    self._forget_message(move.to.key, move.to.hour, move.to.global_index)

    def item_at(self, where: Location) -> tuple[records.SendItem, int] | None:
        """The entry a pending record places at `where` -- a send's, or a
        move's new place -- and the retry it gets there; None if no pending
        record places one there."""
        hour, gi = where
        for kind, _, items in reversed(self.records):
            if kind is records.Kind.SEND:
                for item in cast(Sequence[records.SendItem], items):
                    if item.global_index == gi and item.hour == hour:
                        return item, 0
            elif kind is records.Kind.MOVE:
                for move in cast(Sequence[records.MoveItem], items):
                    if move.to.global_index == gi and move.to.hour == hour:
                        return move.to, move.retry
        return None

    def topic_hash_of(self, where: Location) -> int:
        """The topic hash of a message placed by a pending record (sent, or
        moved there: a reschedule changed it before its commit)."""
        found = self.item_at(where)
        if found is None:
            raise InvariantError(f"{where} is neither applied nor pending")
        return found[0].topic_hash

    # -- ids -----------------------------------------------------------------------

    def messages(self, key: int) -> Sequence[Message]:
        """Messages sent under id key `key` by pending records, oldest first."""
        return self._ids.get(key, ())

    def add_message(self, key: int, message: Message) -> None:
        same_key = self._ids.get(key)
        if same_key is None:
            self._ids[key] = [message]
        else:
            same_key.append(message)

    def _forget_message(self, key: int, hour: int, global_index: int) -> None:
        """The message placed at (hour, global_index) under id key `key` is applied."""
        same_key = self._ids.get(key)
        if same_key is None:
            return
        for i, message in enumerate(same_key):
            if message.location == (hour, global_index):
                del same_key[i]
                if not same_key:
                    del self._ids[key]
                return

    def drop_last_message(self, key: int) -> None:
        """Undo the last `add_message(key, ...)`."""
        same_key = self._ids[key]
        same_key.pop()
        if not same_key:
            del self._ids[key]

    # -- second-table tails -----------------------------------------------------------

    def slot(self, slot: tuple[int, int]) -> tuple[int, int] | None:
        """(last, count) of (file, second) after the pending records, or
        None if none of them sent to it."""
        return self._slots.get(slot)

    def set_slot(self, slot: tuple[int, int], last_and_count: tuple[int, int] | None) -> None:
        """Set (or with None, forget: an undo) the tail of (file, second)."""
        if last_and_count is None:
            del self._slots[slot]
        else:
            self._slots[slot] = last_and_count

    # -- states --------------------------------------------------------------------

    @property
    def states(self) -> PendingStates:
        """(hour, globalIndex) -> the state pending records gave it."""
        return self._states

    @property
    def state_hours(self) -> Set[int]:
        """The files a pending state change is in (O(1), however many changes)."""
        return self._state_hours

    def set_states(self, states: Mapping[tuple[int, int], State]) -> None:
        """Their record is in the log: the changes show from now on."""
        packed, state_hours = self._states.packed, self._state_hours
        for (hour, gi), s in states.items():  # (a loop: a generator's resumptions are calls)
            packed[hour << 32 | gi] = s[0] | s[1] << 8 | s[2] << 16 | s[3] << 32  # (pack_state)
            state_hours.add(hour)

    def drop_states(self, items: Iterable[tuple[int, int, int, int, int, int, int, int, int]]) -> None:
        """The states of these StateItem fields are staged in their hours now
        (a committed PART applied late, storage.applying): each leaves the
        overlay unless a later change gave its entry another state since.
        A delete-all's million states held here until its last part was
        applied grew the heap by over 100 MB."""
        packed = self._states.packed
        for hour, gi, status, retry, flags, _, topic_hash, _, _ in items:
            key = hour << 32 | gi
            if packed.get(key) == status | flags << 8 | retry << 16 | topic_hash << 32:  # (pack_state)
                del packed[key]

    def __repr__(self) -> str:
        return (f"Pending(records={len(self.records)}, ids={len(self._ids)}, slots={len(self._slots)}, "
                f"states={len(self._states)}, far_bytes={self.far_bytes})")
