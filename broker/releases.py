"""How messages leave WAITING, and what keeps a restart right.

WAITING -> READY happens three ways, each one status record:
  - the wheel releases due entries (`_release`, called by wheel.WheelDriver);
  - a send, reschedule or re-drive due already is made READY at once
    (`_ready_if_due`), so its answer says 2 and long polls wake now;
  - messages filed in a far-future span (storage.spans) are moved to
    nearer hour files when the span falls due (`_run_span_moves`), and
    then come through the wheel.
Each becomes EXPIRED instead if it is past its ttl.

Tick persistence: the wheel's position (wheel.tick_state) is written only
past releases that are durable, and never past a send still in its group
commit (`_unfiled` counts, per second, sends appended but not yet handed to
the wheel): a restart starts the wheel from the tick and must find every
message not yet released.

Recovery (`_recover`, at construction): CONSUMING messages come back from
the store's in-flight set with their deadlines; each topic with READY
messages on disk starts spilled from its first hour holding any; WAITING
ones come back through the wheel. No backlog is read.

`Releases` is a part of `broker.service.Broker` (a mixin).
"""

from __future__ import annotations

import asyncio
import logging

from storage.entry import SECONDS_PER_HOUR, IndexEntry, Location, Message, Status
from storage.spans import is_span
from storage.store import SendOutcome, StateChange, text_hash
from wheel.tick_state import TickState

from .metrics import due_ms
from .windows import live_of

# After a failed move of due spans' messages (storage.spans), wait this long.
SPAN_RETRY_S = 5

log = logging.getLogger("hourglass.service")


class Releases:
    """Releases, tick persistence and recovery of `broker.service.Broker`."""

    # == recovery ==================================================================

    def _recover(self, now_ms: int) -> None:
        """Put CONSUMING messages back in RAM from the store's in-flight set
        (no scan), and mark every topic with READY messages spilled from its
        first hour holding any: its window refills as consumers pull."""
        fresh_ms = now_ms + self.defaults.ack_timeout_ms
        held = 0
        for location, deadline_ms in self.store.consuming().items():
            message = self.store.read_message(location)
            if message is None or message.status is not Status.CONSUMING:
                continue
            live = live_of(message, text_hash(message.topic))
            live.message = None
            self.live[location] = live
            self._track_consuming(self._queue(message.topic), live)
            # its own deadline if its pull's record gave one, capped by the default timeout
            live.deadline_ms = min(deadline_ms or fresh_ms, fresh_ms)
            self._timer(live.deadline_ms, location, "ack")
            held += 1
        names = self.store.topic_names()
        spilled = 0
        for topic_hash, hour in self.store.first_hours(Status.READY).items():
            name = names.get(topic_hash)
            if name is not None:
                self._queue(name).spill_at(Location(hour, 0))
                self._to_refill.add(name)
                spilled += 1
        if held or spilled:
            log.info("recovered %d consuming messages; %d topics hold ready messages on disk", held, spilled)

    # == the wheel's side ======================================================

    def _on_committed(self, entries: list[IndexEntry]) -> None:
        unfiled = self._unfiled
        filed = [entry for entry in entries if not is_span(entry.hour)]  # a span's: refile() brings them in time
        self.scheduler.on_new_many(filed)
        for entry in filed:
            second = entry.hour * SECONDS_PER_HOUR + entry.second
            left = unfiled[second] - 1
            if left > 0:
                unfiled[second] = left
            else:
                del unfiled[second]

    def _release(self, entries: list[IndexEntry]) -> None:
        """Released by the wheel: due now. Becomes READY (or EXPIRED)."""
        status = self.store.status
        self._make_ready([(m, entry.topic_hash) for entry in entries
                          if status(entry.location) is Status.WAITING  # (no body read for one released already)
                          and (m := self.store.read_message(entry.location)) is not None])

    def _make_ready(self, messages: list[tuple[Message, int]], arrived_ms: int | None = None) -> None:
        """WAITING messages (with their topic hashes) due now: READY, or
        EXPIRED past their ttl. Their lateness counts from their due time
        (broker.metrics.due_ms): the trigger time, or the arrival if later
        -- each one's produce time, or `arrived_ms` (the request that made
        them due: a send, a rescheduleMsg, a re-drive)."""
        now_ms = self.clock.now_ms()
        changes = []
        woken = set()
        for message, topic_hash in messages:
            due = due_ms(message.trigger_ms, message.produce_ms if arrived_ms is None else arrived_ms)
            self.metrics.lateness_seconds.observe(max(0, now_ms - due) / 1000)
            if now_ms >= message.expire_ms:
                changes.append(StateChange(message.location, Status.EXPIRED, 0))
                self.metrics.topic(message.topic).ended += 1
                continue
            changes.append(StateChange(message.location, Status.READY, 0, prev_status=Status.WAITING,
                                       topic_hash=topic_hash))
            self._admit(live_of(message._replace(status=Status.READY), topic_hash))
            m = self.metrics.topic(message.topic)
            m.ready += 1
            m.ready_gap.observe(now_ms - due)
            woken.add(message.topic)
        if changes:
            self._update(changes, now_ms)
        for topic in woken:
            self._wake(topic)

    async def _persist_tick(self, tick: TickState) -> None:
        """The tick moves only past releases that are durable, and never past
        a send still in its group commit (a slow fsync can outlast the
        scheduler's commit lag): a restart must read that send's second."""
        await self.commits.durable()
        tick = min(tick, self.scheduler.tick, key=lambda t: t.position)
        if self._unfiled:
            held = TickState.at(min(self._unfiled), 0)
            tick = min(tick, held, key=lambda t: t.position)
        self._tick_file.write(tick)


    async def _run_span_moves(self) -> None:
        """Move the waiting messages of due spans to nearer files
        (Store.refile, storage.spans), a record of REFILE_STEP at a time,
        each made durable before the next. A span is due at least 32 hours before its first message, so this
        runs long before the wheel needs them (after a long outage, overdue
        ones are filed into the current second and released at once). A
        full disk is logged and tried again; it refuses nothing. Sleeps
        until the next span falls due, or a send files into a span."""
        moved = 0
        while not self._stopping:
            self._span_wake.clear()
            now_ms = self.clock.now_ms()
            try:
                n = self.store.refile(now_ms)
            except OSError as e:
                log.warning("moving messages of due spans failed (%s); trying again in %d s", e, SPAN_RETRY_S)
                await self.clock.sleep_until(now_ms + SPAN_RETRY_S * 1000, asyncio.Event())
                continue
            if n:
                moved += n
                await self.commits.durable()
                continue
            if moved:
                log.info("moved %d waiting messages from due spans to nearer files", moved)
                moved = 0
            due_ms = self.store.next_refile_ms()
            if due_ms is not None and due_ms <= now_ms:  # due, its sends not applied yet
                await self.commits.durable()
                continue
            await self.clock.sleep_until(due_ms, self._span_wake)


    def _release_due_now(self, results: list, now_ms: int) -> list[Message]:
        """Messages sent due already (delay <= 0, a past trigger time) are
        made READY here rather than at the wheel's next poll, so the answer
        says 2 (as camellia's) and long polls wake at once. The wheel, which
        holds them already, is told to forget them.)"""
        stored = self._ready_if_due([r.message for r in results if r.outcome is SendOutcome.STORED], now_ms)
        changed = {m.location: m.status for m in stored}  # (a duplicate in the batch shares its location)
        return [r.message._replace(status=changed[r.message.location]) if r.message.location in changed
                else r.message for r in results]

    def _ready_if_due(self, messages: list[Message], now_ms: int) -> list[Message]:
        """New WAITING messages (sent, rescheduled, re-driven): those due by
        `now_ms` READY now (see _release_due_now); all with their status."""
        due = [m for m in messages if m.trigger_ms <= now_ms]
        if not due:
            return messages
        status, cancel = self.store.status, self.scheduler.cancel
        waiting = [m for m in due if status(m.location) is Status.WAITING]  # (the wheel may have been first)
        for m in waiting:
            cancel(m.location)
        self._make_ready([(m, text_hash(m.topic)) for m in waiting], arrived_ms=now_ms)
        return [m._replace(status=status(m.location)) if m.trigger_ms <= now_ms else m for m in messages]
