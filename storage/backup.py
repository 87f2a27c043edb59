"""An online backup of a store: which bytes of which files, in two steps,
so that a node serves on while its files are copied (docs/operations.md,
"Backup and restore").

What a restore opens is what a crash would leave at the log end E taken
in step 2: the checkpoint, every file it says was durable, and the commit
log from its offset O to E; opening it replays O..E over the derived
files (storage.recovery), as after a crash, and reaches the state at E
exactly. Everything answered 200 before step 2 is below E; nothing after
it is in the copy at all.

    step 1  (a worker thread, while the node serves; no checkpoint may run
    prefixes  from here to the end: the node holds them off) the bytes the
            checkpoint made durable and nothing changes any more: each
            hour's delay log up to the checkpoint's size for it, and the
            commit-log segment holding O up to O. The bulk of a store (the
            bodies) goes here.
    step 2  (at a quiet point: everything appended applied, nothing applied
    rest      while it runs) every file that changes in place, whole: the
            checkpoint, each checkpointed hour's index and second table, the
            id, key and end indexes; the delay logs' bytes past step 1's; the
            commit log from where step 1 stopped to E; and the node's small
            files beside the store (schedules, topic settings, jobs, push
            subscriptions, the tick). An hour the checkpoint does not list is
            left out: recovery deletes such files and replay makes them again.
            The small files are their writers' own: a copy may end in a torn
            last record, which their readers drop as after a crash; a base
            and its log (topic settings) are copied under the log's shared
            flock, as their reader reads them.

A `Piece` is (the file's path relative to the store, where it starts,
where it ends; None: to its end when copied). Step 2's pieces are copied at
once, at the quiet point (the node blocks that long: what the in-place
files weigh, some 100 bytes a message); step 1's may take as long as they
take.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import struct
from typing import NamedTuple

from .checkpoint import Checkpoint
from .commit_log import HEADER_BYTES as SEGMENT_HEADER_BYTES
from .commit_log import SEGMENT_VERSION, V1_HEADER_BYTES
from .delay_log import HEADER_BYTES as LOG_HEADER_BYTES
from .errors import ContractError
from .fileutil import FILE_MODE
from .hour_files import hour_paths

# The node's own small files a backup carries beside the store (each written
# whole or appended with its records framed: a copy at a quiet point is whole).
NODE_FILES = ("tick", "schedules", "topic-settings", "topic-settings.log", "topic-resumes", "topic-resumes.log",
              "push-subscriptions.json")
NODE_FOLDERS = ("jobs",)
# Logs whose base file is replaced under their exclusive flock (broker.flow.file): a copy holds the shared one.
LOCKED_LOGS = ("topic-settings.log", "topic-resumes.log")
INDEX_FOLDERS = ("ids", "keys", "ends")


class Piece(NamedTuple):
    path: str  # relative to the store's directory
    start: int
    end: int | None  # None: to the file's end when it is copied


def _segments(directory: str) -> list[tuple[int, str, int]]:
    """The commit log's segments: (base offset, relative path, header
    bytes: a version 1 segment's are fewer), in order."""
    folder = os.path.join(directory, "commitlog")
    names = sorted(n for n in os.listdir(folder) if n.endswith(".log")) if os.path.isdir(folder) else []
    found = []
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            head = f.read(6)
        version = int.from_bytes(head[4:6], "little") if len(head) == 6 else SEGMENT_VERSION
        found.append((int(name[:-4]), os.path.join("commitlog", name),
                      SEGMENT_HEADER_BYTES if version == SEGMENT_VERSION else V1_HEADER_BYTES))
    return found


def _holding(segments: list[tuple[int, str, int]], offset: int) -> tuple[int, str, int] | None:
    """The segment holding `offset`: the last one that begins at or before it."""
    before = [s for s in segments if s[0] <= offset]
    return before[-1] if before else None


def prefixes(directory: str, checkpoint: Checkpoint) -> list[Piece]:
    """Step 1: what `checkpoint` (the last one written, none running until
    step 2) made durable and no later change touches."""
    pieces = []
    for h in checkpoint.hours:
        log_path = hour_paths(os.path.join(directory, "delay"), h.hour)[0]
        pieces.append(Piece(os.path.relpath(log_path, directory), 0, LOG_HEADER_BYTES + h.log_bytes))
    holding = _holding(_segments(directory), checkpoint.commit_offset)
    if holding is not None:
        base, path, header = holding
        pieces.append(Piece(path, 0, header + checkpoint.commit_offset - base))
    return pieces


def rest(directory: str, checkpoint: Checkpoint, segment_ends: dict[str, int],
         log_ends: dict[int, int]) -> list[Piece]:
    """Step 2, at the quiet point: everything else a restore needs (module
    docstring). `segment_ends`: each commit-log segment's name -> where its
    records end now (E); `log_ends`: each file's delay-log bytes written
    now (Store.delay_log_ends): a delay log is copied to there, never into
    the zeros a mapped one is grown by (a later backup takes what it holds
    of a delay log as the node's own bytes: storage.backup's `holds`)."""
    pieces = [Piece("checkpoint", 0, None)] if os.path.exists(os.path.join(directory, "checkpoint")) else []
    for h in checkpoint.hours:
        log_path, index_path, seconds_path = hour_paths(os.path.join(directory, "delay"), h.hour)
        written = log_ends.get(h.hour)
        pieces.append(Piece(os.path.relpath(log_path, directory), LOG_HEADER_BYTES + h.log_bytes,
                            None if written is None else LOG_HEADER_BYTES + max(written, h.log_bytes)))
        pieces.extend(Piece(os.path.relpath(p, directory), 0, None) for p in (index_path, seconds_path))
    for folder in INDEX_FOLDERS:
        path = os.path.join(directory, folder)
        if os.path.isdir(path):
            pieces.extend(Piece(os.path.join(folder, n), 0, None) for n in sorted(os.listdir(path))
                          if os.path.isfile(os.path.join(path, n)))
    segments = _segments(directory)
    holding = _holding(segments, checkpoint.commit_offset)
    for base, path, header in segments:
        end = segment_ends.get(os.path.basename(path))
        if end is None or base < (holding[0] if holding is not None else 0):
            continue  # (a segment before the one holding O: replay starts at O)
        start = header + checkpoint.commit_offset - base if (base, path, header) == holding else 0
        pieces.append(Piece(path, start, end))
    for name in NODE_FILES:
        if os.path.isfile(os.path.join(directory, name)):
            pieces.append(Piece(name, 0, None))
    for folder in NODE_FOLDERS:
        path = os.path.join(directory, folder)
        if os.path.isdir(path):
            pieces.extend(Piece(os.path.join(folder, n), 0, None) for n in sorted(os.listdir(path))
                          if not n.endswith(".tmp") and os.path.isfile(os.path.join(path, n)))
    return pieces


def stage(directory: str, pieces: list[Piece], staging: str) -> list[tuple[Piece, str, int]]:
    """Step 2's copy, at the quiet point: each piece's bytes into a file of
    its own under `staging` (the kernel copies: copy_file_range). Returns
    (the piece, its staged file, its length) of each; a file gone since the
    pieces were listed is left out."""
    staged = []
    with contextlib.ExitStack() as held:
        for log_name in LOCKED_LOGS:  # (a base and its log read together, as their reader does)
            try:
                fd = os.open(os.path.join(directory, log_name), os.O_RDONLY)
            except FileNotFoundError:
                continue
            held.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_SH)
        for number, piece in enumerate(pieces):
            copied = _stage_piece(directory, piece, os.path.join(staging, f"{number:08d}"))
            if copied is not None:
                staged.append((piece, copied[0], copied[1]))
    return staged


def _stage_piece(directory: str, piece: Piece, target_path: str) -> tuple[str, int] | None:
    """One piece copied to `target_path`: (that path, its length); None if its file is gone."""
    try:
        source = os.open(os.path.join(directory, piece.path), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        end = os.fstat(source).st_size if piece.end is None else min(piece.end, os.fstat(source).st_size)
        length = max(0, end - piece.start)
        target = os.open(target_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        try:
            copy_range(source, piece.start, length, target)
        finally:
            os.close(target)
    finally:
        os.close(source)
    return target_path, length


def copy_range(source: int, start: int, length: int, target: int) -> None:
    """`length` bytes of `source` from `start` to `target`'s position, in
    the kernel (copy_file_range; through this process where the file
    system has none). A backup's pieces and a cluster's snapshot
    (replication.snapshot) are copied so."""
    copied = 0
    while copied < length:
        try:
            n = os.copy_file_range(source, target, length - copied, start + copied)
        except OSError:
            n = len(chunk := os.pread(source, min(1 << 20, length - copied), start + copied))
            os.write(target, chunk)
        if n == 0:
            raise ContractError(f"a file ended after {copied} of {length} bytes while it was copied")
        copied += n


# A delay log or a commit-log segment is appended to, never changed below
# its end: a file a backup already holds (the last one to the same place)
# is the node's own below its size when their last TAIL_BYTES there agree
# (`tail_digest`; a file retired and made again under its id, or a log cut
# back after a crash and written on, holds other bytes there), and only
# what lies past that size is sent again.
TAIL_BYTES = 1 << 16


def tail_digest(fd: int, size: int) -> str:
    """The SHA-256 of `size` and of the file's last TAIL_BYTES below it ("" when the file is shorter)."""
    start = max(0, size - TAIL_BYTES)
    data = os.pread(fd, size - start, start)
    if len(data) != size - start:
        return ""
    return hashlib.sha256(size.to_bytes(8, "little") + data).hexdigest()


def appended_only(path: str) -> bool:
    """Whether a store's file (relative path) is one that only grows: a delay log or a commit-log segment."""
    return path.startswith(("delay" + os.sep, "commitlog" + os.sep)) and path.endswith(".log")


def holds(path: str, size: int, digest: str) -> bool:
    """Whether the file at `path` is at least `size` bytes with `tail_digest` `digest` there."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        return os.fstat(fd).st_size >= size and tail_digest(fd, size) == digest
    finally:
        os.close(fd)


# The stream a node sends (GET backupShard) and `hourglass backup` reads: frames
#     u32 header length | u32 data length | header (JSON) | data
# a piece's bytes in frames of at most FRAME_DATA_BYTES, each header {"path", "at"}; a frame
# {"path", "keep": size} and no data: the first `size` bytes of that file are the ones the
# asker said it holds (POST backupShard's `have`); the last frame's header {"end": true,
# "position": E, ...} and no data. A stream cut before it is not a backup.
FRAME = struct.Struct("<II")
FRAME_DATA_BYTES = 1 << 20


def frame(header: dict[str, object], data: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return FRAME.pack(len(head), len(data)) + head + data
