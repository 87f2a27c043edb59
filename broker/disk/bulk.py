"""The disk broker's bulk calls (docs/api.md, "Bulk calls"): listMsg,
deleteMsgs, rescheduleMsgs -- messages of a topic found by key, tag, msgId
prefix, status and trigger time range rather than one id at a time.

Finding by key: the key index (storage.key_index) gives the key's own
messages, each read and tested against the rest of the filter; the
topic's other messages are never read. Its places come KEY_SLICE a turn
of the loop, bucket by bucket in trigger-time order (a page stops once
it is full), so a hot key never holds the loop.

Finding otherwise: the topic's index entries in the statuses asked for are scanned
(storage's `scan_matches`: hours holding none of them skipped by their
counts, files whose trigger times lie outside the range asked for not
read, a tag found by a byte search of the raw entries), BULK_SCAN entries
a slice with the event loop free between slices, so a send waits at most
one slice; each file from its floor (storage.reading.ScanFloors): where
the last call of the same filter that changed every match it took left
off -- so calls of a delete-all do not each pass the messages the calls
before them ended. An entry's trigger time and tag hash are in the entry; a key,
a msgId prefix or the tag's own text need the message read from its
delay log, done only for entries the entry-level tests let through (and,
for a page, only for those that could still enter it:
broker.core.bulk_params.PageKeeper).

Changing, all or nothing per call: the matches are gathered first (their
places, status, retry and trigger time, at most `limit`), then, with no
await between, each is taken as read -- or read again if a status change
or a move appended since the gather began touched its file
(`Store.changed_since`; the call's own PART records excepted: they change
other matches than the slices still to come, so a sliced call reads each
state once) -- and stepped through broker.core.transitions (a
message acked or pulled meanwhile steps as it now is: Delete of a final
one and Reschedule of a consuming one change nothing), and every change is
appended as ONE record -- a status record for a delete, a MOVE record for
a reschedule (storage.records) -- answered once durable (fsync'ed; on a
cluster, replicated). A crash before the record is durable loses the
whole call, after it keeps the whole call, and a moved message's old
place never delivers it.

    list        a page in (trigger time, msgId) order, or the count
    export      a page in the order the store holds them (exportMsg)
    delete      live (1, 2, 3) -> DELETED; in RAM out of the wheel (CANCEL)
                or its window / in flight (FORGET), as deleteMsg does
    reschedule  WAITING, READY -> WAITING at the new time (READY if due),
                as rescheduleMsg does
    expire_paused  WAITING, READY -> EXPIRED, end reason `paused` (a
                resume's `expire`: broker.flow.keeper), as a delete ends them

Each step is broker.disk.messages': `end_found`, `move`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from array import array
from collections.abc import AsyncIterator, Callable, Iterator
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

from storage.entry import MS_PER_HOUR, STATUS_BY_VALUE, Location, Message, Status
from storage.errors import HourglassError, InvalidRequest
from storage.key_index import KeyPart
from storage.reading import Match, ScanFloors
from storage.spans import is_span
from storage.store import Store, text_hash

from ..core.bulk_params import MOVABLE, BulkFilter, DeleteMsgsRequest, ListMsgRequest, PageKeeper, RescheduleMsgsRequest, answer_bytes
from ..core.lifecycle import Lifecycle
from ..core.transitions import END_PAUSED, Delete, EndPaused, MessageState, Reschedule
from .journal import Journal
from .messages import Messages, Moved

# Index entries read per slice of a scan, between which the loop runs.
BULK_SCAN = 1024
# Above every file id (hours and spans: storage.spans).
MAX_FILE_ID = 1 << 24
# Messages a deleteMsgs changes between two turns of the loop (~3 ms): a
# call of more appends a PART record a slice and a COMMIT last.
DELETE_SLICE = 512
# Committed status changes left to apply (storage's apply_deferred) above
# which a large delete waits before its next slice: RAM stays bounded
# (about 250 bytes a change) however many calls follow each other.
MAX_DEFERRED = 50_000
# Messages a rescheduleMsgs moves between two turns of the loop (~3 ms): a
# call of more appends an INTENT record first, a MOVE record a slice, and
# DONE last.
MOVE_SLICE = 128
# Places of an INTENT packed between two turns of the loop.
PACK_SLICE = 65_536
# A key's places read between two turns of the loop (storage.key_index's
# buckets and runs: however many messages the key holds).
KEY_SLICE = 1024

# Scan floors kept, one a filter (the last asked for kept).
MAX_FLOORS = 16

_new = tuple.__new__
_DELETE = Delete()
# A gathered match as plain ints: (file, globalIndex, status, retry, trigger
# time). The garbage collector stops tracking a tuple of ints; a Match, which
# holds a Location (a NamedTuple), it tracks: a call's 100,000 of those were
# walked by every full collection while the call ran (2 s of 9 in all).
_Found = tuple[int, int, int, int, int]
_PLACE = itemgetter(0, 1)  # a _Found's (file, globalIndex)
log = logging.getLogger("hourglass.bulk")
W, R, C = Status.WAITING, Status.READY, Status.CONSUMING
# The status changes made at a message's entry (broker.core.transitions' table;
# a reschedule, a re-drive, a retry at a later time and a send over an
# ended id file it anew, as a new entry): (from, to).
IN_PLACE = frozenset({
    (W, R), (W, Status.EXPIRED), (W, Status.ACKED), (W, Status.DELETED),
    (R, C), (R, Status.EXPIRED), (R, Status.ENDED), (R, Status.ACKED), (R, Status.DELETED),
    (C, R), (C, Status.ENDED), (C, Status.ACKED), (C, Status.DELETED),
})


def resumable(statuses: frozenset[Status]) -> bool:
    """Does no message enter `statuses` at its entry from outside them? Then
    an entry a scan passed that was not in them, or that a call took out
    of them, never matches again: the scan floors of a filter of these
    statuses hold after a call that changed every match it took
    (LIVE and WAITING alone are such: a final message stays final, and
    WAITING is only entered by a new entry)."""
    return not any(was not in statuses and now in statuses for was, now in IN_PLACE)


class _Damaged(HourglassError):
    """Raised when a damaged slot of the key index is met mid-lookup: the
    caller scans instead."""


class _Stale:
    """Which files of a call's matches a change may have touched since the
    gather read them (their entries are read again before they are
    changed): those a record appended since the gather began touched,
    except the call's own records -- each slice changes matches no other
    slice holds, so its PART record makes no later slice's matches stale.

    Worked example: matches in files 10 and 11; an ack in file 11 during
    the gather; slice 1 (file 10 and 11) appends its PART: `files()`
    before slice 1 is {11}; an ack in file 10 between the slices, and
    `files()` before slice 2 is {10, 11} -- slice 1's PART, which touched
    both, adds nothing. Cost: O(files of the matches) a slice."""

    __slots__ = ("_files", "_since", "_stale", "_store")

    def __init__(self, store: Store, files: set[int], mark: int) -> None:
        self._store = store
        self._files = files  # the files the matches are in
        self._since = mark  # records appended after this mark are not the call's own
        self._stale: set[int] = set()

    def files(self) -> set[int]:
        """The stale files now. Call with no await between it and the
        slice's append, then `appended()` at once."""
        changed, since = self._store.changed_since, self._since
        self._stale.update(f for f in self._files if f not in self._stale and changed(f, since))
        return self._stale

    def appended(self) -> None:
        """The call appended a slice's record: what was appended before it
        has been looked at by `files()`, and it is the call's own."""
        self._since = self._store.change_mark()

    def __repr__(self) -> str:
        return f"_Stale(files={len(self._files)}, stale={sorted(self._stale)}, since={self._since})"


class _Gathered(NamedTuple):
    found: list[_Found]
    more: bool  # matches past `limit` remain
    stale: _Stale
    floors: ScanFloors | None  # where the scan read to (None: not scanned, or not kept for this filter)


class Bulk:
    """listMsg, deleteMsgs, rescheduleMsgs of the disk broker. Runs on the event loop."""

    def __init__(self, store: Store, messages: Messages, journal: Journal, lifecycle: Lifecycle,
                 page_bytes: int) -> None:
        self._store = store
        self._messages = messages
        self._journal = journal
        self._lifecycle = lifecycle
        self._page_bytes = page_bytes  # an export page's answer at most (--max-page-bytes)
        self.slices = 0  # PART records of sliced deletes appended, for the tests
        # (topic, filter) -> the scan floors the last call of the filter that
        # changed every match it took left (a delete, or a move of WAITING
        # ones); only for filters whose statuses are `resumable`
        self._floors: dict[tuple[str, BulkFilter], ScanFloors] = {}

    def __repr__(self) -> str:
        return "Bulk()"

    def _floors_of(self, topic: str, flt: BulkFilter) -> ScanFloors | None:
        """A copy of the scan floors kept for the filter, for a scan to read
        from and raise (empty if none kept); None for a filter whose
        floors are never kept."""
        if not resumable(flt.statuses):
            return None
        kept = self._floors.get((topic, flt))
        return ScanFloors() if kept is None else kept.copy()

    def _keep_floors(self, topic: str, flt: BulkFilter, gathered: _Gathered) -> None:
        """Keep where the call's scan read to, once the call changed every
        match it took out of the filter's statuses: cut after the last one
        it took if more remain (the scan may have read past it)."""
        floors = gathered.floors
        if floors is None:
            return
        if gathered.more:
            last = gathered.found[-1]
            floors.cut(Location(last[0], last[1] + 1))
        self._floors.pop((topic, flt), None)
        self._floors[topic, flt] = floors
        while len(self._floors) > MAX_FLOORS:
            del self._floors[next(iter(self._floors))]

    async def _slices(self, topic: str, flt: BulkFilter, skip: bool = False,
                      floors: ScanFloors | None = None,
                      narrowed: Callable[[], tuple[int | None, int | None]] | None = None
                      ) -> AsyncIterator[list[Match]]:
        """The topic's entries passing the entry-level tests (status, trigger
        range, tag hash: storage's `scan_matches`), a slice at a time, the
        loop free between (none if `skip`: the key index found them); each
        file from its floor in `floors`, which the scan raises. `narrowed`
        (a page's): the trigger range its candidates may still have, asked
        before each slice, so files outside it are not read (a page after a
        cursor reads from the cursor's time on, and stops reading files
        once it is full: a topic paged through whole is read about once)."""
        self._lifecycle.check_serving()
        await self._journal.flush()  # a change still in its commit is seen
        if skip or not flt.statuses or not self._store.has_topic(topic):  # (one RAM alone holds: none on disk)
            return
        topic_hash, statuses = text_hash(topic), sorted(flt.statuses)
        tag_hash = None if flt.tag is None else text_hash(flt.tag)
        cursor = Location(0, 0)
        while True:
            low, high = flt.trigger_from_ms, flt.trigger_to_ms
            if narrowed is not None:
                page_low, page_high = narrowed()
                low = page_low if low is None else low if page_low is None else max(low, page_low)
                high = page_high if high is None else high if page_high is None else min(high, page_high)
            if low is not None and cursor.hour < low // MS_PER_HOUR and not is_span(low // MS_PER_HOUR):
                cursor = Location(low // MS_PER_HOUR, 0)  # (a message is filed in its trigger's hour or later)
            matches, after = self._store.scan_matches(topic_hash, statuses, cursor, BULK_SCAN, BULK_SCAN, tag_hash,
                                                      low, high, self._messages.now_ms(), floors)
            yield matches
            if after is None:
                return
            cursor = after
            await asyncio.sleep(0)
            self._lifecycle.check_serving()

    async def _key_parts(self, topic: str, flt: BulkFilter) -> list[KeyPart] | None:
        """With a key filter: the parts of the key index holding the key's
        messages (storage.key_index), in the order a page reads them; None
        without a key filter (or no key index): scan."""
        if flt.key is None:
            return None
        self._lifecycle.check_serving()
        await self._journal.flush()  # the index holds applied records only
        self._lifecycle.check_serving()
        if not self._store.has_topic(topic):
            return []
        return self._store.key_parts(topic, flt.key)

    async def _key_slices(self, topic: str, key: str, parts: list[KeyPart],
                          keeper: PageKeeper | None = None) -> AsyncIterator[list[Location]]:
        """The places the key index holds for the key, at most KEY_SLICE of
        them a slice, bucket by bucket in order of their time ranges (a
        page's `keeper`: only as far as the page can still change); the
        loop let through once KEY_SLICE places (or buckets) were handed out
        since it last was, so a key of any size never holds it longer.
        Raises _Damaged on a damaged slot."""
        store, lifecycle = self._store, self._lifecycle
        work = 0  # places and buckets handed out since the loop last turned

        async def turn() -> None:
            nonlocal work
            work = 0
            await asyncio.sleep(0)
            lifecycle.check_serving()

        for part in parts:
            if keeper is not None:
                if keeper.closed_before(part.low_ms):
                    return
                if keeper.before_cursor(part.high_ms):
                    continue
            buckets = store.key_buckets(topic, key, part)
            if buckets is None:
                raise _Damaged
            work += len(buckets)
            handed: list[int] = []  # what the part's buckets handed out: a place a replay put twice, once
            for bucket in buckets:
                if keeper is not None and keeper.closed_before(bucket.low_ms):
                    return
                places = store.key_places(bucket, handed)
                if places is None:
                    raise _Damaged
                while not places.done:
                    if work >= KEY_SLICE:
                        await turn()
                    found = store.take_key_places(places, KEY_SLICE - work)
                    if found is None:
                        raise _Damaged
                    work += max(1, len(found))  # (none: runs read that held no new place)
                    if found:
                        yield found
            if work >= KEY_SLICE:
                await turn()

    async def _keyed(self, topic: str, flt: BulkFilter, parts: list[KeyPart]) -> AsyncIterator[list[Message]]:
        """The key's messages that match the filter, a slice at a time -- the
        key's own messages read, not the topic's -- the loop let through
        between (`_key_slices`). Raises _Damaged on a damaged slot."""
        assert flt.key is not None
        store, key = self._store, flt.key
        async for places in self._key_slices(topic, key, parts):
            yield [m for m in store.keyed_messages(topic, key, places) if flt.matches(m)]

    async def _keyed_page(self, topic: str, flt: BulkFilter, parts: list[KeyPart], keeper: PageKeeper) -> bool:
        """Offer the key's matches to `keeper`, reading buckets in order of
        their time ranges and only as far as the page can still change;
        False on a damaged slot (the caller scans)."""
        assert flt.key is not None
        try:
            async for places in self._key_slices(topic, flt.key, parts, keeper):
                for where, trigger_ms in self._store.keyed_entries(topic, places):
                    if keeper.worth(trigger_ms) and (m := self._full_match(flt, where)) is not None \
                            and m.topic == topic:
                        keeper.offer(m)
        except _Damaged:
            return False
        return True

    def _full_match(self, flt: BulkFilter, where: Location) -> Message | None:
        """The message at `where` if it matches the filter's body-level tests."""
        m = self._store.read_message(where)
        return m if m is not None and flt.matches(m) else None

    async def page(self, request: ListMsgRequest) -> tuple[list[Message], str | None]:
        """A page of matches in (trigger time, msgId) order, after the cursor."""
        keeper = PageKeeper(request.cursor, request.limit, request.max_bytes)
        parts = await self._key_parts(request.topic, request.filter)
        if parts is not None and not await self._keyed_page(request.topic, request.filter, parts, keeper):
            parts, keeper = None, PageKeeper(request.cursor, request.limit, request.max_bytes)  # a damaged slot: scan
        async for matches in self._slices(request.topic, request.filter, parts is not None,
                                          self._floors_of(request.topic, request.filter), keeper.scan_range):
            for where, _, _, trigger_ms in matches:
                if keeper.worth(trigger_ms) and (m := self._full_match(request.filter, where)) is not None:
                    keeper.offer(m)
        page, cursor = keeper.page()
        return page, None if cursor is None else cursor.text()

    async def export_page(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                          limit: int) -> tuple[list[Message], str | None]:
        """exportMsg: a page of the topic's messages in `statuses` in the
        order the store holds them -- its files from the last down, each
        from its first entry -- so a whole topic is read once however its
        trigger times spread (a listMsg page reads every file its trigger
        times may lie in, a span's whole); at most `limit` messages and
        --max-page-bytes of answer (at least one), BULK_SCAN entries a
        slice with the loop free between; the cursor, a place
        (`place_text`), None after the last.

        A message filed again while the walk goes on is met where it goes:
        a span come due files its messages in nearer files, whose ids are
        always lower (storage.spans), so still ahead of the walk; one that
        moves from behind the walk is met twice. One rescheduled meanwhile
        may be met twice or not at all (as by listMsg's pages)."""
        self._lifecycle.check_serving()
        where = place_cursor(cursor, "exportMsg") or Location(MAX_FILE_ID, 0)
        await self._journal.flush()  # the index holds applied records only
        self._lifecycle.check_serving()
        if not self._store.has_topic(topic):
            return [], None
        topic_hash, wanted = text_hash(topic), sorted(statuses)
        page: list[Message] = []
        size = 0
        while True:
            matches, after = self._store.scan_matches(topic_hash, wanted, where, BULK_SCAN, limit - len(page),
                                                      descending=True)
            for place, _, _, _ in matches:
                m = self._store.read_message(place)
                if m is None or m.topic != topic:
                    continue
                size += answer_bytes(m)
                if size > self._page_bytes and page:
                    return page, place_text(place)
                page.append(m)
            if after is None:
                return page, None
            if len(page) >= limit:
                return page, place_text(after)
            where = after
            await asyncio.sleep(0)
            self._lifecycle.check_serving()

    async def count(self, topic: str, flt: BulkFilter) -> int:
        """How many messages match, exactly."""
        parts = await self._key_parts(topic, flt)
        n = 0
        if parts is not None:
            try:
                async for messages in self._keyed(topic, flt, parts):
                    n += len(messages)
                return n
            except _Damaged:
                n = 0
        body = flt.needs_body()
        async for matches in self._slices(topic, flt, floors=self._floors_of(topic, flt)):
            if not body:
                n += len(matches)
                continue
            for match in matches:
                if self._full_match(flt, match[0]) is not None:
                    n += 1
        return n

    async def _gather(self, topic: str, flt: BulkFilter, limit: int) -> _Gathered:
        """Up to `limit` matches (place, status, retry, trigger time as
        read), whether there are more, and what `_Stale` needs to tell
        which of them may have changed since."""
        mark = self._store.change_mark()
        parts = await self._key_parts(topic, flt)
        found: list[_Found] = []
        files: set[int] = set()
        if parts is not None:
            try:
                async for messages in self._keyed(topic, flt, parts):
                    found += [(*m.location, int(m.status), m.retry, m.trigger_ms) for m in messages]
                    files.update(m.location.hour for m in messages)
                    if len(found) > limit:
                        return _Gathered(found[:limit], True, _Stale(self._store, files, mark), None)
                return _Gathered(found, False, _Stale(self._store, files, mark), None)
            except _Damaged:
                found, files = [], set()
        body = flt.needs_body()
        floors = self._floors_of(topic, flt)
        async for matches in self._slices(topic, flt, floors=floors):
            if body:
                matches = [match for match in matches if self._full_match(flt, match[0]) is not None]
            elif flt.exclude:
                matches = [match for match in matches if match[0] not in flt.exclude]
            if len(found) + len(matches) > limit:
                matches = matches[:limit - len(found)]
                found += [(*where, status, retry, trigger_ms) for where, status, retry, trigger_ms in matches]
                files.update(match[0].hour for match in matches)
                return _Gathered(found, True, _Stale(self._store, files, mark), floors)
            found += [(*where, status, retry, trigger_ms) for where, status, retry, trigger_ms in matches]
            files.update(match[0].hour for match in matches)
        return _Gathered(found, False, _Stale(self._store, files, mark), floors)

    def _current(self, found: list[_Found], stale: set[int]) -> Iterator[Match]:
        """The matches as they are now: read again in the `stale` files
        (`_Stale.files`); left out if released (moved) meanwhile."""
        store = self._store
        for hour, gi, status, retry, trigger_ms in found:
            where = _new(Location, (hour, gi))
            if hour not in stale:
                yield where, status, retry, trigger_ms
                continue
            now = store.live_state(where)
            if now is not None:
                yield where, int(now[0]), now[1], trigger_ms

    async def delete(self, request: DeleteMsgsRequest) -> tuple[int, bool]:
        """The live matches (at most `limit`) DELETED, as one record -- or,
        past DELETE_SLICE of them, as one PART record a slice (the loop free
        between) and the COMMIT record last (storage.records): whole across
        a crash either way. How many, and whether matches remain."""
        return await self._end(request.topic, request.filter, request.limit, _DELETE)

    async def expire_paused(self, topic: str, flt: BulkFilter, limit: int) -> tuple[int, bool]:
        """A resume's `expire` (broker.flow.keeper): the waiting and ready
        matches (at most `limit`) EXPIRED, their end reason `paused`, as
        `delete` ends its matches -- whole across a crash, one call. How
        many, and whether matches remain."""
        return await self._end(topic, flt, limit, END_PAUSED)

    async def _end(self, topic: str, flt: BulkFilter, limit: int, event: Delete | EndPaused) -> tuple[int, bool]:
        gathered = await self._gather(topic, flt, limit)
        found, more, stale, _ = gathered
        self._lifecycle.check_serving()
        end_found = self._messages.end_found
        if len(found) <= DELETE_SLICE:  # (no await from the read of the current states to the append)
            ended = end_found(self._current(found, stale.files()), topic, 0, event)
        else:
            call_id = secrets.randbits(62) + 1
            ended = 0
            try:
                for first in range(0, len(found), DELETE_SLICE):
                    if first:
                        await asyncio.sleep(0)
                        self._lifecycle.check_serving()
                    while self._store.deferred_items() > MAX_DEFERRED:  # the calls before it applied first
                        await asyncio.sleep(0.001)
                        self._lifecycle.check_serving()
                    ended += end_found(self._current(found[first:first + DELETE_SLICE], stale.files()), topic,
                                       call_id, event)
                    stale.appended()
                    self.slices += 1
                self._journal.commit_parts(call_id, self._messages.now_ms())
            except BaseException as e:
                if ended:  # parts taken out of RAM, never committed: a restart puts them back
                    self._lifecycle.fail(e, "a bulk delete cut short")
                raise
        if ended:
            await self._journal.durable()
        self._keep_floors(topic, flt, gathered)  # (every match taken is now DELETED or EXPIRED, or ended)
        return ended, more

    async def reschedule(self, request: RescheduleMsgsRequest) -> tuple[int, bool]:
        """The waiting and ready matches (at most `limit`) filed anew at their
        new trigger times: as one MOVE record, or, past MOVE_SLICE of
        them, an INTENT record naming them all and then a MOVE record a
        slice (the loop free between) and DONE last: once the INTENT is
        durable the call is carried out whole, here or, after a crash or
        a failover, by the next node to serve (`carry_out_intents`). How
        many moved, and whether matches remain."""
        gathered = await self._gather(request.topic, request.filter, request.limit)
        found, more, stale, _ = gathered
        self._lifecycle.check_serving()
        if len(found) <= MOVE_SLICE:
            done = self._move_slice(request.topic, found, stale.files(), request.new_trigger_ms)
            if done.messages:
                await self._journal.durable()
                self._messages.ready_now(*done)
            moved = len(done.messages)
        else:
            call_id = secrets.randbits(62) + 1
            places = array("q")
            for first in range(0, len(found), PACK_SLICE):  # (reads only: the loop free between)
                if first:
                    await asyncio.sleep(0)
                places.extend(chain.from_iterable(map(_PLACE, found[first:first + PACK_SLICE])))
            self._lifecycle.check_serving()
            self._journal.intend(call_id, request.topic, request.shift_ms, request.trigger_ms, places,
                                 self._messages.now_ms())
            try:
                await self._journal.durable()
                moved = await self._carry_out(request.topic, call_id, found, stale, request.new_trigger_ms)
            except BaseException as e:
                # Cut short on a node that goes on serving: its INTENT would
                # stay half carried out, and hold every checkpoint, until a
                # restart; the node fails instead, and the next to serve
                # (restarted, or a new leader) carries it out.
                if not self._lifecycle.stopping:
                    self._lifecycle.fail(e, "a bulk reschedule cut short")
                raise
        # (every match taken is released at its old place, or was no longer
        # WAITING: kept only for a filter of WAITING alone, `resumable`)
        self._keep_floors(request.topic, request.filter, gathered)
        return moved, more

    def _move_slice(self, topic: str, found: list[_Found], stale: set[int],
                    new_trigger_ms: Callable[[int], int]) -> Moved:
        """Matches filed anew at their new trigger times, as one MOVE record
        (Reschedule's step: a consuming or final one meanwhile stays), out
        of the wheel and the windows. Those in `stale` files are read
        again first (no await from there up to the append)."""
        # (a reschedule's step needs the status, retry and trigger time only)
        return self._messages.move([(where, MessageState(STATUS_BY_VALUE[status], retry, 0, trigger_ms, 0),
                                     Reschedule(new_trigger_ms(trigger_ms)))
                                    for where, status, retry, trigger_ms in self._current(found, stale)], topic)

    async def _carry_out(self, topic: str, call_id: int, found: list[_Found], stale: _Stale,
                         new_trigger_ms: Callable[[int], int]) -> int:
        """An INTENT's moves, MOVE_SLICE a record, each durable before the
        next (a commit round applies one slice, not many in one go; the
        loop free between), then its DONE; durable once it returns. How
        many moved."""
        moved = 0
        for first in range(0, len(found), MOVE_SLICE):
            self._lifecycle.check_serving()
            done = self._move_slice(topic, found[first:first + MOVE_SLICE], stale.files(), new_trigger_ms)
            stale.appended()
            self.slices += 1
            await self._journal.durable()
            self._messages.ready_now(*done)
            moved += len(done.messages)  # (not kept: a call's 100,000 Messages were walked by every full collection)
        self._journal.done(call_id, self._messages.now_ms())
        await self._journal.durable()
        return moved

    async def carry_out_intents(self) -> None:
        """Carry out the INTENTs held whose DONE never came (a large
        rescheduleMsgs whose node was killed or deposed after its INTENT
        was durable): each place still waiting or ready, as it now is,
        filed anew. Run when the node starts to serve."""
        await self._journal.flush()
        for intent in self._store.intents():
            mark = self._store.change_mark()
            found: list[_Found] = []
            for i, where in enumerate(intent.places):
                if i and i % BULK_SCAN == 0:
                    await asyncio.sleep(0)
                    self._lifecycle.check_serving()
                try:
                    m = self._store.read_message(where)
                except InvalidRequest:  # its file retired meanwhile (every message in it ended)
                    continue
                if m is not None and m.status in MOVABLE and m.topic == intent.topic:
                    found.append((where.hour, where.global_index, int(m.status), m.retry, m.trigger_ms))
            self._lifecycle.check_serving()
            shift_ms, trigger_ms = intent.shift_ms, intent.trigger_ms
            request = RescheduleMsgsRequest(intent.topic, BulkFilter(), 0, shift_ms, trigger_ms)
            stale = _Stale(self._store, {f[0] for f in found}, mark)
            moved = await self._carry_out(intent.topic, intent.call_id, found, stale, request.new_trigger_ms)
            log.info("a rescheduleMsgs of topic %s cut short was carried out: %d moved", intent.topic, moved)


def place_text(where: Location) -> str:
    """A cursor of a walk in the store's order (exportMsg, listDeadMsg):
    "<file id>-<globalIndex>"."""
    return f"{where.hour}-{where.global_index}"


def place_cursor(cursor: str | None, command: str) -> Location | None:
    """The place a `command` page's cursor names (`place_text`); None when
    not given; InvalidRequest (cursor) for anything else."""
    if not cursor:
        return None
    hour, dash, gi = cursor.partition("-")
    if not (dash and hour.isascii() and hour.isdigit() and gi.isascii() and gi.isdigit()
            and len(hour) < 12 and len(gi) < 12):
        raise InvalidRequest("cursor", f"must be a cursor a {command} page answered, got {cursor[:40]!r}")
    return Location(int(hour), int(gi))
