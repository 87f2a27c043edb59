"""Rescheduling and dead letters (docs/api.md, the section of that name: rescheduleMsg, listDeadMsg,
redriveMsg).

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

`DeadLetters` is a part of `broker.service.Broker` (a mixin).
"""

from __future__ import annotations

import asyncio

from storage.entry import MS_PER_SECOND, Location, Message, Status
from storage.errors import Conflict, InvalidRequest, Unavailable
from storage.spans import is_span
from storage.store import text_hash

from .backend import DEAD_SCAN, REDRIVE_STEP
from .redact import client_text

# Past every hour and span id (storage.spans): "scan to the end".
MAX_FILE_ID = 1 << 24


class DeadLetters:
    """Reschedule and dead letters of `broker.service.Broker`."""

    # == reschedule and dead letters ==============================================

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        """A WAITING or READY message gets a new trigger time (<= now: due
        now, READY at once); it keeps its id, body, priority and delivery
        count. Its old place never delivers it: it is filed anew (a MOVE
        record, storage.records), so the change survives a restart and a
        failover. A consuming or ended message: Conflict, nothing changed."""
        self._check_serving()
        await self.commits.flush()  # (a change to it still in its commit is applied first)
        message = self._message(topic, msg_id)
        if message.status not in (Status.WAITING, Status.READY):
            raise Conflict(f"message {msg_id!r} is {_status_words(message.status)}: only a waiting or ready "
                           f"message can be rescheduled" + (" (ack or nack it first)"
                                                            if message.status is Status.CONSUMING else ""))
        now_ms = self.clock.now_ms()
        moved, = self._move([(message, trigger_ms, message.retry)], now_ms)
        self.metrics.topic(topic).reschedules += 1
        await self.commits.durable()
        return self._ready_if_due([moved], now_ms)[0]

    def _move(self, changes: list[tuple[Message, int, int]], now_ms: int) -> list[Message]:
        """Store.move, then the RAM side: the old places leave the wheel or
        the ready window (after the append: a refused one changes nothing)."""
        try:
            moved = self.store.move([(m.location, trigger_ms, retry) for m, trigger_ms, retry in changes], now_ms)
        except InvalidRequest:
            raise
        except OSError as e:
            raise Unavailable(f"the commit log refused the write: {client_text(e)}") from e
        for old, _, _ in changes:
            if old.status is Status.WAITING:
                self.scheduler.cancel(old.location)
            elif (live := self.live.get(old.location)) is not None:  # READY in the window
                self._forget(live)
        for m in moved:
            if is_span(m.location.hour):
                self._span_wake.set()
            else:
                self._unfiled[max(m.trigger_ms, now_ms) // MS_PER_SECOND] += 1
        return moved

    async def list_dead(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                        limit: int) -> tuple[list[Message], str | None]:
        """A page of the topic's dead letters (EXPIRED 5 and/or ENDED 6, still
        retained), oldest filed first, and the cursor of the next page (None:
        no more). Bounded work: reads at most DEAD_SCAN index entries, so a
        page may hold fewer than `limit` with a cursor to go on."""
        self._check_serving()
        await self.commits.flush()
        start = _parse_cursor(cursor)
        topic_hash = text_hash(topic)
        if not self.has_topic(topic):
            return [], None
        entries, after = self.store.scan_status(topic_hash, sorted(statuses), start, MAX_FILE_ID, DEAD_SCAN, limit)
        messages = [m for e in entries if (m := self.store.read_message(e.location)) is not None]
        return messages, None if after is None else f"{after.hour}-{after.global_index}"

    async def redrive(self, topic: str, msg_id: str) -> Message:
        """A dead letter (5 or 6) READY again now, with a fresh retry budget
        (retry 0) and ttl (counted from now); anything else: Conflict."""
        self._check_serving()
        await self.commits.flush()
        message = self._message(topic, msg_id)
        if message.status not in (Status.EXPIRED, Status.ENDED):
            raise Conflict(f"message {msg_id!r} is {_status_words(message.status)}: only an expired (5) or "
                           f"ended (6) message can be re-driven")
        now_ms = self.clock.now_ms()
        moved = self._move([(message, now_ms, 0)], now_ms)
        self.metrics.topic(topic).redrives += 1
        await self.commits.durable()
        return self._ready_if_due(moved, now_ms)[0]

    async def redrive_all(self, topic: str, limit: int) -> tuple[int, bool]:
        """Re-drive the topic's dead letters, oldest first, at most `limit`,
        REDRIVE_STEP a record (each durable before the next; other requests
        run between). Returns how many, and whether more are left."""
        self._check_serving()
        await self.commits.flush()
        if not self.has_topic(topic):
            return 0, False
        topic_hash, done, cursor = text_hash(topic), 0, Location(0, 0)
        dead = (Status.EXPIRED, Status.ENDED)
        while done < limit and not self._stopping:
            entries, after = self.store.scan_status(topic_hash, dead, cursor, MAX_FILE_ID, DEAD_SCAN,
                                                    min(REDRIVE_STEP, limit - done))
            if entries:
                now_ms = self.clock.now_ms()
                olds = [m for e in entries if (m := self.store.read_message(e.location)) is not None]
                moved = self._move([(m, now_ms, 0) for m in olds], now_ms)
                done += len(moved)
                self.metrics.topic(topic).redrives += len(moved)
                await self.commits.durable()
                self._ready_if_due(moved, now_ms)
            if after is None:
                return done, False
            cursor = after
            await asyncio.sleep(0)
        return done, done >= limit and self._has_dead(topic_hash, cursor)

    def _has_dead(self, topic_hash: int, cursor: Location) -> bool:
        entries, after = self.store.scan_status(topic_hash, (Status.EXPIRED, Status.ENDED), cursor, MAX_FILE_ID,
                                                DEAD_SCAN, 1)
        return bool(entries) or after is not None


def _status_words(status: Status) -> str:
    return f"{status.name.lower()} (status {int(status)})"


def _parse_cursor(cursor: str | None) -> Location:
    """listDeadMsg's cursor, "<file id>-<globalIndex>" as a page answered it."""
    if not cursor:
        return Location(0, 0)
    hour, dash, gi = cursor.partition("-")
    if not (dash and hour.isascii() and hour.isdigit() and gi.isascii() and gi.isdigit()
            and len(hour) < 12 and len(gi) < 12):
        raise InvalidRequest("cursor", f"must be a cursor a listDeadMsg page answered, got {cursor[:40]!r}")
    return Location(int(hour), int(gi))
