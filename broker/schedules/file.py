"""The schedules file: a node's recurring schedules on disk, an append-only
log of their states (docs/internals.md, "Files").

    offset  size  field
    0       4     magic b"HGSC"
    4       2     version (2), little-endian
    6       2     zero
    then records, each:
    0       4     length of the body, in bytes (u32 LE)
    4       4     CRC-32 of the body (u32 LE)
    8       n     body: a JSON object, one of
                    {"put": <a schedule's row: every parameter, version,
                             paused, pending, runs, catchUp, lastRuns, stale>}
                    {"delete": [topic, scheduleId], "stale": msgId or null}
                    {"runs": [[topic, scheduleId, version, pending, runs,
                               catchUp, nominal, lateMs, missed], ...]}

The last "put" or "delete" of a (topic, scheduleId) is its state: a "put"
its row, a "delete" none (and a run, `stale`, to delete if it is still
waiting). A put, pause or resume appends the whole row. A run made appends
its progress alone, in a "runs" record of every schedule whose run one
batch made (`write_runs`): the row's pending, runs and catchUp become the
record's, and the run released ([nominal, lateMs, missed]) joins its
lastRuns (the last LAST_RUNS kept). A "runs" entry names the version it
follows: one for another version (or none) is a file no node wrote.
Every write is one append made durable (fsync, `sync()`: concurrent
callers share one) before the change is acted on. When the file has grown
past four times its live rows (and 1 MiB), `rewrite` replaces it with the
live rows alone (written in slices to a temporary file, fsync'ed, renamed,
the directory fsync'ed: a crash leaves the old file or the new).

Version 1 (before "runs" records) is read as well, and rewritten as
version 2 at open, so a node of an older build refuses the file by its
version rather than by a record it does not know.

Opening validates: a wrong magic or version, or a record whose CRC fails
with records after it, raises CorruptionError naming the path and offset;
a torn last record (cut short, or its CRC failing at the end of the file:
a write a crash interrupted, never answered) is cut off.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

import orjson

from storage.errors import CorruptionError, HourglassError
from storage.fileutil import FILE_MODE, check_header, create_file, fsync_dir

MAGIC = b"HGSC"
VERSION = 2
READ_VERSIONS = (1, 2)
# Released runs a schedule keeps (getSchedule's lastRuns).
LAST_RUNS = 10
# Rows a rewrite frames at a time (the file written in slices, the loop
# given a turn between them).
REWRITE_SLICE = 1000
HEADER = struct.Struct("<4sHH")
RECORD = struct.Struct("<II")
# A body longer than this is no body this file writes (a schedule's row is
# its msg, at most --max-msg-bytes, and a few hundred bytes more).
MAX_BODY_BYTES = 64 * 1024 * 1024
REWRITE_FLOOR_BYTES = 1024 * 1024

class RowError(HourglassError, ValueError):
    """A record of the schedules file that is not a schedule's (raised while
    reading one back; opening reports it as a CorruptionError)."""


Row = dict[str, object]
Key = tuple[str, str]  # (topic, scheduleId)


class OpenedRowsLike(Protocol):
    """What a schedule store hands over at open (broker.schedules.keeper reads each
    row once, then clears them): OpenedRows, or a dict of rows."""

    def values(self) -> Iterable[Row]: ...

    def clear(self) -> None: ...


# What _Opened keeps for a progress field the row leaves out (None).
_NONE = -(1 << 63)
_RUN = 3 * LAST_RUNS  # a schedule's last runs: three numbers each (nominal, ms late, missed)


class _Opened:
    """The schedules as the file was opened, in flat arrays (one slot a
    schedule, no object of its own): where each one's last "put" record
    is, and the progress the records after it gave (the row's own until
    then)."""

    def __init__(self) -> None:
        self.slots: dict[Key, int] = {}
        self.where = array("q")  # two a slot: the put record's body, start and end
        self.progress = array("q")  # four a slot: version, pending, runs, catchUp (_NONE: absent)
        self.last = array("q")  # _RUN a slot
        self.lasts = array("B")  # last runs held, a slot

    def put(self, key: Key, start: int, end: int, row: Row) -> None:
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = len(self.lasts)
            self.where.extend((0, 0))
            self.progress.extend((0, 0, 0, 0))
            self.last.frombytes(bytes(8 * _RUN))
            self.lasts.append(0)
        self.where[2 * slot], self.where[2 * slot + 1] = start, end
        self.set_progress(slot, row.get("version"), row.get("pending"), row.get("runs"), row.get("catchUp"))
        last = row.get("lastRuns")
        if not isinstance(last, list):
            raise RowError("lastRuns is not a list")
        self.lasts[slot] = 0
        for run in last[-LAST_RUNS:]:
            self.add_run(slot, run[0], run[1], run[2])

    def version(self, key: Key) -> int | None:
        """The version of the schedule's last put (None: none, or none given)."""
        slot = self.slots.get(key)
        return None if slot is None or self.progress[4 * slot] == _NONE else self.progress[4 * slot]

    def set_progress(self, slot: int, *values: object) -> None:
        for i, value in enumerate(values):
            if value is not None and type(value) is not int:
                raise RowError(f"a progress field that is not a whole number: {value!r}")
            self.progress[4 * slot + i] = _NONE if value is None else value

    def add_run(self, slot: int, nominal: object, late: object, missed: object) -> None:
        if type(nominal) is not int or type(late) is not int:
            raise RowError(f"a last run that is not whole numbers: {nominal!r}, {late!r}")
        base, held = _RUN * slot, self.lasts[slot]
        if held == LAST_RUNS:  # full: the oldest shifted out
            self.last[base:base + _RUN - 3] = self.last[base + 3:base + _RUN]
            held -= 1
        at = base + 3 * held
        self.last[at], self.last[at + 1], self.last[at + 2] = nominal, late, bool(missed)
        self.lasts[slot] = held + 1

    def drop(self, key: Key) -> None:
        self.slots.pop(key, None)  # (its slot is left unused)

    def row(self, data: bytes, key: Key) -> Row:
        slot = self.slots[key]
        row: Row = orjson.loads(data[self.where[2 * slot]:self.where[2 * slot + 1]])["put"]
        p = [None if v == _NONE else v for v in self.progress[4 * slot:4 * slot + 4]]
        row["version"], row["pending"], row["runs"], row["catchUp"] = p
        h, base = self.last, _RUN * slot
        row["lastRuns"] = [[h[i], h[i + 1], bool(h[i + 2])] for i in range(base, base + 3 * self.lasts[slot], 3)]
        return row


class OpenedRows(Mapping[Key, Row]):
    """Each schedule's last row as the file was opened, each built when it
    is read (its put record parsed again, the progress after it applied):
    100,000 rows held as dicts at once are some 3 KB a schedule, a heap the
    process would keep after reading them (its pieces interleaved with what
    is made from them). `clear` lets the file's bytes go."""

    def __init__(self, data: bytes, opened: _Opened) -> None:
        self._data = data
        self._opened = opened

    def __getitem__(self, key: Key) -> Row:
        return self._opened.row(self._data, key)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._opened.slots)

    def __len__(self) -> int:
        return len(self._opened.slots)

    def clear(self) -> None:
        self._opened = _Opened()
        self._data = b""


class RunProgress(Protocol):
    """A schedule whose run was made (broker.schedules.keeper.ScheduleState), as a
    store writes it: its progress, read when `write_runs` is called."""

    @property
    def key(self) -> Key: ...

    version: int
    pending: int | None
    runs: int
    catch_up: int

    def last_run(self) -> tuple[int, int, bool]:
        """The run just released: (nominal ms, ms late, missed)."""
        ...

    def progress(self) -> Row:
        """pending, runs, catchUp, lastRuns, stale (the row's own)."""
        ...

    def row(self) -> Row: ...


def runs_record(states: Sequence[RunProgress]) -> Row:
    """The "runs" record of schedules whose runs one batch made."""
    entries = []
    for s in states:
        nominal, late, missed = s.last_run()
        entries.append([*s.key, s.version, s.pending, s.runs, s.catch_up, nominal, late, missed])
    return {"runs": entries}


def frame(body: Row) -> bytes:
    data = orjson.dumps(body)
    return RECORD.pack(len(data), zlib.crc32(data)) + data


class ScheduleFile:
    """The schedules file at `path` (made with its header if missing).
    `fsync` False (--fsync never) skips the syncs. Runs on the event loop;
    the syncs run in a worker thread."""

    def __init__(self, path: str, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        self._old_version = False
        self.rows: OpenedRows
        self.rows, self.stale = self._load()
        if self._old_version:  # version 1: written anew as version 2 before anything is appended
            records: list[Row] = [{"put": row} for row in self.rows.values()]
            records += [{"delete": list(key), "stale": msg_id} for key, msg_id in self.stale.items()]
            self._replace(records)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.size_bytes = os.fstat(self._fd).st_size
        self._written = 0  # appends so far, and those synced
        self._synced = 0
        self._syncing: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"ScheduleFile({self.path!r}, {len(self.rows)} schedules, {self.size_bytes} bytes)"

    def _load(self) -> tuple[OpenedRows, dict[Key, str]]:
        """Every schedule's last row (each built when read), and the runs
        deletes left to delete."""
        if not os.path.exists(self.path):
            fd = create_file(self.path, os.O_WRONLY)
            try:
                os.write(fd, HEADER.pack(MAGIC, VERSION, 0))
                os.fsync(fd)
            finally:
                os.close(fd)
        with open(self.path, "rb") as f:
            data = f.read()
        found = HEADER.unpack_from(data, 0)[1] if len(data) >= HEADER.size else VERSION
        check_header(self.path, data, HEADER, MAGIC, found if found in READ_VERSIONS else VERSION)
        self._old_version = found != VERSION
        rows = _Opened()
        stale: dict[Key, str] = {}
        at = HEADER.size
        while at < len(data):
            if at + RECORD.size > len(data):
                self._cut(at, "a record head cut short")
                break
            length, crc = RECORD.unpack_from(data, at)
            end = at + RECORD.size + length
            if length > MAX_BODY_BYTES:
                if end >= len(data):
                    self._cut(at, "a torn record")
                    break
                raise CorruptionError(self.path, at, f"record of {length} bytes, more than {MAX_BODY_BYTES}")
            if end > len(data):
                self._cut(at, "a record cut short")
                break
            body = data[at + RECORD.size:end]
            if zlib.crc32(body) != crc:
                if end == len(data):
                    self._cut(at, "the last record's CRC fails")
                    break
                raise CorruptionError(self.path, at, "record CRC mismatch with records after it")
            try:
                record = orjson.loads(body)
                self._apply(record, at + RECORD.size, end, rows, stale)
            except (ValueError, KeyError, TypeError, IndexError, RowError) as e:
                raise CorruptionError(self.path, at, f"record is not a schedule's: {e}") from None
            at = end
        return OpenedRows(data, rows), stale

    @staticmethod
    def _apply(record: object, start: int, end: int, rows: _Opened, stale: dict[Key, str]) -> None:
        if not isinstance(record, dict):
            raise RowError("not a JSON object")
        runs = record.get("runs")
        if runs is not None:
            if not isinstance(runs, list):
                raise RowError("runs is not a list")
            for entry in runs:
                topic, schedule_id, version, pending, made, catch_up, nominal, late, missed = entry
                key = (str(topic), str(schedule_id))
                if version is None or rows.version(key) != version:
                    raise RowError(f"a run of {schedule_id!r} at version {version}, which is not the schedule's")
                slot = rows.slots[key]
                rows.add_run(slot, nominal, late, missed)
                rows.set_progress(slot, version, pending, made, catch_up)
            return
        row = record.get("put")
        if isinstance(row, dict):
            key = (sys.intern(str(row["topic"])), str(row["scheduleId"]))
            rows.put(key, start, end, row)
            stale.pop(key, None)
            return
        deleted = record["delete"]
        if not isinstance(deleted, list) or len(deleted) != 2:
            raise RowError("delete is not [topic, scheduleId]")
        key = (str(deleted[0]), str(deleted[1]))
        rows.drop(key)
        if isinstance(record.get("stale"), str):
            stale[key] = str(record["stale"])

    def _cut(self, offset: int, reason: str) -> None:
        """A torn tail (never answered): the file ends before it."""
        os.truncate(self.path, offset)

    def append(self, records: list[Row]) -> None:
        """Append records (made durable by the next `sync`)."""
        data = b"".join(frame(r) for r in records)
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
        self.size_bytes += len(data)
        self._written += 1

    async def write(self, records: list[Row]) -> None:
        """Append the records and sync them (broker.schedules.keeper.ScheduleStore)."""
        self.append(records)
        await self.sync()

    async def write_runs(self, states: Sequence[RunProgress]) -> None:
        """Runs made: their progress, one "runs" record, synced."""
        await self.write([runs_record(states)])

    async def forget_stale(self, keys: list[Key]) -> None:
        """Nothing to do: the next rewrite keeps live rows alone."""

    async def read(self, keys: Sequence[Key]) -> None:
        return None  # this node alone writes them: RAM is current

    async def topic_ids(self, topic: str) -> None:
        return None

    async def sync(self) -> None:
        """Every record appended so far on disk (one fsync for all callers
        waiting meanwhile)."""
        target = self._written
        while self._synced < target:
            if self._syncing is None:
                self._syncing = asyncio.ensure_future(self._sync_once())
            await asyncio.shield(self._syncing)

    async def _sync_once(self) -> None:
        upto = self._written
        try:
            if self._fsync:
                await asyncio.to_thread(os.fsync, self._fd)
            self._synced = max(self._synced, upto)
        finally:
            self._syncing = None

    def rewrite_due(self, live_bytes: int) -> bool:
        return self.size_bytes > max(REWRITE_FLOOR_BYTES, 4 * live_bytes)

    async def rewrite(self, rows: Sequence[RunProgress]) -> None:
        """Replace the file by these schedules' rows alone (each a "put"),
        durably: framed and written REWRITE_SLICE at a time to a temporary
        file (the loop has a turn between slices; the caller changes none of
        them meanwhile), fsync'ed, renamed over the file, the directory
        fsync'ed."""
        await self.sync()
        tmp = self.path + ".tmp"
        fd = create_file(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            os.fchmod(fd, FILE_MODE)
            size = _write_all(fd, tmp, HEADER.pack(MAGIC, VERSION, 0))
            for at in range(0, len(rows), REWRITE_SLICE):
                size += _write_all(fd, tmp, b"".join(frame({"put": s.row()}) for s in rows[at:at + REWRITE_SLICE]))
                await asyncio.sleep(0)
            await asyncio.to_thread(os.fsync, fd)
        finally:
            os.close(fd)
        await asyncio.to_thread(self._rename, tmp)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size_bytes = size

    def _rename(self, tmp: str) -> None:
        os.replace(tmp, self.path)
        fsync_dir(os.path.dirname(self.path) or ".")

    def _replace(self, records: list[Row]) -> None:
        """The file made of `records` alone (at open, before it is appended to)."""
        tmp = self.path + ".tmp"
        fd = create_file(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            os.fchmod(fd, FILE_MODE)
            _write_all(fd, tmp, HEADER.pack(MAGIC, VERSION, 0) + b"".join(frame(r) for r in records))
            os.fsync(fd)
        finally:
            os.close(fd)
        self._rename(tmp)

    def close(self) -> None:
        os.close(self._fd)


def _write_all(fd: int, path: str, data: bytes) -> int:
    written = os.write(fd, data)
    if written != len(data):
        raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
    return written


def schedules_path(data_path: str) -> str:
    return os.path.join(data_path, "schedules")
