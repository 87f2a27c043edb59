"""Applying durable records to the derived files, and group commit.

A record appended to the commit log (a send, state changes, moves) is
*pending* until `commit()`: one fsync for every record appended since the
last commit, then each record applied in order:

    SEND   each item's index entry, delay-log frame and second-table slot
           staged in its hour (storage.hour), its id put in the id index,
           its topic counted WAITING
    STATE  the entry's status, flags and retry staged; counts, ended
           messages and the in-flight set follow
    MOVE   the old entry ends (released, moved), the message is staged at
           its new place as a send is

Applying writes only at positions the record names, so applying a record
twice (recovery replays from the checkpoint's offset) changes nothing.
`commit()` returns the index entries of the messages it stored, for the
wheel. A server may split it: `sync_log()` in a worker thread while this
thread keeps appending, then `apply_pending(count)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from . import delay_log, records
from .delay_index import FLAG_MOVED, FLAG_RELEASED
from .entry import IndexEntry, Location, Status
from .errors import ContractError
from .hour import Hour
from .hour_table import HourTable

WAITING = Status.WAITING


class Applying(HourTable):
    """Pending records, group commit and applying (see the module docstring)."""

    def _decode(self, body: bytes) -> tuple[records.Kind, int, Sequence[records.Item]]:
        """A record from the log or from a leader, its sends keyed with this
        store's id-index secret (the writer's key may come from another)."""
        kind, now_ms, items = records.decode(body)
        key = self.ids.key_of_bytes
        if kind is records.Kind.SEND:
            items = [item._replace(key=key(*delay_log.id_fields(item.body)))
                     for item in cast(Sequence[records.SendItem], items)]
        elif kind is records.Kind.MOVE:
            items = [item._replace(to=item.to._replace(key=key(*delay_log.id_fields(item.to.body))))
                     for item in cast(Sequence[records.MoveItem], items)]
        return kind, now_ms, items

    def _append(self, kind: records.Kind, now_ms: int, items: Sequence[records.Item]) -> None:
        self.log.append(records.encode(kind, now_ms, items))
        self._pending.append((kind, now_ms, items))

    @property
    def pending_records(self) -> int:
        """Records appended and not yet applied (see `sync_log`)."""
        return len(self._pending)

    def sync_log(self) -> None:
        """fsync everything appended so far. Safe to run in a worker thread
        while this one keeps appending: read `pending_records` before it, and
        apply that many afterwards (`apply_pending`)."""
        self.log.sync()

    def apply_pending(self, count: int | None = None) -> list[IndexEntry]:
        """Apply the first `count` (default: all) pending records, which must
        be durable, to the derived files. Returns the new index entries."""
        n = len(self._pending) if count is None else count
        batch, self._pending = self._pending[:n], self._pending[n:]
        new_entries: list[IndexEntry] = []
        for kind, now_ms, items in batch:
            self._apply(kind, now_ms, items, new_entries)
        self._flush_staged(everything=False)
        if not self._pending:
            self._pending_far_bytes = 0
            self._pending_slots.clear()
            self._pending_ids.clear()
            self._pending_state.clear()
        return new_entries

    def commit(self) -> list[IndexEntry]:
        """Group commit: one fsync for every change since the last commit,
        then apply them. Returns the index entries of newly stored messages."""
        self._check_open()
        count = self.pending_records
        self.sync_log()
        return self.apply_pending(count)

    def _apply(self, kind: records.Kind, now_ms: int, items: Sequence[records.Item],
               new_entries: list[IndexEntry] | None) -> None:
        """Apply one durable record (its items are all of its kind's type)."""
        if kind is records.Kind.SEND:
            put, dirty, topic_names = self.ids.put, self._dirty, self._topic_names
            add_entry = None if new_entries is None else new_entries.append
            staged: dict[tuple[Hour, int], int] = {}  # (hour, topic hash) -> entries staged: counted once
            h: Hour | None = None
            for item in cast(Sequence[records.SendItem], items):
                if h is None or h.hour != item.hour:
                    h = self._hour(item.hour)
                if h.stage_send(item):
                    counted = (h, item.topic_hash)
                    staged[counted] = staged.get(counted, 0) + 1
                    if item.topic_hash not in topic_names:
                        topic_names[item.topic_hash] = delay_log.unpack_body(item.body).topic
                put(item.key, item.hour, item.global_index)
                dirty.add(h)  # after put: its look at a released message may have flushed h
                if add_entry is not None:
                    add_entry(tuple.__new__(IndexEntry, (
                        item.hour, item.second, item.local_index, item.global_index, item.pre_global_index,
                        item.trigger_ms, item.priority, item.topic_hash, item.tag_hash, WAITING, 0)))
            for (h, topic_hash), count in staged.items():
                h.count(topic_hash, WAITING, count)
            return
        if kind is records.Kind.MOVE:
            self._apply_moves(now_ms, cast(Sequence[records.MoveItem], items), new_entries)
            return
        for change in cast(Sequence[records.StateItem], items):
            h = self._hours.get(change.hour)
            if h is None or change.global_index >= h.applied:
                raise ContractError(f"state change for unknown message {change.hour}/{change.global_index}")
            h.stage_state(change.global_index, change.status, change.flags, change.retry)
            self._dirty.add(h)
            if change.status == Status.CONSUMING:
                self._consuming[Location(change.hour, change.global_index)] = change.deadline_ms
            elif change.prev_status == Status.CONSUMING:
                self._consuming.pop(Location(change.hour, change.global_index), None)
            h.count(change.topic_hash, change.prev_status, -1)
            h.count(change.topic_hash, change.status, 1)
            was_final, is_final = change.prev_status >= Status.ACKED, change.status >= Status.ACKED
            if is_final and not was_final:
                h.ended += 1
                h.last_end_ms = max(h.last_end_ms, now_ms)
            elif was_final and not is_final:
                h.ended -= 1

    def _apply_moves(self, now_ms: int, items: Sequence[records.MoveItem], new_entries: list[IndexEntry] | None) -> None:
        """The old entry ends (status 7, released, moved: it counts as ended
        for its file, as a deleted message for no topic), then the message
        is staged at its new place as a send is."""
        for move in items:
            old = self._hours.get(move.from_hour)
            if old is None or move.from_global_index >= old.applied:
                raise ContractError(f"move of unknown message {move.from_hour}/{move.from_global_index}")
            to = move.to
            old.stage_state(move.from_global_index, Status.DELETED, FLAG_RELEASED | FLAG_MOVED, move.retry)
            self._dirty.add(old)
            old.count(to.topic_hash, move.prev_status, -1)
            if move.prev_status < Status.ACKED:  # (a re-driven one had ended there already)
                old.ended += 1
            if move.prev_status == Status.CONSUMING:
                self._consuming.pop(Location(move.from_hour, move.from_global_index), None)
            old.last_end_ms = max(old.last_end_ms, now_ms)
            h = self._hour(to.hour)
            if h.stage_send(to):
                h.count(to.topic_hash, WAITING, 1)
                if move.retry:
                    h.stage_state(to.global_index, WAITING, 0, move.retry)
            self.ids.put(to.key, to.hour, to.global_index)  # after the old one's release: it reuses its slot
            self._dirty.add(h)
            if new_entries is not None:
                new_entries.append(IndexEntry(
                    to.hour, to.second, to.local_index, to.global_index, to.pre_global_index, to.trigger_ms,
                    to.priority, to.topic_hash, to.tag_hash, WAITING, move.retry))
