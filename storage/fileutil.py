"""Small file-system helpers shared by the on-disk formats."""

from __future__ import annotations

import ctypes
import errno
import ctypes.util
import os
import struct

from .errors import CorruptionError

PAGE_BYTES = 4096


def preallocate(fd: int, size_bytes: int) -> None:
    """Reserve disk blocks so writes through mmap never hit ENOSPC (SIGBUS)."""
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError:
        os.ftruncate(fd, size_bytes)


def allocate(fd: int, offset: int, length: int) -> None:
    """Reserve disk blocks for [offset, offset + length) of a sized file."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new
    file, never a mix."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


_libc = None


def sync_filesystem(path: str) -> None:
    """Flush every dirty page of the file system holding `path` (syncfs(2)).

    A checkpoint may have touched hundreds of hour files; one syncfs is far
    cheaper than an fsync each. Falls back to sync(2)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def check_header(path: str, buf, header: struct.Struct, magic: bytes, version: int) -> tuple:
    """Unpack a file header and refuse a wrong magic number or version."""
    if len(buf) < header.size:
        raise CorruptionError(path, 0, f"file is {len(buf)} bytes, shorter than its {header.size}-byte header")
    fields = header.unpack_from(buf, 0)
    if fields[0] != magic:
        raise CorruptionError(path, 0, f"bad magic {fields[0]!r}, expected {magic!r}")
    if fields[1] != version:
        raise CorruptionError(path, 4, f"unsupported version {fields[1]}, expected {version}")
    return fields
