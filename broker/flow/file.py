"""The topic settings files: a node's topic settings and pauses on disk
(docs/internals.md, "Files"): a base file replaced whole now and then,
and a log of the changes since, so a change costs that change (one record
appended and fsync'ed), not a rewrite of every pause of the node.

`<data-dir>/topic-settings`, the base, written whole (written, fsync'ed,
renamed, the directory fsync'ed: storage.fileutil.atomic_write):

    offset  size  field
    0       4     magic b"HGTS"
    4       2     version (1), little-endian
    6       2     zero
    8       4     length n of the body, in bytes (u32 LE)
    12      4     CRC-32 of the body (u32 LE)
    16      n     body: a JSON object {entry name: entry value as a
                  JSON string}, the
                  entries of broker.flow.settings (one per topic with
                  settings, one per paused serial key)

`<data-dir>/topic-settings.log`, the changes since the base, in order:

    offset  size  field
    0       4     magic b"HGTL"
    4       2     version (1), little-endian
    6       2     zero
    8       ...   records, each:
                    0  4  length n of the body (u32 LE)
                    4  4  CRC-32 of the body (u32 LE)
                    8  n  body: a JSON object {entry name: the entry's new
                          value as a JSON string, or null: removed}

A change is one record, appended and fdatasync'ed off the event loop
before the call is answered (broker.flow.keeper). Once the log outgrows
COMPACT_MIN_BYTES and the base, the base is written anew from the
settings as they are (in a thread: the loop is not held by the node's
pauses) and the log emptied after it. A crash between the two leaves the
new base and the old log: replayed over it, the log's last value of each
entry is the base's, so the outcome is the same.

Opening validates and fails loudly: a short header, a wrong magic or
version, a length other than the file's, a CRC that fails or a body that
is not the entries raises CorruptionError naming the path, the offset and
the reason. The one damage a crash makes -- the log's last record cut
short (a record running past the end of the file, or the last record's
CRC failing) -- is a change never answered: dropped, and the log cut
back to the records before it.

On a node of shards every shard carries out every change (the router
sends it to all), and shard 0's files keep them for the node: a change
is appended and fdatasync'ed once, not once a shard. Shard i > 0 reads
shard 0's files when it starts (`ShardSettings`: read only, a torn last
record left to its writer) and keeps what changes since in RAM. A reader
holds a shared flock on the log while it reads the base and the log; the
compaction holds it exclusive, so a reader never reads the old base and
then the emptied log.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import struct
import zlib
from collections.abc import Callable
from typing import BinaryIO

import orjson

from storage.errors import CorruptionError
from storage.fileutil import FILE_MODE, atomic_write, check_header, fsync_dir

from .settings import Changes, Entries, TopicSettings, entries, rows

log = logging.getLogger("hourglass.flow")

MAGIC = b"HGTS"
VERSION = 1
HEADER = struct.Struct("<4sHHII")
FILE_NAME = "topic-settings"
RESUMES_NAME = "topic-resumes"
LOG_MAGIC = b"HGTL"
LOG_HEADER = struct.Struct("<4sHH")
RECORD = struct.Struct("<II")
LOG_SUFFIX = ".log"
# The log is folded into a new base once it is larger than this and than the base.
COMPACT_MIN_BYTES = 1 << 20


def settings_path(data_path: str) -> str:
    return os.path.join(data_path, FILE_NAME)


def resumes_path(data_path: str) -> str:
    """Where shard i > 0 keeps its resumes in progress (`ShardSettings`), in this format."""
    return os.path.join(data_path, RESUMES_NAME)


def encode(kept: Entries) -> bytes:
    """The file's bytes for these entries."""
    body = orjson.dumps({k: kept[k].decode() for k in sorted(kept)})
    return HEADER.pack(MAGIC, VERSION, 0, len(body), zlib.crc32(body)) + body


def decode(path: str, data: bytes) -> Entries:
    """The entries of the file's bytes; CorruptionError if they are not a file `encode` wrote."""
    _, _, zero, length, crc = check_header(path, data, HEADER, MAGIC, VERSION)
    if zero != 0:
        raise CorruptionError(path, 6, f"reserved field is {zero}, expected 0")
    if length != len(data) - HEADER.size:
        raise CorruptionError(path, 8, f"body length {length} but the file holds {len(data) - HEADER.size} "
                                       f"bytes after its header")
    body = data[HEADER.size:]
    if zlib.crc32(body) != crc:
        raise CorruptionError(path, 12, f"body CRC {zlib.crc32(body):#010x}, expected {crc:#010x}")
    try:
        kept = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise CorruptionError(path, HEADER.size, f"body is not JSON: {e}") from None
    if not isinstance(kept, dict) or not all(isinstance(v, str) for v in kept.values()):
        raise CorruptionError(path, HEADER.size, "body is not an object of entries")
    out = {str(k): v.encode() for k, v in kept.items()}
    try:
        rows(out)
    except ValueError as e:
        raise CorruptionError(path, HEADER.size, str(e)) from None
    return out


def encode_record(changes: Changes) -> bytes:
    """One log record of these changes."""
    body = orjson.dumps({k: None if v is None else v.decode() for k, v in changes.items()})
    return RECORD.pack(len(body), zlib.crc32(body)) + body


def replay(path: str, data: bytes, kept: Entries) -> int:
    """Apply the log's records (its bytes `data`) to `kept`; the length of
    its whole records (a torn last one left out); CorruptionError for any
    other damage."""
    _, _, zero = check_header(path, data, LOG_HEADER, LOG_MAGIC, VERSION)
    if zero != 0:
        raise CorruptionError(path, 6, f"reserved field is {zero}, expected 0")
    at = LOG_HEADER.size
    while at < len(data):
        if len(data) - at < RECORD.size:
            return at  # torn: a record's header cut short
        length, crc = RECORD.unpack_from(data, at)
        end = at + RECORD.size + length
        if end > len(data):
            return at  # torn: a record cut short
        if length == 0:  # never written (a record holds at least "{}"): zeros a crash left, or damage
            if not any(data[at:]):
                return at
            raise CorruptionError(path, at, "a record of length 0")
        body = data[at + RECORD.size:end]
        if zlib.crc32(body) != crc:
            if end == len(data):
                return at  # torn: the last record's bytes not all written
            raise CorruptionError(path, at + 4, f"record CRC {zlib.crc32(body):#010x}, expected {crc:#010x}")
        try:
            changes = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise CorruptionError(path, at + RECORD.size, f"record is not JSON: {e}") from None
        if not isinstance(changes, dict) or not all(v is None or isinstance(v, str) for v in changes.values()):
            raise CorruptionError(path, at + RECORD.size, "record is not an object of entries")
        for name, value in changes.items():
            if value is None:
                kept.pop(name, None)
            else:
                kept[name] = value.encode()
        at = end
    return at


def read(path: str) -> tuple[Entries, int, bytes | None]:
    """The base's entries, its length, and the log's bytes (None: no log),
    read together: under a shared flock of the log, which a compaction
    holds exclusive (the module docstring)."""
    with contextlib.ExitStack() as stack:
        log_file: BinaryIO | None
        try:
            log_file = stack.enter_context(open(path + LOG_SUFFIX, "rb"))
        except FileNotFoundError:
            log_file = None
        if log_file is not None:
            fcntl.flock(log_file.fileno(), fcntl.LOCK_SH)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            kept: Entries = {}
            base_bytes = 0
        else:
            kept, base_bytes = decode(path, data), len(data)
        return kept, base_bytes, None if log_file is None else log_file.read()


class SettingsFile:
    """broker.flow.keeper's SettingsStore on a node's disk: the base file
    and the log of changes since (the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.log_path = path + LOG_SUFFIX
        self._log_fd: int | None = None
        self._log_bytes = 0  # the log's length, its header included
        self._base_bytes = 0
        self.appended = 0  # bytes appended to the log (tests, benchmarks)
        self.compactions = 0

    def __repr__(self) -> str:
        return f"SettingsFile({self.path!r}, log={self._log_bytes} bytes)"

    def load(self) -> dict[str, TopicSettings]:
        """The settings kept: the base, then the log replayed over it (a
        torn last record cut off the log)."""
        kept = self.load_entries()
        try:
            return rows(kept)
        except ValueError as e:
            raise CorruptionError(self.log_path if self._log_bytes else self.path, 0, str(e)) from None

    def load_entries(self) -> Entries:
        """The entries kept, as `load` reads them."""
        kept, self._base_bytes, log = read(self.path)
        self._log_bytes = 0
        if log is not None:
            if len(log) < LOG_HEADER.size:  # torn at its creation: nothing was appended
                os.unlink(self.log_path)
            else:
                whole = replay(self.log_path, log, kept)
                if whole < len(log):
                    os.truncate(self.log_path, whole)
                self._log_bytes = whole
        return kept

    async def save(self, settings: dict[str, TopicSettings], changes: Changes) -> None:
        """Durable once it returns: `changes` appended to the log and
        fdatasync'ed; past COMPACT_MIN_BYTES and the base, `settings` (all
        of them, as they are now) written as the new base and the log
        emptied (both in a thread)."""
        values = list(settings.values())
        await self.save_entries(lambda: entries(values), changes)

    async def save_entries(self, kept: Callable[[], Entries], changes: Changes) -> None:
        """As `save`, the new base (when one is written) the entries `kept()` makes."""
        record = encode_record(changes)
        await asyncio.to_thread(self._append, record)
        if self._log_bytes > max(COMPACT_MIN_BYTES, self._base_bytes):
            try:
                await asyncio.to_thread(self._compact, kept)
            except OSError as e:  # (the change is durable in the log: the next save tries again)
                log.warning("the topic settings log could not be folded into %s: %s", self.path, e)

    def _append(self, record: bytes) -> None:
        if self._log_fd is None:
            created = not os.path.exists(self.log_path)
            self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
            if created or self._log_bytes == 0:
                os.ftruncate(self._log_fd, 0)
                os.write(self._log_fd, LOG_HEADER.pack(LOG_MAGIC, VERSION, 0))
                self._log_bytes = LOG_HEADER.size
                os.fdatasync(self._log_fd)
                fsync_dir(os.path.dirname(self.log_path) or ".")
        try:
            written = 0
            while written < len(record):
                written += os.write(self._log_fd, record[written:])
            os.fdatasync(self._log_fd)
        except OSError:
            # nothing of a change not answered may stay before the next one's record: cut back to the
            # records before it (best effort; the fd opened again at the next append)
            fd, self._log_fd = self._log_fd, None
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._log_bytes)
            os.close(fd)
            raise
        self._log_bytes += len(record)
        self.appended += len(record)

    def _compact(self, kept: Callable[[], Entries]) -> None:
        base = encode(kept())
        assert self._log_fd is not None
        fcntl.flock(self._log_fd, fcntl.LOCK_EX)  # (the shards reading it: `read`)
        try:
            atomic_write(self.path, base)
            self._base_bytes = len(base)
            os.ftruncate(self._log_fd, LOG_HEADER.size)
            os.fdatasync(self._log_fd)
        finally:
            fcntl.flock(self._log_fd, fcntl.LOCK_UN)
        self._log_bytes = LOG_HEADER.size
        self.compactions += 1

    def close(self) -> None:
        if self._log_fd is not None:
            os.close(self._log_fd)
            self._log_fd = None


def _resuming(name: str, value: bytes | None) -> bool:
    """Whether an entry holds a resume in progress: a pause whose resume
    time is kept (a `shift` or an `expire` moving or ending its messages)."""
    if value is None:
        return False
    row = orjson.loads(value)
    pause = row.get("pause") if name.startswith('["c"') else row
    return isinstance(pause, dict) and pause.get("resumeAt") is not None


class ShardSettings:
    """broker.flow.keeper's SettingsStore on shard i > 0 of a node of
    shards: shard 0's files keep the node's settings (the module
    docstring), read at start; a change, carried out by every shard and
    saved by shard 0, is kept here in RAM -- but for a resume in progress
    (`shift`, `expire`), which each shard carries out on its own messages
    and may be cut short on this one while shard 0 finished: its entry is
    kept in this shard's own files (`own_path`) until its resume ends, and
    read over shard 0's at start, so the next resumeTopic ends it here."""

    def __init__(self, keeper_path: str, own_path: str) -> None:
        self.path = keeper_path  # shard 0's settings file
        self._own = SettingsFile(own_path)
        self._resuming: Entries = {}  # this shard's resumes in progress, by entry

    def __repr__(self) -> str:
        return f"ShardSettings({self.path!r}, resuming={len(self._resuming)})"

    def load(self) -> dict[str, TopicSettings]:
        """The settings shard 0 keeps: its base, its log's whole records
        replayed over it (a torn last one is its writer's to cut); this
        shard's resumes in progress over them."""
        kept, _, log = read(self.path)
        if log is not None and len(log) >= LOG_HEADER.size:
            replay(self.path + LOG_SUFFIX, log, kept)
        self._resuming = {n: v for n, v in self._own.load_entries().items() if _resuming(n, v)}
        kept.update(self._resuming)
        try:
            return rows(kept)
        except ValueError as e:
            raise CorruptionError(self.path, 0, str(e)) from None

    async def save(self, settings: dict[str, TopicSettings], changes: Changes) -> None:
        """Shard 0 saves the change before the node answers; a resume in
        progress here, started or ended, is saved here too."""
        own: Changes = {}
        for name, value in changes.items():
            if _resuming(name, value):
                own[name] = value
            elif name in self._resuming:
                own[name] = None
        if not own:
            return
        resuming = dict(self._resuming)
        for name, value in own.items():
            if value is None:
                resuming.pop(name, None)
            else:
                resuming[name] = value
        await self._own.save_entries(lambda: resuming, own)
        self._resuming = resuming

    def close(self) -> None:
        self._own.close()
