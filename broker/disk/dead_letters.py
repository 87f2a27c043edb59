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

Which message may move, and to what, is broker.core.transitions' `Reschedule`
and `Redrive`.
"""

from __future__ import annotations

import asyncio

from storage.entry import Location, Message, Status
from storage.errors import Conflict, InvalidRequest
from storage.store import Store, text_hash
from wheel.clock import Clock

from ..backend import DEAD_SCAN, REDRIVE_STEP
from ..core.bulk_params import answer_bytes
from ..core.lifecycle import Lifecycle
from ..core.transitions import REDRIVE, Effect, MessageState, Refusal, Reschedule, RetryAt, Step, step
from ..observe.metrics import Metrics
from .filing import Filing
from .group_commit import GroupCommit
from .journal import Journal
from .releaser import Releaser
from .requests import not_found
from .topics import Topics
from .windows import ReadyWindows

# Past every hour and span id (storage.spans): "scan to the end".
MAX_FILE_ID = 1 << 24


class DeadLetters:
    """Reschedule and dead letters of the disk broker. Runs on the event loop."""

    def __init__(self, store: Store, clock: Clock, metrics: Metrics, lifecycle: Lifecycle, journal: Journal,
                 commits: GroupCommit, filing: Filing, windows: ReadyWindows, releaser: Releaser,
                 topics: Topics) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._lifecycle = lifecycle
        self._journal = journal
        self._commits = commits
        self._filing = filing
        self._windows = windows
        self._releaser = releaser
        self._topics = topics

    def __repr__(self) -> str:
        return "DeadLetters()"

    async def reschedule(self, topic: str, msg_id: str, trigger_ms: int) -> Message:
        """A WAITING or READY message gets a new trigger time (<= now: due
        now, READY at once); it keeps its id, body, priority and delivery
        count. Its old place never delivers it: it is filed anew (a MOVE
        record, storage.records), so the change survives a restart and a
        failover. A consuming or ended message: Conflict, nothing changed."""
        self._lifecycle.check_serving()
        await self._commits.flush()  # (a change to it still in its commit is applied first)
        message = self._store.get(topic, msg_id)
        now_ms = self._clock.now_ms()
        if message is None:
            raise not_found(topic, msg_id)
        done = step(MessageState.of(message), Reschedule(trigger_ms), now_ms)
        if done.refusal is Refusal.NOT_MOVABLE:
            raise Conflict(f"message {msg_id!r} is {_status_words(message.status)}: only a waiting or ready "
                           f"message can be rescheduled" + (" (ack or nack it first)"
                                                            if message.status is Status.CONSUMING else ""))
        moved, = self.move([(message.location, done)], now_ms)
        self._metrics.topic(topic).reschedules += 1
        await self._commits.durable()
        return self._releaser.ready_if_due([moved], now_ms)[0]

    async def retry_at(self, topic: str, msg_id: str, at_ms: int) -> Status | None:
        """A failed push delivery (broker.push.pusher): the CONSUMING message
        leaves flight (its in-flight caps and key freed) and waits again,
        filed anew (a MOVE record, one fsync) at `at_ms`, its trigger time
        then, as a nack with a delay; ENDED instead, as a nack, after its
        last delivery or if `at_ms` is past its expiry. A message not
        consuming (acked, nacked, timed out since) is left as it is. Its
        status after it (None: no such message in flight)."""
        self._lifecycle.check_serving()
        held = self._windows.in_flight(topic, msg_id)
        if held is None:
            await self._commits.settled()
            return None
        now_ms = self._clock.now_ms()
        done = step(held.state, RetryAt(max(at_ms, now_ms)), now_ms)
        if done.state is None or not done.effects:
            return held.status
        if done.state.status is Status.ENDED:  # (no move: the windows carry the step out, as a nack's)
            self._journal.append(self._windows.apply(RetryAt(max(at_ms, now_ms)), [held], now_ms), now_ms)
            await self._commits.durable()
            return Status.ENDED
        moved = self.move([(held.location, done)], now_ms)
        self._metrics.topic(topic).count(done.effects)
        await self._commits.durable()
        return self._releaser.ready_if_due(moved, now_ms)[0].status

    def move(self, moves: list[tuple[Location, Step]], now_ms: int) -> list[Message]:
        """Journal.move of the message at each place to its step's new
        state, then the RAM side: the old places leave the wheel or the
        ready window (after the append: a refused one changes nothing), the
        new ones go to the wheel."""
        moved = self._journal.move([(where, done.state.trigger_ms, done.state.retry)
                                    for where, done in moves if done.state is not None], now_ms)
        for where, done in moves:
            if Effect.CANCEL in done.effects:
                self._filing.cancel(where)
            elif Effect.FORGET in done.effects:
                self._windows.forget_at(where)
        for m in moved:
            self._filing.add(m.location, m.trigger_ms, now_ms)  # (FILE)
        return moved

    async def list_dead(self, topic: str, statuses: frozenset[Status], cursor: str | None,
                        limit: int, max_bytes: int | None = None) -> tuple[list[Message], str | None]:
        """A page of the topic's dead letters (EXPIRED 5 and/or ENDED 6, still
        retained), oldest filed first, and the cursor of the next page (None:
        no more). Bounded work: reads at most DEAD_SCAN index entries, so a
        page may hold fewer than `limit` with a cursor to go on; and at most
        `max_bytes` of answer (`answer_bytes`, at least one message): the
        cursor then names the first entry not read."""
        self._lifecycle.check_serving()
        await self._commits.flush()
        start = _parse_cursor(cursor)
        topic_hash = text_hash(topic)
        if not self._topics.has_topic(topic):
            return [], None
        entries, after = self._store.scan_status(topic_hash, sorted(statuses), start, MAX_FILE_ID, DEAD_SCAN, limit)
        messages: list[Message] = []
        size = 0
        for e in entries:
            m = self._store.read_message(e.location)
            if m is None:
                continue
            size += answer_bytes(m)
            if max_bytes is not None and size > max_bytes and messages:
                after = e.location
                break
            messages.append(m)
        return messages, None if after is None else f"{after.hour}-{after.global_index}"

    async def redrive(self, topic: str, msg_id: str) -> Message:
        """A dead letter (5 or 6) READY again now, with a fresh retry budget
        (retry 0) and ttl (counted from now); anything else: Conflict."""
        self._lifecycle.check_serving()
        await self._commits.flush()
        message = self._store.get(topic, msg_id)
        if message is None:
            raise not_found(topic, msg_id)
        now_ms = self._clock.now_ms()
        done = step(MessageState.of(message), REDRIVE, now_ms)
        if done.refusal is Refusal.NOT_DEAD:
            raise Conflict(f"message {msg_id!r} is {_status_words(message.status)}: only an expired (5) or "
                           f"ended (6) message can be re-driven")
        moved = self.move([(message.location, done)], now_ms)
        self._metrics.topic(topic).redrives += 1
        await self._commits.durable()
        return self._releaser.ready_if_due(moved, now_ms)[0]

    async def redrive_all(self, topic: str, limit: int) -> tuple[int, bool]:
        """Re-drive the topic's dead letters, oldest first, at most `limit`,
        REDRIVE_STEP a record (each durable before the next; other requests
        run between). Returns how many, and whether more are left."""
        self._lifecycle.check_serving()
        await self._commits.flush()
        if not self._topics.has_topic(topic):
            return 0, False
        topic_hash, done, cursor = text_hash(topic), 0, Location(0, 0)
        dead = (Status.EXPIRED, Status.ENDED)
        while done < limit and not self._lifecycle.stopping:
            entries, after = self._store.scan_status(topic_hash, dead, cursor, MAX_FILE_ID, DEAD_SCAN,
                                                     min(REDRIVE_STEP, limit - done))
            if entries:
                now_ms = self._clock.now_ms()
                olds = [m for e in entries if (m := self._store.read_message(e.location)) is not None]
                moves = [(m.location, redriven) for m in olds
                         if (redriven := step(MessageState.of(m), REDRIVE, now_ms)).refusal is None]
                moved = self.move(moves, now_ms)
                done += len(moved)
                self._metrics.topic(topic).redrives += len(moved)
                await self._commits.durable()
                self._releaser.ready_if_due(moved, now_ms)
            if after is None:
                return done, False
            cursor = after
            await asyncio.sleep(0)
        return done, done >= limit and self._has_dead(topic_hash, cursor)

    def _has_dead(self, topic_hash: int, cursor: Location) -> bool:
        entries, after = self._store.scan_status(topic_hash, (Status.EXPIRED, Status.ENDED), cursor, MAX_FILE_ID,
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
