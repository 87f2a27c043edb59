"""Refusing a send the disk has no room for, with few statvfs calls.

A send commits the store to writes it makes later (applying the record to
far hours, the commit log's next segment). If any of them met a full disk
the node would stop, so a send that would not fit is refused up front with
OSError(ENOSPC), before anything is appended. The store computes `need`,
the bytes still to be written that the store is committed to, and asks
`DiskRoom.check`, which adds DISK_HEADROOM_BYTES.

Reading the free space is a statvfs: cheap, but not per message. So the
figure read is reused for up to DISK_RECHECK_SENDS sends, as long as what
they may have written since stays DISK_RECHECK_MARGIN_BYTES short of it.
Worked example: 10 GiB free, sends of 1 MiB: one send reads statvfs,
the next 64 go on that figure, the one after reads it again. Near a full disk (free within the
margin) every send reads it.
"""

from __future__ import annotations

import errno

from .disk import Disk

# Disk room a send leaves free beyond what the writes it commits the store to
# will take: for the checkpoint file, a shard doubling, block rounding.
DISK_HEADROOM_BYTES = 1024 * 1024
# The free space a send checks is read (statvfs) again after this many sends,
# or sooner when what they may have written since comes within
# DISK_RECHECK_MARGIN_BYTES of what was free: a send pays for a statvfs only
# near a full disk (where it checks every time) or once per so many sends.
DISK_RECHECK_SENDS = 64
DISK_RECHECK_MARGIN_BYTES = 256 * 1024 * 1024


class DiskRoom:
    """The free space of the file system holding `directory`, as last read
    from `disk`, and what the sends since may have taken of it."""

    def __init__(self, directory: str, disk: Disk) -> None:
        self.directory = directory
        self._disk = disk
        # (free bytes at the last statvfs, bytes sent since, sends since)
        self._seen = (0, 0, DISK_RECHECK_SENDS)

    def check(self, need_bytes: int, written_bytes: int) -> None:
        """Raise OSError(ENOSPC) unless `need_bytes` plus DISK_HEADROOM_BYTES
        fit on the disk; `written_bytes` is what this send writes now (its
        record, far-hour bytes, and what near hours' files grew by). The
        error's text reaches clients (a 503), so it does not name the
        directory's path."""
        need = need_bytes + DISK_HEADROOM_BYTES
        seen_free, spent, sends = self._seen
        spent += written_bytes
        if sends < DISK_RECHECK_SENDS and need + spent + DISK_RECHECK_MARGIN_BYTES <= seen_free:
            self._seen = (seen_free, spent, sends + 1)  # room enough, seen a moment ago: no statvfs
            return
        free = self._disk.free_bytes(self.directory)
        self._seen = (free, 0, 0)
        if free < need:
            raise OSError(errno.ENOSPC, f"the disk holding the data directory has {free} bytes free; "
                                        f"this batch needs {need} (writes it commits to, and headroom)")

    def __repr__(self) -> str:
        free, spent, sends = self._seen
        return f"DiskRoom({self.directory!r}, free_seen={free}, spent_since={spent}, sends_since={sends})"
