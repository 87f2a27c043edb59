"""The commit log: the one source of truth, segmented and append-only.

Every state change of the broker (a batch of sends, a batch of status
changes) is one record appended here; delay logs, indexes and the id index
are derived from it and rebuilt from it after a crash.

A segment file `commitlog/<base_offset:020d>.log` is sized up front (its
disk blocks reserved a few MiB ahead of the writes), written
through mmap, and laid out as (version 2):

    offset  size  field
    0       4     magic       b"HGCL"
    4       2     version     u16 = 2
    6       2     reserved    0
    8       8     base_offset u64: logical offset of the first record
    16      4     salt        u32: random, chosen when the segment is made
    20      4     crc32       u32 of bytes 0..19
    24      ...   frames (see storage.framing): u32 length | u32 crc32 | body,
                  the crc32 seeded with frame_seed(salt, record offset), so
                  it covers the record's position, not only its bytes
    ...           zero bytes up to the preallocated size

A record's *offset* is logical: base_offset + (position in file - 24). The
next segment's base_offset is exactly where the previous one ended, so
offsets are continuous across segments and a follower can ask for "every
record from offset X".

Version 1 segments (written before version 2 existed) are read as they
are: a 16-byte header (bytes 0..15 above, no salt, no header crc) and
frames whose crc32 covers the body alone. Opening a log whose newest
segment is version 1 starts a version 2 one, so every record appended from
then on covers its position; the old segments go as checkpoints pass them.

Opening scans the last segment from a known-good offset (the checkpoint's)
to find the end. A bad frame there is a torn tail, truncated (zeroed) and
forgotten, if no valid frame follows it; if valid frames follow, the middle
of the log is corrupt and opening refuses with the path, offset and reason.
Sealed segments are checked as they are read.

Concurrency: one writer (the store's event-loop thread); `sync()` may run in
a worker thread while the writer keeps appending to the same mmap.
"""

from __future__ import annotations

import bisect
import errno
import mmap
import os
import struct
import zlib
from collections.abc import Iterator

from .config import FsyncPolicy
from .disk import DISK, Disk
from .errors import ContractError, CorruptionError
from .fileutil import PAGE_BYTES, create_file, fsync_dir, make_dir, map_file, refuse_newer
from .framing import (
    FRAME_HEADER_BYTES,
    FrameProblem,
    decode_frame,
    encode_frame,
    encode_salted_frame,
    find_valid_frame,
    frame_seed,
)

SEGMENT_HEADER = struct.Struct("<4sHHQII")
SEGMENT_MAGIC = b"HGCL"
SEGMENT_VERSION = 2
HEADER_BYTES = SEGMENT_HEADER.size
V1_HEADER = struct.Struct("<4sHHQ")
V1_HEADER_BYTES = V1_HEADER.size
ALLOCATE_STEP_BYTES = 4 * 1024 * 1024


class Segment:
    """One preallocated, memory-mapped segment file."""

    def __init__(self, path: str, base_offset: int, fd: int, mm: mmap.mmap, disk: Disk,
                 version: int = SEGMENT_VERSION, salt: int = 0) -> None:
        self.path = path
        self.base_offset = base_offset
        self._fd = fd
        self.mm = mm
        self._disk = disk  # its block reservations and fdatasyncs (storage.disk)
        self.version = version
        self.salt = salt
        self.header_bytes = HEADER_BYTES if version == SEGMENT_VERSION else V1_HEADER_BYTES
        self.write_pos = self.header_bytes  # file position where the next frame goes
        self.synced_pos = self.header_bytes
        # Disk blocks are reserved ALLOCATE_STEP_BYTES ahead of the writes
        # (so a write through the mapping never meets a full disk as
        # SIGBUS), not for the whole segment at once.
        self.allocated = 0

    @classmethod
    def create(cls, path: str, base_offset: int, size_bytes: int, disk: Disk, replace: bool = False) -> Segment:
        """A new, empty segment at `path`; with `replace`, built aside and
        renamed over the (empty) segment of the same name. A failure (a full
        disk) leaves no file behind, so the next roll can try again."""
        made = path + ".new" if replace else path
        if replace and os.path.exists(made):
            os.unlink(made)
        fd = create_file(made, os.O_RDWR | os.O_EXCL)
        try:
            os.ftruncate(fd, size_bytes)
            disk.allocate(fd, 0, min(size_bytes, ALLOCATE_STEP_BYTES))
            mm = map_file(fd, size_bytes)  # (a segment opened again, to replay it, keeps read-ahead)
        except BaseException:
            os.close(fd)
            os.unlink(made)
            raise
        salt = int.from_bytes(os.urandom(4), "little")
        head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0, base_offset, salt, 0)[:20]
        mm[:HEADER_BYTES] = head + struct.pack("<I", zlib.crc32(head))
        mm.flush(0, PAGE_BYTES)
        if replace:
            os.replace(made, path)
        fsync_dir(os.path.dirname(path))
        return cls(path, base_offset, fd, mm, disk, SEGMENT_VERSION, salt)

    @classmethod
    def open(cls, path: str, expected_base: int, disk: Disk) -> Segment:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
            version, base, salt = _check_header(path, head, size)
            if base != expected_base:
                raise CorruptionError(path, 8, f"base offset {base} does not match the file name ({expected_base})")
            return cls(path, base, fd, mmap.mmap(fd, size), disk, version, salt)
        except BaseException:
            os.close(fd)
            raise

    @property
    def capacity(self) -> int:
        return len(self.mm)

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.write_pos - self.header_bytes

    def seed(self, offset: int) -> int:
        """The frame checksum seed of the record at `offset` (storage.framing)."""
        return frame_seed(self.salt, offset) if self.version >= 2 else 0

    def seed_at(self, position: int) -> int:
        """As `seed`, for the frame at file position `position`."""
        return self.seed(self.base_offset + position - self.header_bytes)

    def grow(self, size_bytes: int) -> None:
        """Enlarge a segment that holds no record yet, so that a record larger
        than it fits (a crash meanwhile leaves a longer all-zero tail). On a
        full disk it raises and the segment stays as it was."""
        self._disk.preallocate(self._fd, size_bytes)
        self.mm.close()
        self.allocated = size_bytes
        self.mm = map_file(self._fd, size_bytes)

    def reserve(self, end_pos: int) -> None:
        """Reserve disk blocks up to end_pos plus one step (a no-op for
        blocks reserved before, e.g. by an earlier process)."""
        start = max(self.allocated, self.write_pos - self.write_pos % PAGE_BYTES)
        stop = min(self.capacity, max(end_pos, start + ALLOCATE_STEP_BYTES))
        self._disk.allocate(self._fd, start, stop - start)
        self.allocated = stop

    def position(self, offset: int) -> int:
        return offset - self.base_offset + self.header_bytes

    def sync(self) -> None:
        """fdatasync of the file, which on Linux writes the pages the mapping
        dirtied as msync(MS_SYNC) would; unlike mmap.flush (msync), which
        holds the GIL for the whole disk wait, os.fdatasync releases it, so a
        sync in a worker thread lets the event loop run meanwhile."""
        end = self.write_pos
        if end > self.synced_pos:
            self._disk.fdatasync(self._fd)
        self.synced_pos = end

    def close(self) -> None:
        self.mm.close()
        os.close(self._fd)

    def __repr__(self) -> str:
        return f"Segment({os.path.basename(self.path)}, end_offset={self.end_offset})"


class CommitLog:
    """Segmented append-only log of framed records, addressed by offset.

    Worked example: with 64 MiB segments, appending records of 100 KB gives
    offsets 0, 100008, 200016, ...; when the next frame does not fit, a new
    segment named by the current end offset is created and the frame goes
    there. `read_from(100008)` yields every record from the second on.

    Cost: append is a memcpy into the mmap; `sync()` is one fdatasync of
    the active segment when anything was written since the last sync
    (group commit: callers append many records, then sync once).
    """

    def __init__(self, directory: str, fsync: FsyncPolicy, segment_bytes: int, disk: Disk) -> None:
        self.directory = directory
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.disk = disk  # the one its segments reserve blocks and fdatasync through (storage.disk)
        self._segments: list[Segment] = []
        self._bases: list[int] = []

    # -- opening -----------------------------------------------------------

    @classmethod
    def open(cls, directory: str, fsync: FsyncPolicy = FsyncPolicy.BATCH,
             segment_bytes: int = 64 * 1024 * 1024, scan_from: int = 0, disk: Disk = DISK) -> CommitLog:
        """Open (or create) the log in `directory`. `scan_from` is an offset
        known to be a record boundary (the checkpoint's); the tail scan of
        the last segment starts there instead of at its beginning. `disk`:
        what its segments reserve blocks and fdatasync through."""
        make_dir(directory)
        log = cls(directory, fsync, segment_bytes, disk)
        names = sorted(n for n in os.listdir(directory) if n.endswith(".log"))
        for name in names:
            if not (name[:-4].isascii() and name[:-4].isdigit()):
                raise CorruptionError(os.path.join(directory, name), 0, "segment name is not an offset")
        if names and _never_written(os.path.join(directory, names[-1])):
            # A crash while rolling left the newest segment created, its
            # header not yet written: it holds no record.
            os.unlink(os.path.join(directory, names.pop()))
            fsync_dir(directory)
        try:
            for name in names:
                base = int(name[:-4])
                log._segments.append(Segment.open(os.path.join(directory, name), base, disk))
                log._bases.append(base)
            for seg, nxt in zip(log._segments, log._segments[1:]):
                seg.write_pos = seg.synced_pos = seg.position(nxt.base_offset)
                if seg.write_pos > seg.capacity:
                    raise CorruptionError(seg.path, seg.capacity,
                                          f"next segment starts at offset {nxt.base_offset}, past this one's end")
            if log._segments:
                log._recover_tail(scan_from)
                if log._segments[-1].version < SEGMENT_VERSION:
                    log._roll(0)  # append only frames that cover their position
            else:
                log._roll(0)
        except BaseException:
            for seg in log._segments:
                seg.close()
            raise
        return log

    def _recover_tail(self, scan_from: int) -> None:
        seg = self._segments[-1]
        pos = seg.position(max(scan_from, seg.base_offset))
        if pos > seg.capacity:
            pos = seg.header_bytes
        # Past the last data region (holes, blocks reserved but never
        # written) every byte reads as zero: no need to fault it in.
        end = _data_end(seg._fd, pos, seg.capacity)
        mm, seed_at = seg.mm, seg.seed_at
        while True:
            frame = decode_frame(mm, pos, end, seed_at(pos))
            if frame.problem is FrameProblem.OK:
                pos = frame.next_offset
                continue
            if frame.problem is FrameProblem.END or frame.problem is FrameProblem.SHORT_HEADER:
                # A zero length could still hide garbage after it.
                if find_valid_frame(mm, pos, end, seed_at) is not None:
                    raise CorruptionError(seg.path, pos, "zero length frame followed by valid records")
                break
            follower = find_valid_frame(mm, pos + 1, end, seed_at)
            if follower is not None:
                raise CorruptionError(seg.path, pos, f"{frame.problem.value}, and a valid record follows at {follower}")
            break
        seg.write_pos = seg.synced_pos = pos
        dirty = _dirty_extent(mm, pos, end)
        if dirty > pos:  # torn tail: forget it, so a later scan finds zeros
            mm[pos:dirty] = bytes(dirty - pos)
            mm.flush(pos - pos % PAGE_BYTES, dirty - (pos - pos % PAGE_BYTES))

    # -- writing -------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """Offset the next record will get."""
        return self._segments[-1].end_offset

    @property
    def start_offset(self) -> int:
        return self._segments[0].base_offset

    def append(self, body: bytes) -> int:
        """Append one record; returns its offset. Durable after `sync()`
        (at once under FsyncPolicy.ALWAYS)."""
        frame_bytes = FRAME_HEADER_BYTES + len(body)
        seg = self._segments[-1]
        if seg.write_pos + frame_bytes > seg.capacity:
            seg = self._roll(frame_bytes)
        pos = seg.write_pos
        offset = seg.end_offset
        frame = encode_salted_frame(body, seg.salt, offset) if seg.version >= 2 else encode_frame(body)
        if pos + len(frame) > seg.allocated:
            seg.reserve(pos + len(frame))
        seg.mm[pos:pos + len(frame)] = frame
        seg.write_pos = pos + len(frame)
        if self.fsync is FsyncPolicy.ALWAYS:
            self.sync()
        return offset

    def allocation_for(self, body_bytes: int) -> int:
        """At most how many disk bytes appending a record of `body_bytes`
        would newly reserve (0 when its blocks are reserved already)."""
        seg = self._segments[-1]
        capacity = len(seg.mm)
        end = seg.write_pos + FRAME_HEADER_BYTES + body_bytes
        if end > capacity:  # a new segment
            return HEADER_BYTES + ALLOCATE_STEP_BYTES + FRAME_HEADER_BYTES + body_bytes
        if end <= seg.allocated:
            return 0
        start = max(seg.allocated, seg.write_pos - seg.write_pos % PAGE_BYTES)
        return min(capacity, max(end, start + ALLOCATE_STEP_BYTES)) - start

    def sync(self) -> None:
        """Make every appended record durable (no-op under NEVER)."""
        if self.fsync is FsyncPolicy.NEVER:
            return
        for seg in reversed(self._segments):
            if seg.synced_pos == seg.write_pos:
                break
            seg.sync()

    def _roll(self, min_frame_bytes: int) -> Segment:
        size = max(self.segment_bytes, HEADER_BYTES + min_frame_bytes)
        last = self._segments[-1] if self._segments else None
        if last is not None and last.write_pos == last.header_bytes:
            # An empty segment cannot roll (the next would take its name).
            if last.version == SEGMENT_VERSION:
                last.grow(size)
                return last
            fresh = Segment.create(last.path, last.base_offset, max(size, last.capacity), self.disk, replace=True)
            last.close()
            self._segments[-1] = fresh
            return fresh
        base = self._segments[-1].end_offset if self._segments else 0
        if self._segments:
            self._segments[-1].sync()
        path = os.path.join(self.directory, f"{base:020d}.log")
        seg = Segment.create(path, base, size, self.disk)
        self._segments.append(seg)
        self._bases.append(base)
        return seg

    # -- reading -------------------------------------------------------------

    def read_from(self, offset: int) -> Iterator[tuple[int, bytes]]:
        """Yield (offset, body) of every record from `offset` (a record
        boundary) to the current end. Refuses a bad frame with CorruptionError."""
        if offset < self.start_offset or offset > self.end_offset:
            raise ContractError(f"offset {offset} outside the log [{self.start_offset}, {self.end_offset}]")
        i = bisect.bisect_right(self._bases, offset) - 1
        while i < len(self._segments):
            seg = self._segments[i]
            pos = seg.position(offset)
            while pos < seg.write_pos:
                frame = decode_frame(seg.mm, pos, seg.write_pos, seg.seed_at(pos))
                if frame.problem is not FrameProblem.OK:
                    raise CorruptionError(seg.path, pos, frame.problem.value)
                yield seg.base_offset + pos - seg.header_bytes, bytes(frame.body)
                pos = frame.next_offset
            i += 1
            offset = seg.end_offset

    def seal_active(self, min_bytes: int) -> bool:
        """Start a new segment if the active one holds at least `min_bytes`,
        so a checkpoint can delete the old one whole."""
        seg = self._segments[-1]
        if seg.write_pos - seg.header_bytes < min_bytes:
            return False
        try:
            self._roll(0)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            return False  # a full disk: sealed at a later checkpoint, appends go on here
        return True

    def delete_before(self, offset: int) -> int:
        """Delete whole segments that end at or before `offset` (never the
        active one). Returns how many were deleted."""
        deleted = 0
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            seg = self._segments.pop(0)
            self._bases.pop(0)
            seg.close()
            os.unlink(seg.path)
            deleted += 1
        if deleted:
            fsync_dir(self.directory)
        return deleted

    def shed(self) -> None:
        """Drop the resident pages of what is already synced: the log is
        written once and read again only on replay or by followers."""
        for seg in self._segments:
            end = seg.synced_pos - seg.synced_pos % PAGE_BYTES
            if end > 0:
                seg.mm.madvise(mmap.MADV_DONTNEED, 0, end)

    def segment_ends(self) -> dict[str, int]:
        """File name -> file position where its records end (a snapshot
        copies each segment up to there)."""
        return {os.path.basename(s.path): s.write_pos for s in self._segments}

    def disk_bytes(self) -> int:
        return sum(s.capacity for s in self._segments)

    def close(self) -> None:
        self.sync()
        for seg in self._segments:
            seg.close()
        self._segments.clear()
        self._bases.clear()

    def __repr__(self) -> str:
        return (f"CommitLog({self.directory!r}, segments={len(self._segments)}, "
                f"offsets=[{self.start_offset}, {self.end_offset}), fsync={self.fsync.value})")


def _check_header(path: str, head: bytes, size: int) -> tuple[int, int, int]:
    """(version, base offset, salt) of a segment header; refuses a bad one."""
    if size < V1_HEADER_BYTES or len(head) < V1_HEADER_BYTES:
        raise CorruptionError(path, 0, f"segment is {size} bytes, shorter than its header")
    magic, version, _, base = V1_HEADER.unpack_from(head)
    if magic != SEGMENT_MAGIC:
        raise CorruptionError(path, 0, f"bad magic {magic!r}, expected {SEGMENT_MAGIC!r}")
    refuse_newer(path, version, SEGMENT_VERSION)
    if version == 1:
        # A version 2 header whose version field was damaged into a 1 would
        # be read with the wrong frame checksums, i.e. as all torn tail.
        if len(head) == HEADER_BYTES and _header_crc_matches(head[:4] + b"\2\0" + head[6:]):
            raise CorruptionError(path, 4, "version 1 in a header that checks as version 2")
        return 1, base, 0
    if version != SEGMENT_VERSION:
        raise CorruptionError(path, 4, f"unsupported version {version}, expected 1 or {SEGMENT_VERSION}")
    if size < HEADER_BYTES or len(head) < HEADER_BYTES:
        raise CorruptionError(path, 0, f"segment is {size} bytes, shorter than its header")
    if not _header_crc_matches(head):
        raise CorruptionError(path, 20, "segment header checksum mismatch")
    return version, base, SEGMENT_HEADER.unpack_from(head)[4]


def _header_crc_matches(head: bytes) -> bool:
    crc: int = struct.unpack_from("<I", head, 20)[0]
    return zlib.crc32(head[:20]) == crc


def _never_written(path: str) -> bool:
    """True if the file is empty or all zeros (no header, no record)."""
    with open(path, "rb") as f:
        if f.read(HEADER_BYTES).strip(b"\0"):
            return False
        while chunk := f.read(1 << 20):
            if chunk.strip(b"\0"):
                return False
    return True


def _data_end(fd: int, start: int, end: int) -> int:
    """End of the last data region of the file in [start, end), found with
    SEEK_DATA/SEEK_HOLE (ext4, xfs, btrfs and tmpfs report unwritten
    reserved blocks as holes unless the page cache holds data for them);
    `end` where the file system cannot tell."""
    last, pos = start, start
    try:
        while pos < end:
            data = os.lseek(fd, pos, os.SEEK_DATA)
            if data >= end:
                break
            pos = os.lseek(fd, data, os.SEEK_HOLE)
            last = min(pos, end)
    except OSError as e:
        if e.errno == errno.ENXIO:  # no data after pos
            return last
        return end
    return last


def _dirty_extent(mm: mmap.mmap, start: int, end: int) -> int:
    """End of the last non-zero byte in [start, end), or start if all zero."""
    chunk = 1 << 20
    stop = end
    while stop > start:
        lo = max(start, stop - chunk)
        piece = mm[lo:stop]
        stripped = piece.rstrip(b"\0")
        if stripped:
            return lo + len(stripped)
        stop = lo
    return start
