"""broker.redis.lease on a real redis-server: the holder keeps its lease
while the wall clock steps back (renewals are timed on the monotonic
clock), a second node waits while it is held, and a stop hands it over at
once."""

from __future__ import annotations

import asyncio

import pytest

from broker.clock import SystemClock

redis = pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

from broker.redis.lease import RedisLease  # noqa: E402

LEASE_MS = 300


class SteppedBack:
    """The system's clock, its wall time set back an hour by `step_back`
    (a compiled SystemClock takes no interpreted subclass)."""

    def __init__(self) -> None:
        self._clock = SystemClock()
        self.offset_ms = 0

    def step_back(self) -> None:
        self.offset_ms = -3_600_000

    def now_ms(self) -> int:
        return self._clock.now_ms() + self.offset_ms

    def monotonic_s(self) -> float:
        return self._clock.monotonic_s()

    async def sleep(self, seconds: float) -> None:
        await self._clock.sleep(seconds)


class Counted:
    """A work that counts its takes and lets-go."""

    what = "test work"
    tick_ms = None
    opened = True

    def __init__(self, key: str) -> None:
        self.key = key
        self.taken = self.let_go_count = 0

    async def open(self) -> None:
        pass

    async def take(self) -> None:
        self.taken += 1

    async def let_go(self) -> None:
        self.let_go_count += 1

    async def tick(self) -> None:
        pass


def Work(client, key: str, clock, node: str) -> RedisLease:
    return RedisLease(client, Counted(key), clock, lease_ms=LEASE_MS, node=node)


def test_a_holder_keeps_its_lease_through_a_wall_clock_set_back_and_hands_it_over_at_stop(redis_url):
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            await run(client)
        finally:
            await client.aclose()

    async def run(client) -> None:
        key = "leasetest:lease"
        await client.delete(key)
        clock = SteppedBack()
        first = Work(client, key, clock, "node-a")
        second = Work(client, key, SystemClock(), "node-b")
        first.start()
        for _ in range(100):
            if first.holding:
                break
            await asyncio.sleep(0.01)
        assert first.holding
        clock.step_back()  # while it holds the lease
        second.start()
        await asyncio.sleep(4 * LEASE_MS / 1000)  # four lease times: renewed throughout, by the monotonic clock
        assert first.holding and first.work.let_go_count == 0 and not second.holding
        assert (await client.get(key)) == b"node-a"
        await first.stop()
        assert first.work.let_go_count == 1
        for _ in range(100):  # released: the other takes it within its next look, not a lease time later
            if second.holding:
                break
            await asyncio.sleep(0.01)
        assert second.holding and second.work.taken == 1
        await second.stop()
        assert await client.get(key) is None

    asyncio.run(main())
