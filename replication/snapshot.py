"""Snapshots: a node's derived files and log, for a follower that cannot
continue from its own log (it is behind the leader's retained log, or its
tail diverged: it led, or followed a leader, whose last records never
reached a quorum).

A snapshot is a tar stream of the data directory's store files:

    checkpoint             the last checkpoint (offset O, hours, counts)
    delay/*, ids/*         delay logs, indexes, second tables, id index
    commitlog/*.log        every segment, each cut at the log end E taken
                           when the copy began

Derived files do not change during the copy (the sender holds its apply
lock, so no record is applied meanwhile), but they may hold the effect of
records after O: the receiver opens the store like after a crash, which
replays O..E over them and so reaches exactly the sender's state at E. It
then fetches from E as any follower. Records appended after E are not in
the snapshot and arrive by fetch.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile

STORE_ENTRIES = ("checkpoint", "delay", "ids", "commitlog")


def capture(data_dir: str, segment_ends: dict[str, int]) -> list[tuple[str, int | None]]:
    """The files to send, as (relative path, bytes to send or None: all).
    `segment_ends` gives, per commit-log segment file name, the position up
    to which it holds records."""
    files: list[tuple[str, int | None]] = []
    if os.path.exists(os.path.join(data_dir, "checkpoint")):
        files.append(("checkpoint", None))
    for folder in ("delay", "ids"):
        path = os.path.join(data_dir, folder)
        if os.path.isdir(path):
            files.extend((os.path.join(folder, n), None) for n in sorted(os.listdir(path)))
    files.extend((os.path.join("commitlog", n), end) for n, end in sorted(segment_ends.items()))
    return files


def write_tar(data_dir: str, files: list[tuple[str, int | None]], out: str) -> int:
    """Write the snapshot to `out` (runs in a worker thread). Returns its size.
    A file deleted since `capture` (an hour retired) is left out."""
    with tarfile.open(out, "w") as tar:
        for relative, size in files:
            path = os.path.join(data_dir, relative)
            try:
                f = open(path, "rb")
            except FileNotFoundError:
                continue
            with f:
                data = f.read() if size is None else f.read(size)
            info = tarfile.TarInfo(relative)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return os.path.getsize(out)


def install(tar_path: str, data_dir: str) -> None:
    """Replace the store files of `data_dir` with the snapshot's (the store
    must be closed). Entries outside the store's files are refused."""
    for name in STORE_ENTRIES:
        path = os.path.join(data_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.unlink(path)
    with tarfile.open(tar_path, "r") as tar:
        for member in tar.getmembers():
            top = member.name.split("/", 1)[0]
            if top not in STORE_ENTRIES or ".." in member.name.split("/") or not member.isfile():
                raise ValueError(f"snapshot entry {member.name!r} is not a store file")
        tar.extractall(data_dir, filter="data")
    os.unlink(tar_path)
