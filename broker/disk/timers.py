"""Ack deadlines and expiries of the messages RAM holds, on one DelayQueue.

    Timer(ACK, due_ms, [location, ...])     CONSUMING messages' ack deadline
    Timer(EXPIRY, due_ms, [location, ...])  READY window messages' expire time

The ready windows (broker.disk.windows) build the queue and run its task, and
set a timer when they take a message in
(EXPIRY) or hand messages out (ACK: one timer for a pull's whole batch,
which shares its deadline); a timer set right after one of the same kind
and due time joins it (a batch filed together expires together: one entry,
not one a message). The timer task sleeps on the injected clock
until the earliest (woken early when an earlier one is set), hands every
due timer to the windows, which apply its event (broker.core.transitions:
`AckTimeout`, `Ttl`) to its messages still held, and makes the changes
durable as one record before it sleeps again.

A message extended to a later deadline (extendMsg) keeps the timer it has:
when that fires, the windows set it again at the message's deadline then
(one timer a lease period, however often a consumer extends). A timer is
never removed when its messages move on (an ack, a new deadline): the step
says a stale timer changes nothing when it fires, and
the windows compact the queue (dropping the places a timer would no longer
change) once its places outnumber the held messages, so it stays O(held).
A spilled READY message has no timer: the refill that reads it back ends
it if it has expired.
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

from ..core.lifecycle import Lifecycle
from ..core.transitions import TTL, AckTimeout, Event
from .group_commit import GroupCommit
from .journal import Journal

# Compact once the timers' places exceed twice the held messages by this many.
COMPACT_SLACK = 1024


class TimerKind(enum.Enum):
    ACK = "ack"  # a CONSUMING message's ack deadline
    EXPIRY = "expiry"  # a READY window message's expire time


class Timer(NamedTuple):
    kind: TimerKind
    due_ms: int
    locations: list[Location]  # its messages' places (a compaction drops the stale ones)

    @property
    def event(self) -> Event:
        """What the timer firing is to its messages (broker.core.transitions)."""
        return AckTimeout(self.due_ms) if self.kind is TimerKind.ACK else TTL


# The windows' answer to fired timers: the status changes they made.
Fire = Callable[[list[Timer], int], list[StateChange]]


class TimerQueue:
    """The timers, on one DelayQueue: what they hold, set, compacted and
    taken when due (the data structure; `Timers` adds its task)."""

    def __init__(self) -> None:
        self._queue: DelayQueue[Timer] = DelayQueue()
        self.locations = 0  # places in the queued timers: what a compaction weighs
        # The last timer set while it is still queued: a timer of its kind and due time joins it
        # (messages filed together expire together: one heap entry for a batch, not one each).
        self._last: Timer | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._queue!r}, locations={self.locations})"

    def __len__(self) -> int:
        return len(self._queue)

    def set(self, kind: TimerKind, due_ms: int, locations: list[Location]) -> bool:
        """A timer of `kind` due at `due_ms` for the messages at `locations`
        (the list is the timer's from now on). When the last timer set is of
        the same kind and due time and has not fired, the places join it.
        True when the timer is now the first due (a sleeper re-plans)."""
        self.locations += len(locations)
        last = self._last
        if last is not None and last.due_ms == due_ms and last.kind is kind:
            last.locations.extend(locations)
            return False
        timer = tuple.__new__(Timer, (kind, due_ms, locations))  # (no Python __new__)
        self._last = timer
        return self._queue.offer(timer, due_ms)

    def compact(self, trim: Callable[[Timer], bool]) -> None:
        """`trim` drops each timer's stale places (their messages acked,
        deleted, ended or moved on) and says whether any is left; the
        timers left with none go: the windows call it once the places may
        outnumber the messages they hold by COMPACT_SLACK."""
        left = 0

        def keep(timer: Timer, due_ms: int) -> bool:
            nonlocal left
            if not trim(timer):
                return False
            left += len(timer.locations)
            return True
        self._queue.retain(keep)
        self.locations = left
        self._last = None  # (it may have gone)

    def due(self, now_ms: int) -> list[Timer]:
        """The timers due at `now_ms`, taken out of the queue."""
        due = []
        while (timer := self._queue.poll_expired(now_ms)) is not None:
            due.append(timer)
            self.locations -= len(timer.locations)
            if timer is self._last:  # fired: no later place joins it
                self._last = None
        return due


class Timers(TimerQueue):
    """The timer queue and its task. Runs on the event loop."""

    def __init__(self, clock: Clock, lifecycle: Lifecycle, journal: Journal, commits: GroupCommit) -> None:
        super().__init__()
        self._clock = clock
        self._lifecycle = lifecycle
        self._journal = journal
        self._commits = commits
        self._wake = asyncio.Event()  # an earlier timer was set, or the node stops

    def set(self, kind: TimerKind, due_ms: int, locations: list[Location]) -> bool:
        first = super().set(kind, due_ms, locations)
        if first:
            self._wake.set()
        return first

    def wake(self) -> None:
        self._wake.set()

    async def run(self, fire: Fire) -> None:
        """Hand due timers to `fire` and make its changes durable, until the node stops."""
        clock = self._clock
        while not self._lifecycle.stopping:
            self._wake.clear()
            now_ms = clock.now_ms()
            changes: list[StateChange] = []
            while due := self.due(now_ms):  # (firing may set timers due already)
                changes += fire(due, now_ms)
            if changes:
                self._journal.append(changes, now_ms)
                await self._commits.background_durable("ack deadlines and expiries")
            await clock.sleep_until(self._queue.peek_expiration_ms(), self._wake)
