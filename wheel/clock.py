"""The clock everything above storage/ is handed: wall time for triggers,
monotonic time for timeouts, and ways to wait.

Nothing in wheel/ or replication/ reads the system clock, and broker/ reads
it only through the one object it builds at start-up and passes down. The real clock (in broker/) reads
the wall clock for `now_ms` and waits on the monotonic clock, so a wall
clock that steps back or jumps makes a wait neither endless nor early:
the driver re-polls with the wall time it then reads, and the scheduler
releases nothing whose trigger is after it. `FakeClock` is for tests.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, Protocol, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (UTC): what trigger times
        are compared with. May step back or jump forward."""
        ...

    async def sleep_until(self, wall_ms: int | None, wake: asyncio.Event) -> None:
        """Return once now_ms() >= wall_ms (never, for None), or as soon as
        `wake` is set, whichever comes first. Always yields to the event
        loop at least once, even when already due. May return early;
        callers re-check."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never steps back: for timeouts, leases
        and durations, never for trigger times."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of monotonic time (0 or less: yield once)."""
        ...

    async def wait_for(self, awaitable: Awaitable[T], timeout_s: float) -> T:
        """Await `awaitable`, or raise TimeoutError (cancelling it) once
        `timeout_s` of monotonic time has passed."""
        ...

    def call_later(self, delay_s: float, callback: Callable[[], object]) -> Timer:
        """Run `callback` once `delay_s` of monotonic time has passed,
        unless the returned timer is cancelled first."""
        ...


class Timer(Protocol):
    def cancel(self) -> None: ...


class _FakeTimer:
    __slots__ = ("due_ms", "callback", "cancelled")

    def __init__(self, due_ms: float, callback: Callable[[], object]) -> None:
        self.due_ms = due_ms
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _CountingExecutor(ThreadPoolExecutor):
    """The default executor `FakeClock.watch_threads` installs: tells the
    clock, on the loop's thread, when a job starts and when it has ended.
    The end is queued on the loop only after the job's future is resolved,
    in the same worker thread, so it comes after the callback asyncio queues
    to wake the awaiting task: by then that wake-up is already in the
    loop's queue (two separate done callbacks would race, the worker
    waiting for the GIL between them while settle() spins)."""

    def __init__(self, clock: FakeClock, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(thread_name_prefix="fakeclock")
        self._clock = clock
        self._loop = loop

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        outer: Future[T] = Future()

        def job() -> None:
            try:
                if outer.set_running_or_notify_cancel():
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as e:
                        outer.set_exception(e)
                    else:
                        outer.set_result(result)
            finally:
                self._ended()

        self._clock._thread_started()
        try:
            inner = super().submit(job)
        except BaseException:
            self._clock._thread_ended()
            raise
        inner.add_done_callback(lambda inner: self._dropped(inner, outer))
        return outer

    def _dropped(self, inner: Future[None], outer: Future[T]) -> None:
        if inner.cancelled():  # shutdown(cancel_futures=True): job() never ran
            outer.cancel()
            self._ended()

    def _ended(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._clock._thread_ended)
        except RuntimeError:  # the loop is closed: nothing waits any more
            pass


class FakeClock:
    """A clock that moves only when told to, in either direction.

        clock = FakeClock(now_ms=1_000)
        task = asyncio.create_task(driver.run())
        await clock.run_until(7_200_000)   # jumps from one sleeper's deadline
                                           # to the next, letting tasks run
        clock.set(500)                     # the wall clock steps back

    `sleeps` counts sleep_until calls. Deadlines are checked when the time
    is set; `run_until` is the way to let hours pass in a test without
    running through them millisecond by millisecond.

    Its monotonic time is its wall time in seconds: a test that sets the
    time back steps both (a real monotonic clock never does, so tests of
    timeouts only move forward).

    Work in threads: a task awaiting a worker thread (asyncio.to_thread, as
    the broker's group commit does when fsyncs are slow) calls no
    sleep_until, so `settle` would take it for asleep and `run_until` would
    jump the time past deadlines while that work, and every task waiting
    for it, is still in flight. After `watch_threads()` the loop's default
    executor counts its jobs and `settle` also waits (in real time) until
    none is running.
    """

    def __init__(self, now_ms: int = 0) -> None:
        self._now_ms = now_ms
        self._sleepers: list[tuple[int | None, asyncio.Future[None]]] = []
        self._timers: list[_FakeTimer] = []
        self.sleeps = 0
        self._in_threads = 0  # jobs of the watched executor not yet ended
        self._threads_idle = asyncio.Event()
        self._threads_idle.set()

    def watch_threads(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Make `loop` (default: the running one) run its default-executor
        jobs on an executor that tells this clock when they start and end,
        so `settle` waits for them. Call before the tasks under test start."""
        loop = loop or asyncio.get_running_loop()
        loop.set_default_executor(_CountingExecutor(self, loop))

    def _thread_started(self) -> None:
        self._in_threads += 1
        self._threads_idle.clear()

    def _thread_ended(self) -> None:
        self._in_threads -= 1
        if self._in_threads == 0:
            self._threads_idle.set()

    def now_ms(self) -> int:
        return self._now_ms

    def set(self, now_ms: int) -> None:
        """Move the time to now_ms (back or forward); wake due sleepers."""
        self._now_ms = now_ms
        for wall_ms, future in self._sleepers:
            if wall_ms is not None and wall_ms <= now_ms and not future.done():
                future.set_result(None)
        due = [timer for timer in self._timers if timer.due_ms <= now_ms]
        if due:
            self._timers = [timer for timer in self._timers if timer.due_ms > now_ms]
            for timer in sorted(due, key=lambda timer: timer.due_ms):
                if not timer.cancelled:
                    timer.callback()

    def advance(self, delta_ms: int) -> None:
        self.set(self._now_ms + delta_ms)

    def next_deadline_ms(self) -> int | None:
        """The earliest time a current sleeper or timer waits for (None:
        none does)."""
        self._timers = [timer for timer in self._timers if not timer.cancelled]
        sleepers = (wall_ms for wall_ms, _ in self._sleepers if wall_ms is not None)
        timers = (math.ceil(timer.due_ms) for timer in self._timers)
        return min(itertools.chain(sleepers, timers), default=None)

    async def sleep_until(self, wall_ms: int | None, wake: asyncio.Event) -> None:
        self.sleeps += 1
        if wake.is_set() or (wall_ms is not None and wall_ms <= self._now_ms):
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sleeper = (wall_ms, future)
        self._sleepers.append(sleeper)
        waiter = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait((future, waiter), return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._sleepers.remove(sleeper)
            waiter.cancel()
            future.cancel()

    def monotonic_s(self) -> float:
        return self._now_ms / 1000

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now_ms + math.ceil(seconds * 1000), asyncio.Event())

    async def wait_for(self, awaitable: Awaitable[T], timeout_s: float) -> T:
        task = asyncio.ensure_future(awaitable)
        deadline = asyncio.ensure_future(self.sleep(timeout_s))
        try:
            await asyncio.wait((task, deadline), return_when=asyncio.FIRST_COMPLETED)
        finally:
            deadline.cancel()
        if not task.done():
            task.cancel()
            raise TimeoutError
        return task.result()

    def call_later(self, delay_s: float, callback: Callable[[], object]) -> Timer:
        timer = _FakeTimer(self._now_ms + delay_s * 1000, callback)
        self._timers.append(timer)
        return timer

    async def settle(self, max_rounds: int = 100_000) -> None:
        """Let ready tasks run until no task has called sleep_until for a few
        rounds of the event loop (they are all asleep or blocked) and no job
        of a watched executor is running (see watch_threads): while one is,
        wait for it to end, then settle again."""
        quiet = 0
        for _ in range(max_rounds):
            before = self.sleeps
            await asyncio.sleep(0)
            quiet = quiet + 1 if self.sleeps == before else 0
            if quiet >= 5:
                if not self._in_threads:
                    return
                await self._threads_idle.wait()
                quiet = 0

    async def run_until(self, target_ms: int) -> None:
        """Let time pass up to target_ms: settle, jump to the earliest
        sleeper's deadline, repeat; then set target_ms and settle."""
        while True:
            await self.settle()
            deadline = self.next_deadline_ms()
            if deadline is None or deadline > target_ms:
                break
            self.set(max(deadline, self._now_ms))
        if target_ms > self._now_ms:
            self.set(target_ms)
        await self.settle()

    def __repr__(self) -> str:
        return f"FakeClock(now_ms={self._now_ms}, sleepers={len(self._sleepers)})"
