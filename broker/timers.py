"""Ack deadlines and expiries of the messages RAM holds, on one DelayQueue.

    Timer(location, ACK, due_ms)     a CONSUMING message's ack deadline
    Timer(location, EXPIRY, due_ms)  a READY window message's expire time

The ready windows (broker.windows) set a timer when they take a message in
(EXPIRY) or hand it out (ACK). The timer task sleeps on the injected clock
until the earliest (woken early when an earlier one is set), hands every
due timer to the windows, which turn those still current into status
changes (broker.transitions: `AckTimeout`, `Ttl`), and makes the changes
durable as one record before it sleeps again.

A timer is never removed when its message moves on (an ack, a new
deadline): it is checked against the message when it fires, and the queue
is compacted when stale timers outnumber the held messages, so it stays
O(held). A spilled READY message has no timer: the refill that reads it
back ends it if it has expired.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import NamedTuple

from storage.entry import Location
from storage.store import StateChange
from wheel.clock import Clock
from wheel.delay_queue import DelayQueue

from .group_commit import GroupCommit
from .journal import Journal
from .lifecycle import Lifecycle
from .transitions import TTL, AckTimeout, Event

# Compact once timers exceed twice the held messages by this many.
COMPACT_SLACK = 1024


class TimerKind(enum.Enum):
    ACK = "ack"  # a CONSUMING message's ack deadline
    EXPIRY = "expiry"  # a READY window message's expire time


class Timer(NamedTuple):
    location: Location
    kind: TimerKind
    due_ms: int

    @property
    def event(self) -> Event:
        """What the timer firing is to its message (broker.transitions)."""
        return AckTimeout(self.due_ms) if self.kind is TimerKind.ACK else TTL


# The windows' answer to fired timers: the status changes they made.
Fire = Callable[[list[Timer], int], list[StateChange]]


class Timers:
    """The timer queue and its task. Runs on the event loop."""

    def __init__(self, clock: Clock, lifecycle: Lifecycle, journal: Journal, commits: GroupCommit) -> None:
        self._clock = clock
        self._lifecycle = lifecycle
        self._journal = journal
        self._commits = commits
        self._queue: DelayQueue[Timer] = DelayQueue()
        self._wake = asyncio.Event()  # an earlier timer was set, or the node stops

    def __repr__(self) -> str:
        return f"Timers({self._queue!r})"

    def __len__(self) -> int:
        return len(self._queue)

    def set(self, location: Location, kind: TimerKind, due_ms: int) -> None:
        if self._queue.offer(tuple.__new__(Timer, (location, kind, due_ms)), due_ms):  # (no Python __new__)
            self._wake.set()

    def compact(self, current: Callable[[Timer], bool]) -> None:
        """Drop the timers not `current` (their message acked, deleted, ended,
        or moved on): the windows call it once the timers may outnumber the
        messages they hold by COMPACT_SLACK."""
        self._queue.retain(lambda timer, _: current(timer))

    def wake(self) -> None:
        self._wake.set()

    def _due(self, now_ms: int) -> list[Timer]:
        due = []
        while (timer := self._queue.poll_expired(now_ms)) is not None:
            due.append(timer)
        return due

    async def run(self, fire: Fire) -> None:
        """Hand due timers to `fire` and make its changes durable, until the node stops."""
        clock = self._clock
        while not self._lifecycle.stopping:
            self._wake.clear()
            now_ms = clock.now_ms()
            changes: list[StateChange] = []
            while due := self._due(now_ms):  # (firing may set timers due already)
                changes += fire(due, now_ms)
            if changes:
                self._journal.append(changes, now_ms)
                await self._commits.background_durable("ack deadlines and expiries")
            await clock.sleep_until(self._queue.peek_expiration_ms(), self._wake)
