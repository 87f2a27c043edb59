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
    ends/                 location -> when it ended, for topics with a
                          dedup window (storage.end_index)

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

Concurrency: one thread calls everything, except that `sync_log()` and
`sync_checkpoint()` may run in a worker thread while that thread keeps
appending.

`Store` is the one front door: it checks that it is open and hands each
call to the part that does it. The parts are plain classes, built by
`Store.open` and kept as private fields; each owns its state, and reaches
another part only through the methods of one it was handed when built:

    _hours      HourTable (storage.hour_table)
                owns every hour's counters and write stage, the cache of
                open files and the near pair; handed nothing
    _pending    Pending (storage.pending)
                owns the records appended and not applied, and the
                overlays later calls see them through; handed the log
    _applier    Applier (storage.applying)
                group commit and applying; owns the topic names and the
                in-flight set; handed the hours, id index, log, pending
    _reader     Reader (storage.reading)
                lookups and scans, owns nothing; handed the hours,
                pending, id index
    _placement  Placement (storage.placement)
                sends and status changes; owns the disk-room check;
                handed the hours, pending, id index, log, reader
    _refiler    Refiler (storage.refile)
                moves and span refiling, owns nothing; handed the hours,
                pending, id index, placement
    _retention  Retention (storage.retention)
                checkpoints and retirement; owns the last checkpoint's
                offset; handed the hours, pending, applier, log, id index
    log, ids    the commit log (storage.commit_log) and the id index
                (storage.id_index), public fields; the id index is handed
                the hour table's `__contains__` and `released`
    keys, ends  the key index (storage.key_index) and the end index
                (storage.end_index: when a windowed topic's messages
                ended), public fields; the applier puts into both
    disk        the Disk (storage.disk) every call where the disk can fail
                goes through, a public field: handed to the log, the hour
                table, the indexes, Placement and Retention

Who calls whom: `Store` calls every part; Placement asks the Reader (is
this id stored? what is that message's state? a second's tail) and moves
the hours' counters and Pending's overlays; Refiler places, undoes and
makes room through Placement; Retention commits through the Applier and
saves what it keeps; the Applier takes Pending's records and stages them
into the hours. Nothing calls back up, and no part holds another's state.

Opening is a step over the parts, not a part (storage.recovery): the
checkpoint and log are opened, the hour table and id index built from
them, the other parts built, and the log replayed through the Applier
that serves every later commit. Values callers pass and get back are in
storage.types.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet  # (typing's name for it is deprecated)

from . import records, recovery
from .applying import Applier, Lease
from .checkpoint import Checkpoint
from .commit_log import CommitLog
from .config import StoreConfig
from .delay_index import FLAG_END_TIME, FLAG_RELEASED
from .disk import DISK, Disk
from .end_index import EndIndex
from .entry import STATUS_BY_VALUE, IndexEntry, Location, Message, Status
from .errors import ContractError, CorruptionError, StoreClosedError
from .files import far_hours_limit
from .hour_table import HourTable
from .id_index import IdIndex, Residency
from .key_index import BucketPlaces, KeyBucket, KeyIndex, KeyPart, key_dir, open_key_index
from .pending import Pending
from .placement import Placement
from .reading import Match, Reader, ScanFloors
from .refile import REFILE_STEP, Refiler
from .retention import Retention
from .types import (
    MAX_FAIR_KEY_BYTES,
    MAX_PRIORITY,
    MAX_RECORD_CHARS,
    MAX_RETRY_COUNT,
    MIN_PRIORITY,
    CheckpointReport,
    Intent,
    NewMessage,
    PreparedCheckpoint,
    SendOutcome,
    SendResult,
    StateChange,
    text_hash,
    total_counts,
)

__all__ = [
    "MAX_FAIR_KEY_BYTES", "MAX_PRIORITY", "MAX_RECORD_CHARS", "MAX_RETRY_COUNT", "MIN_PRIORITY", "CheckpointReport",
    "Intent", "NewMessage", "PreparedCheckpoint", "SendOutcome", "SendResult", "StateChange", "Store", "text_hash", "total_counts",
]

# Places of a key's bucket `keyed` takes at a time (it reads them all, in one call).
KEY_PLACES_SLICE = 65_536


class Store:
    """The disk engine. See the module docstring for the flow of a change
    and the parts that carry it.

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

    def __init__(self, directory: str, config: StoreConfig, log: CommitLog, hours: HourTable, ids: IdIndex,
                 checkpoint: Checkpoint, keys: KeyIndex | None, disk: Disk, ends: EndIndex | None = None) -> None:
        """Build the parts over what `open` opened on `disk`: the log, the
        hour table the checkpoint filled, and the id index over it. Use
        `open`."""
        self.directory = directory
        self.config = config
        self.log = log
        self.ids = ids
        self.disk = disk
        self.keys = keys  # the key index (storage.key_index); None: lookups by key scan
        self._closed = False
        self._hours = hours
        self._pending = Pending(log)
        consuming = {Location(hour, gi): Lease(deadline, delivery)
                     for hour, gi, deadline, delivery in checkpoint.consuming or ()}
        self._applier = Applier(hours, ids, log, self._pending, dict(checkpoint.topic_names), consuming,
                                keys, ends, lambda: EndIndex.open(os.path.join(directory, "ends"), config,
                                                                  hours.__contains__, disk, ids.residency))
        # The names of the topics with a message in a live hour (as
        # `has_topic`), the applier's own set: read it, never change it.
        self.topic_set: AbstractSet[str] = self._applier.topics_by_name
        self._reader = Reader(hours, self._pending, ids)
        self._placement = Placement(directory, hours, self._pending, ids, log, self._reader, disk)
        self._refiler = Refiler(hours, self._pending, ids, self._placement)
        # send(batch, now_ms, checked=False) -- append a batch of new
        # messages as one commit-log record: the placement's own method
        # (its contract there), no forwarding frame between.
        self.send = self._placement.send
        # Two steps of every commit round, the parts' own methods (no
        # forwarding frame between):
        # sync_log() -- fsync everything appended so far. Safe to run in a
        # worker thread while this one keeps appending: read
        # `pending_records` before it, and apply that many afterwards.
        self.sync_log = log.sync
        # apply_pending(count=None, defer=False) -- apply the first `count`
        # (default: all) pending records, which must be durable, to the
        # derived files; returns the new index entries. `defer`: the PARTs
        # a COMMIT applies are left to `apply_deferred`.
        self.apply_pending = self._applier.apply_pending
        # The applier's bulk-call parts: held until their COMMIT, and
        # committed but not applied yet (`apply_deferred`). Read them to
        # know whether a round has that to do; never change them.
        self.held_parts: Mapping[int, object] = self._applier.held
        self.deferred_parts: Sequence[object] = self._applier.deferred
        self._retention = Retention(directory, config, hours, self._pending, self._applier, log,
                                    checkpoint.commit_offset, disk)

    @classmethod
    def open(cls, directory: str, config: StoreConfig | None = None, now_ms: int | None = None,
             disk: Disk = DISK) -> Store:
        """Open or create a store; repairs derived files from the commit log
        (storage.recovery). `disk`: what it reserves blocks, reads the free
        space and makes data durable through (storage.disk; a test hands it
        one that fails)."""
        config = config or StoreConfig()
        checkpoint, log = recovery.open_log(directory, config, disk)
        hours = HourTable(os.path.join(directory, "delay"), far_hours_limit(config.open_far_hours), disk)
        ids: IdIndex | None = None
        keys: KeyIndex | None = None
        ends: EndIndex | None = None
        try:
            recovery.load_hours(hours, checkpoint)
            residency = Residency(config.index_resident_bytes)  # (the indexes' one budget: --index-resident-mb)
            ids = recovery.open_id_index(os.path.join(directory, "ids"), config, hours, disk, residency)
            keys = open_key_index(key_dir(directory), config, hours, disk, residency)
            ends_dir = os.path.join(directory, "ends")
            if os.path.isdir(ends_dir):  # (else made when a first end is kept: Applier)
                ends = EndIndex.open(ends_dir, config, hours.__contains__, disk, residency)
            store = cls(directory, config, log, hours, ids, checkpoint, keys, disk, ends)
            recovery.replay(checkpoint, log, hours, store._applier, store._reader)
        except BaseException:  # a refused directory keeps no descriptor open, and is not cut
            hours.release()
            if ids is not None:
                ids.close()
            if keys is not None:
                keys.close()
            if ends is not None:
                ends.close()
            log.close()
            raise
        if now_ms is not None:
            store.advance(now_ms)
        return store

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.directory!r} is closed")

    # == time =================================================================

    def advance(self, now_ms: int) -> None:
        """Tell the store the time; when the hour changes, the mapped pair of
        near hours moves with it."""
        self._hours.advance(now_ms)

    # == changes: storage.placement, storage.refile ===========================

    def update(self, changes: Iterable[StateChange], now_ms: int, part_of: int = 0) -> None:
        """Append status/retry changes as one record; in place after commit.
        `part_of` (a call id, not 0): as a PART of that call (storage.records),
        held until `commit_parts(part_of)` is applied; readers see the
        changes at once, as any record's."""
        self._check_open()
        self._placement.update(changes, now_ms, part_of)

    def commit_parts(self, call_id: int, now_ms: int) -> None:
        """Append the COMMIT record of a call's PARTs: applied, it applies
        them (other calls' stay held). Call id 0 drops every PART held
        (a node that starts to serve abandons a call it holds parts of)."""
        self._check_open()
        items = [records.CommitItem(call_id)]
        self._pending.append(records.encode(records.Kind.COMMIT, now_ms, items), records.Kind.COMMIT, now_ms, items)

    def intend(self, call_id: int, topic: str, shift_ms: int | None, trigger_ms: int | None,
               places: array[int], now_ms: int) -> None:
        """Append the INTENT record of a large move (storage.records): once
        durable, the call is carried out whole, by this node or, after a
        crash or a failover, by the one that next starts to serve
        (`intents`), until `done(call_id)`. `places`: an array "q" of
        (hour, globalIndex) pairs, flat."""
        self._check_open()
        if sys.byteorder == "big":
            places = array("q", places)
            places.byteswap()
        items = [records.IntentItem(call_id, topic, shift_ms, trigger_ms, places.tobytes())]
        self._pending.append(records.encode(records.Kind.INTENT, now_ms, items), records.Kind.INTENT, now_ms, items)

    def done(self, call_id: int, now_ms: int) -> None:
        """Append the DONE record of an INTENT's call: carried out."""
        self._check_open()
        items = [records.CommitItem(call_id)]
        self._pending.append(records.encode(records.Kind.DONE, now_ms, items), records.Kind.DONE, now_ms, items)

    def intents(self) -> list[Intent]:
        """The INTENTs applied whose DONE has not been (commit first), in log order."""
        found = []
        for item in self._applier.intents():
            packed = array("q", item.places)
            if sys.byteorder == "big":
                packed.byteswap()
            places = [Location(packed[i], packed[i + 1]) for i in range(0, len(packed), 2)]
            found.append(Intent(item.call_id, item.topic, item.shift_ms, item.trigger_ms, places))
        return found

    def intents_held(self) -> bool:
        """Whether an INTENT waits for its DONE (`intents` without decoding their places)."""
        return bool(self._applier.intents())

    def parts_held(self) -> bool:
        """Whether PART records wait for their COMMIT (or committed ones
        for `apply_deferred`), or an INTENT for its DONE: no checkpoint is
        taken meanwhile (the log holds them until then)."""
        return self._applier.parts_pending() or self.intents_held()

    def deferred_items(self) -> int:
        """Status changes of committed PARTs not applied yet (`apply_deferred`)."""
        return self._applier.deferred_items()

    def apply_deferred(self, max_items: int | None) -> bool:
        """Apply committed PARTs left by `apply_pending(defer=True)`, about
        `max_items` status changes; True while some are left. What they
        staged is written at once, in far hours too: left staged, a
        delete-all's states piled up until the stage limit and were then
        written in one go (half a million writes, 0.8 s, the event loop
        held)."""
        applier = self._applier
        if not applier.parts_pending():
            return False
        more = applier.apply_deferred(max_items)
        self._hours.flush_staged(everything=True)
        return more

    def move(self, changes: Sequence[tuple[Location, int, int]], now_ms: int, redrive: bool = False) -> list[Message]:
        """File messages again with new trigger times, as one MOVE record: each
        (location, trigger_ms, retry) keeps its id, body, priority and tag,
        and becomes WAITING at the place a send at `now_ms` with that
        trigger time would take, with `retry`; the old entry is released
        (storage.records). For a reschedule or a re-drive: the caller
        checks the status allows it, and makes a message due now READY.
        Returns the messages at their new places (pending, as a send's).
        Raises InvalidRequest, appending nothing, for a location that holds
        no live message or one listed twice. `redrive`: a redriveMsgs
        job's move, each body filed with its redriveCount one more
        (storage.delay_log)."""
        self._check_open()
        return self._refiler.move(changes, now_ms, redrive)

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
        return self._refiler.refile(now_ms, max_moves)

    def next_refile_ms(self) -> int | None:
        """When `refile()` next has work: the time the first span holding
        waiting messages not yet moved falls due (None: no such span)."""
        return self._refiler.next_refile_ms()

    # == group commit: storage.applying =======================================

    @property
    def pending_records(self) -> int:
        """Records appended and not yet applied (see `sync_log`)."""
        return len(self._pending)

    def commit_point(self) -> tuple[int, int]:
        """(`pending_records`, `log_end_offset`): what a commit round now
        would make durable, read together."""
        return len(self._pending.records), self.log.end_offset

    def commit(self) -> list[IndexEntry]:
        """Group commit: one fsync for every change since the last commit,
        then apply them. Returns the index entries of newly stored messages."""
        self._check_open()
        return self._applier.commit()

    # == reads: storage.reading ===============================================

    def get(self, topic: str, msg_id: str) -> Message | None:
        """The message stored under (topic, msgId), or None (never stored,
        released, or its hour retired)."""
        self._check_open()
        return self._reader.get(topic, msg_id)

    def read_entry(self, where: Location) -> IndexEntry:
        """The index entry at `where`, with any pending status change."""
        return self._reader.read_entry(where)

    def status(self, where: Location) -> Status:
        """The status at `where`, pending changes included (no body read)."""
        return self._reader.status(where)

    def live_state(self, where: Location) -> tuple[Status, int] | None:
        """(status, retry) at `where`, pending changes included; None once
        the entry is released (moved, or its id freed): no body read."""
        status, flags, retry, _ = self._reader.state(where)
        return None if flags & FLAG_RELEASED else (STATUS_BY_VALUE[status], retry)

    # == ends, for a topic's dedup window (storage.end_index) =================

    @property
    def ends(self) -> EndIndex | None:
        """When ended messages ended (storage.end_index); None: none kept
        yet (the index is made with the first end a dedup window keeps)."""
        return self._applier.ends

    def keep_ends(self, topic: str, keep: bool) -> None:
        """Keep (or no longer keep) the end time of each message of `topic`
        that ends from now on: a change that ends one is marked so, and
        applying it puts the time in the end index."""
        topic_hash = text_hash(topic)
        if keep:
            self._placement.end_topics.add(topic_hash)
        else:
            self._placement.end_topics.discard(topic_hash)

    def ended_at(self, where: Location, now_ms: int) -> int | None:
        """When the ended message at `where` ended, or was last sent again
        (`seen_again`), if that was kept (`keep_ends`) -- `now_ms` for a
        change appended and not applied yet --; None if not kept, or kept
        2**31 ms (24.8 days) or more before `now_ms`."""
        pending = self._pending.states.get(where)
        if pending is not None and pending[1] & FLAG_END_TIME:
            return now_ms
        return None if self.ends is None else self.ends.ended_at(where, now_ms)

    def seen_again(self, places: Iterable[Location], now_ms: int) -> None:
        """The end times kept for the ended messages at `places` moved on to
        `now_ms` (a duplicate send a dedup window answered): one record,
        durable and applied at the next commit."""
        self._check_open()
        self._placement.seen_again(places, now_ms)

    def keyed(self, topic: str, key: str) -> list[Message] | None:
        """Every unreleased message of `topic` sent with serial key `key`, in
        live files, any status, found through the key index (none kept:
        None, scan instead), in one go (the broker reads a slice at a
        time: `key_buckets`, `key_places`). Pending records are not in it:
        commit first."""
        parts = self.key_parts(topic, key)
        if parts is None:
            return None
        found: list[Message] = []
        for part in parts:
            buckets = self.key_buckets(topic, key, part)
            if buckets is None:
                return None
            handed: list[int] = []
            for bucket in buckets:
                places = self.key_places(bucket, handed)
                if places is None:
                    return None
                while not places.done:
                    where = self.take_key_places(places, KEY_PLACES_SLICE)
                    if where is None:
                        return None
                    found += self.keyed_messages(topic, key, where)
        return found

    def key_parts(self, topic: str, key: str) -> list[KeyPart] | None:
        """The parts of the key index holding `key`'s messages in `topic`
        (storage.key_index): LATE ones first, then by the start of their
        time range, so a page in trigger order can stop early. None: no
        key index (scan instead) or a damaged slot."""
        self._check_open()
        if self.keys is None:
            return None
        hours = self._hours
        files = [(h.hour, start) for h in hours.ascending() if (start := hours.span_start(h)) is not None]
        try:
            return self.keys.parts(self.keys.key(topic, key), files)
        except CorruptionError:  # a damaged slot: the caller scans (the index is rebuilt at the next open)
            return None

    def key_buckets(self, topic: str, key: str, part: KeyPart) -> list[KeyBucket] | None:
        """The buckets of one part of `key` (see `key_parts`), by the start
        of their time range: bounded probes, whatever the key's count. None:
        no key index, or a damaged slot."""
        self._check_open()
        if self.keys is None:
            return None
        try:
            return self.keys.buckets(self.keys.key(topic, key), part)
        except CorruptionError:
            return None

    def key_places(self, bucket: KeyBucket, handed: list[int]) -> BucketPlaces | None:
        """What hands out the places of a bucket, a slice at a time
        (`take_key_places`); `handed`, what was handed out of its part
        (storage.key_index.BucketPlaces: one list for a part's buckets,
        which they fill). None: no key index."""
        return None if self.keys is None else BucketPlaces(self.keys, bucket, handed)

    def take_key_places(self, places: BucketPlaces, limit: int) -> list[Location] | None:
        """At most `limit` places of a bucket not handed out before (and at
        most `limit` of its runs read), until `places.done` (none for a
        file retired since); None on a damaged slot."""
        self._check_open()
        file_id = places.file_id
        if file_id not in self._hours:
            places.finish()
            return []
        try:
            handed = places.take(limit)
        except CorruptionError:
            return None
        new = tuple.__new__
        return [new(Location, (file_id, gi)) for first, length in handed for gi in range(first, first + length)]

    def keyed_messages(self, topic: str, key: str, places: Iterable[Location]) -> list[Message]:
        """The unreleased messages of `topic` with serial key `key` at `places`
        (the key index's: `take_key_places`)."""
        read, found = self._reader.read_message, []
        for where in places:
            m = read(where)
            if m is not None and m.key == key and m.topic == topic:
                found.append(m)
        return found

    def keyed_entries(self, topic: str, places: Iterable[Location]) -> list[tuple[Location, int]]:
        """(place, trigger time) of the unreleased entries of `topic` at
        `places` (the key index's) -- their bodies not read, so a message
        of another key whose slot collides may be among them: confirm by
        reading it."""
        topic_hash, live_entry, found = text_hash(topic), self._reader.live_entry, []
        for where in places:
            entry = live_entry(where)
            if entry is not None and entry.topic_hash == topic_hash:
                found.append((where, entry.trigger_ms))
        return found

    def read_message(self, where: Location) -> Message | None:
        """The whole message at `where`; None once it has been released."""
        return self._reader.read_message(where)

    def read_second(self, hour: int, second: int) -> list[IndexEntry]:
        """Every applied entry filed under `second` of `hour`, localIndex
        ascending, found by walking preGlobalIndex back from the second
        table: cost proportional to that second's entries."""
        self._check_open()
        return self._reader.read_second(hour, second)

    def second_counts(self, hour: int) -> Sequence[int]:
        """Entries per second of `hour` (3600 values)."""
        return self._reader.second_counts(hour)

    def scan_ready(self, topic_hash: int, start: Location, until_hour: int, max_scan: int,
                   max_found: int) -> tuple[list[IndexEntry], Location | None]:
        """READY entries of a topic (pending changes included), in filing
        order -- hour ascending, then globalIndex -- from `start`, in hours up
        to `until_hour`: at most `max_found` of them, reading at most about
        `max_scan` entries. Returns them and where to go on (None: nothing
        more up to `until_hour` now). Only hours whose counts hold live
        messages of the topic are read, a slice of raw entries at a time."""
        self._check_open()
        return self._reader.scan_ready(topic_hash, start, until_hour, max_scan, max_found)

    def scan_status(self, topic_hash: int, statuses: Sequence[Status], start: Location, until_hour: int,
                    max_scan: int, max_found: int, worth_reading: Sequence[Status] = ()
                    ) -> tuple[list[IndexEntry], Location | None]:
        """As `scan_ready`, for entries in any of `statuses` (dead letters:
        EXPIRED and ENDED), released ones left out. An hour is read only if
        its committed counts hold the topic in one of `worth_reading`
        (default: `statuses`; a change to them still pending is seen only
        in hours read)."""
        self._check_open()
        return self._reader.scan_status(topic_hash, statuses, start, until_hour, max_scan, max_found, worth_reading)

    def change_mark(self) -> int:
        """A mark for `changed_since` (storage.pending)."""
        return self._pending.change_mark()

    def changed_since(self, file_id: int, mark: int) -> bool:
        """Has a status change or a move appended since `mark` touched an
        entry of this file (hour or span)? If not, what was read of its
        entries then is as it is now."""
        return self._pending.changed_since(file_id, mark)

    def scan_matches(self, topic_hash: int, statuses: Sequence[Status], start: Location, max_scan: int,
                     max_found: int, tag_hash: int | None = None, trigger_from: int | None = None,
                     trigger_to: int | None = None, now_ms: int = 0, floors: ScanFloors | None = None,
                     descending: bool = False) -> tuple[list[Match], Location | None]:
        """The bulk calls' scan (storage.reading.Reader.scan_matches): the
        topic's unreleased entries in `statuses`, of tag hash `tag_hash` and
        trigger time in [trigger_from, trigger_to), as (place, status,
        retry, trigger_ms), from `start` in file order (`descending`: the
        files from start's down); each file from its floor in `floors`,
        which the scan raises as it goes (ScanFloors: below a floor,
        nothing matches)."""
        self._check_open()
        return self._reader.scan_matches(topic_hash, statuses, start, max_scan, max_found, tag_hash, trigger_from,
                                         trigger_to, now_ms, floors, descending)

    def count_waiting(self, hour: int, first: int, count: int, topics: dict[int, list[int]],
                      edges: Sequence[int]) -> int:
        """Add the WAITING messages of `topics` (topic hash -> counts) among
        the file's entries `first` .. `first + count - 1` to their counts,
        at index `bisect_right(edges, trigger_ms)` (edges: ascending trigger
        times); returns the entries read, 0 past the file's end. A topic's
        delay buckets, without an entry object a message."""
        return self._reader.count_waiting(hour, first, count, topics, edges)

    def hour_entries(self, hour: int, first: int = 0, count: int | None = None) -> list[IndexEntry]:
        """Applied entries of `hour` from globalIndex `first` (`count` of them,
        default all), ascending: a sequential read of the hour's index, for
        scans (recovery of ready and consuming messages, delay histograms);
        O(the entries read). [] once past the end or for an unknown hour."""
        self._check_open()
        return self._reader.hour_entries(hour, first, count)

    def next_hour(self, from_hour: int) -> int | None:
        """The first hour >= `from_hour` that holds any entry (spans, which
        sort after every hour, are not hours)."""
        return self._reader.next_hour(from_hour)

    def file_hours(self, file_id: int) -> tuple[int, int]:
        """[first, last] hour a file covers: the hour itself, or a span's
        hours (storage.spans)."""
        return self._reader.file_hours(file_id)

    def hours(self) -> list[tuple[int, int, int]]:
        """(hour, entries, ended) of every live hour, ascending."""
        return self._reader.hours()

    # -- per-topic counts (committed changes only) ------------------------------

    def topic_hours(self, topic_hash: int) -> list[tuple[int, list[int]]]:
        """(hour, counts) of every live hour holding messages of the topic,
        ascending; counts[s] is how many are in status s (index 0 unused)."""
        return self._reader.topic_hours(topic_hash)

    def topic_counts(self, topic_hash: int) -> list[int]:
        """The topic's messages per status over all live hours (index 0 unused)."""
        return self._reader.topic_counts(topic_hash)

    def file_counts(self) -> list[tuple[int, list[int]]]:
        """(file id, messages per status over all topics) of every live
        hour and span, ascending: O(files), from totals kept with the
        per-topic counts."""
        return self._reader.file_counts()

    def first_hours(self, status: Status) -> dict[int, int]:
        """topic hash -> the first live hour holding a message of the topic
        in `status` (committed changes): one pass over the hours' counts."""
        return self._reader.first_hours(status)

    def topic_names(self) -> dict[int, str]:
        """topic hash -> topic, for every topic with a message in a live hour."""
        return self._applier.topic_names()

    def topic_count(self) -> int:
        """How many topics `topic_names` holds, O(1)."""
        return self._applier.topic_count()

    def hour_topic_counts(self) -> Iterator[list[tuple[int, list[int]]]]:
        """Every topic's counts (messages per status) an hour at a time,
        ascending; summed, each topic's `topic_counts` (storage.reading)."""
        return self._reader.hour_topic_counts()

    def has_topic(self, topic: str) -> bool:
        """`topic` has a message in a live hour (as `topic_names`, O(1))."""
        return topic in self.topic_set  # (the applier's has_topic, without its call)

    # -- in flight -----------------------------------------------------------------

    def ack_deadline(self, where: Location) -> int | None:
        """The ack deadline of a CONSUMING message, if its pull's record gave
        one (records since version 2 of the checkpoint all do)."""
        return self._applier.ack_deadline(where)

    def consuming(self) -> dict[Location, Lease]:
        """Every CONSUMING message (as of the records applied), its ack
        deadline and its delivery, 0 where unknown: found without a scan, from the checkpoint
        and the records replayed after it (a checkpoint written before the
        set was kept costs one scan of the hours holding any, at open)."""
        return self._applier.consuming()

    # == checkpoints: storage.retention =========================================

    def checkpoint(self, now_ms: int) -> CheckpointReport | None:
        """Make every derived file durable, record the commit offset, then
        delete what is no longer needed: commit-log segments before it, and
        hours whose messages have all ended at least `retention_ms` ago.
        None, nothing written, while a bulk call's records are held
        (`parts_held`: a PART without its COMMIT, an INTENT without its
        DONE): the checkpoint file holds neither, so its offset must not
        pass them; the next open replays the log instead.

        In three steps, so a server can run the slow middle one in a worker
        thread while it keeps serving: `prepare_checkpoint` (commit, write
        everything staged, choose the offset and the hours to retire),
        `sync_checkpoint` (one syncfs; thread-safe), `finish_checkpoint`
        (write the checkpoint file, delete what it no longer needs). Changes
        made between prepare and finish are after the offset: replayed."""
        self._check_open()
        self.commit()
        if self.parts_held():
            return None
        return self._retention.checkpoint(now_ms)

    def prepare_checkpoint(self, now_ms: int) -> PreparedCheckpoint:
        self._check_open()
        self._applier.apply_deferred(None)  # (a quiet point waits for held parts' COMMIT: broker.disk.group_commit)
        return self._retention.prepare_checkpoint(now_ms)

    def sync_checkpoint(self) -> None:
        """Flush every dirty page of the data directory's file system (mapped
        pages included): safe to run in a worker thread."""
        self._retention.sync_checkpoint()

    def finish_checkpoint(self, p: PreparedCheckpoint, keep_log_from: int | None = None) -> CheckpointReport:
        """`keep_log_from`: keep commit-log segments from this offset on even
        if the checkpoint no longer needs them (a follower still reads them)."""
        self._check_open()
        report = self._retention.finish_checkpoint(p, keep_log_from)
        self.shed()
        return report

    def shed(self) -> None:
        """Drop every mapped file's resident pages (the commit log's, the
        hours', the id, key and end indexes'): the data stays in the files
        and the page cache, and the next touch faults it back in. After
        each checkpoint, and every second between (broker.node.server): pages
        touched while a slow syncfs runs would otherwise count in the
        node's RSS until the checkpoint ends (docs/internals.md, "Writing").
        A closed store has nothing mapped: nothing to do."""
        if self._closed:
            return
        self.ids.shed()
        self.log.shed()
        self._hours.shed()
        if self.keys is not None:
            self.keys.shed()
        if self.ends is not None:
            self.ends.shed()

    def checkpoint_due(self, now_ms: int) -> bool:
        """Whether a checkpoint would change anything: a record appended since
        the last one, or a file to retire. An idle node skips it, so it
        rewrites nothing."""
        self._check_open()
        return not self.parts_held() and self._retention.checkpoint_due(now_ms)

    def disk_bytes(self) -> int:
        """Bytes the data directory takes on disk (blocks allocated)."""
        return self._retention.disk_bytes()

    # == the commit log, for replication =======================================

    @property
    def log_end_offset(self) -> int:
        """The offset the next record appended to the commit log will get
        (appended: durable only after `commit()`)."""
        return self.log.end_offset

    @property
    def log_start_offset(self) -> int:
        """The offset of the oldest record still in the commit log (older
        segments were deleted by a checkpoint)."""
        return self.log.start_offset

    def delay_log_ends(self) -> dict[int, int]:
        """Each live file's delay-log bytes (after its header) written to
        the file itself, not staged: how much of each an online backup
        copies (storage.backup; the rest, past a mapped file's written
        bytes, is zeros, and replay writes what was staged)."""
        return {h.hour: h.written_log_bytes for h in self._hours.ascending()}

    def log_segment_ends(self) -> dict[str, int]:
        """Each commit-log segment's file name -> the file position where
        its records end: how much of each a snapshot copies."""
        return self.log.segment_ends()

    def append_replicated(self, offset: int, body: bytes) -> None:
        """A follower appends the leader's record found at `offset`, byte for
        byte, so both logs give it the same offset. Durable and applied by
        the next `commit()`, exactly as if this store had made it."""
        self._check_open()
        if offset != self.log.end_offset:
            raise ContractError(f"record at offset {offset} does not continue this log (it ends at {self.log.end_offset})")
        kind, now_ms, items = self._applier.decode(body)
        self._pending.append(body, kind, now_ms, items)

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

    # == closing ===============================================================

    def close(self) -> None:
        """Commit what is pending and close every file (no checkpoint: the
        next open replays from the last one)."""
        if self._closed:
            return
        self.commit()
        self._hours.close()
        self.ids.close()
        if self.keys is not None:
            self.keys.close()
        if self.ends is not None:
            self.ends.close()
        self.log.close()
        self._closed = True
        self._placement.closed = True  # (its `send`, which is the store's, refuses)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Store({self.directory!r}, hours={len(self._hours)}, log_end={self.log_end_offset}, "
                f"pending_records={len(self._pending)}, fsync={self.config.fsync.value})")
