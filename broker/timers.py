"""Ack deadlines and expiries: one heap of timers for every held message.

    (due_ms, seq, location, "ack")     a CONSUMING message's ack deadline
    (due_ms, seq, location, "expire")  a READY window message's expire time

The timer task sleeps on the injected clock until the earliest timer (woken
early when an earlier one is pushed), then turns every due timer into a
status change, all in one record made durable before it sleeps again:
an ack timeout is CONSUMING -> READY (retry + 1) or ENDED past maxRetry or
its ttl; an expiry is READY -> EXPIRED (never delivered) or ENDED.

A timer is never removed when its message moves on (an ack, a new
deadline): it is checked against the message when it fires, and the heap is
compacted when stale timers outnumber the held messages, so it stays
O(live). A spilled READY message has no timer: the refill that reads it
back ends it if it has expired.

`Timers` is a part of `broker.service.Broker` (a mixin).
"""

from __future__ import annotations

import heapq

from storage.entry import Location, Status
from storage.store import StateChange

from .ready import Live


class Timers:
    """The ack-deadline and expiry timers of `broker.service.Broker`."""

    def _retry_or_end(self, live: Live, now_ms: int) -> StateChange:
        """A delivery was not acked: the message goes back to READY (its next
        pull counts the next delivery), or ends (6) after max_retry + 1
        deliveries or past its ttl."""
        m = self.metrics.topic(live.topic)
        if live.retry > live.max_retry or now_ms >= live.expire_ms:
            self._forget(live)
            m.ended += 1
            return StateChange(live.location, Status.ENDED, live.retry, prev_status=Status.CONSUMING,
                               topic_hash=live.topic_hash)
        self._requeue(live, live.retry)
        m.retries += 1
        self._wake(live.topic)
        return StateChange(live.location, Status.READY, live.retry, prev_status=Status.CONSUMING,
                           topic_hash=live.topic_hash)

    # == timers: ack deadlines and expiries ======================================

    def _timer(self, due_ms: int, location: Location, kind: str) -> None:
        if len(self._timers) > 2 * len(self.live) + 1024:
            self._compact_timers()
        first = self._timers[0][0] if self._timers else None
        heapq.heappush(self._timers, (due_ms, next(self._timer_seq), location, kind))
        if first is None or due_ms < first:
            self._timer_wake.set()

    def _compact_timers(self) -> None:
        """Drop timers of messages no longer held (acked, deleted, ended) or
        no longer in the timer's state, so the heap stays O(live)."""
        def current(timer) -> bool:
            due_ms, _, location, kind = timer
            live = self.live.get(location)
            if live is None:
                return False
            if kind == "ack":
                return live.status is Status.CONSUMING and live.deadline_ms == due_ms
            return live.status is Status.READY and live.expire_ms == due_ms
        self._timers = [t for t in self._timers if current(t)]
        heapq.heapify(self._timers)

    async def _run_timers(self) -> None:
        while not self._stopping:
            self._timer_wake.clear()
            now_ms = self.clock.now_ms()
            changes = []
            while self._timers and self._timers[0][0] <= now_ms:
                due_ms, _, location, kind = heapq.heappop(self._timers)
                live = self.live.get(location)
                if live is None:
                    continue
                if kind == "ack" and live.status is Status.CONSUMING and live.deadline_ms == due_ms:
                    changes.append(self._retry_or_end(live, now_ms))
                elif kind == "expire" and live.status is Status.READY and now_ms >= live.expire_ms:
                    self._forget(live)
                    self.metrics.topic(live.topic).ended += 1
                    changes.append(StateChange(location, Status.EXPIRED if live.retry == 0 else Status.ENDED,
                                               live.retry, prev_status=Status.READY, topic_hash=live.topic_hash))
            if changes:
                self._update(changes, now_ms)
                await self.commits.durable()
            due = self._timers[0][0] if self._timers else None
            await self.clock.sleep_until(due, self._timer_wake)
