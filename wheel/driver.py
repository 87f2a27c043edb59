"""WheelDriver: the asyncio task that runs a Scheduler on a Clock."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from storage.entry import IndexEntry
from storage.errors import ConfigError, ContractError, Unavailable

from .clock import Clock
from .scheduler import Scheduler
from .tick_state import TickState

log = logging.getLogger("hourglass.wheel")

Deliver = Callable[[list[IndexEntry]], Awaitable[None] | None]
PersistTick = Callable[[TickState], Awaitable[None] | None]


class WheelDriver:
    """Polls the scheduler when it is due, hands released entries to
    `deliver`, persists the tick, and sleeps until the next wake-up.

    Loop: { poll(clock.now_ms()); await deliver(released); persist the tick
    if it changed (at most once per tick_interval_ms, and no later than
    tick_interval_ms after it changed; an awaitable persist runs beside
    the loop, one at a time, so a slow one -- a cluster's waits for a
    quorum -- delays no release); sleep until min(next_wakeup_ms,
    pending persist, release + commit_lag_ms) or until the scheduler
    announces an earlier wake-up }.

    Worked example (one message due in 2 h 5 min, preload 10 s, commit lag
    100 ms): wake-ups at start, at 1:59:50 (cascade the hour), 2:04:50
    (preload the second), 2:05:00.050 (release), 2:05:00.151 (the tick
    may now claim second 2:05:00 and so cover the release: write it):
    five polls and five tick writes in 2 h.
    While idle the tick is not written: it only moves with the clock then,
    and a restart from an older tick re-reads empty seconds, which costs
    nothing.

    Early wake: the driver listens to the scheduler; on_new of a message
    due before the current sleep's end sets the wake event, the sleep ends,
    and the loop re-plans. A backlog (next wake-up <= now) makes the loop
    poll again after one yield to the event loop per batch of at most
    max_release_per_poll: that, plus `deliver` being awaited, is the
    catch-up rate limit. A clock that steps back only lengthens the sleep;
    poll never releases an entry before its trigger.

    `deliver` must not lose what it is given: once returned, the entries
    count as released for the tick. If it raises, the loop stops, the tick
    of that batch is not persisted, and the error propagates from run().
    `stop()` ends the loop after the current step and persists the tick
    one last time (a graceful handover). One driver per scheduler.
    """

    def __init__(self, scheduler: Scheduler, clock: Clock, deliver: Deliver, *,
                 persist_tick: PersistTick | None = None, tick_interval_ms: int = 50) -> None:
        if tick_interval_ms <= 0:
            raise ConfigError(f"tick_interval_ms must be > 0, got {tick_interval_ms}")
        self._scheduler = scheduler
        self._clock = clock
        self._deliver = deliver
        self._persist_tick = persist_tick
        self.tick_interval_ms = tick_interval_ms
        self._wake = asyncio.Event()
        self._stopping = False
        self._running = False
        self._persisted: TickState | None = None
        self._last_persist_ms: int | None = None
        self._persist_due_ms: int | None = None  # a changed tick waits for the interval
        self._writing: asyncio.Future[None] | None = None  # a persist under way beside the loop
        self._settle_ms: int | None = None  # when the tick will cover the last release
        self._started_logged = 0  # catch-up episodes whose start / end was logged
        self._finished_logged = 0
        self.wakeups = 0  # loop iterations, each one poll
        self.delivered = 0
        self.persists = 0

    def _on_earlier(self, due_ms: int) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Ask run() to return after its current step."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        if self._running:
            raise ContractError("WheelDriver.run() is already running")
        self._running = True
        scheduler, clock = self._scheduler, self._clock
        scheduler.add_wake_listener(self._on_earlier)
        try:
            while not self._stopping:
                self._wake.clear()  # before poll: a wake-up announced from here on is kept
                now_ms = clock.now_ms()
                released = scheduler.poll(now_ms)
                self.wakeups += 1
                if self._settle_ms is not None and self._settle_ms <= now_ms:
                    self._settle_ms = None
                if released:
                    self.delivered += len(released)
                    lag_ms = scheduler.config.commit_lag_ms
                    if lag_ms:  # the tick claims a second only commit_lag_ms after it: look again then
                        self._settle_ms = now_ms + lag_ms + 1
                    result = self._deliver(released)
                    if inspect.isawaitable(result):
                        await result
                self._log_catch_up()
                await self._persist(clock.now_ms(), force=False)
                if self._stopping:
                    break
                wakeups = [ms for ms in (scheduler.next_wakeup_ms(), self._persist_due_ms, self._settle_ms)
                           if ms is not None]
                await clock.sleep_until(min(wakeups) if wakeups else None, self._wake)
            task = asyncio.current_task()
            if task is None or not task.cancelling():  # (cancelled: the commits it would wait for are gone)
                await self._persist(clock.now_ms(), force=True)
        finally:
            writing, self._writing = self._writing, None
            if writing is not None:
                if not writing.done():  # cancelled: the write with it
                    writing.cancel()
                elif (not writing.cancelled() and (error := writing.exception()) is not None
                      and not isinstance(error, Unavailable)):
                    # It ended as the loop did (a node standing down fails its
                    # commits and cancels the driver together). Its error is
                    # retrieved here, not left to asyncio's "never retrieved"
                    # report; the stand-down's Unavailable says nothing new.
                    log.warning("the last tick persist failed as the wheel stopped: %r", error)
            scheduler.remove_wake_listener(self._on_earlier)
            self._running = False

    async def _persist(self, now_ms: int, *, force: bool) -> None:
        """Persist the tick if it changed and the interval allows. An
        awaitable persist (it waits for the releases to be durable: on a
        cluster, for a quorum) runs beside the loop, one at a time, so the
        releases go on meanwhile; `force` (the last one) waits for it."""
        if self._persist_tick is None:
            return
        writing = self._writing
        if writing is not None:
            if not writing.done() and not force:
                self._persist_due_ms = now_ms + self.tick_interval_ms  # one write at a time: look again then
                return
            self._writing = None
            await writing  # (done, or the last one: its error, if any, ends the loop)
        tick = self._scheduler.tick
        if tick == self._persisted:
            self._persist_due_ms = None
            return
        last_ms = self._last_persist_ms
        if not force and last_ms is not None and last_ms <= now_ms < last_ms + self.tick_interval_ms:
            self._persist_due_ms = last_ms + self.tick_interval_ms
            return
        result = self._persist_tick(tick)
        if inspect.isawaitable(result):
            if force:
                await result
            else:
                self._writing = asyncio.ensure_future(result)
        self._persisted, self._last_persist_ms, self._persist_due_ms = tick, now_ms, None
        self.persists += 1

    def _log_catch_up(self) -> None:
        report = self._scheduler.catch_up
        if report is None:
            return
        episode = self._scheduler.stats.catch_ups
        if report.active and self._started_logged < episode:
            log.warning("wheel catching up since %d: %d released so far, %d overdue, up to %d ms late",
                        report.started_at_ms, report.released, report.overdue, report.max_lateness_ms)
            self._started_logged = episode
        if report.finished_at_ms is not None and self._finished_logged < episode:
            log.warning("wheel caught up in %d ms: %d released, %d overdue, up to %d ms late",
                        report.finished_at_ms - report.started_at_ms, report.released, report.overdue,
                        report.max_lateness_ms)
            self._started_logged = self._finished_logged = episode

    def __repr__(self) -> str:
        return (f"WheelDriver(wakeups={self.wakeups}, delivered={self.delivered}, persists={self.persists}, "
                f"persisted={self._persisted!r}, stopping={self._stopping})")
