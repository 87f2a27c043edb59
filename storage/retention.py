"""Checkpoints, and what they let go: old log segments and ended hours.

A checkpoint makes every derived file durable and records the commit
offset up to which they are; recovery then replays only what follows.
Once it is written, nothing before that offset is needed: commit-log
segments wholly before it are deleted (the active one is sealed at
SEAL_AT_CHECKPOINT_BYTES so it can go next time), and so are hours whose
messages all ended `retention_ms` ago and in which nothing can be filed
any more (a past hour, a due span).

It runs in three steps so a server can do the slow middle one (syncfs)
in a worker thread while it keeps serving:

    prepare_checkpoint   commit, write everything staged, choose the
                         offset and the hours to retire (gone for readers)
    sync_checkpoint      one syncfs of the data directory's file system
    finish_checkpoint    write the checkpoint file, then delete what it no
                         longer lists

Changes made between prepare and finish are after the offset: a crash
replays them. `checkpoint_due` lets an idle node skip the whole thing.

`Retention` owns the offset of the last checkpoint read or written. It
commits through the `Applier` it is given (which also hands it the topic
names and the in-flight set to save), retires hours from the
`HourTable`, and deletes segments from the commit log.
"""

from __future__ import annotations

import os

from . import spans
from .applying import Applier
from .checkpoint import Checkpoint
from .commit_log import CommitLog
from .config import StoreConfig
from .disk import Disk
from .entry import MS_PER_HOUR
from .hour import Hour
from .hour_table import HourTable
from .pending import Pending
from .types import CheckpointReport, PreparedCheckpoint

# A checkpoint starts a new commit-log segment when the active one holds this
# much, so the old one, wholly before the checkpoint, can be deleted.
SEAL_AT_CHECKPOINT_BYTES = 4 * 1024 * 1024


class Retention:
    """Checkpoints and retirement (see the module docstring; each call's
    contract is on `storage.store.Store`). One thread calls it, except
    `sync_checkpoint`."""

    def __init__(self, directory: str, config: StoreConfig, hours: HourTable, pending: Pending, applier: Applier,
                 log: CommitLog, checkpoint_offset: int, disk: Disk) -> None:
        self._directory = directory
        self._disk = disk  # what a checkpoint makes the data directory durable through (storage.disk)
        self._retention_ms = config.retention_ms
        self._hours = hours
        self._pending = pending
        self._applier = applier
        self._log = log
        self._checkpoint_offset = checkpoint_offset  # commit offset of the last checkpoint read or written

    def checkpoint(self, now_ms: int) -> CheckpointReport:
        prepared = self.prepare_checkpoint(now_ms)
        self.sync_checkpoint()
        return self.finish_checkpoint(prepared)

    def prepare_checkpoint(self, now_ms: int) -> PreparedCheckpoint:
        self._applier.commit()
        self._hours.advance(now_ms)
        self._hours.flush_staged(everything=True)
        retired = tuple(h.hour for h in self._hours.ascending() if self.retirable(h, now_ms))
        for hour in retired:  # gone for readers now; files deleted once the checkpoint no longer lists them
            self._hours.retire(hour)
        kept = tuple(h.record() for h in self._hours.ascending())
        self._applier.keep_topics({th for h in kept for th, counts in h.topics.items() if any(counts)})
        self._log.seal_active(SEAL_AT_CHECKPOINT_BYTES)
        return PreparedCheckpoint(self._log.end_offset, kept, retired, now_ms, self._applier.topic_names(),
                                  self._applier.consuming_rows())

    def sync_checkpoint(self) -> None:
        self._disk.sync_filesystem(self._directory)

    def finish_checkpoint(self, p: PreparedCheckpoint, keep_log_from: int | None = None) -> CheckpointReport:
        Checkpoint(p.offset, p.kept, p.now_ms, p.topic_names, p.consuming).save(os.path.join(self._directory, "checkpoint"))
        self._checkpoint_offset = p.offset
        self._hours.delete_files(p.retired)
        deleted = self._log.delete_before(p.offset if keep_log_from is None else min(p.offset, keep_log_from))
        return CheckpointReport(p.offset, deleted, p.retired)

    def checkpoint_due(self, now_ms: int) -> bool:
        return (self._log.end_offset != self._checkpoint_offset or bool(len(self._pending))
                or any(self.retirable(h, now_ms) for h in self._hours.ascending() if h.ended == h.entries))

    def retirable(self, h: Hour, now_ms: int) -> bool:
        """Every message ended `retention_ms` ago, and nothing can be filed
        in it any more: an hour that is past, a span that is due."""
        if not (h.entries > 0 and h.ended == h.entries and h.last_end_ms + self._retention_ms <= now_ms):
            return False
        if spans.is_span(h.hour):
            start = self._hours.span_start(h)
            return start is not None and spans.is_due(h.hour, start, now_ms // MS_PER_HOUR)
        return (h.hour + 1) * MS_PER_HOUR <= now_ms

    def disk_bytes(self) -> int:
        total = 0
        for root, _, names in os.walk(self._directory):
            for name in names:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
        return total

    def __repr__(self) -> str:
        return f"Retention({self._directory!r}, checkpoint_offset={self._checkpoint_offset})"
