"""The schedules file: a node's recurring schedules on disk, an append-only
log of their states (docs/internals.md, "Files").

    offset  size  field
    0       4     magic b"HGSC"
    4       2     version (1), little-endian
    6       2     zero
    then records, each:
    0       4     length of the body, in bytes (u32 LE)
    4       4     CRC-32 of the body (u32 LE)
    8       n     body: a JSON object, one of
                    {"put": <a schedule's row: every parameter, version,
                             paused, pending, runs, catchUp, lastRuns, stale>}
                    {"delete": [topic, scheduleId], "stale": msgId or null}

The last record of a (topic, scheduleId) is its state: a "put" its row, a
"delete" none (and a run, `stale`, to delete if it is still waiting).
Every change of a schedule (a put, pause, resume, a run made) appends its
whole row: one write, made durable (fsync, `sync()`: concurrent callers
share one) before the change is acted on. When the file has grown past
four times its live rows (and 1 MiB), `rewrite` replaces it with the live
rows alone (written whole, fsync'ed, renamed: storage.fileutil.atomic_write).

Opening validates: a wrong magic or version, or a record whose CRC fails
with records after it, raises CorruptionError naming the path and offset;
a torn last record (cut short, or its CRC failing at the end of the file:
a write a crash interrupted, never answered) is cut off.
"""

from __future__ import annotations

import asyncio
import os
import struct
import zlib

import orjson

from storage.errors import CorruptionError, HourglassError
from storage.fileutil import atomic_write, check_header, create_file

MAGIC = b"HGSC"
VERSION = 1
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
        self.rows, self.stale = self._load()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self.size_bytes = os.fstat(self._fd).st_size
        self._written = 0  # appends so far, and those synced
        self._synced = 0
        self._syncing: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"ScheduleFile({self.path!r}, {len(self.rows)} schedules, {self.size_bytes} bytes)"

    def _load(self) -> tuple[dict[Key, Row], dict[Key, str]]:
        """Every schedule's last row, and the runs deletes left to delete."""
        if not os.path.exists(self.path):
            fd = create_file(self.path, os.O_WRONLY)
            try:
                os.write(fd, HEADER.pack(MAGIC, VERSION, 0))
                os.fsync(fd)
            finally:
                os.close(fd)
        with open(self.path, "rb") as f:
            data = f.read()
        check_header(self.path, data, HEADER, MAGIC, VERSION)
        rows: dict[Key, Row] = {}
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
                self._apply(record, rows, stale)
            except (ValueError, KeyError, TypeError, RowError) as e:
                raise CorruptionError(self.path, at, f"record is not a schedule's: {e}") from None
            at = end
        return rows, stale

    @staticmethod
    def _apply(record: object, rows: dict[Key, Row], stale: dict[Key, str]) -> None:
        if not isinstance(record, dict):
            raise RowError("not a JSON object")
        row = record.get("put")
        if isinstance(row, dict):
            key = (str(row["topic"]), str(row["scheduleId"]))
            rows[key] = row
            stale.pop(key, None)
            return
        deleted = record["delete"]
        if not isinstance(deleted, list) or len(deleted) != 2:
            raise RowError("delete is not [topic, scheduleId]")
        key = (str(deleted[0]), str(deleted[1]))
        rows.pop(key, None)
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
        """Append the records and sync them (broker.schedules.ScheduleStore)."""
        self.append(records)
        await self.sync()

    async def forget_stale(self, keys: list[Key]) -> None:
        """Nothing to do: the next rewrite keeps live rows alone."""

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

    async def rewrite(self, rows: list[Row]) -> None:
        """Replace the file by `rows` alone (each a "put"), durably."""
        await self.sync()
        data = HEADER.pack(MAGIC, VERSION, 0) + b"".join(frame({"put": row}) for row in rows)
        await asyncio.to_thread(atomic_write, self.path, data)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size_bytes = len(data)

    def close(self) -> None:
        os.close(self._fd)


def schedules_path(data_path: str) -> str:
    return os.path.join(data_path, "schedules")
