"""The disk where it can fail: block reservations, the free space, and the
calls that make data durable.

A full disk or a write-back error must be an answer (a refused send, a
failed checkpoint), never a crash or a silent loss (docs/internals.md).
Every call of the store where the disk can fail that way goes through the
one `Disk` the store is opened with (`Store.open(..., disk=...)`), handed
down to the parts that make it:

    allocate, preallocate   the commit log's segments (storage.commit_log),
                            the mapped files of near hours (storage.files)
                            and the id and key indexes' shards
                            (storage.id_index)
    free_bytes              the disk-room check of a send (storage.disk_room)
    fdatasync               the commit log's group commit
    sync_filesystem         a checkpoint (storage.retention); `syncfs`,
                            `fsync_tree` and `fsync` are its steps

The real one is `DISK`. A test hands the store a subclass instead -- a
disk that is full, counts its fsyncs or fails them -- and the store's own
handling of the failure is what it checks. Writing a file atomically and
fsync'ing a directory stay in storage.fileutil: no test needs them to fail.

This module stays interpreted in the compiled build (setup.py): the tests'
disks subclass `Disk`, and an interpreted class cannot subclass a compiled
one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os


class Disk:
    """The calls above, on the real disk. It holds no state: one instance
    serves every store of a process."""

    def allocate(self, fd: int, offset: int, length: int) -> None:
        """Reserve disk blocks for [offset, offset + length) of a sized
        file; a file system that cannot reserve them (EOPNOTSUPP, EINVAL)
        leaves them to the writes. A full disk raises OSError(ENOSPC)."""
        if length <= 0:
            return
        try:
            os.posix_fallocate(fd, offset, length)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise

    def preallocate(self, fd: int, size_bytes: int) -> None:
        """Size a file to `size_bytes` with its disk blocks reserved, so a
        write through a mapping of it never meets a full disk (that would be
        SIGBUS, the process's death). A full disk raises OSError(ENOSPC)
        here instead; never falls back to a sparse file."""
        os.posix_fallocate(fd, 0, size_bytes)

    def free_bytes(self, path: str) -> int:
        """Bytes an unprivileged writer may still take on the file system of `path`."""
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def fdatasync(self, fd: int) -> None:
        """Make a file's data durable (a write-back error raises OSError)."""
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        """Make a file or directory durable, its metadata too."""
        os.fsync(fd)

    def sync_filesystem(self, path: str) -> None:
        """Make every file under the directory `path` durable: one syncfs(2)
        of its file system.

        A checkpoint may have touched hundreds of hour files; one syncfs is
        far cheaper than an fsync each. syncfs reports a write-back error
        (EIO) of any file of the file system since the last call: that is
        raised, and the checkpoint fails, because what it would record as
        durable may not be (the error's text names no path, as a caller may
        show it to clients; its filename is `path`). Only where the kernel
        has no syncfs (ENOSYS) does it fall back to `fsync_tree`."""
        error = self.syncfs(path)
        if error == errno.ENOSYS:
            self.fsync_tree(path)
        elif error:
            raise OSError(error, f"syncfs of the data directory's file system: {os.strerror(error)}", path)

    def syncfs(self, path: str) -> int:
        """syncfs(2) of the file system holding `path`: 0 or the errno."""
        syncfs = getattr(_c_library(), "syncfs", None)
        if syncfs is None:
            return errno.ENOSYS
        fd = os.open(path, os.O_RDONLY)
        try:
            return 0 if syncfs(fd) == 0 else ctypes.get_errno()
        finally:
            os.close(fd)

    def fsync_tree(self, path: str) -> None:
        """`fsync` every file and directory under `path` (errors raise)."""
        for root, _, names in os.walk(path):
            for name in names:
                try:
                    fd = os.open(os.path.join(root, name), os.O_RDONLY)
                except FileNotFoundError:  # deleted meanwhile: nothing to make durable
                    continue
                try:
                    self.fsync(fd)
                finally:
                    os.close(fd)
            fd = os.open(root, os.O_RDONLY)
            try:
                self.fsync(fd)
            finally:
                os.close(fd)


# The real disk, the default of every part that takes one.
DISK = Disk()

_libc: ctypes.CDLL | None = None


def _c_library() -> ctypes.CDLL:
    """The C library, loaded at the first syncfs."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return _libc
