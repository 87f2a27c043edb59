"""The store's state, and the hours it holds with their open files.

`HourTable` is the base of `storage.store.Store`: it owns every field the
store's parts share (the hours, the pending overlays of records appended
but not applied, the in-flight set, the commit log and the id index) and
the one part everything else leans on, the file cache:

    near hours   the hour of `now_ms` and the next one: memory-mapped,
                 opened on first use, reopened plainly when `advance()`
                 moves past them
    far hours    every other hour or span: pread/pwrite through at most
                 `_far_limit` open hours (three descriptors each), least
                 recently used closed first

An `Hour` (storage.hour) stages the bytes applied records give it;
`_flush_staged` writes near hours' stages after every apply (the wheel
reads them soon) and far hours' only past STAGE_LIMIT_BYTES in all, and
`_readable(h)` writes h's stage before anything reads h's files, so the
stage is never visible.

The parts built on it, each in its own module: storage.applying (records
into derived files), storage.reading (lookups and scans),
storage.placement (sends and status changes), storage.refile (moves),
storage.recovery (open), storage.retention (checkpoints).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence

from sortedcontainers import SortedList

from . import records, spans
from .commit_log import CommitLog
from .config import StoreConfig
from .disk_room import DiskRoom
from .entry import MS_PER_HOUR, Location, Message
from .errors import StoreClosedError
from .files import far_hours_limit
from .hour import Hour
from .hour_files import HourFiles
from .id_index import IdIndex

# The hour the store is told before any advance(): none a clock can give.
NO_HOUR = -(1 << 63)
# Staged bytes of far hours kept before they are written (see storage.hour).
STAGE_LIMIT_BYTES = 8 * 1024 * 1024


class HourTable:
    """The state every part of the store shares, and the file cache (see
    the module docstring). One thread calls it."""

    def __init__(self, directory: str, config: StoreConfig) -> None:
        self.directory = directory
        self.config = config
        self._delay_dir = os.path.join(directory, "delay")
        self._hours: dict[int, Hour] = {}
        self._hour_order = SortedList()
        self._far_open: OrderedDict[int, Hour] = OrderedDict()
        self._near: tuple[int, ...] = ()
        self._now_hour = NO_HOUR  # the hour of the last advance()
        self._pending: list[tuple[records.Kind, int, Sequence[records.Item]]] = []
        self._pending_slots: dict[tuple[int, int], tuple[int, int]] = {}
        self._pending_ids: dict[int, list[Message]] = {}
        # (hour, globalIndex) -> (status, flags, retry, topic hash)
        self._pending_state: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        self._topic_names: dict[int, str] = {}
        # Every CONSUMING message and its ack deadline (0: unknown), kept in
        # the checkpoint and by every record applied: O(messages in flight),
        # which the broker caps.
        self._consuming: dict[Location, int] = {}
        self._dirty: set[Hour] = set()  # hours with staged bytes (see storage.hour)
        self._staged_bytes = 0  # their total, as of the last apply (an upper bound)
        self._pending_far_bytes = 0  # far-hour bytes of sends appended, not applied yet
        self._disk_room = DiskRoom(directory)
        self._closed = False
        self._far_limit = far_hours_limit(config.open_far_hours)
        self._checkpoint_offset = -1  # commit offset of the last checkpoint read or written
        self.log: CommitLog
        self.ids: IdIndex

    # -- the commit log's extent, for those outside storage/ ------------------

    @property
    def log_end_offset(self) -> int:
        """The offset the next record appended to the commit log will get
        (appended: durable only after `commit()`)."""
        return self.log.end_offset

    @property
    def log_start_offset(self) -> int:
        """The offset of the oldest record still in the commit log (older
        segments were deleted by a checkpoint)."""
        return self.log.start_offset

    def log_segment_ends(self) -> dict[str, int]:
        """Each commit-log segment's file name -> the file position where
        its records end: how much of each a snapshot copies."""
        return self.log.segment_ends()

    # -- hours and their files --------------------------------------------------

    def _add_hour(self, h: Hour) -> None:
        self._hours[h.hour] = h
        self._hour_order.add(h.hour)

    def _hour(self, hour: int) -> Hour:
        h = self._hours.get(hour)
        if h is None:
            h = Hour(hour)
            self._add_hour(h)
        return h

    def _files(self, h: Hour) -> HourFiles:
        """Open files of hour `h` (creating them on its first write)."""
        if h.files is not None:
            if not h.files.mapped:
                self._far_open.move_to_end(h.hour)
            return h.files
        mapped = h.hour in self._near
        h.files = HourFiles(self._delay_dir, h.hour, mapped, create=True)
        if not mapped:
            self._far_open[h.hour] = h
            if len(self._far_open) > self._far_limit:
                _, old = self._far_open.popitem(last=False)
                self._close_files(old)
        return h.files

    def _close_files(self, h: Hour) -> None:
        if h.files is not None:
            if h in self._dirty:
                h.flush(h.files)
                self._dirty.discard(h)
            h.files.close(h.entries, h.log_bytes)
            h.files = None
            h.forget_slots()
            self._far_open.pop(h.hour, None)

    def advance(self, now_ms: int) -> None:
        """Tell the store the time; when the hour changes, the mapped pair of
        near hours moves with it."""
        now_hour = now_ms // MS_PER_HOUR
        if now_hour == self._now_hour:
            return
        self._now_hour = now_hour
        near = (now_hour, now_hour + 1)
        for hour in set(self._near) | set(near):
            h = self._hours.get(hour)
            if h is not None and h.files is not None and h.files.mapped != (hour in near):
                self._close_files(h)  # reopened in the right mode on next use
        self._near = near

    def _flush_staged(self, everything: bool) -> None:
        """Write staged bytes: always for near hours (the dispatcher reads
        them soon), for far hours only past STAGE_LIMIT_BYTES or when asked."""
        if not self._dirty:
            self._staged_bytes = 0
            return
        staged = 0
        if not everything:
            staged = sum(h.staged_bytes for h in self._dirty)
            everything = staged > STAGE_LIMIT_BYTES
        for h in list(self._dirty):
            if everything or h.hour in self._near:
                h.flush(self._files(h))
                self._dirty.discard(h)
        self._staged_bytes = 0 if everything else staged

    def _readable(self, h: Hour) -> HourFiles:
        """h's files with everything staged for h written."""
        files = self._files(h)
        if h in self._dirty:
            h.flush(files)
            self._dirty.discard(h)
        return files

    def _span_start(self, h: Hour) -> int | None:
        """A span's first hour, from its first applied entry (None: none yet)."""
        if h.start is None and h.applied:
            h.start = spans.start_hour(h.hour, self._readable(h).read_entry(0)[0].trigger_ms)
        return h.start

    def _release_files(self) -> None:
        for h in self._hours.values():
            if h.files is not None:  # closed as they are: a refused directory is not cut
                for f in (h.files.log, h.files.idx, h.files.sec):
                    f.close()
                h.files = None
        for part in ("ids", "log"):
            opened = self.__dict__.get(part)
            if opened is not None:
                opened.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.directory!r} is closed")

