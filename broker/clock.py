"""The one real clock of hourglass: built once at start-up and handed
down; everything below broker/ takes time as a parameter or through this
object (see wheel.clock.Clock, the protocol, and tests/fakes.py's FakeClock)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class SystemClock:
    """Wall time for trigger times, the event loop's monotonic timer for
    waiting: a wall clock that steps back only makes a wait end early and
    be re-planned, never makes anything release early."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep_until(self, wall_ms: int | None, wake: asyncio.Event) -> None:
        if wall_ms is None:
            await wake.wait()
            return
        delay_s = (wall_ms - time.time_ns() / 1_000_000) / 1000
        if delay_s <= 0:
            await asyncio.sleep(0)
            return
        # asyncio.timeout, not wait_for: on Python 3.11 a wait_for whose wait
        # ends (wake set) as the task is cancelled swallows the cancellation
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await wake.wait()

    def monotonic_s(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait_for(self, awaitable: Awaitable[T], timeout_s: float) -> T:
        if asyncio.current_task() is None:
            # A request's frame runs without a Task until it first waits
            # (broker.http.httpd); asyncio.timeout needs one: a bare yield has
            # the frame handed to its Task first (a leader's ack that
            # changes nothing waits so for a quorum: GroupCommit.settled)
            await asyncio.sleep(0)
        async with asyncio.timeout(timeout_s):  # (not asyncio.wait_for: see sleep_until)
            return await awaitable

    def call_later(self, delay_s: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback)

    def __repr__(self) -> str:
        return f"SystemClock(now_ms={self.now_ms()})"
