"""The hours (and spans) a store holds, and the cache of their open files.

`HourTable` is the store's one record of which hours exist: each `Hour`
(storage.hour) with its counters, its write stage and, while open, its
files. Every other part of the store (storage.store) receives it and asks
it for hours; none keeps hours of its own.

    near hours   the hour of `now_ms` and the next one: memory-mapped,
                 opened on first use, reopened plainly when `advance()`
                 moves past them
    far hours    every other hour or span: pread/pwrite through at most
                 `far_limit` open hours (three descriptors each), least
                 recently used closed first

Worked example (far_limit 2): files(a), files(b), files(c) for three far
hours opens a, then b, then closes a to open c; files(b) again moves b to
the back of the line, so the next far hour opened closes c.

Staging: applying a record stages bytes in an `Hour` and marks it dirty
here (`mark_dirty`). `flush_staged` writes near hours' stages after every
apply (the wheel reads them soon) and far hours' only past
STAGE_LIMIT_BYTES in all; `readable(h)` writes h's stage before anything
reads h's files, so the stage is never visible. Invariant: an hour with
staged bytes is in the dirty set, and its files are open or it is flushed
when they are closed.

Cost: O(1) per lookup; memory O(hours), the open files bounded. One
thread calls it.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator

from sortedcontainers import SortedList

from . import spans
from .delay_index import FLAG_RELEASED
from .disk import Disk
from .entry import MS_PER_HOUR
from .fileutil import fsync_dir
from .hour import Hour
from .hour_files import HourFiles, hour_paths

# The hour the table is told before any advance(): none a clock can give.
NO_HOUR = -(1 << 63)
# Staged bytes of far hours kept before they are written (see storage.hour).
STAGE_LIMIT_BYTES = 8 * 1024 * 1024


class HourTable:
    """The live hours, their files and their stages (see the module docstring)."""

    def __init__(self, delay_dir: str, far_limit: int, disk: Disk) -> None:
        self.delay_dir = delay_dir  # where the hours' files are (storage.hour_files)
        self._disk = disk  # what their mapped files reserve blocks through (storage.disk)
        self._hours: dict[int, Hour] = {}
        self._order = SortedList()  # the keys of _hours, ascending (spans after every hour)
        self._far_open: OrderedDict[int, Hour] = OrderedDict()  # far hours with open files, least recent first
        self._far_limit = far_limit
        # Read by the send path without a call (storage.placement); only
        # this table writes them:
        self.near: tuple[int, ...] = ()  # the mapped pair of hours (`advance`)
        self.now_hour = NO_HOUR  # the hour of the last advance()
        self.dirty: set[Hour] = set()  # hours with staged bytes (see storage.hour; `mark_dirty`)
        # bytes staged in far hours, as of the last `flush_staged` (an upper bound)
        self.staged_bytes = 0

    # -- which hours there are ---------------------------------------------------

    def get(self, hour: int) -> Hour | None:
        return self._hours.get(hour)

    def __getitem__(self, hour: int) -> Hour:
        return self._hours[hour]

    def __contains__(self, hour: object) -> bool:
        return hour in self._hours

    def __len__(self) -> int:
        return len(self._hours)

    def add(self, h: Hour) -> None:
        self._hours[h.hour] = h
        self._order.add(h.hour)

    def get_or_add(self, hour: int) -> Hour:
        h = self._hours.get(hour)
        if h is None:
            h = Hour(hour)
            self.add(h)
        return h

    def ascending(self, first: int | None = None, last: int | None = None) -> Iterator[Hour]:
        """The hours from `first` to `last` (both included; None: no bound),
        ascending. Spans sort after every hour (storage.spans)."""
        for hour in self._order.irange(first, last):
            yield self._hours[hour]

    def descending(self, first: int | None = None) -> Iterator[Hour]:
        """The hours from `first` (included; None: the last) down to the first."""
        for hour in self._order.irange(None, first, reverse=True):
            yield self._hours[hour]

    def retire(self, hour: int) -> Hour:
        """Forget `hour` (its files closed, not deleted: see `delete_files`)."""
        h = self._hours.pop(hour)
        self._order.remove(hour)
        self._close_files(h)
        return h

    def discard_unapplied(self, hour: int) -> None:
        """Forget an hour that only placements of a record never appended
        made, deleting the empty files a send may have created for it."""
        h = self._hours.pop(hour)
        self._order.remove(hour)
        if h.files is not None:
            h.files.close(0, 0)
            self._far_open.pop(hour, None)
            for path in hour_paths(self.delay_dir, hour):
                os.unlink(path)

    def delete_files(self, hours: tuple[int, ...]) -> None:
        """Delete the files of retired hours, durably."""
        for hour in hours:
            for path in hour_paths(self.delay_dir, hour):
                os.unlink(path)
        if hours:
            fsync_dir(self.delay_dir)

    # -- time --------------------------------------------------------------------

    def is_near(self, hour: int) -> bool:
        return hour in self.near

    def advance(self, now_ms: int) -> None:
        """Tell the table the time; when the hour changes, the mapped pair of
        near hours moves with it."""
        now_hour = now_ms // MS_PER_HOUR
        if now_hour == self.now_hour:
            return
        self.now_hour = now_hour
        near = (now_hour, now_hour + 1)
        for hour in set(self.near) | set(near):
            h = self._hours.get(hour)
            if h is not None and h.files is not None and h.files.mapped != (hour in near):
                self._close_files(h)  # reopened in the right mode on next use
        self.near = near

    # -- files -------------------------------------------------------------------

    def files(self, h: Hour) -> HourFiles:
        """Open files of hour `h` (creating them on its first write)."""
        if h.files is not None:
            if not h.files.mapped:
                self._far_open.move_to_end(h.hour)
            return h.files
        mapped = h.hour in self.near
        h.files = HourFiles(self.delay_dir, h.hour, mapped, create=True, disk=self._disk)
        if not mapped:
            self._far_open[h.hour] = h
            if len(self._far_open) > self._far_limit:
                _, old = self._far_open.popitem(last=False)
                self._close_files(old)
        return h.files

    def readable(self, h: Hour) -> HourFiles:
        """h's files with everything staged for h written."""
        files = self.files(h)
        if h in self.dirty:
            h.flush(files)
            self.dirty.discard(h)
        return files

    def _close_files(self, h: Hour) -> None:
        if h.files is not None:
            if h in self.dirty:
                h.flush(h.files)
                self.dirty.discard(h)
            h.files.close(h.entries, h.log_bytes)
            h.files = None
            h.forget_slots()
            self._far_open.pop(h.hour, None)

    def shed(self) -> None:
        """Return the open files' cached pages (after a checkpoint)."""
        for h in self._hours.values():
            if h.files is not None:
                h.files.shed()

    def close(self) -> None:
        """Write everything staged and close every file, each cut to its data."""
        self.flush_staged(everything=True)
        for h in list(self._hours.values()):
            self._close_files(h)

    def release(self) -> None:
        """Close every file as it is, nothing written or cut: for a directory
        the store refused to open."""
        for h in self._hours.values():
            if h.files is not None:
                for f in (h.files.log, h.files.idx, h.files.sec):
                    f.close()
                h.files = None

    # -- staging -----------------------------------------------------------------

    def mark_dirty(self, h: Hour) -> None:
        """Bytes were staged in `h` (storage.hour)."""
        self.dirty.add(h)

    def flush_staged(self, everything: bool) -> None:
        """Write staged bytes: always for near hours (the dispatcher reads
        them soon), for far hours only past STAGE_LIMIT_BYTES or when asked."""
        if not self.dirty:
            self.staged_bytes = 0
            return
        staged = 0
        near = self.near
        if not everything:
            for h in self.dirty:
                if h.hour not in near:  # (near hours are written now whatever their size)
                    staged += h.staged_bytes
            everything = staged > STAGE_LIMIT_BYTES
        for h in list(self.dirty):
            if everything or h.hour in near:
                h.flush(h.files if h.files is not None and h.files.mapped else self.files(h))
                self.dirty.discard(h)
        self.staged_bytes = 0 if everything else staged

    # -- reads every part needs ----------------------------------------------------

    def span_start(self, h: Hour) -> int | None:
        """A span's first hour, from its first applied entry (None: none yet)."""
        if h.start is None and h.applied:
            h.start = spans.start_hour(h.hour, self.readable(h).read_entry(0)[0].trigger_ms)
        return h.start

    def released(self, hour: int, global_index: int) -> bool:
        """True if the applied state of the message says it was deleted for
        good (the id index reuses its slot for the next one under its id)."""
        h = self._hours.get(hour)
        if h is None or global_index >= h.applied:
            return False
        flags = h.staged_flags(global_index)
        if flags is None:
            flags = self.readable(h).read_entry(global_index)[3]
        return bool(flags & FLAG_RELEASED)

    def __repr__(self) -> str:
        return (f"HourTable({self.delay_dir!r}, hours={len(self._hours)}, near={self.near}, "
                f"far_open={len(self._far_open)}/{self._far_limit}, dirty={len(self.dirty)})")
