"""Applying durable records to the derived files, and group commit.

A record appended to the commit log (a send, state changes, moves) is
pending (storage.pending) until `commit()`: one fsync for every record
appended since the last commit, then each record applied in order:

    SEND   each item's index entry, delay-log frame and second-table slot
           staged in its hour (storage.hour), its id put in the id index,
           its topic counted WAITING and named
    STATE  the entry's status, flags and retry staged; counts, ended
           messages and the in-flight set follow; a change marked
           FLAG_END_TIME puts its time in the end index
    MOVE   the old entry ends (released, moved), the message is staged at
           its new place as a send is

Applying writes only at positions the record names, so applying a record
twice (recovery replays from the checkpoint's offset) changes nothing.
`commit()` returns the index entries of the messages it stored, for the
wheel. A server may split it: `sync_log()` in a worker thread while this
thread keeps appending, then `apply_pending(count)`.

`Applier` is the one writer of applied state. Beside the hours (which it
stages into, through the `HourTable` it is given) and the id index, it
owns the two things applying keeps that are no hour's: the name of every
topic with a message in a live hour, and the in-flight set (every
CONSUMING message and its ack deadline, 0 if unknown). Both are seeded
from the checkpoint and written back into the next one (storage.retention).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence, Set
from typing import Any, NamedTuple, cast

from . import delay_log, records
from .commit_log import CommitLog
from .delay_index import FLAG_END_TIME, FLAG_MOVED, FLAG_RELEASED
from .end_index import EndIndex
from .entry import Fields, IndexEntry, Location, Status
from .errors import ContractError
from .hour import Hour
from .hour_table import HourTable
from .id_index import IdIndex
from .key_index import KEYED_BODY, KeyIndex, key_of_body
from .pending import Pending

WAITING = Status.WAITING
# A StateItem's fields as a plain tuple: (hour, globalIndex, status, retry,
# flags, prev_status, topic hash, deadline ms, delivery).
_State = tuple[int, int, int, int, int, int, int, int, int]


class Lease(NamedTuple):
    """A CONSUMING message's ack deadline and delivery: 0 where unknown."""

    deadline_ms: int
    delivery: int


_UNKNOWN_LEASE = Lease(0, 0)
CONSUMING, ACKED, DELETED = int(Status.CONSUMING), int(Status.ACKED), int(Status.DELETED)


class Applier:
    """Group commit and applying, and what applying derives beyond the
    hours (see the module docstring). One thread calls it, except
    `sync_log`."""

    def __init__(self, hours: HourTable, ids: IdIndex, log: CommitLog, pending: Pending,
                 topic_names: dict[int, str], consuming: dict[Location, Lease], keys: KeyIndex | None = None,
                 ends: EndIndex | None = None, open_ends: Callable[[], EndIndex] | None = None) -> None:
        self._hours = hours
        self._ids = ids
        # location -> when it ended (storage.end_index); None: none kept yet,
        # made by `open_ends` when the first end to keep is applied (a node
        # with no dedup window holds no end index: no files, no descriptors)
        self.ends = ends
        self._open_ends = open_ends
        self._keys = keys  # (topic, serial key) -> locations (storage.key_index); None: not kept
        self._log = log
        self._pending = pending
        self._topic_names = topic_names  # topic hash -> topic, for topics in live hours
        # the same topics by name, read by the store's `has_topic` without a
        # call (a send's); one set for the applier's life (`Store.topic_set`)
        self.topics_by_name = set(topic_names.values())
        # Every CONSUMING message, its ack deadline and its delivery (0:
        # unknown), kept in the checkpoint and by every record applied:
        # O(messages in flight), which the broker caps.
        self._consuming = consuming
        # (`held` and `deferred` are read by the store that owns this part, without a call.)
        # PART records (storage.records) held until their call's COMMIT:
        # call id -> (now_ms, items) of each, in log order. Held as plain
        # tuples of ints, which the garbage collector stops tracking (a
        # StateItem, a tuple's subclass, it tracks: a delete-all's 100,000
        # held were walked by every full collection, 10 to 75 ms each).
        self.held: dict[int, list[tuple[int, list[_State]]]] = {}
        # Committed PARTs not applied yet (`apply_pending(defer=True)`):
        # applied a slice at a time by `apply_deferred`.
        self.deferred: list[tuple[int, list[_State]]] = []
        # INTENT records (storage.records) whose DONE has not come: call id
        # -> the intent; carried out by the broker when it starts to serve.
        self._intents: dict[int, records.IntentItem] = {}

    def decode(self, body: bytes) -> tuple[records.Kind, int, Sequence[records.Item]]:
        """A record from the log or from a leader, its sends keyed with this
        store's id-index secret (the writer's key may come from another)."""
        kind, now_ms, items = records.decode(body)
        key = self._ids.key_of_bytes
        if kind is records.Kind.SEND:
            items = [item._replace(key=key(*delay_log.id_fields(item.body)))
                     for item in cast(Sequence[records.SendItem], items)]
        elif kind is records.Kind.MOVE:
            items = [item._replace(to=item.to._replace(key=key(*delay_log.id_fields(item.to.body))))
                     for item in cast(Sequence[records.MoveItem], items)]
        return kind, now_ms, items

    # -- group commit ----------------------------------------------------------------

    def sync_log(self) -> None:
        self._log.sync()

    def apply_pending(self, count: int | None = None, defer: bool = False) -> list[IndexEntry]:
        """`defer`: the PARTs a COMMIT applies are left to `apply_deferred`
        (the event loop applies them a slice at a time); else applied now."""
        n = len(self._pending) if count is None else count
        new_entries: list[IndexEntry] = []
        taken = self._pending.take(n)
        for kind, now_ms, items in taken:
            self.apply(kind, now_ms, items, new_entries)
        if not defer:
            self.apply_deferred(None)
        self._hours.flush_staged(everything=False)
        self._pending.applied(taken, keep_states=bool(self.held or self.deferred))  # (parts_pending)
        return new_entries

    def parts_pending(self) -> bool:
        """Whether PARTs are held (their COMMIT not applied) or committed and not applied yet."""
        return bool(self.held or self.deferred)

    def deferred_items(self) -> int:
        """Status changes of committed PARTs not applied yet."""
        return sum(len(items) for _, items in self.deferred)

    def apply_deferred(self, max_items: int | None) -> bool:
        """Apply committed PARTs, about `max_items` status changes (None:
        all); True while some are left. Their entries change in no other
        record meanwhile (a bulk call's, which took them out of the
        wheel, the windows and the in-flight set first; every reader sees
        their new status through the pending states), so applying them
        after records appended later gives the same state."""
        done = 0
        while self.deferred and (max_items is None or done < max_items):
            now_ms, items = self.deferred[0]
            take = len(items) if max_items is None else min(len(items), max_items - done)
            self._apply_states(now_ms, items[:take])
            self._pending.drop_states(items[:take])  # staged now: readers read them there
            done += take
            if take == len(items):
                self.deferred.pop(0)
            else:
                self.deferred[0] = (now_ms, items[take:])
        if not self.deferred and not self.held and not len(self._pending):
            self._pending.applied(())  # the states the parts kept can go
        return bool(self.deferred)

    def commit(self) -> list[IndexEntry]:
        count = len(self._pending)
        self.sync_log()
        return self.apply_pending(count)

    # -- applying --------------------------------------------------------------------

    def apply(self, kind: records.Kind, now_ms: int, items: Sequence[records.Item],
              new_entries: list[IndexEntry] | None) -> None:
        """Apply one durable record (its items are all of its kind's type);
        its new entries go to `new_entries` (None: recovery, nobody wants them)."""
        of_kind: Any = items  # (typed by `kind`: no cast, which is a call)
        if kind is records.Kind.SEND:
            self._apply_sends(of_kind, new_entries)
        elif kind is records.Kind.MOVE:
            self._apply_moves(now_ms, of_kind, new_entries)
        elif kind is records.Kind.PART:
            for part in cast(Sequence[records.PartItem], items):
                self.held.setdefault(part.call_id, []).append((now_ms, [
                    (h, gi, st, retry, flags, prev, topic, deadline, delivery)
                    for h, gi, st, retry, flags, prev, topic, deadline, delivery in part.items]))
        elif kind is records.Kind.COMMIT:
            for commit in cast(Sequence[records.CommitItem], items):
                if commit.call_id:
                    self.deferred += self.held.pop(commit.call_id, [])
                else:  # a node that starts to serve: every call whose COMMIT never came is abandoned
                    self.held.clear()
        elif kind is records.Kind.INTENT:
            for intent in cast(Sequence[records.IntentItem], items):
                self._intents[intent.call_id] = intent
        elif kind is records.Kind.DONE:
            for done in cast(Sequence[records.CommitItem], items):
                self._intents.pop(done.call_id, None)
        else:
            self._apply_states(now_ms, of_kind)

    def intents(self) -> list[records.IntentItem]:
        """The INTENTs applied whose DONE has not been, in log order."""
        return list(self._intents.values())

    def _apply_sends(self, items: Sequence[records.SendItem], new_entries: list[IndexEntry] | None) -> None:
        """Stage each run of one file's items (Hour.stage_sends), put their
        ids, then their serial keys, each in one call; count them per file
        and topic once."""
        hours, topic_names, keys = self._hours, self._topic_names, self._keys
        add_entry = None if new_entries is None else new_entries.append
        new = tuple.__new__
        staged: dict[tuple[Hour, int], int] = {}  # (hour, topic hash) -> entries staged: counted once
        ids: list[tuple[int, int, int]] = []  # (id key, file, gi): the id index's puts
        keyed: list[tuple[int, int, int, int]] = []  # (serial key, file, trigger, gi): the key index's puts
        serials: dict[tuple[str, str], int] = {}  # (topic, serial key) -> its hash, once a record
        touched: list[Hour] = []
        i, end = 0, len(items)
        while i < end:
            hour = items[i].hour
            j = i + 1
            while j < end and items[j].hour == hour:
                j += 1
            h = hours.get_or_add(hour)
            touched.append(h)
            for item in h.stage_sends(items[i:j] if i or j < end else items):
                counted = (h, item.topic_hash)
                staged[counted] = staged.get(counted, 0) + 1
                if item.topic_hash not in topic_names:
                    name = topic_names[item.topic_hash] = delay_log.unpack_body(item.body).topic
                    self.topics_by_name.add(name)
                if keys is not None and item.body[0] == KEYED_BODY:
                    serial = key_of_body(keys, item.body, serials)
                    if serial is not None:
                        keyed.append((serial, hour, item.trigger_ms, item.global_index))
            for item in items[i:j] if i or j < end else items:  # (a replayed one again too: put is idempotent)
                ids.append((item.key, hour, item.global_index))
                if add_entry is not None:
                    add_entry(new(IndexEntry, (
                        hour, item.second, item.local_index, item.global_index, item.pre_global_index,
                        item.trigger_ms, item.priority, item.topic_hash, item.tag_hash, WAITING, 0)))
            i = j
        self._ids.put_many(ids)
        for h in touched:
            hours.mark_dirty(h)  # after the puts: their look at a released message may have flushed h
        for (h, topic_hash), count in staged.items():
            h.count(topic_hash, WAITING, count)
        if keyed:
            assert keys is not None
            keys.put_many(keyed)

    def _apply_states(self, now_ms: int, items: Sequence[_State]) -> None:
        """Each entry's status, flags and retry staged in place, the per-topic
        counts moved (summed per file, topic and status first: a bulk
        call's record holds many changes of few files)."""
        consuming, get = self._consuming, self._hours.get
        deltas: dict[tuple[Hour, int, int], int] = {}
        ends: list[tuple[int, int, int]] = []  # (file, gi, time): the end index's puts
        h: Hour | None = None
        fields: Sequence[Fields] = items  # (a consuming one's place and lease go on as they are)
        for row in fields:
            hour, gi, status, retry, flags, prev_status, topic_hash, _, _ = cast(_State, row)
            if h is None or h.hour != hour:
                h = get(hour)
                if h is None:
                    raise ContractError(f"state change for unknown message {hour}/{gi}")
                self._hours.mark_dirty(h)
            if gi >= h.applied:
                raise ContractError(f"state change for unknown message {hour}/{gi}")
            if flags & FLAG_END_TIME:  # an end, or a send again, of a windowed topic's message: kept
                flags ^= FLAG_END_TIME
                if status >= ACKED:
                    ends.append((hour, gi, now_ms))
                    h.last_end_ms = max(h.last_end_ms, now_ms)  # (a send again: its file kept as long again)
            h.stage_state(gi, status, flags, retry)
            if status == CONSUMING:
                consuming[tuple.__new__(Location, row[:2])] = tuple.__new__(Lease, row[7:])
            elif prev_status == CONSUMING:
                consuming.pop(tuple.__new__(Location, row[:2]), None)
            if status == prev_status:  # (an extension, an end time moved on: no count moves)
                continue
            key = (h, topic_hash, prev_status)
            deltas[key] = deltas.get(key, 0) - 1
            key = (h, topic_hash, status)
            deltas[key] = deltas.get(key, 0) + 1
            if status >= ACKED:
                if prev_status < ACKED:
                    h.ended += 1
                    h.last_end_ms = max(h.last_end_ms, now_ms)
            elif prev_status >= ACKED:
                h.ended -= 1
        for (h, topic_hash, status), delta in deltas.items():
            if delta:
                h.count(topic_hash, status, delta)
        if ends:
            index = self.ends
            if index is None and self._open_ends is not None:
                index = self.ends = self._open_ends()
            if index is not None:
                index.record_many(ends)

    def _apply_moves(self, now_ms: int, items: Sequence[records.MoveItem], new_entries: list[IndexEntry] | None) -> None:
        """The old entry ends (status 7, released, moved: it counts as ended
        for its file, as a deleted message for no topic), then the message
        is staged at its new place as a send is. (Per-topic counts summed
        per file, topic and status first, as _apply_states does.)"""
        hours, keys, ids, consuming = self._hours, self._keys, self._ids, self._consuming
        deltas: dict[tuple[Hour, int, int], int] = {}
        keyed: list[tuple[int, int, int, int]] = []  # the key index's puts, in one call: runs form as for sends
        serials: dict[tuple[str, str], int] = {}
        for from_hour, from_gi, prev_status, retry, to in items:
            old = hours.get(from_hour)
            if old is None or from_gi >= old.applied:
                raise ContractError(f"move of unknown message {from_hour}/{from_gi}")
            old.stage_state(from_gi, DELETED, FLAG_RELEASED | FLAG_MOVED, retry)
            hours.mark_dirty(old)
            key = (old, to.topic_hash, prev_status)
            deltas[key] = deltas.get(key, 0) - 1
            if prev_status < ACKED:  # (a re-driven one had ended there already)
                old.ended += 1
            if prev_status == CONSUMING:
                consuming.pop(tuple.__new__(Location, (from_hour, from_gi)), None)
            old.last_end_ms = max(old.last_end_ms, now_ms)
            h = hours.get_or_add(to.hour)
            if h.stage_send(to):
                key = (h, to.topic_hash, WAITING)
                deltas[key] = deltas.get(key, 0) + 1
                if retry:
                    h.stage_state(to.global_index, WAITING, 0, retry)
            ids.move(to.key, (from_hour, from_gi), to.hour, to.global_index)
            if keys is not None and to.body[0] == KEYED_BODY:  # its new place (the old one is released)
                serial = key_of_body(keys, to.body, serials)
                if serial is not None:
                    keyed.append((serial, to.hour, to.trigger_ms, to.global_index))
            hours.mark_dirty(h)
            if new_entries is not None:
                new_entries.append(tuple.__new__(IndexEntry, (
                    to.hour, to.second, to.local_index, to.global_index, to.pre_global_index, to.trigger_ms,
                    to.priority, to.topic_hash, to.tag_hash, WAITING, retry)))
        for (h, topic_hash, status), delta in deltas.items():
            if delta:
                h.count(topic_hash, status, delta)
        if keyed:
            assert keys is not None
            keys.put_many(keyed)

    # -- what applying keeps beside the hours ------------------------------------------

    def topic_names(self) -> dict[int, str]:
        return dict(self._topic_names)

    def topic_count(self) -> int:
        """How many topics `topic_names` holds, O(1)."""
        return len(self._topic_names)

    def has_topic(self, topic: str) -> bool:
        return topic in self.topics_by_name

    def keep_topics(self, live: Set[int]) -> None:
        """Forget the names of topics not in `live` (their hours retired)."""
        self._topic_names = {th: name for th, name in self._topic_names.items() if th in live}
        self.topics_by_name.clear()  # (in place: readers hold the set)
        self.topics_by_name.update(self._topic_names.values())

    def ack_deadline(self, where: Location) -> int | None:
        """The ack deadline of a CONSUMING message (None: not in flight, or unknown)."""
        lease = self._consuming.get(where)
        return lease[0] or None if lease is not None else None

    def consuming(self) -> dict[Location, Lease]:
        return dict(self._consuming)

    def consuming_rows(self) -> tuple[tuple[int, int, int, int], ...]:
        """The in-flight set as the checkpoint keeps it: (hour, globalIndex, deadline, delivery)."""
        places: Sequence[Fields] = tuple(self._consuming)  # (read as objects: each row joins them as they are)
        leases: Sequence[Fields] = tuple(self._consuming.values())
        return cast(tuple[tuple[int, int, int, int], ...], tuple(map(operator.add, places, leases)))

    def found_consuming(self, where: Location) -> None:
        """A CONSUMING message found by a scan (a checkpoint from before the
        in-flight set was kept): in flight, its deadline and delivery unknown."""
        self._consuming.setdefault(where, _UNKNOWN_LEASE)

    def __repr__(self) -> str:
        return f"Applier(topics={len(self._topic_names)}, consuming={len(self._consuming)}, pending={len(self._pending)})"
