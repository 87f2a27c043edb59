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
"""

from __future__ import annotations

import os

from . import spans
from .checkpoint import Checkpoint
from .entry import MS_PER_HOUR
from .fileutil import fsync_dir, sync_filesystem
from .hour import Hour
from .hour_files import hour_paths
from .reading import Reading
from .types import CheckpointReport, PreparedCheckpoint

# A checkpoint starts a new commit-log segment when the active one holds this
# much, so the old one, wholly before the checkpoint, can be deleted.
SEAL_AT_CHECKPOINT_BYTES = 4 * 1024 * 1024


class Retention(Reading):
    """Checkpoints and retirement (see the module docstring)."""

    def checkpoint(self, now_ms: int) -> CheckpointReport:
        """Make every derived file durable, record the commit offset, then
        delete what is no longer needed: commit-log segments before it, and
        hours whose messages have all ended at least `retention_ms` ago.

        In three steps, so a server can run the slow middle one in a worker
        thread while it keeps serving: `prepare_checkpoint` (commit, write
        everything staged, choose the offset and the hours to retire),
        `sync_checkpoint` (one syncfs; thread-safe), `finish_checkpoint`
        (write the checkpoint file, delete what it no longer needs). Changes
        made between prepare and finish are after the offset: replayed."""
        prepared = self.prepare_checkpoint(now_ms)
        self.sync_checkpoint()
        return self.finish_checkpoint(prepared)

    def prepare_checkpoint(self, now_ms: int) -> PreparedCheckpoint:
        self._check_open()
        self.commit()
        self.advance(now_ms)
        self._flush_staged(everything=True)
        retired = tuple(hour for hour in self._hour_order if self._retirable(self._hours[hour], now_ms))
        for hour in retired:  # gone for readers now; files deleted once the checkpoint no longer lists them
            h = self._hours.pop(hour)
            self._hour_order.remove(hour)
            self._close_files(h)
        kept = tuple(h.record() for _, h in sorted(self._hours.items()))
        live_topics = {th for h in kept for th, counts in h.topics.items() if any(counts)}
        self._topic_names = {th: name for th, name in self._topic_names.items() if th in live_topics}
        self.log.seal_active(SEAL_AT_CHECKPOINT_BYTES)
        consuming = tuple((hour, gi, deadline) for (hour, gi), deadline in self._consuming.items())
        return PreparedCheckpoint(self.log_end_offset, kept, retired, now_ms, dict(self._topic_names), consuming)

    def sync_checkpoint(self) -> None:
        """Flush every dirty page of the data directory's file system (mapped
        pages included): safe to run in a worker thread."""
        sync_filesystem(self.directory)

    def finish_checkpoint(self, p: PreparedCheckpoint, keep_log_from: int | None = None) -> CheckpointReport:
        """`keep_log_from`: keep commit-log segments from this offset on even
        if the checkpoint no longer needs them (a follower still reads them)."""
        self._check_open()
        Checkpoint(p.offset, p.kept, p.now_ms, p.topic_names, p.consuming).save(os.path.join(self.directory, "checkpoint"))
        self._checkpoint_offset = p.offset
        for hour in p.retired:
            for path in hour_paths(self._delay_dir, hour):
                os.unlink(path)
        if p.retired:
            fsync_dir(self._delay_dir)
        deleted = self.log.delete_before(p.offset if keep_log_from is None else min(p.offset, keep_log_from))
        self.ids.shed()
        self.log.shed()
        for h in self._hours.values():
            if h.files is not None:
                h.files.shed()
        return CheckpointReport(p.offset, deleted, p.retired)

    def checkpoint_due(self, now_ms: int) -> bool:
        """Whether a checkpoint would change anything: a record appended since
        the last one, or a file to retire. An idle node skips it, so it
        rewrites nothing."""
        self._check_open()
        return (self.log_end_offset != self._checkpoint_offset or bool(self._pending)
                or any(self._retirable(h, now_ms) for h in self._hours.values() if h.ended == h.entries))

    def _retirable(self, h: Hour, now_ms: int) -> bool:
        """Every message ended `retention_ms` ago, and nothing can be filed
        in it any more: an hour that is past, a span that is due."""
        if not (h.entries > 0 and h.ended == h.entries and h.last_end_ms + self.config.retention_ms <= now_ms):
            return False
        if spans.is_span(h.hour):
            start = self._span_start(h)
            return start is not None and spans.is_due(h.hour, start, now_ms // MS_PER_HOUR)
        return (h.hour + 1) * MS_PER_HOUR <= now_ms

    def disk_bytes(self) -> int:
        total = 0
        for root, _, names in os.walk(self.directory):
            for name in names:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
        return total
