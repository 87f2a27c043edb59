"""Small file-system helpers shared by the on-disk formats."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import struct
from typing import Any

from .errors import CorruptionError

PAGE_BYTES = 4096
# Modes of every file and directory a store makes: its owner's alone. A data
# directory holds message bodies and the id index's hash key (see
# storage.data_dir); a umask only ever takes bits away, so whatever it is,
# group and others get none.
FILE_MODE = 0o600
DIR_MODE = 0o700


def preallocate(fd: int, size_bytes: int) -> None:
    """Size a file to `size_bytes` with its disk blocks reserved, so a write
    through a mapping of it never meets a full disk (that would be SIGBUS,
    the process's death). A full disk raises OSError(ENOSPC) here instead;
    never falls back to a sparse file."""
    os.posix_fallocate(fd, 0, size_bytes)


def allocate(fd: int, offset: int, length: int) -> None:
    """Reserve disk blocks for [offset, offset + length) of a sized file."""
    if length <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still take on the file system of `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dir(path: str) -> None:
    """Create the directory `path` (DIR_MODE) unless it exists; one that
    exists is left as it is. Missing parents are made as `mkdir -p` makes
    them: they are not the store's."""
    os.makedirs(path, DIR_MODE, exist_ok=True)


def create_file(path: str, flags: int = os.O_RDWR) -> int:
    """Open `path` with `flags`, creating it (FILE_MODE) if it is missing;
    returns the descriptor."""
    return os.open(path, flags | os.O_CREAT, FILE_MODE)


def atomic_write(path: str, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old or the new
    file, never a mix: written whole to `path + ".tmp"` (FILE_MODE),
    fsync'ed, renamed over `path`, and the directory fsync'ed so the rename
    itself survives a crash."""
    tmp = path + ".tmp"
    with open(create_file(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as f:
        os.fchmod(f.fileno(), FILE_MODE)  # a .tmp a crash left behind keeps its own mode through O_TRUNC
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


_libc: ctypes.CDLL | None = None


def sync_filesystem(path: str) -> None:
    """Make every file under the directory `path` durable: one syncfs(2) of
    its file system.

    A checkpoint may have touched hundreds of hour files; one syncfs is far
    cheaper than an fsync each. syncfs reports a write-back error (EIO) of
    any file of the file system since the last call: that is raised, and the
    checkpoint fails, because what it would record as durable may not be
    (the error's text names no path, as a caller may show it to clients;
    its filename is `path`). Only where the kernel has no syncfs (ENOSYS)
    does it fall back to an fsync of every file and directory under `path`."""
    error = _syncfs(path)
    if error == errno.ENOSYS:
        fsync_tree(path)
    elif error:
        raise OSError(error, f"syncfs of the data directory's file system: {os.strerror(error)}", path)


def _syncfs(path: str) -> int:
    """syncfs(2) of the file system holding `path`: 0 or the errno."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    syncfs = getattr(_libc, "syncfs", None)
    if syncfs is None:
        return errno.ENOSYS
    fd = os.open(path, os.O_RDONLY)
    try:
        return 0 if syncfs(fd) == 0 else ctypes.get_errno()
    finally:
        os.close(fd)


def fsync_tree(path: str) -> None:
    """fsync every file and directory under `path` (errors raise)."""
    for root, _, names in os.walk(path):
        for name in names:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except FileNotFoundError:  # deleted meanwhile: nothing to make durable
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(root)


def check_header(path: str, buf: bytes | bytearray | memoryview | mmap.mmap, header: struct.Struct, magic: bytes,
                 version: int) -> tuple[Any, ...]:
    """Unpack a file header and refuse a wrong magic number or version."""
    if len(buf) < header.size:
        raise CorruptionError(path, 0, f"file is {len(buf)} bytes, shorter than its {header.size}-byte header")
    fields = header.unpack_from(buf, 0)
    if fields[0] != magic:
        raise CorruptionError(path, 0, f"bad magic {fields[0]!r}, expected {magic!r}")
    if fields[1] != version:
        raise CorruptionError(path, 4, f"unsupported version {fields[1]}, expected {version}")
    return fields
