"""Small file-system helpers shared by the on-disk formats (the calls
where the disk can fail for want of room or by a write-back error are
storage.disk's)."""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

from .errors import CorruptionError, NewerFormatError

PAGE_BYTES = 4096
# Modes of every file and directory a store makes: its owner's alone. A data
# directory holds message bodies and the id index's hash key (see
# storage.data_dir); a umask only ever takes bits away, so whatever it is,
# group and others get none.
FILE_MODE = 0o600
DIR_MODE = 0o700
# A write of `n` bytes through the file makes page-cache folios up to `n`
# large (Linux 6.x, ext4 and xfs), and a later fault on any page of a large
# folio maps the whole folio into the process (up to 2 MB: the RSS of one
# probe). Writes that mapped files later read go through in pieces of at
# most this size (`write_in_pieces`).
WRITE_PIECE_BYTES = 16 * 1024


def map_file(fd: int, size_bytes: int) -> mmap.mmap:
    """`fd` mapped shared and writable, its first `size_bytes`, read without
    read-around (MADV_RANDOM): a fault reads and maps the page it needs (and
    the kernel's fault-around of pages cached already, 64 kB), not a
    read-ahead window of large folios -- a write fault into a preallocated
    tail would otherwise make folios of hundreds of kB whose every later
    touch maps them whole into the node's RSS (docs/internals.md, "Writing")."""
    mm = mmap.mmap(fd, size_bytes)
    mm.madvise(mmap.MADV_RANDOM)
    return mm


def write_in_pieces(fd: int, data: memoryview, offset: int) -> None:
    """`data` written at `offset` through the file, WRITE_PIECE_BYTES a call."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:done + WRITE_PIECE_BYTES], offset + done)


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


def check_header(path: str, buf: bytes | bytearray | memoryview | mmap.mmap, header: struct.Struct, magic: bytes,
                 version: int) -> tuple[Any, ...]:
    """Unpack a file header and refuse a wrong magic number or version (a
    newer one with NewerFormatError: see refuse_newer)."""
    if len(buf) < header.size:
        raise CorruptionError(path, 0, f"file is {len(buf)} bytes, shorter than its {header.size}-byte header")
    fields = header.unpack_from(buf, 0)
    if fields[0] != magic:
        raise CorruptionError(path, 0, f"bad magic {fields[0]!r}, expected {magic!r}")
    refuse_newer(path, fields[1], version)
    if fields[1] != version:
        raise CorruptionError(path, 4, f"unsupported version {fields[1]}, expected {version}")
    return fields


def refuse_newer(path: str, found: int, reads: int) -> None:
    """Raise NewerFormatError if a file's format version `found` is above
    the newest this build reads: checked before the file's checksums (a
    newer format may check differently) and before any repair, so a
    directory a newer version wrote is refused as it is, never taken for
    damage and rebuilt."""
    if found > reads:
        raise NewerFormatError(path, found, reads)


def refuse_newer_file(path: str, magic: bytes, reads: int) -> None:
    """refuse_newer for a file on disk whose first 6 bytes are its magic
    number and a u16 version (those of another magic are left to the
    file's own checks)."""
    with open(path, "rb") as f:
        head = f.read(6)
    if len(head) == 6 and head[:4] == magic:
        refuse_newer(path, int.from_bytes(head[4:6], "little"), reads)
