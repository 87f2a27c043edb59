"""The storage engine: commit log in, hourly delay logs and indexes out.

Layout of a data directory:

    checkpoint            commit offset + per-hour sizes (storage.checkpoint)
    commitlog/*.log       the commit log segments (storage.commit_log)
    delay/<id>.log        bodies of messages triggering in that UTC hour,
                          or in a span of hours (storage.spans)
    delay/<id>.idx        their index entries (storage.delay_index)
    delay/<id>.sec        the hour's second table (storage.second_table)
    ids/secret            the id index's hash key (storage.id_index)
    ids/<shard>.hix       (topic, msgId) -> location (storage.id_index)

How a change flows:

    send()/update()   assign coordinates (hour, globalIndex, preGlobalIndex,
                      localIndex, delay-log offset), append ONE record to the
                      commit log. Nothing derived is written yet; later calls
                      in the same batch see the change through small
                      "pending" overlays (dedup, second-table tails, status).
    commit()          fsync the log once for everything appended since the
                      last commit (group commit), then apply the records to
                      the derived files and return the new index entries.
    checkpoint()      flush every derived file, record the commit offset,
                      delete commit-log segments and hours no longer needed.

Derived files are never ahead of the durable log, and applying a record is a
set of writes at positions the record names; so recovery is: cut each hour
back to its checkpointed size, replay the log from the checkpoint's offset.

Time is a parameter (`now_ms`): the store never reads a clock. The hour of
`now_ms` and the next one are the "near" hours, memory-mapped; all others
are reached with pread/pwrite through a bounded cache of open files.
Messages more than 32 hours ahead are filed in coarser spans of hours, and
filed again (`refile()`) as their span comes near: storage.spans.

Concurrency: one thread calls everything, except that `sync_log()` may run
in a worker thread while that thread keeps appending.
"""

from __future__ import annotations

import enum
import errno
import os
import resource
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from sortedcontainers import SortedList

from . import delay_index, delay_log, records, spans
from .checkpoint import Checkpoint, HourRecord
from .commit_log import CommitLog
from .config import StoreConfig
from .delay_index import FLAG_MOVED, FLAG_RELEASED
from .entry import MS_PER_HOUR, MS_PER_SECOND, SECONDS_PER_HOUR, IndexEntry, Location, Message, Status
from .errors import CorruptionError, InvalidRequest, StoreClosedError
from .fileutil import PAGE_BYTES, free_bytes, fsync_dir, sync_filesystem
from .framing import FRAME_HEADER_BYTES
from .hour import Hour
from .hour_files import HourFiles, hour_paths, parse_hour_name
from .id_index import IdIndex

MAX_PRIORITY = 2**15 - 1
MIN_PRIORITY = -(2**15)
MAX_RETRY_COUNT = 2**16 - 1
WAITING = Status.WAITING
# A checkpoint starts a new commit-log segment when the active one holds this
# much, so the old one, wholly before the checkpoint, can be deleted.
SEAL_AT_CHECKPOINT_BYTES = 4 * 1024 * 1024
# A batch's characters, bounded so its record (UTF-8, up to 4 bytes each,
# plus framing) stays under storage.framing.MAX_BODY_BYTES.
MAX_RECORD_CHARS = 32 * 1024 * 1024
# Index entries read at once by a scan (scan_ready): 192 KiB.
SCAN_SLICE = 4096
# Waiting messages of due spans moved by one refile() record.
REFILE_STEP = 1024
# Staged bytes of far hours kept before they are written (see storage.hour).
STAGE_LIMIT_BYTES = 8 * 1024 * 1024
# Disk room a send leaves free beyond what the writes it commits the store to
# will take: for the checkpoint file, a shard doubling, block rounding.
DISK_HEADROOM_BYTES = 1024 * 1024
# The free space a send checks is read (statvfs) again after this many sends,
# or sooner when what they may have written since comes within
# DISK_RECHECK_MARGIN_BYTES of what was free: a send pays for a statvfs only
# near a full disk (where it checks every time) or once per so many sends.
DISK_RECHECK_SENDS = 64
DISK_RECHECK_MARGIN_BYTES = 256 * 1024 * 1024


class NewMessage(NamedTuple):
    topic: str
    msg_id: str
    msg: str
    produce_ms: int
    trigger_ms: int
    ttl_ms: int
    max_retry: int
    priority: int = 0
    tag: str = ""
    key: str = ""  # serial key (SPEC `key`), in the body


class SendOutcome(enum.Enum):
    STORED = "stored"
    DUPLICATE = "duplicate"  # the id exists: `message` is the stored one, unchanged


class SendResult(NamedTuple):
    outcome: SendOutcome
    message: Message


STORED, DUPLICATE = SendOutcome.STORED, SendOutcome.DUPLICATE


class StateChange(NamedTuple):
    location: Location
    status: Status
    retry: int
    released: bool = False  # deleted for good: lookups by id no longer find it
    deadline_ms: int = 0  # to CONSUMING: the ack deadline (see Store.ack_deadline)
    # The caller's knowledge of the message, to spare reading its entry: its
    # status before the change (0: unknown, read it) and its topic's hash.
    # Only for a message neither released nor changed earlier in the batch.
    prev_status: int = 0
    topic_hash: int = 0


@dataclass
class _Moves:
    """A MOVE record being built, and what to put back if it is not appended."""
    moves: list[records.MoveItem] = field(default_factory=list)
    states: dict[Location, tuple[int, int, int, int]] = field(default_factory=dict)  # old entries' new state
    undo_hours: dict = field(default_factory=dict)
    undo_slots: dict = field(default_factory=dict)
    undo_ids: list[int] = field(default_factory=list)


class CheckpointReport(NamedTuple):
    commit_offset: int
    segments_deleted: int
    hours_retired: tuple[int, ...]  # ascending


class PreparedCheckpoint(NamedTuple):
    offset: int
    kept: tuple[HourRecord, ...]
    retired: tuple[int, ...]
    now_ms: int
    topic_names: dict[int, str]
    consuming: tuple[tuple[int, int, int], ...]


def total_counts(hours: Iterable[tuple[int, list[int]]]) -> list[int]:
    """Per-status counts (index = status) summed over `topic_hours` rows."""
    total = [0] * 8
    for _, counts in hours:
        total = [a + b for a, b in zip(total, counts)]
    return total


def text_hash(text: str) -> int:
    """Non-zero 32-bit hash of a topic or tag (0 means "no tag")."""
    return (zlib.crc32(text.encode()) or 1) if text else 0


class Store:
    """The disk engine. See the module docstring for the flow of a change.

    Worked example (now = 10:00:00.000 UTC, hour h):
        send([m1 due 10:00:05.250, m2 due 12:30:00.000], now)
          m1 -> hour h,   second 5,    globalIndex 0, localIndex 0
          m2 -> hour h+2, second 1800, globalIndex 0, localIndex 0
        commit()                        # one fsync, then both applied
        read_second(h, 5)  -> [entry of m1]
        update([StateChange(m1.location, Status.ACKED, 0)], now); commit()

    Cost: send and update are O(1) per message plus one record append;
    commit is one fsync plus O(1) writes per message; read_second is O(the
    second's messages); memory is O(hours + pending batch), never O(backlog).
    """

    def __init__(self, directory: str, config: StoreConfig) -> None:
        self.directory = directory
        self.config = config
        self._delay_dir = os.path.join(directory, "delay")
        self._hours: dict[int, Hour] = {}
        self._hour_order = SortedList()
        self._far_open: OrderedDict[int, Hour] = OrderedDict()
        self._near: tuple[int, ...] = ()
        self._now_hour: int | None = None
        self._pending: list[tuple[records.Kind, int, list]] = []
        self._pending_slots: dict[tuple[int, int], tuple[int, int]] = {}
        self._pending_ids: dict[int, list[Message]] = {}
        self._pending_state: dict[Location, tuple[int, int, int, int]] = {}  # status, flags, retry, topic hash
        self._topic_names: dict[int, str] = {}
        # Every CONSUMING message and its ack deadline (0: unknown), kept in
        # the checkpoint and by every record applied: O(messages in flight),
        # which the broker caps.
        self._consuming: dict[Location, int] = {}
        self._dirty: set[Hour] = set()  # hours with staged bytes (see storage.hour)
        self._staged_bytes = 0  # their total, as of the last apply (an upper bound)
        self._pending_far_bytes = 0  # far-hour bytes of sends appended, not applied yet
        # (free bytes at the last statvfs, bytes sent since, sends since): see DISK_RECHECK_SENDS
        self._disk_seen = (0, 0, DISK_RECHECK_SENDS)
        self._closed = False
        self._far_limit = _far_hours_limit(config.open_far_hours)
        self._checkpoint_offset = -1  # commit offset of the last checkpoint read or written
        self.log: CommitLog
        self.ids: IdIndex

    # == opening and recovery ================================================

    @classmethod
    def open(cls, directory: str, config: StoreConfig | None = None, now_ms: int | None = None) -> Store:
        """Open or create a store; repairs derived files from the commit log."""
        store = cls(directory, config or StoreConfig())
        try:
            store._recover()
        except BaseException:  # a refused directory keeps no descriptor open
            store._release_files()
            raise
        if now_ms is not None:
            store.advance(now_ms)
        return store

    def _recover(self) -> None:
        os.makedirs(self._delay_dir, exist_ok=True)
        checkpoint_path = os.path.join(self.directory, "checkpoint")
        ck = Checkpoint.load(checkpoint_path) or Checkpoint()
        self.log = CommitLog.open(os.path.join(self.directory, "commitlog"), self.config.fsync,
                                  self.config.segment_bytes, scan_from=ck.commit_offset)
        if self.log.start_offset > ck.commit_offset or self.log.end_offset < ck.commit_offset:
            raise CorruptionError(checkpoint_path, 0,
                                  f"checkpoint offset {ck.commit_offset} is outside the commit log "
                                  f"[{self.log.start_offset}, {self.log.end_offset}]")
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

    def _decode(self, body: bytes) -> tuple[records.Kind, int, list]:
        """A record from the log or from a leader, its sends keyed with this
        store's id-index secret (the writer's key may come from another)."""
        kind, now_ms, items = records.decode(body)
        key = self.ids.key_of_bytes
        if kind is records.Kind.SEND:
            items = [item._replace(key=key(*delay_log.id_fields(item.body))) for item in items]
        elif kind is records.Kind.MOVE:
            items = [item._replace(to=item.to._replace(key=key(*delay_log.id_fields(item.to.body))))
                     for item in items]
        return kind, now_ms, items

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

    # == hours and their files ===============================================

    def _add_hour(self, h: Hour) -> None:
        self._hours[h.hour] = h
        self._hour_order.add(h.hour)

    def _hour(self, hour: int) -> Hour:
        h = self._hours.get(hour)
        if h is None:
            h = Hour(hour)
            self._add_hour(h)
        return h

    def _files(self, h: Hour) -> HourFiles:
        """Open files of hour `h` (creating them on its first write)."""
        if h.files is not None:
            if not h.files.mapped:
                self._far_open.move_to_end(h.hour)
            return h.files
        mapped = h.hour in self._near
        h.files = HourFiles(self._delay_dir, h.hour, mapped, create=True)
        if not mapped:
            self._far_open[h.hour] = h
            if len(self._far_open) > self._far_limit:
                _, old = self._far_open.popitem(last=False)
                self._close_files(old)
        return h.files

    def _close_files(self, h: Hour) -> None:
        if h.files is not None:
            if h in self._dirty:
                h.flush(h.files)
                self._dirty.discard(h)
            h.files.close(h.entries, h.log_bytes)
            h.files = None
            h.forget_slots()
            self._far_open.pop(h.hour, None)

    def advance(self, now_ms: int) -> None:
        """Tell the store the time; when the hour changes, the mapped pair of
        near hours moves with it."""
        now_hour = now_ms // MS_PER_HOUR
        if now_hour == self._now_hour:
            return
        self._now_hour = now_hour
        near = (now_hour, now_hour + 1)
        for hour in set(self._near) | set(near):
            h = self._hours.get(hour)
            if h is not None and h.files is not None and h.files.mapped != (hour in near):
                self._close_files(h)  # reopened in the right mode on next use
        self._near = near

    # == writing ===============================================================

    def send(self, batch: Sequence[NewMessage], now_ms: int) -> list[SendResult]:
        """Append a batch of new messages as one commit-log record.

        A message whose (topic, msgId) exists (stored, or earlier in this
        batch) is not stored again: its result is DUPLICATE with the stored
        message. Durable, and visible to readers, after `commit()`.
        Raises InvalidRequest (nothing appended) for out-of-range fields,
        and OSError(ENOSPC) (nothing appended) if the disk lacks room for
        what the batch will write (see `_make_room`); if the append itself
        fails, every counter and overlay it touched is put back, so the
        next send numbers on without a gap."""
        self._check_open()
        for i, m in enumerate(batch):
            _validate(m, i)
        if sum(len(m.msg) for m in batch) > MAX_RECORD_CHARS:
            raise InvalidRequest("batch", f"messages total more than {MAX_RECORD_CHARS} characters; split it")
        self.advance(now_ms)
        results: list[SendResult] = []
        items: list[records.SendItem] = []
        hashes: dict[str, int] = {}  # topic and tag hashes, once per batch
        undo_hours: dict[int, tuple[int, int, bool]] = {}  # hour -> (entries, log_bytes, created here)
        undo_slots: dict[tuple[int, int], tuple[int, int] | None] = {}
        undo_ids: list[int] = []
        try:
            self._send_items(batch, now_ms, results, items, hashes, undo_hours, undo_slots, undo_ids)
            if items:
                body = records.encode(records.Kind.SEND, now_ms, items)
                far_bytes = self._make_room(items, undo_hours, len(body))
                self.log.append(body)
                self._pending.append((records.Kind.SEND, now_ms, items))
                self._pending_far_bytes += far_bytes
        except BaseException:
            self._undo_placements(undo_hours, undo_slots, undo_ids)
            raise
        return results

    def _undo_placements(self, undo_hours: dict, undo_slots: dict, undo_ids: list[int]) -> None:
        """Put back every counter and overlay `_place` and `_pend_id` moved
        for a record that was not appended."""
        pending_slots, pending_ids = self._pending_slots, self._pending_ids
        for hour, (entries, log_bytes, created) in undo_hours.items():
            if created:
                h = self._hours.pop(hour)
                self._hour_order.remove(hour)
                if h.files is not None:  # made by _make_room, empty
                    h.files.close(0, 0)
                    for path in hour_paths(self._delay_dir, hour):
                        os.unlink(path)
            else:
                self._hours[hour].entries, self._hours[hour].log_bytes = entries, log_bytes
        for slot, before in undo_slots.items():
            if before is None:
                del pending_slots[slot]
            else:
                pending_slots[slot] = before
        for key in reversed(undo_ids):
            same_key = pending_ids[key]
            same_key.pop()
            if not same_key:
                del pending_ids[key]

    def _send_items(self, batch, now_ms, results, items, hashes, undo_hours, undo_slots, undo_ids) -> None:
        key_of, find, pack_body = self.ids.key_of_bytes, self._find, delay_log.pack_body
        place, pend_id = self._place, self._pend_id
        append_result, append_item = results.append, items.append
        new = tuple.__new__  # NamedTuples built without their Python-level __new__ (the send path's hottest loop)
        for m in batch:
            topic, msg_id = m.topic, m.msg_id
            key = key_of(topic.encode(), msg_id.encode())
            existing = find(key, topic, msg_id)
            if existing is not None:
                append_result(new(SendResult, (DUPLICATE, existing)))
                continue
            body = pack_body(topic, msg_id, m.msg, m.produce_ms, m.ttl_ms, m.max_retry, m.tag, m.key)
            topic_hash = hashes.get(topic)
            if topic_hash is None:
                topic_hash = hashes[topic] = text_hash(topic)
            tag = m.tag
            if tag:
                tag_hash = hashes.get(tag)
                if tag_hash is None:
                    tag_hash = hashes[tag] = text_hash(tag)
            else:
                tag_hash = 0
            trigger_ms = m.trigger_ms
            item = place(trigger_ms if trigger_ms > now_ms else now_ms, trigger_ms, m.priority, topic_hash, tag_hash,
                         key, body, undo_hours, undo_slots)
            append_item(item)
            message = new(Message, (topic, msg_id, m.msg, m.produce_ms, trigger_ms, m.ttl_ms, m.max_retry,
                                    m.priority, tag, WAITING, 0, new(Location, (item.hour, item.global_index)), m.key))
            pend_id(key, message, undo_ids)
            append_result(new(SendResult, (STORED, message)))

    def _place(self, filing_ms: int, trigger_ms: int, priority: int, topic_hash: int, tag_hash: int, key: int,
               body: bytes, undo_hours: dict, undo_slots: dict) -> records.SendItem:
        """The coordinates of a new entry filed under the hour and second of
        `filing_ms`, in the file storage.spans names for that hour now; the
        file's counters and the pending second-table tail move on (their
        previous values noted in `undo_hours` and `undo_slots`)."""
        hour, rest_ms = divmod(filing_ms, MS_PER_HOUR)
        second = rest_ms // MS_PER_SECOND
        file_id = spans.file_for(hour, self._now_hour)
        h = self._hours.get(file_id)
        if file_id not in undo_hours:
            undo_hours[file_id] = (h.entries, h.log_bytes, False) if h is not None else (0, 0, True)
        if h is None:
            h = self._hour(file_id)
        gi = h.entries
        h.entries = gi + 1
        slot = (file_id, second)
        pending_slots = self._pending_slots
        before = pending_slots.get(slot)
        last, count = before or self._slot(h, second)
        frame_size = FRAME_HEADER_BYTES + len(body)
        offset8 = h.log_bytes >> 3
        h.log_bytes += (frame_size + 7) & ~7
        if slot not in undo_slots:
            undo_slots[slot] = before
        pending_slots[slot] = (gi, count + 1)
        return tuple.__new__(records.SendItem, (file_id, gi, last, count, second, offset8, frame_size, trigger_ms,
                                                priority, topic_hash, tag_hash, key, body))

    def _pend_id(self, key: int, message: Message, undo_ids: list[int]) -> None:
        """Make a message appended but not applied findable by its id."""
        same_key = self._pending_ids.get(key)
        if same_key is None:
            self._pending_ids[key] = [message]
        else:
            same_key.append(message)
        undo_ids.append(key)

    def update(self, changes: Iterable[StateChange], now_ms: int) -> None:
        """Append status/retry changes as one record; in place after commit."""
        self._check_open()
        self.advance(now_ms)
        items = []
        staged: dict[Location, tuple[int, int, int, int]] = {}  # published only if every change is valid
        for change in changes:
            hour, gi = change.location
            known = staged.get(change.location)
            if known is None and change.prev_status:
                known = (change.prev_status, 0, change.retry, change.topic_hash)
            status, flags, retry, topic_hash = known or self._state(change.location)
            if topic_hash < 0:
                topic_hash = self._pending_topic_hash(change.location)
            if change.retry < 0 or change.retry > MAX_RETRY_COUNT:
                raise InvalidRequest("retry", f"must be in 0..{MAX_RETRY_COUNT}, got {change.retry}")
            new_flags = flags | (FLAG_RELEASED if change.released else 0)
            items.append(records.StateItem(hour, gi, int(change.status), change.retry, new_flags, status, topic_hash,
                                           change.deadline_ms))
            staged[change.location] = (int(change.status), new_flags, change.retry, topic_hash)
        if items:
            self._append(records.Kind.STATE, now_ms, items)
        self._pending_state.update(staged)  # only once the record is in the log

    def refile(self, now_ms: int, max_moves: int = REFILE_STEP) -> int:
        """Append one MOVE record filing up to `max_moves` waiting messages of
        due spans again, by the rule of storage.spans at `now_ms` (smaller
        spans, or their own hours; an overdue one into the second of
        `now_ms`, as a late send). Returns how many it moved: 0 when no due
        span holds a waiting message whose record is applied. The leader
        calls it (a follower applies its records); like a send, the moves
        are durable and visible after `commit()`, their new entries
        returned by it for the wheel."""
        self._check_open()
        self.advance(now_ms)
        batch = _Moves()
        cursors: dict[Hour, int] = {}
        try:
            for h in self._due_spans(now_ms):
                files = self._readable(h)
                gi = h.refiled
                while gi < h.applied and len(batch.moves) < max_moves:
                    entry, offset8, size, flags = files.read_entry(gi)
                    where = Location(h.hour, gi)
                    status, flags, retry, _ = self._pending_state.get(where) or (entry.status, flags, entry.retry, 0)
                    gi += 1
                    if status != WAITING or flags & FLAG_RELEASED:
                        continue
                    self._move_one(batch, files, entry, offset8, size, flags, status, retry, entry.trigger_ms, now_ms)
                cursors[h] = gi
                if len(batch.moves) >= max_moves:
                    break
            self._append_moves(batch, now_ms)
        except BaseException:
            self._undo_placements(batch.undo_hours, batch.undo_slots, batch.undo_ids)
            raise
        self._pending_state.update(batch.states)
        for h, gi in cursors.items():
            h.refiled = gi
        return len(batch.moves)

    def next_refile_ms(self) -> int | None:
        """When `refile()` next has work: the time the first span holding
        waiting messages not yet moved falls due (None: no such span)."""
        first = None
        for h in self._spans_to_move():
            start = self._span_start(h)
            due_ms = 0 if start is None else (start - (1 << spans.span_shift(h.hour)) + 1) * MS_PER_HOUR
            first = due_ms if first is None else min(first, due_ms)
        return first

    def move(self, changes: Sequence[tuple[Location, int, int]], now_ms: int) -> list[Message]:
        """File messages again with new trigger times, as one MOVE record: each
        (location, trigger_ms, retry) keeps its id, body, priority and tag,
        and becomes WAITING at the place a send at `now_ms` with that
        trigger time would take, with `retry`; the old entry is released
        (storage.records). For a reschedule or a re-drive: the caller
        checks the status allows it, and makes a message due now READY.
        Returns the messages at their new places (pending, as a send's).
        Raises InvalidRequest, appending nothing, for a location that holds
        no live message or one listed twice."""
        self._check_open()
        self.advance(now_ms)
        batch = _Moves()
        moved: list[Message] = []
        try:
            for i, (where, trigger_ms, retry) in enumerate(changes):
                h = self._hours.get(where.hour)
                if h is None or not 0 <= where.global_index < h.applied or where in batch.states:
                    raise InvalidRequest(f"[{i}].location", f"no movable message at {where}")
                if not 0 <= retry <= MAX_RETRY_COUNT:
                    raise InvalidRequest(f"[{i}].retry", f"must be in 0..{MAX_RETRY_COUNT}, got {retry}")
                files = self._readable(h)
                entry, offset8, size, flags = files.read_entry(where.global_index)
                status, flags, _, _ = self._pending_state.get(where) or (entry.status, flags, entry.retry, 0)
                if flags & FLAG_RELEASED:
                    raise InvalidRequest(f"[{i}].location", f"the message at {where} was released")
                moved.append(self._move_one(batch, files, entry, offset8, size, flags, status, retry,
                                            max(0, trigger_ms), now_ms))
            self._append_moves(batch, now_ms)
        except BaseException:
            self._undo_placements(batch.undo_hours, batch.undo_slots, batch.undo_ids)
            raise
        self._pending_state.update(batch.states)
        return moved

    def _append_moves(self, batch: _Moves, now_ms: int) -> None:
        if batch.moves:
            body = records.encode(records.Kind.MOVE, now_ms, batch.moves)
            self._pending_far_bytes += self._make_room([m.to for m in batch.moves], batch.undo_hours, len(body))
            self.log.append(body)
            self._pending.append((records.Kind.MOVE, now_ms, batch.moves))

    def _move_one(self, batch: _Moves, files: HourFiles, entry: IndexEntry, offset8: int, size: int, flags: int,
                  status: int, retry: int, trigger_ms: int, now_ms: int) -> Message:
        """Place one message anew (see `move`), into `batch`."""
        raw = files.read_body(offset8, size)
        body = delay_log.unpack_body(raw)
        key = self.ids.key_of_bytes(body.topic.encode(), body.msg_id.encode())
        to = self._place(max(trigger_ms, now_ms), trigger_ms, entry.priority, entry.topic_hash, entry.tag_hash, key,
                         raw, batch.undo_hours, batch.undo_slots)
        where = entry.location
        batch.moves.append(records.MoveItem(where.hour, where.global_index, status, retry, to))
        batch.states[where] = (Status.DELETED, flags | FLAG_RELEASED | FLAG_MOVED, retry, entry.topic_hash)
        message = Message(body.topic, body.msg_id, body.msg, body.produce_ms, trigger_ms, body.ttl_ms, body.max_retry,
                          entry.priority, body.tag, Status.WAITING, retry, Location(to.hour, to.global_index),
                          body.key)
        self._pend_id(key, message, batch.undo_ids)
        return message

    def _due_spans(self, now_ms: int) -> list[Hour]:
        """Spans that are due and hold waiting messages not yet moved."""
        now_hour = now_ms // MS_PER_HOUR
        due = [h for h in self._spans_to_move()
               if (start := self._span_start(h)) is not None and spans.is_due(h.hour, start, now_hour)]
        due.sort(key=lambda h: h.start)
        return due

    def _spans_to_move(self) -> Iterable[Hour]:
        for file_id in self._hour_order.irange(spans.SPAN_FLAG):
            h = self._hours[file_id]
            if h.refiled < h.entries and any(counts[WAITING] for counts in h.topics.values()):
                yield h

    def _span_start(self, h: Hour) -> int | None:
        """A span's first hour, from its first applied entry (None: none yet)."""
        if h.start is None and h.applied:
            h.start = spans.start_hour(h.hour, self._readable(h).read_entry(0)[0].trigger_ms)
        return h.start

    def _make_room(self, items: list[records.SendItem], hours: Iterable[int], record_bytes: int) -> int:
        """Make sure the writes a send commits the store to will find disk
        room, or refuse it (OSError ENOSPC) before anything is appended: the
        mapped files of near hours are grown now to hold the batch (a write
        through a mapping cannot fail cleanly: it would be SIGBUS), and the
        file system must have room for everything else still to be written
        -- far hours' staged bytes, sends appended but not applied, this
        batch's far-hour bytes, the commit log's next reservation -- plus
        DISK_HEADROOM_BYTES. Returns this batch's far-hour bytes."""
        near = self._near
        grown = 0  # bytes the near hours' files took now (a growth doubles a file)
        for hour in hours:
            if hour in near:
                h = self._hours[hour]
                files = self._files(h)
                before = files.mapped_bytes()
                files.reserve(h.entries, h.log_bytes)
                grown += files.mapped_bytes() - before
        far_bytes = sum(item.frame_size + delay_index.ENTRY_BYTES + 16 for item in items if item.hour not in near)
        need = (self._staged_bytes + self._pending_far_bytes + far_bytes + self.log.allocation_for(record_bytes)
                + 3 * PAGE_BYTES * (len(self._dirty) + 1) + DISK_HEADROOM_BYTES)
        seen_free, spent, sends = self._disk_seen
        spent += record_bytes + far_bytes + grown
        if sends < DISK_RECHECK_SENDS and need + spent + DISK_RECHECK_MARGIN_BYTES <= seen_free:
            self._disk_seen = (seen_free, spent, sends + 1)  # room enough, seen a moment ago: no statvfs
            return far_bytes
        free = free_bytes(self.directory)
        self._disk_seen = (free, 0, 0)
        if free < need:
            raise OSError(errno.ENOSPC, f"the disk holding {self.directory} has {free} bytes free; "
                                        f"this batch needs {need} (writes it commits to, and headroom)")
        return far_bytes

    def _append(self, kind: records.Kind, now_ms: int, items: list) -> None:
        self.log.append(records.encode(kind, now_ms, items))
        self._pending.append((kind, now_ms, items))

    # == replication ============================================================

    def append_replicated(self, offset: int, body: bytes) -> None:
        """A follower appends the leader's record found at `offset`, byte for
        byte, so both logs give it the same offset. Durable and applied by
        the next `commit()`, exactly as if this store had made it."""
        self._check_open()
        if offset != self.log.end_offset:
            raise ValueError(f"record at offset {offset} does not continue this log (it ends at {self.log.end_offset})")
        kind, now_ms, items = self._decode(body)
        self.log.append(body)
        self._pending.append((kind, now_ms, items))

    def read_log(self, offset: int, end_offset: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Records from `offset` (a record boundary) before `end_offset`, at
        least one and about `max_bytes` in all: what a follower fetches."""
        found: list[tuple[int, bytes]] = []
        size = 0
        for at, body in self.log.read_from(offset):
            if at >= end_offset or (found and size + len(body) > max_bytes):
                break
            found.append((at, body))
            size += len(body)
        return found

    @property
    def pending_records(self) -> int:
        """Records appended and not yet applied (see `sync_log`)."""
        return len(self._pending)

    def sync_log(self) -> None:
        """fsync everything appended so far. Safe to run in a worker thread
        while this one keeps appending: read `pending_records` before it, and
        apply that many afterwards (`apply_pending`)."""
        self.log.sync()

    def apply_pending(self, count: int | None = None) -> list[IndexEntry]:
        """Apply the first `count` (default: all) pending records, which must
        be durable, to the derived files. Returns the new index entries."""
        n = len(self._pending) if count is None else count
        batch, self._pending = self._pending[:n], self._pending[n:]
        new_entries: list[IndexEntry] = []
        for kind, now_ms, items in batch:
            self._apply(kind, now_ms, items, new_entries)
        self._flush_staged(everything=False)
        if not self._pending:
            self._pending_far_bytes = 0
            self._pending_slots.clear()
            self._pending_ids.clear()
            self._pending_state.clear()
        return new_entries

    def commit(self) -> list[IndexEntry]:
        """Group commit: one fsync for every change since the last commit,
        then apply them. Returns the index entries of newly stored messages."""
        self._check_open()
        count = self.pending_records
        self.sync_log()
        return self.apply_pending(count)

    # == applying records (normal path and recovery) =========================

    def _apply(self, kind: records.Kind, now_ms: int, items: list, new_entries: list[IndexEntry] | None) -> None:
        if kind is records.Kind.SEND:
            put, dirty, topic_names = self.ids.put, self._dirty, self._topic_names
            add_entry = None if new_entries is None else new_entries.append
            staged: dict[tuple[Hour, int], int] = {}  # (hour, topic hash) -> entries staged: counted once
            h = None
            for item in items:
                if h is None or h.hour != item.hour:
                    h = self._hour(item.hour)
                if h.stage_send(item):
                    counted = (h, item.topic_hash)
                    staged[counted] = staged.get(counted, 0) + 1
                    if item.topic_hash not in topic_names:
                        topic_names[item.topic_hash] = delay_log.unpack_body(item.body).topic
                put(item.key, item.hour, item.global_index)
                dirty.add(h)  # after put: its look at a released message may have flushed h
                if add_entry is not None:
                    add_entry(tuple.__new__(IndexEntry, (
                        item.hour, item.second, item.local_index, item.global_index, item.pre_global_index,
                        item.trigger_ms, item.priority, item.topic_hash, item.tag_hash, WAITING, 0)))
            for (h, topic_hash), count in staged.items():
                h.count(topic_hash, WAITING, count)
            return
        if kind is records.Kind.MOVE:
            self._apply_moves(now_ms, items, new_entries)
            return
        for item in items:
            h = self._hours.get(item.hour)
            if h is None or item.global_index >= h.applied:
                raise LookupError(f"state change for unknown message {item.hour}/{item.global_index}")
            h.stage_state(item.global_index, item.status, item.flags, item.retry)
            self._dirty.add(h)
            if item.status == Status.CONSUMING:
                self._consuming[Location(item.hour, item.global_index)] = item.deadline_ms
            elif item.prev_status == Status.CONSUMING:
                self._consuming.pop(Location(item.hour, item.global_index), None)
            h.count(item.topic_hash, item.prev_status, -1)
            h.count(item.topic_hash, item.status, 1)
            was_final, is_final = item.prev_status >= Status.ACKED, item.status >= Status.ACKED
            if is_final and not was_final:
                h.ended += 1
                h.last_end_ms = max(h.last_end_ms, now_ms)
            elif was_final and not is_final:
                h.ended -= 1

    def _apply_moves(self, now_ms: int, items: list, new_entries: list[IndexEntry] | None) -> None:
        """The old entry ends (status 7, released, moved: it counts as ended
        for its file, as a deleted message for no topic), then the message
        is staged at its new place as a send is."""
        for move in items:
            old = self._hours.get(move.from_hour)
            if old is None or move.from_global_index >= old.applied:
                raise LookupError(f"move of unknown message {move.from_hour}/{move.from_global_index}")
            to = move.to
            old.stage_state(move.from_global_index, Status.DELETED, FLAG_RELEASED | FLAG_MOVED, move.retry)
            self._dirty.add(old)
            old.count(to.topic_hash, move.prev_status, -1)
            if move.prev_status < Status.ACKED:  # (a re-driven one had ended there already)
                old.ended += 1
            if move.prev_status == Status.CONSUMING:
                self._consuming.pop(Location(move.from_hour, move.from_global_index), None)
            old.last_end_ms = max(old.last_end_ms, now_ms)
            h = self._hour(to.hour)
            if h.stage_send(to):
                h.count(to.topic_hash, WAITING, 1)
                if move.retry:
                    h.stage_state(to.global_index, WAITING, 0, move.retry)
            self.ids.put(to.key, to.hour, to.global_index)  # after the old one's release: it reuses its slot
            self._dirty.add(h)
            if new_entries is not None:
                new_entries.append(IndexEntry(
                    to.hour, to.second, to.local_index, to.global_index, to.pre_global_index, to.trigger_ms,
                    to.priority, to.topic_hash, to.tag_hash, WAITING, move.retry))

    def _flush_staged(self, everything: bool) -> None:
        """Write staged bytes: always for near hours (the dispatcher reads
        them soon), for far hours only past STAGE_LIMIT_BYTES or when asked."""
        if not self._dirty:
            self._staged_bytes = 0
            return
        staged = 0
        if not everything:
            staged = sum(h.staged_bytes for h in self._dirty)
            everything = staged > STAGE_LIMIT_BYTES
        for h in list(self._dirty):
            if everything or h.hour in self._near:
                h.flush(self._files(h))
                self._dirty.discard(h)
        self._staged_bytes = 0 if everything else staged

    def _readable(self, h: Hour) -> HourFiles:
        """h's files with everything staged for h written."""
        files = self._files(h)
        if h in self._dirty:
            h.flush(files)
            self._dirty.discard(h)
        return files

    # == reading ================================================================

    def get(self, topic: str, msg_id: str) -> Message | None:
        """The message stored under (topic, msgId), or None (never stored,
        released, or its hour retired)."""
        self._check_open()
        return self._find(self.ids.key(topic, msg_id), topic, msg_id)

    def _find(self, key: int, topic: str, msg_id: str) -> Message | None:
        for message in self._pending_ids.get(key, ()):
            if message.topic == topic and message.msg_id == msg_id:
                found = self.read_message(message.location, message)
                if found is not None:  # released in this batch: a later resend may follow
                    return found
        for where in self.ids.candidates(key):
            h = self._hours[where.hour]
            if where.global_index >= h.applied:
                continue
            message = self.read_message(where)
            if message is not None and message.topic == topic and message.msg_id == msg_id:
                return message
        return None

    def read_entry(self, where: Location) -> IndexEntry:
        """The index entry at `where`, with any pending status change."""
        entry, _, _, _ = self._readable(self._hours[where.hour]).read_entry(where.global_index)
        pending = self._pending_state.get(where)
        if pending is not None:
            entry = entry._replace(status=Status(pending[0]), retry=pending[2])
        return entry

    def status(self, where: Location) -> Status:
        """The status at `where`, pending changes included (no body read)."""
        return Status(self._state(where)[0])

    def ack_deadline(self, where: Location) -> int | None:
        """The ack deadline of a CONSUMING message, if its pull's record gave
        one (records since version 2 of the checkpoint all do)."""
        return self._consuming.get(where) or None

    def consuming(self) -> dict[Location, int]:
        """Every CONSUMING message (as of the records applied) and its ack
        deadline, 0 where unknown: found without a scan, from the checkpoint
        and the records replayed after it (a checkpoint written before the
        set was kept costs one scan of the hours holding any, at open)."""
        return dict(self._consuming)

    def scan_ready(self, topic_hash: int, start: Location, until_hour: int, max_scan: int,
                   max_found: int) -> tuple[list[IndexEntry], Location | None]:
        """READY entries of a topic (pending changes included), in filing
        order -- hour ascending, then globalIndex -- from `start`, in hours up
        to `until_hour`: at most `max_found` of them, reading at most about
        `max_scan` entries. Returns them and where to go on (None: nothing
        more up to `until_hour` now). Only hours whose counts hold live
        messages of the topic are read, a slice of raw entries at a time."""
        return self.scan_status(topic_hash, (Status.READY,), start, until_hour, max_scan, max_found,
                                worth_reading=(Status.WAITING, Status.READY, Status.CONSUMING))

    def scan_status(self, topic_hash: int, statuses: Sequence[Status], start: Location, until_hour: int,
                    max_scan: int, max_found: int, worth_reading: Sequence[Status] = ()
                    ) -> tuple[list[IndexEntry], Location | None]:
        """As `scan_ready`, for entries in any of `statuses` (dead letters:
        EXPIRED and ENDED), released ones left out. An hour is read only if
        its committed counts hold the topic in one of `worth_reading`
        (default: `statuses`; a change to them still pending is seen only
        in hours read)."""
        self._check_open()
        found: list[IndexEntry] = []
        scanned = 0
        pending = self._pending_state
        wanted = frozenset(int(s) for s in statuses)
        worth = tuple(worth_reading or statuses)
        i = self._hour_order.bisect_left(start.hour)
        # `start` may lie in an hour no longer held (retired since): then the
        # next hour is read from its first entry
        first = start.global_index if i < len(self._hour_order) and self._hour_order[i] == start.hour else 0
        while i < len(self._hour_order):
            hour = self._hour_order[i]
            if hour > until_hour:
                break
            h = self._hours[hour]
            counts = h.topics.get(topic_hash)
            if counts is None or not any(counts[s] for s in worth):
                i, first = i + 1, 0
                continue
            files = self._readable(h)
            while first < h.applied:
                if scanned >= max_scan or len(found) >= max_found:
                    return found, Location(hour, first)
                n = min(SCAN_SLICE, h.applied - first)
                raw = files.idx.read(delay_index.entry_offset(first), n * delay_index.ENTRY_BYTES)
                gi = first
                for fields in delay_index.ENTRY.iter_unpack(raw):
                    if fields[6] == topic_hash:
                        status = fields[11]
                        if pending:
                            p = pending.get((hour, gi))
                            if p is not None:
                                status = p[0]
                        if status in wanted and not fields[12] & FLAG_RELEASED:
                            at = (gi - first) * delay_index.ENTRY_BYTES
                            entry = delay_index.unpack_entry(files.idx.path, hour, gi,
                                                             raw[at:at + delay_index.ENTRY_BYTES])[0]
                            found.append(entry._replace(status=Status(status)) if entry.status != status else entry)
                            if len(found) >= max_found:
                                gi += 1
                                break
                    gi += 1
                scanned += gi - first
                first = gi
            i, first = i + 1, 0
        return found, None

    def read_message(self, where: Location, pending_message: Message | None = None) -> Message | None:
        """The whole message at `where`; None once it has been released."""
        h = self._hours.get(where.hour)
        if pending_message is not None or h is None or not 0 <= where.global_index < h.applied:
            status, flags, retry, _ = self._state(where)
            if flags & FLAG_RELEASED:
                return None
            if pending_message is not None:
                return pending_message._replace(status=Status(status), retry=retry)
        files = self._readable(h)
        entry, offset8, size, flags = files.read_entry(where.global_index)
        pending = self._pending_state.get(where)
        if pending is None:
            status, retry = entry.status, entry.retry
        else:
            status, flags, retry = pending[0], pending[1], pending[2]
        if flags & FLAG_RELEASED:
            return None
        body = delay_log.unpack_body(files.read_body(offset8, size))
        return Message(body.topic, body.msg_id, body.msg, body.produce_ms, entry.trigger_ms, body.ttl_ms,
                       body.max_retry, entry.priority, body.tag, Status(status), retry, where, body.key)

    def _state(self, where: Location) -> tuple[int, int, int, int]:
        """(status, flags, retry, topic hash) at `where`, pending changes included."""
        pending = self._pending_state.get(where)
        if pending is not None:
            return pending
        h = self._hours.get(where.hour)
        if h is None or not 0 <= where.global_index < h.entries:
            raise InvalidRequest("location", f"no message at {where}")
        if where.global_index >= h.applied:  # sent in this batch, not applied yet
            return Status.WAITING, 0, 0, -1  # topic hash: see _pending_topic_hash
        entry, _, _, flags = self._readable(h).read_entry(where.global_index)
        return int(entry.status), flags, entry.retry, entry.topic_hash

    def _pending_topic_hash(self, where: Location) -> int:
        for kind, _, items in self._pending:
            if kind is records.Kind.SEND:
                for item in items:
                    if item.hour == where.hour and item.global_index == where.global_index:
                        return item.topic_hash
        raise AssertionError(f"{where} is neither applied nor pending")

    def _slot(self, h: Hour, second: int) -> tuple[int, int]:
        """(last, count) of a second for the next send: staged or on disk
        (the caller has looked at the not-yet-durable ones)."""
        staged = h.slot(second)
        if staged is not None:
            return staged
        if h.applied == 0:
            return -1, 0  # nothing of this hour is on disk yet
        slot = self._files(h).read_slot(second)
        h.know_slot(second, slot)
        return slot

    def read_second(self, hour: int, second: int) -> list[IndexEntry]:
        """Every applied entry filed under `second` of `hour`, localIndex
        ascending, found by walking preGlobalIndex back from the second
        table: cost proportional to that second's entries."""
        self._check_open()
        h = self._hours.get(hour)
        if h is None:
            return []
        files = self._readable(h)
        last, count = files.read_slot(second)
        if count and last >= h.applied:
            raise CorruptionError(files.sec.path, 0, f"second {second} points at entry {last}, past the end")
        out = []
        gi = last
        for expected_local in range(count - 1, -1, -1):
            entry, _, _, _ = files.read_entry(gi)
            if entry.local_index != expected_local or entry.second != second:
                raise CorruptionError(files.idx.path, delay_index.entry_offset(gi),
                                      f"chain of second {second} broken at entry {gi}")
            out.append(entry)
            gi = entry.pre_global_index
        out.reverse()
        return out

    def second_counts(self, hour: int) -> Sequence[int]:
        """Entries per second of `hour` (3600 values)."""
        h = self._hours.get(hour)
        if h is None:
            return [0] * SECONDS_PER_HOUR
        return self._readable(h).counts()

    def next_hour(self, from_hour: int) -> int | None:
        """The first hour >= `from_hour` that holds any entry (spans, which
        sort after every hour, are not hours)."""
        i = self._hour_order.bisect_left(from_hour)
        if i < len(self._hour_order) and not spans.is_span(self._hour_order[i]):
            return self._hour_order[i]
        return None  # (spans are for refile(), never for the wheel)

    def file_hours(self, file_id: int) -> tuple[int, int]:
        """[first, last] hour a file covers: the hour itself, or a span's
        hours (storage.spans)."""
        h = self._hours.get(file_id)
        if h is None or not spans.is_span(file_id):
            return file_id, file_id
        start = self._span_start(h)
        if start is None:  # nothing applied yet: a span starts at least its size from now
            start = self._now_hour or 0
        return start, start + (1 << spans.span_shift(file_id)) - 1

    def hours(self) -> list[tuple[int, int, int]]:
        """(hour, entries, ended) of every live hour, ascending."""
        return [(hour, self._hours[hour].entries, self._hours[hour].ended) for hour in self._hour_order]

    # == per-topic counts (committed changes only) ==============================

    def topic_names(self) -> dict[int, str]:
        """topic hash -> topic, for every topic with a message in a live hour."""
        return dict(self._topic_names)

    def has_topic(self, topic: str) -> bool:
        """`topic` has a message in a live hour (as `topic_names`, O(1))."""
        return self._topic_names.get(text_hash(topic)) == topic

    def topic_hours(self, topic_hash: int) -> list[tuple[int, list[int]]]:
        """(hour, counts) of every live hour holding messages of the topic,
        ascending; counts[s] is how many are in status s (index 0 unused)."""
        out = []
        for hour in self._hour_order:
            counts = self._hours[hour].topics.get(topic_hash)
            if counts is not None and any(counts):
                out.append((hour, list(counts)))
        return out

    def file_counts(self) -> list[tuple[int, list[int]]]:
        """(file id, messages per status over all topics) of every live
        hour and span, ascending: O(files), from totals kept with the
        per-topic counts."""
        return [(hour, list(self._hours[hour].totals)) for hour in self._hour_order]

    def first_hours(self, status: Status) -> dict[int, int]:
        """topic hash -> the first live hour holding a message of the topic
        in `status` (committed changes): one pass over the hours' counts."""
        first: dict[int, int] = {}
        for hour in self._hour_order:
            for topic_hash, counts in self._hours[hour].topics.items():
                if counts[status] and topic_hash not in first:
                    first[topic_hash] = hour
        return first

    def topic_counts(self, topic_hash: int) -> list[int]:
        """The topic's messages per status over all live hours (index 0 unused)."""
        return total_counts(self.topic_hours(topic_hash))

    def hour_entries(self, hour: int, first: int = 0, count: int | None = None) -> list[IndexEntry]:
        """Applied entries of `hour` from globalIndex `first` (`count` of them,
        default all), ascending: a sequential read of the hour's index, for
        scans (recovery of ready and consuming messages, delay histograms);
        O(the entries read). [] once past the end or for an unknown hour."""
        self._check_open()
        h = self._hours.get(hour)
        if h is None:
            return []
        files = self._readable(h)
        stop = h.applied if count is None else min(h.applied, first + count)
        out = [files.read_entry(gi)[0] for gi in range(first, stop)]
        pending = self._pending_state
        if pending:
            out = [e if (s := pending.get(e.location)) is None else e._replace(status=Status(s[0]), retry=s[2])
                   for e in out]
        return out

    # == checkpoint, retention, close ========================================

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
        return PreparedCheckpoint(self.log.end_offset, kept, retired, now_ms, dict(self._topic_names), consuming)

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
        return (self.log.end_offset != self._checkpoint_offset or bool(self._pending)
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

    def close(self) -> None:
        """Commit what is pending and close every file (no checkpoint: the
        next open replays from the last one)."""
        if self._closed:
            return
        self.commit()
        self._flush_staged(everything=True)
        for h in list(self._hours.values()):
            self._close_files(h)
        self.ids.close()
        self.log.close()
        self._closed = True

    def _release_files(self) -> None:
        for h in self._hours.values():
            if h.files is not None:  # closed as they are: a refused directory is not cut
                for f in (h.files.log, h.files.idx, h.files.sec):
                    f.close()
                h.files = None
        for part in ("ids", "log"):
            opened = self.__dict__.get(part)
            if opened is not None:
                opened.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.directory!r} is closed")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Store({self.directory!r}, hours={len(self._hours)}, log_end={self.log.end_offset}, "
                f"pending_records={len(self._pending)}, fsync={self.config.fsync.value})")


def _far_hours_limit(wanted: int) -> int:
    """How many far hours may be open at once: each holds three file
    descriptors, so raise the soft limit as far as allowed and stay below it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(4, min(wanted, (soft - 256) // 3))


def _validate(m: NewMessage, index: int) -> None:
    where = f"[{index}]."
    if not m.topic:
        raise InvalidRequest(where + "topic", "must not be empty")
    if not m.msg_id:
        raise InvalidRequest(where + "msgId", "must not be empty")
    if m.trigger_ms < 0:
        raise InvalidRequest(where + "triggerTime", f"must be >= 0, got {m.trigger_ms}")
    if m.ttl_ms < 0:
        raise InvalidRequest(where + "ttlMillis", f"must be >= 0, got {m.ttl_ms}")
    if not 0 <= m.max_retry <= MAX_RETRY_COUNT:
        raise InvalidRequest(where + "maxRetry", f"must be in 0..{MAX_RETRY_COUNT}, got {m.max_retry}")
    if not MIN_PRIORITY <= m.priority <= MAX_PRIORITY:
        raise InvalidRequest(where + "priority", f"must be in {MIN_PRIORITY}..{MAX_PRIORITY}, got {m.priority}")
