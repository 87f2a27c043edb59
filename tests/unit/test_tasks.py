"""Stopping tasks whose cancel may be lost (broker.tasks): on Python 3.11 an
asyncio.wait_for whose wait ends as the cancel lands returns normally
(CPython gh-86296), and redis-py sends each command through one. CI saw a
Redis-backed node outlive SIGTERM so: its jobs lease's loop ran on, and
the stop waited for it for ever."""

from __future__ import annotations

import asyncio
import contextlib
import gc

from broker.clock import SystemClock
from broker.redis.lease import RedisLease
from broker.tasks import cancel_and_wait, raise_swallowed_cancel


class SwallowingRedis:
    """A Redis client whose every command, as redis-py's, is sent through
    asyncio.wait_for; `in_flight` is set during the send, so a stopper
    woken by it cancels the loop at the moment the wait_for loses it."""

    def __init__(self) -> None:
        self.in_flight = asyncio.Event()
        self.commands = 0

    def register_script(self, script: str):
        async def run(keys, args):
            return await self._command(0)
        return run

    async def _command(self, answer):
        async def send():
            self.commands += 1
            self.in_flight.set()
            return answer
        return await asyncio.wait_for(send(), 5)

    async def set(self, *args, **kwargs):
        return await self._command(None)  # taken by another node

    async def pttl(self, key):
        return await self._command(50)


class Work:
    """A work that does nothing."""

    what = "work"
    key = "k"
    tick_ms = None
    opened = True

    async def open(self) -> None:
        pass

    async def take(self) -> None:
        pass

    async def let_go(self) -> None:
        pass

    async def tick(self) -> None:
        pass


def test_a_lease_stopped_while_a_redis_call_swallows_the_cancel_stops():
    async def main():
        client = SwallowingRedis()
        lease = RedisLease(client, Work(), SystemClock(), lease_ms=300, node="a")
        lease.start()
        await client.in_flight.wait()  # the loop is inside a Redis call's wait_for
        task = lease._task
        await asyncio.wait_for(lease.stop(), 2)  # before: TimeoutError, the loop ran on
        assert task.done()
        commands = client.commands
        await asyncio.sleep(0.3)
        assert client.commands == commands  # nothing renews or looks any more

    asyncio.run(main())


def test_cancel_and_wait_cancels_again_a_task_that_swallowed_its_cancel():
    async def main():
        rounds = []

        async def loop():
            while True:
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    if not rounds:  # the first cancel lost, as a 3.11 wait_for loses it
                        rounds.append("swallowed")
                        continue
                    raise

        task = asyncio.create_task(loop())
        await asyncio.sleep(0.02)
        await asyncio.wait_for(cancel_and_wait([task]), 3)
        assert task.cancelled() and rounds == ["swallowed"]

    asyncio.run(main())


def test_a_loop_that_checks_between_rounds_ends_after_a_swallowed_cancel():
    async def main():
        async def loop():
            while True:
                with contextlib.suppress(asyncio.CancelledError):  # lost
                    await asyncio.sleep(0.01)
                raise_swallowed_cancel()

        task = asyncio.create_task(loop())
        await asyncio.sleep(0.02)
        task.cancel()
        await asyncio.wait({task}, timeout=1)
        assert task.done()

    asyncio.run(main())


def test_cancel_and_wait_takes_what_the_tasks_raised():
    """As gather(return_exceptions=True): a failed task it waited for is
    not reported "exception was never retrieved" once it is gone (the
    control: one nobody waited for is)."""
    async def main():
        reported: list[dict] = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))

        async def fails():
            raise ValueError("x")

        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        await cancel_and_wait([task, asyncio.create_task(asyncio.sleep(10))])
        del task
        gc.collect()
        assert reported == []
        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        del task
        gc.collect()
        assert [type(c.get("exception")) for c in reported] == [ValueError]

    asyncio.run(main())
