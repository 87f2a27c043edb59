"""Rescheduling and dead letters (docs/api.md, "Rescheduling and dead
letters"): rescheduleMsg, listDeadMsg, redriveMsg.

A reschedule or re-drive files the message anew (a MOVE record,
storage.records): its old place never delivers it, so the change survives
a restart and a failover. Dead letters are EXPIRED (5) and ENDED (6)
messages still retained; they are found by scanning the topic's index
entries by status, at most DEAD_SCAN entries per page or step, so a page
may be short and carry a cursor ("<file id>-<globalIndex>") to go on.

    reschedule   WAITING or READY -> WAITING at the new trigger (or READY
                 now if due); CONSUMING or final: Conflict
    redrive      EXPIRED or ENDED -> READY now, retry 0, ttl from now;
                 anything else: Conflict
    redrive_all  REDRIVE_STEP messages a record, each durable before the
                 next, other requests running between
    redrive_slice  a redriveMsgs job's slice (broker.jobs.runner): matches
                 of a filter from a cursor, -> WAITING at the job's
                 trigger time (READY if due), retry 0, redriveCount + 1

Which message may move, and to what, is broker.core.transitions' `Reschedule`
and `Redrive`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from storage.entry import Location, Message, Status
from storage.errors import Conflict
from storage.store import Store, text_hash

from ..backend import DEAD_SCAN, REDRIVE_STEP
from ..core.bulk_params import DeadFilter, JobCursor, answer_bytes
from ..core.lifecycle import Lifecycle
from ..core.transitions import REDRIVE, MessageState, Redrive, Reschedule
from .bulk import MAX_FILE_ID, place_cursor, place_text
from .journal import Journal
from .messages import Messages, Moved, not_found

# Past every hour and span id (storage.spans): "scan to the end".
# Index entries a redriveMsgs job's slice reads at most (a few ms of the loop).
JOB_SCAN = 16384


class DeadLetters:
    """Reschedule and dead letters of the disk broker. Runs on the event loop."""

    def __init__(self, store: Store, messages: Messages, journal: Journal, lifecycle: Lifecycle, *,
                 page_bytes: int) -> None:
        self._store = store
        self._messages = messages
        self._journal = journal
        self._lifecycle = lifecycle
        self._page_bytes = page_bytes  # a dead-letter page's bytes of answer at most (--max-page-bytes)

    def __repr__(self) -> str:
        return "DeadLetters()"

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        """A WAITING or READY message gets a new trigger time (<= now: due
        now, READY at once); it keeps its id, body, priority and delivery
        count. Its old place never delivers it: it is filed anew (a MOVE
        record, storage.records), so the change survives a restart and a
        failover. A consuming or ended message: Conflict, nothing changed."""
        return await self._move_one(topic, msg_id, Reschedule(trigger_ms), "only a waiting or ready message can be "
                                    "rescheduled", " (ack or nack it first)")

    async def _move_one(self, topic: str, msg_id: str, event: Reschedule | Redrive, only: str,
                        consuming: str = "") -> Message:
        """The message filed anew by `event`'s step (broker.disk.messages'
        `move`), answered once durable: READY if due now. Its refusal (a
        status it may not move from) is Conflict, `only` saying which may
        (and `consuming` more, to a consuming one)."""
        self._lifecycle.check_serving()
        await self._journal.flush()  # (a change to it still in its commit is applied first)
        message = self._store.get(topic, msg_id)
        if message is None:
            raise not_found(topic, msg_id)
        moved = self._messages.move([(message.location, MessageState.of(message), event)], topic)
        if not moved.messages:
            raise Conflict(f"message {msg_id!r} is {_status_words(message.status)}: {only}"
                           + (consuming if message.status is Status.CONSUMING else ""))
        await self._journal.durable()
        return self._messages.ready_now(*moved)[0]

    async def retry_at(self, topic: str, msg_id: str, at_ms: int) -> Status | None:
        """A failed push delivery (broker.push.pusher): the CONSUMING message
        leaves flight (its in-flight caps and key freed) and waits again,
        filed anew (a MOVE record, one fsync) at `at_ms`, its trigger time
        then, as a nack with a delay; ENDED instead, as a nack, after its
        last delivery or if `at_ms` is past its expiry. A message not
        consuming (acked, nacked, timed out since) is left as it is. Its
        status after it (None: no such message in flight)."""
        self._lifecycle.check_serving()
        status, moved = self._messages.retry_at(topic, msg_id, at_ms)
        if status is None:
            await self._journal.settled()
        elif moved is not None:
            await self._journal.durable()
            return self._messages.ready_now(*moved)[0].status
        elif status is Status.ENDED:
            await self._journal.durable()
        return status

    async def list_dead(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                        limit: int) -> tuple[list[Message], str | None]:
        """A page of the topic's dead letters (EXPIRED 5 and/or ENDED 6, still
        retained), oldest filed first, and the cursor of the next page (None:
        no more). Bounded work: reads at most DEAD_SCAN index entries, so a
        page may hold fewer than `limit` with a cursor to go on; and at most
        --max-page-bytes of answer (`answer_bytes`, at least one message): the
        cursor then names the first entry not read."""
        self._lifecycle.check_serving()
        await self._journal.flush()
        start = place_cursor(cursor, "listDeadMsg") or Location(0, 0)
        topic_hash = text_hash(topic)
        if not self._store.has_topic(topic):  # (a topic RAM alone holds has no dead letters)
            return [], None
        entries, after = self._store.scan_status(topic_hash, sorted(statuses), start, MAX_FILE_ID, DEAD_SCAN, limit)
        messages: list[Message] = []
        size = 0
        for e in entries:
            m = self._store.read_message(e.location)
            if m is None:
                continue
            size += answer_bytes(m)
            if size > self._page_bytes and messages:
                after = e.location
                break
            messages.append(m)
        return messages, None if after is None else place_text(after)

    async def redrive(self, topic: str, msg_id: str) -> Message:
        """A dead letter (5 or 6) READY again now, with a fresh retry budget
        (retry 0) and ttl (counted from now); anything else: Conflict."""
        return await self._move_one(topic, msg_id, REDRIVE, "only an expired (5) or ended (6) message can be "
                                    "re-driven")

    async def redrive_all(self, topic: str, limit: int) -> tuple[int, bool]:
        """Re-drive the topic's dead letters, oldest first, at most `limit`,
        REDRIVE_STEP a record (each durable before the next; other requests
        run between). Returns how many, and whether more are left."""
        self._lifecycle.check_serving()
        await self._journal.flush()
        if not self._store.has_topic(topic):
            return 0, False
        topic_hash, done, cursor = text_hash(topic), 0, Location(0, 0)
        dead = (Status.EXPIRED, Status.ENDED)
        while done < limit and not self._lifecycle.stopping:
            entries, after = self._store.scan_status(topic_hash, dead, cursor, MAX_FILE_ID, DEAD_SCAN,
                                                     min(REDRIVE_STEP, limit - done))
            if entries:
                olds = [m for e in entries if (m := self._store.read_message(e.location)) is not None]
                moved = self._messages.move([(m.location, MessageState.of(m), REDRIVE) for m in olds], topic)
                done += len(moved.messages)
                await self._journal.durable()
                self._messages.ready_now(*moved)
            if after is None:
                return done, False
            cursor = after
            await asyncio.sleep(0)
        return done, done >= limit and self._has_dead(topic_hash, cursor)

    async def redrive_slice(self, topic: str, flt: DeadFilter, trigger_ms: int | None, job_cursor: JobCursor,
                            max_moves: int) -> tuple[int, int, Location | None, Coroutine[Any, Any, None] | None]:
        """One slice of a redriveMsgs job (broker.jobs.runner): the topic's
        dead letters from `cursor` on, at most JOB_SCAN index entries read
        and `max_moves` matches of `flt` taken, each filed anew WAITING
        (READY if due) at `trigger_ms` (None: now) with retry 0 and its
        redriveCount one more, as one MOVE record. (matched, re-driven,
        where the next slice starts: None, the scan is over; `settled`: a
        coroutine done once the record is durable and the due ones READY,
        None: nothing moved).
        The record is appended on return, not yet durable: the job's next
        slice is read and appended while this one's fsync runs, and the
        job saves its cursor only past settled slices. The first slice
        (`cursor` at the start) waits for what was appended before it, so
        a message ended before the job began is seen. A match re-driven
        meanwhile by another call is counted matched, not re-driven; one
        re-driven by a slice is no longer dead (the reads see appended
        changes), so a slice read again (after a crash, before the job's
        cursor was saved) passes it."""
        self._lifecycle.check_serving()
        cursor = Location(job_cursor[0], int(job_cursor[1]))
        if cursor == Location(0, 0):
            await self._journal.flush()
        if not self._store.has_topic(topic):
            return 0, 0, None, None
        tag_hash = None if flt.tag is None else text_hash(flt.tag)
        entries, after = self._store.scan_status(text_hash(topic), sorted(flt.statuses), cursor, MAX_FILE_ID,
                                                 JOB_SCAN, max_moves)
        read = self._store.read_message
        found = [m for e in entries if (tag_hash is None or e.tag_hash == tag_hash)
                 and (m := read(e.location)) is not None and m.topic == topic and flt.matches(m)]
        event = Redrive(trigger_ms, counted=True)
        moved = self._messages.move([(m.location, MessageState.of(m), event) for m in found], topic)
        return len(found), len(moved.messages), after, self._settle(moved) if moved.messages else None

    async def _settle(self, moved: Moved) -> None:
        await self._journal.durable()
        self._messages.ready_now(*moved)

    def _has_dead(self, topic_hash: int, cursor: Location) -> bool:
        entries, after = self._store.scan_status(topic_hash, (Status.EXPIRED, Status.ENDED), cursor, MAX_FILE_ID,
                                                 DEAD_SCAN, 1)
        return bool(entries) or after is not None


def _status_words(status: Status) -> str:
    return f"{status.name.lower()} (status {int(status)})"
