"""A RedisBroker on a FakeClock for tests of the Redis backend's rules
(tests/integration/test_redis_lifecycle.py, test_redis_keys.py): the fake
time moves only when a test says, and `advance_to` waits until the mover
has ticked at it, counted by a wrapper of the TICK script."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fakes import FakeClock

from broker.core.params import Defaults
from broker.observe.metrics import Metrics
from broker.redis.backend import RedisBroker
from broker.redis.keys import RedisConfig

SHOWS_WITHIN_S = 10.0  # real time for a Redis round trip to show; a bound, not an expectation


class FakeClockBroker:
    """One RedisBroker on `clock`; brokers made with the same `prefix`
    share the Redis state, as processes sharing one Redis do."""

    def __init__(self, redis_url: str, prefix: str, clock: FakeClock) -> None:
        self.url = redis_url
        self.clock = clock
        self.config = RedisConfig(key_prefix=prefix)
        self.broker: RedisBroker | None = None
        self.ticked_ms = 0  # the latest fake time a TICK of the mover has come back from Redis for

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    async def open(self) -> None:
        self.broker = RedisBroker.from_url(self.url, self.clock, Defaults(), Metrics(), self.config)
        script = self.broker._link.scripts["tick"]

        async def tick(keys, args):  # type: ignore[no-untyped-def]
            result = await script(keys=keys, args=args)
            self.ticked_ms = max(self.ticked_ms, int(args[0]))
            return result
        self.broker._link.scripts["tick"] = tick
        await self.broker.start()
        await self.clock.settle()

    async def close(self) -> None:
        assert self.broker is not None
        await self.broker.stop()

    async def restart(self) -> None:
        """Stop this process's broker and start another on the same Redis."""
        await self.close()
        self.ticked_ms = 0
        await self.open()

    async def until(self, shown: Callable[[], bool], what: str) -> None:
        """Wait in real time (the fake time frozen) until `shown()`."""
        deadline = time.monotonic() + SHOWS_WITHIN_S
        while not shown():
            assert time.monotonic() < deadline, f"{what}: not shown within {SHOWS_WITHIN_S} s"
            await asyncio.sleep(0.002)
        await self.clock.settle()

    async def advance_to(self, target_ms: int) -> None:
        """Set the fake time (due timers fire), and wait until the mover has
        ticked every topic at it (so the topic must have been sent to)."""
        assert self.broker is not None
        self.clock.set(target_ms)
        self.broker._state.mover_wake.set()
        await self.until(lambda: self.ticked_ms >= target_ms, f"a TICK at {target_ms}")
