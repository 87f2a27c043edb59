"""A store's online backup, sent as it is taken (docs/operations.md,
"Backup and restore"; the steps and the frames: storage.backup).

    GET backupShard   (the node's token) answers a stream of frames: the
                      store's files in two steps, then an end frame with the
                      log position E the copy stands at. One at a time a
                      store: a second asked meanwhile answers an error frame
    POST backupShard  the same, the body {"have": {path: [size, digest]}}:
                      delay logs and log segments the asker holds from an
                      earlier backup (storage.backup's `tail_digest`): of
                      each the node still holds below that size, only what
                      lies past it is sent (a `keep` frame first)

    1. a checkpoint, so the log to replay is short; then none until the end
       (the node's checkpoints wait on `lock`: the files step 1 reads are
       not retired, the log from the checkpoint's offset is kept)
    2. step 1's pieces read in a worker thread while the node serves
    3. step 2's pieces copied into a staging directory beside the store at
       one quiet point of the group commit (the node answers nothing for
       that long: some 100 bytes a message of in-place files), then sent
    4. the end frame; the staging directory deleted (and any a killed
       node left, at the next start: `clear_staging`)

A client that goes away cuts the stream: what it wrote is no backup
(storage.backup: a stream without its end frame), and the lock is let go.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import NamedTuple

from storage import backup
from storage.checkpoint import Checkpoint
from storage.errors import InvalidRequest
from storage.fileutil import make_dir
from storage.store import Store

log = logging.getLogger("hourglass.backup")

STAGING_PREFIX = "backup.staging-"


class Staged(NamedTuple):
    """Step 2's outcome: the log end E, and each piece staged (the piece, its staged file, its length)."""

    position: int
    pieces: list[tuple[backup.Piece, str, int]]


def clear_staging(data_path: str) -> None:
    """Delete the staging directories a node killed during a backup left."""
    for name in os.listdir(data_path):
        if name.startswith(STAGING_PREFIX):
            shutil.rmtree(os.path.join(data_path, name), ignore_errors=True)


class Backups:
    """The online backups of one store (`data_path`)."""

    def __init__(self, store: Callable[[], Store], data_path: str,
                 quiet_point: Callable[[Callable[[], object]], Awaitable[object]],
                 checkpoint: Callable[[], Awaitable[None]], shard: tuple[int, int],
                 lock: asyncio.Lock | None = None) -> None:
        self._store = store
        self._data_path = data_path
        self._quiet_point = quiet_point
        self._checkpoint = checkpoint
        self._shard = shard
        # held for a backup's whole run; a checkpoint takes it too (a cluster node's: its checkpoint lock)
        self.lock = asyncio.Lock() if lock is None else lock
        self._running = False
        self.taken = 0

    def __repr__(self) -> str:
        return f"Backups({self._data_path!r}, running={self._running}, taken={self.taken})"

    async def stream(self, have: Mapping[str, tuple[int, str]] | None = None) -> AsyncGenerator[bytes, None]:
        """The frames of one backup (module docstring); `have`: the files
        that only grow the asker holds (relative path -> size, tail digest)."""
        if self._running:
            yield backup.frame({"error": "a backup of this store is under way: one at a time"})
            return
        self._running = True
        started = time.perf_counter()
        staging = os.path.join(self._data_path, f"{STAGING_PREFIX}{os.getpid()}-{time.monotonic_ns()}")
        try:
            await self._checkpoint()
            async with self.lock:
                checkpoint = Checkpoint.load(os.path.join(self._data_path, "checkpoint")) or Checkpoint()
                sent = kept = 0
                for piece in backup.prefixes(self._data_path, checkpoint):
                    path, start = os.path.join(self._data_path, piece.path), piece.start
                    held = (have or {}).get(piece.path)
                    if held is not None and start == 0 and piece.end is not None and 0 < held[0] <= piece.end \
                            and await asyncio.to_thread(backup.holds, path, *held):
                        yield backup.frame({"path": piece.path, "keep": held[0]})
                        start = held[0]
                        kept += start
                    async for chunk in self._read(path, piece.path, start, piece.end):
                        sent += len(chunk)
                        yield chunk
                make_dir(staging)
                blocked = time.perf_counter()
                stepped: object = await self._quiet_point(lambda: self._stage(checkpoint, staging))
                assert isinstance(stepped, Staged)
                position, staged = stepped
                blocked_s = time.perf_counter() - blocked
                for piece, path, length in staged:
                    async for chunk in self._read(path, piece.path, 0, length, at=piece.start):
                        sent += len(chunk)
                        yield chunk
                seconds = time.perf_counter() - started
                self.taken += 1
                log.info("backup of %s sent: %d bytes up to log offset %d in %.2f s (%d bytes the asker held; "
                         "the node paused %.3f s)", self._data_path, sent, position, seconds, kept, blocked_s)
                yield backup.frame({"end": True, "position": position, "shard": self._shard[0],
                                    "shards": self._shard[1], "bytes": sent, "kept": kept, "seconds": round(seconds, 3),
                                    "pausedSeconds": round(blocked_s, 4), "checkpointOffset": checkpoint.commit_offset})
        finally:
            self._running = False
            await asyncio.to_thread(shutil.rmtree, staging, True)

    def _stage(self, checkpoint: Checkpoint, staging: str) -> Staged:
        """Step 2, at the quiet point: the log end E, and the pieces copied under `staging`."""
        store = self._store()
        pieces = backup.rest(self._data_path, checkpoint, store.log_segment_ends(), store.delay_log_ends())
        return Staged(store.log_end_offset, backup.stage(self._data_path, pieces, staging))

    async def _read(self, path: str, name: str, start: int, end: int | None,
                    at: int | None = None) -> AsyncGenerator[bytes, None]:
        """Frames of `path`'s bytes [start, end) (None: to its end), said to
        start at `at` of `name` (default: `start`), read in a worker thread."""
        try:
            fd = await asyncio.to_thread(os.open, path, os.O_RDONLY)
        except FileNotFoundError:  # (a file gone since it was listed: its hour retired before the lock)
            return
        try:
            size = os.fstat(fd).st_size
            stop = size if end is None else min(end, size)
            offset = start
            first = True
            while offset < stop or first:
                data = await asyncio.to_thread(os.pread, fd, min(backup.FRAME_DATA_BYTES, stop - offset), offset)
                if not data and not first:
                    break
                yield backup.frame({"path": name, "at": offset - start + (start if at is None else at)}, data)
                offset += len(data)
                first = False
        finally:
            os.close(fd)


# Files a POST backupShard's `have` may name: a store holds under 500 delay
# logs (storage.spans), an hour's a day more, and a few log segments.
MAX_HAVE = 100_000


def parse_have(body: bytes) -> dict[str, tuple[int, str]]:
    """POST backupShard's body, {"have": {path: [size, digest]}}: the files
    that only grow the asker holds; InvalidRequest (have) for anything else."""
    try:
        decoded = json.loads(body or b"{}")
    except (ValueError, RecursionError) as e:
        raise _bad_have(f"not JSON: {e}") from None
    have = decoded.get("have") or {} if isinstance(decoded, dict) else None
    if not isinstance(have, dict) or len(have) > MAX_HAVE:
        raise _bad_have("not an object of at most 100,000 files")
    out: dict[str, tuple[int, str]] = {}
    for path, held in have.items():
        size, digest = held if isinstance(held, list) and len(held) == 2 else (None, None)
        if not (backup.appended_only(path) and ".." not in path and type(size) is int and 0 < size < 1 << 62
                and isinstance(digest, str) and len(digest) == 64):
            raise _bad_have(f"{path[:80]!r}: {str(held)[:80]}")
        out[path] = (size, digest)
    return out


def _bad_have(why: str) -> InvalidRequest:
    return InvalidRequest("have", f"must be {{\"have\": {{\"delay/<file>.log\": [size, sha256 hex]}}}}: {why}")
