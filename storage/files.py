"""Two ways to reach a file's bytes, behind one small interface.

The two nearest hours are memory-mapped (`MappedFile`): reads and writes are
memcpy's. Later hours are reached with pread/pwrite (`PlainFile`), so a
backlog of thousands of hours costs file descriptors, not mappings or RSS.
The on-disk formats (delay log, index, second table) only call `read`,
`write` and `size_hint`, and do not care which one they got.

Every far hour open costs three descriptors, so the store sizes its cache
of open far hours from the process's descriptor limit (`far_hours_limit`).
Raising that limit is the process's business, done once at start-up by
the server (`raise_descriptor_limit`), not by opening a store.
"""

from __future__ import annotations

import mmap
import os
import resource
from collections.abc import Iterable

from .disk import DISK, Disk
from .fileutil import FILE_MODE, PAGE_BYTES, map_file


class PlainFile:
    def __init__(self, path: str, create: bool = False) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.path = path
        self.fd = os.open(path, flags, FILE_MODE)

    mapped = False

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def write(self, offset: int, data: bytes | bytearray) -> None:
        os.pwrite(self.fd, data, offset)

    def write_many(self, writes: Iterable[tuple[int, bytes]]) -> None:
        """`write` of each (offset, data)."""
        fd, pwrite = self.fd, os.pwrite
        for offset, data in writes:
            pwrite(fd, data, offset)

    def file_bytes(self) -> int:
        return os.fstat(self.fd).st_size

    def truncate(self, size_bytes: int) -> None:
        os.ftruncate(self.fd, size_bytes)

    def flush(self) -> None:
        """Nothing to do: a checkpoint syncs the whole file system once."""

    def shed(self) -> None:
        """Nothing resident to drop."""

    def close(self) -> None:
        os.close(self.fd)

    def __repr__(self) -> str:
        return f"PlainFile({os.path.basename(self.path)})"


class MappedFile:
    """A file mapped whole, grown by doubling (preallocated, so a write into
    the mapping never meets a full disk as SIGBUS: a full disk is an
    OSError(ENOSPC) from the write that needed more room, and the file stays
    as it was). Its blocks are reserved through `disk` (storage.disk)."""

    mapped = True

    def __init__(self, path: str, create: bool = False, min_bytes: int = 64 * 1024, disk: Disk = DISK) -> None:
        self.path = path
        self._disk = disk
        self.fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), FILE_MODE)
        try:
            size = os.fstat(self.fd).st_size
            capacity = max(min_bytes, _round_up(size, PAGE_BYTES))
            if capacity > size:
                disk.preallocate(self.fd, capacity)
            self.mm = map_file(self.fd, capacity)
        except BaseException:
            os.close(self.fd)
            raise

    def read(self, offset: int, length: int) -> bytes:
        return self.mm[offset:offset + length]

    def write(self, offset: int, data: bytes | bytearray) -> None:
        end = offset + len(data)
        if end > len(self.mm):
            self._grow(end)
        self.mm[offset:end] = data

    def write_many(self, writes: Iterable[tuple[int, bytes]]) -> None:
        """`write` of each (offset, data): small writes (slots, states) in one call."""
        for offset, data in writes:
            end = offset + len(data)
            if end > len(self.mm):
                self._grow(end)
            self.mm[offset:end] = data

    def reserve(self, size_bytes: int) -> int:
        """Grow now so that writes up to `size_bytes` need no new disk blocks
        (OSError ENOSPC here, instead of in the write); returns the bytes
        the file grew by (0: it held them already)."""
        before = len(self.mm)
        if size_bytes <= before:
            return 0
        self._grow(size_bytes)
        return len(self.mm) - before

    def _grow(self, needed_bytes: int) -> None:
        capacity = len(self.mm)
        while capacity < needed_bytes:
            capacity *= 2
        self._disk.preallocate(self.fd, capacity)  # first: on a full disk the old mapping stays usable
        self.mm.close()
        self.mm = map_file(self.fd, capacity)

    def file_bytes(self) -> int:
        return len(self.mm)

    def flush(self) -> None:
        self.mm.flush()

    def shed(self) -> None:
        """Drop this mapping's resident pages (the data stays in the page
        cache and the file); the next touch faults them back in."""
        self.mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.mm.flush()
        self.mm.close()
        os.close(self.fd)

    def __repr__(self) -> str:
        return f"MappedFile({os.path.basename(self.path)}, capacity={len(self.mm)})"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple



# Descriptors far hours never take: the commit log, the id index, near
# hours, a checkpoint's temporary files, and the server's own.
OTHER_DESCRIPTORS = 256
# The soft limit asked for when the hard limit is unlimited.
UNLIMITED_TARGET = 65536


def raise_descriptor_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE as far as the hard limit
    allows (to UNLIMITED_TARGET when the hard one is unlimited) and return
    the soft limit in force. A server calls it once at start-up, before it
    opens its store; a refusal leaves the limit as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def far_hours_limit(wanted: int) -> int:
    """How many far hours may be open at once: `wanted`, lowered so their
    three descriptors each fit under the soft limit beside
    OTHER_DESCRIPTORS, and never below 4."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = UNLIMITED_TARGET
    return max(4, min(wanted, (soft - OTHER_DESCRIPTORS) // 3))
