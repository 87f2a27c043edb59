"""Opening a data directory: derived files repaired from the commit log.

The commit log is the truth; the checkpoint says up to which offset the
derived files (hour files, id index) were durable, and how large each
hour was then. Opening therefore:

    1. loads the checkpoint (none: an empty store) and opens the commit
       log, which cuts a torn tail; refuses a checkpoint offset outside
       the log, and a directory from before spans holding a hour whose
       number now names a span
    2. deletes hour files the checkpoint does not list (made after it, or
       retired): replay makes them again
    3. opens the id index, or rebuilds it (missing, or from before its
       keyed hash) from every entry of the checkpointed hours
    4. replays every record after the checkpoint's offset, exactly as
       `commit()` applies it (applying twice changes nothing), and writes
       everything staged
    5. cuts each hour's files to exactly its data (a crash can leave
       preallocation or a half-applied tail)

A record its checksum passed that does not decode or apply raises
CorruptionError naming the log and the offset: the directory is refused,
never half-opened (`Store.open` then closes every file it opened).
"""

from __future__ import annotations

import os

from . import delay_index, delay_log, spans
from .checkpoint import Checkpoint
from .commit_log import CommitLog
from .delay_index import FLAG_RELEASED
from .entry import Location, Status
from .errors import CorruptionError
from .fileutil import make_dir
from .hour import Hour
from .hour_files import hour_paths, parse_hour_name
from .id_index import IdIndex
from .reading import Reading


class Recovery(Reading):
    """Open-time repair (see the module docstring)."""

    def _recover(self) -> None:
        make_dir(self.directory)  # not made with delay/ below: a parent gets no DIR_MODE
        make_dir(self._delay_dir)
        checkpoint_path = os.path.join(self.directory, "checkpoint")
        ck = Checkpoint.load(checkpoint_path) or Checkpoint()
        self.log = CommitLog.open(os.path.join(self.directory, "commitlog"), self.config.fsync,
                                  self.config.segment_bytes, scan_from=ck.commit_offset)
        if self.log_start_offset > ck.commit_offset or self.log_end_offset < ck.commit_offset:
            raise CorruptionError(checkpoint_path, 0,
                                  f"checkpoint offset {ck.commit_offset} is outside the commit log "
                                  f"[{self.log_start_offset}, {self.log_end_offset}]")
        if ck.layout < spans.LAYOUT and any(spans.is_span(h.hour) for h in ck.hours):
            hour = max(h.hour for h in ck.hours)
            raise CorruptionError(checkpoint_path, 0,
                                  f"this data directory was written before far hours were filed in spans, and "
                                  f"holds hour {hour} (after the year 2926), whose number now names a span; "
                                  f"to migrate, delete its messages due after 2926 with the release that wrote "
                                  f"it, then open it here")
        self._checkpoint_offset = ck.commit_offset
        for h in ck.hours:
            self._add_hour(Hour(h.hour, h.entries, h.log_bytes, h.ended, h.last_end_ms, h.topics))
        self._topic_names = dict(ck.topic_names)
        if ck.consuming is not None:
            self._consuming = {Location(hour, gi): deadline for hour, gi, deadline in ck.consuming}
        self._drop_unknown_hour_files()
        ids_dir = os.path.join(self.directory, "ids")
        if IdIndex.is_current(ids_dir):
            self.ids = IdIndex.open(ids_dir, self.config.id_shard_initial_slots, self._hours.__contains__,
                                    self._released)
        else:
            self.ids = self._rebuild_id_index(ids_dir)
        for offset, body in self.log.read_from(ck.commit_offset):
            try:
                kind, now_ms, items = self._decode(body)
                self._apply(kind, now_ms, items, None)
            except (LookupError, ValueError) as e:  # a body its checksum passed but no record: refuse
                raise CorruptionError(self.log.directory, offset, f"commit-log record at offset {offset}: {e}") from e
        self._flush_staged(everything=True)
        self._trim_hour_files()
        if ck.consuming is None:  # a checkpoint from before the set was kept: find them once
            self._find_consuming()

    def _find_consuming(self) -> None:
        for hour in self._hour_order:
            h = self._hours[hour]
            if any(counts[Status.CONSUMING] for counts in h.topics.values()):
                for entry in self.hour_entries(hour):
                    if entry.status == Status.CONSUMING:
                        self._consuming.setdefault(entry.location, 0)

    def _rebuild_id_index(self, directory: str) -> IdIndex:
        """A new id index (new secret) holding every unreleased message of
        the checkpointed hours; replaying the log adds the rest. Used when
        the index is missing or from before the keyed hash: read every
        entry and the front of every body, once."""
        ids = IdIndex.build(directory, self.config.id_shard_initial_slots, self._hours.__contains__, self._released)
        try:
            for hour in self._hour_order:
                h = self._hours[hour]
                files = self._files(h)
                for gi in range(h.entries):
                    _, offset8, size, flags = files.read_entry(gi)
                    if not flags & FLAG_RELEASED:
                        topic, msg_id = delay_log.id_fields(files.read_body(offset8, size))
                        ids.put(ids.key_of_bytes(topic, msg_id), hour, gi)
            ids.publish()
        except BaseException:
            ids.close()
            raise
        return ids

    def _released(self, hour: int, global_index: int) -> bool:
        """True if the applied state of the message says it was deleted for
        good (the id index reuses its slot for the next one under its id)."""
        h = self._hours.get(hour)
        if h is None or global_index >= h.applied:
            return False
        flags = h.staged_flags(global_index)
        if flags is None:
            flags = self._readable(h).read_entry(global_index)[3]
        return bool(flags & FLAG_RELEASED)

    def _drop_unknown_hour_files(self) -> None:
        """Files of hours the checkpoint does not list were created after it
        (replay recreates them) or belong to a retired hour."""
        for name in os.listdir(self._delay_dir):
            hour = parse_hour_name(name)
            if hour is None or hour not in self._hours:
                os.unlink(os.path.join(self._delay_dir, name))

    def _trim_hour_files(self) -> None:
        """Cut each hour's log and index to exactly its data (a crash can
        leave a mapped file's preallocation or half-applied tail behind)."""
        for h in self._hours.values():
            log_path, idx_path, sec_path = hour_paths(self._delay_dir, h.hour)
            if not os.path.exists(sec_path):
                raise CorruptionError(sec_path, 0, f"hour {h.hour} is in the checkpoint but its files are missing")
            log_size = delay_log.HEADER_BYTES + h.log_bytes
            idx_size = delay_index.entry_offset(h.entries)
            for path, size in ((log_path, log_size), (idx_path, idx_size)):
                actual = os.path.getsize(path)
                if actual < size:
                    raise CorruptionError(path, actual, f"file is {actual} bytes, its data needs {size}")
                if actual > size and h.files is None:  # an open hour is cut when it closes
                    os.truncate(path, size)
