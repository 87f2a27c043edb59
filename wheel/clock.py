"""The clock everything above storage/ is handed: wall time for triggers,
monotonic time for timeouts, and ways to wait.

Nothing in wheel/ or replication/ reads the system clock, and broker/ reads
it only through the one object it builds at start-up and passes down. The real clock (in broker/) reads
the wall clock for `now_ms` and waits on the monotonic clock, so a wall
clock that steps back or jumps makes a wait neither endless nor early:
the driver re-polls with the wall time it then reads, and the scheduler
releases nothing whose trigger is after it. Tests hand a `FakeClock`
(tests/fakes.py) instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

T = TypeVar("T")


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
