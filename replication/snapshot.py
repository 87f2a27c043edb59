"""Snapshots: a node's derived files and log, for a follower that cannot
continue from its own log (it is behind the leader's retained log, or its
tail diverged: it led, or followed a leader, whose last records never
reached a quorum).

A snapshot is a tar stream of the data directory's store files:

    checkpoint             the last checkpoint (offset O, hours, counts)
    delay/*, ids/*         delay logs, indexes, second tables, id index
    keys/*                 the key index (storage.key_index)
    ends/*                 the end index (storage.end_index): not derived
                           from the other files, so always sent
    commitlog/*.log        every segment, each cut at the log end E taken
                           when the copy began

Derived files do not change during the copy (the sender holds its apply
lock, so no record is applied meanwhile; the copy is the kernel's,
`write_tar`, so the lock is held briefly), but they may hold the effect of
records after O: the receiver opens the store like after a crash, which
replays O..E over them and so reaches exactly the sender's state at E. It
then fetches from E as any follower. Records appended after E are not in
the snapshot and arrive by fetch.

Installing is atomic across a crash. `unpack` extracts the tar into
`snapshot.new/` beside the live store (which stays open meanwhile), makes
every store entry the sender had none of (an empty one, so nothing of the
old store survives), and fsyncs it all. `swap_in` (the store closed) adds
the files that must change with the store (the epochs file), renames the
directory to `snapshot.swap/`, then moves each live entry into
`snapshot.old/` and the new one into its place. `recover`, run before the
store opens, deletes a `snapshot.new/` (never complete) and finishes a
`snapshot.swap/` (always complete); `remove_replaced` deletes the old files.
"""

from __future__ import annotations

import os
import shutil
import tarfile

from storage.backup import copy_range
from storage.checkpoint import Checkpoint
from storage.disk import DISK
from storage.errors import ContractError
from storage.fileutil import FILE_MODE, create_file, fsync_dir, make_dir

STORE_ENTRIES = ("checkpoint", "delay", "ids", "keys", "ends", "commitlog")
UNPACKED = "snapshot.new"  # being extracted: deleted if found at start
SWAPPING = "snapshot.swap"  # complete and durable: its entries are being moved in
REPLACED = "snapshot.old"  # the files it replaced: deleted once it is in


def capture(data_dir: str, segment_ends: dict[str, int]) -> list[tuple[str, int | None]]:
    """The files to send, as (relative path, bytes to send or None: all).
    `segment_ends` gives, per commit-log segment file name, the position up
    to which it holds records."""
    files: list[tuple[str, int | None]] = []
    if os.path.exists(os.path.join(data_dir, "checkpoint")):
        files.append(("checkpoint", None))
    for folder in ("delay", "ids", "keys", "ends"):
        path = os.path.join(data_dir, folder)
        if os.path.isdir(path):
            files.extend((os.path.join(folder, n), None) for n in sorted(os.listdir(path)))
    files.extend((os.path.join("commitlog", n), end) for n, end in sorted(segment_ends.items()))
    return files


def write_tar(data_dir: str, files: list[tuple[str, int | None]], out: str) -> int:
    """Write the snapshot to `out` (runs in a worker thread, while the
    sender applies nothing). Returns its size. A file deleted since
    `capture` (an hour retired) is left out. Each file's bytes go from file
    to file in the kernel (copy_file_range), not through this process: the
    sender's apply lock is held for the copy only, a fraction of what
    reading them into a tarfile took."""
    with open(out, "wb", buffering=0) as tar:
        for relative, size in files:
            try:
                f = open(os.path.join(data_dir, relative), "rb")  # noqa: SIM115 -- closed below, once copied
            except FileNotFoundError:
                continue
            with f:
                length = os.fstat(f.fileno()).st_size
                if size is not None:
                    length = min(length, size)
                info = tarfile.TarInfo(relative)
                info.size = length
                info.mode = FILE_MODE
                tar.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
                copy_range(f.fileno(), 0, length, tar.fileno())
                tar.write(bytes(-length % tarfile.BLOCKSIZE))
        tar.write(bytes(2 * tarfile.BLOCKSIZE))  # the end of the archive
        end = tar.tell()
        tar.write(bytes(-end % tarfile.RECORDSIZE))
    return os.path.getsize(out)


def unpack(tar_path: str, data_dir: str) -> str:
    """Extract the snapshot at `tar_path` into `data_dir`/snapshot.new,
    complete and fsync'ed, and delete the tar; the live store is not
    touched. Entries outside the store's files are refused. Returns the
    directory, for `swap_in`."""
    staged = os.path.join(data_dir, UNPACKED)
    if os.path.exists(staged):
        shutil.rmtree(staged)
    make_dir(staged)
    try:
        with tarfile.open(tar_path, "r") as tar:
            tops = set()
            for member in tar.getmembers():
                top = member.name.split("/", 1)[0]
                if top not in STORE_ENTRIES or ".." in member.name.split("/") or not member.isfile():
                    raise ContractError(f"snapshot entry {member.name!r} is not a store file")
                tops.add(top)
            for name in STORE_ENTRIES:  # made here, not by tarfile: DIR_MODE whatever the umask
                # (ends/ only when the snapshot has one: a store makes it with its first kept end)
                if name != "checkpoint" and (name != "ends" or name in tops):
                    make_dir(os.path.join(staged, name))
            tar.extractall(staged, filter=_private_data)
        checkpoint = os.path.join(staged, "checkpoint")
        if not os.path.exists(checkpoint):
            with open(create_file(checkpoint, os.O_WRONLY | os.O_TRUNC), "wb") as f:
                f.write(Checkpoint().encode())  # what no checkpoint means: replay from offset 0
        DISK.fsync_tree(staged)
        fsync_dir(data_dir)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    os.unlink(tar_path)
    return staged


def _private_data(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo:
    """tarfile's "data" filter, and every file FILE_MODE whatever mode the
    sender's tar gives it (tarfile sets it after the umask)."""
    return tarfile.data_filter(member, destination).replace(mode=FILE_MODE, deep=False)


def swap_in(data_dir: str, also: dict[str, bytes]) -> None:
    """Replace the store files of `data_dir` (the store must be closed) with
    those `unpack` made, together with the files in `also` (name -> bytes,
    e.g. the epochs file): after a crash at any point, `recover` leaves all
    of them old or all new. Quick (renames and a few fsyncs); the replaced
    files stay in snapshot.old until `remove_replaced`."""
    staged = os.path.join(data_dir, UNPACKED)
    for name, data in also.items():
        with open(create_file(os.path.join(staged, name), os.O_WRONLY | os.O_TRUNC), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    fsync_dir(staged)
    os.rename(staged, os.path.join(data_dir, SWAPPING))
    fsync_dir(data_dir)
    _finish_swap(data_dir)


def recover(data_dir: str) -> None:
    """Before the store opens: drop a snapshot that was still unpacking,
    finish a swap that a crash interrupted, delete replaced files."""
    staged = os.path.join(data_dir, UNPACKED)
    if os.path.isdir(staged):
        shutil.rmtree(staged)
    _finish_swap(data_dir)
    remove_replaced(data_dir)


def remove_replaced(data_dir: str) -> None:
    old = os.path.join(data_dir, REPLACED)
    if os.path.isdir(old):
        shutil.rmtree(old)


def _finish_swap(data_dir: str) -> None:
    """Move every entry left in snapshot.swap into place (the live one it
    replaces into snapshot.old). Each step is a rename, and an entry still
    in snapshot.swap has not been moved yet, so this can be run again after
    a crash at any point."""
    swapping = os.path.join(data_dir, SWAPPING)
    if not os.path.isdir(swapping):
        return
    old = os.path.join(data_dir, REPLACED)
    make_dir(old)
    for name in sorted(os.listdir(swapping)):
        live, moved = os.path.join(data_dir, name), os.path.join(old, name)
        if os.path.lexists(live):
            if os.path.lexists(moved):  # left by an earlier swap whose clean-up was cut short
                _remove(moved)
            os.rename(live, moved)
        os.rename(os.path.join(swapping, name), live)
    fsync_dir(data_dir)
    os.rmdir(swapping)
    fsync_dir(data_dir)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
