"""FakeClock (tests/fakes.py), and the rule that nothing in wheel/ reads a clock."""

import asyncio
import pathlib
import re
import threading

from fakes import FakeClock

from broker.disk.syncer import Syncer
from wheel.clock import Clock

WHEEL = pathlib.Path(__file__).resolve().parents[2] / "wheel"
CLOCK_READS = re.compile(r"\btime\.(time|monotonic|perf_counter|process_time|clock_gettime)\w*\b"
                         r"|\bimport time\b|\bfrom time\b|\bdatetime\b|\bdate\.today\b"
                         r"|\.now\(|\.utcnow\(|\bloop\.time\(|\.time\(\)")


def test_no_module_in_wheel_reads_the_system_clock():
    offenders = []
    for path in sorted(WHEEL.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if CLOCK_READS.search(code):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []
    assert len(list(WHEEL.glob("*.py"))) >= 8


def test_sleep_until_returns_at_the_deadline_or_on_wake():
    async def main():
        clock: Clock = FakeClock(100)
        assert isinstance(clock, FakeClock)
        wake = asyncio.Event()
        done = []

        async def sleeper(until):
            await clock.sleep_until(until, wake)
            done.append((until, clock.now_ms()))

        a = asyncio.create_task(sleeper(200))
        b = asyncio.create_task(sleeper(None))
        await clock.settle()
        assert clock.next_deadline_ms() == 200 and done == []
        clock.advance(99)
        await clock.settle()
        assert done == []
        clock.set(200)
        await clock.settle()
        assert done == [(200, 200)]
        wake.set()
        await asyncio.gather(a, b)
        assert done[-1] == (None, 200)
        assert clock.next_deadline_ms() is None
        assert repr(clock) == "FakeClock(now_ms=200, sleepers=0)"

    asyncio.run(main())


def test_an_expired_deadline_still_yields_once():
    async def main():
        clock = FakeClock(500)
        order = []

        async def other():
            order.append("other")

        task = asyncio.create_task(other())
        await clock.sleep_until(400, asyncio.Event())
        order.append("sleeper")
        await task
        assert order == ["other", "sleeper"]
        assert clock.sleeps == 1

    asyncio.run(main())


def test_run_until_jumps_from_deadline_to_deadline():
    async def main():
        clock = FakeClock(0)
        seen = []

        async def ticker():
            for until in (1_000, 7_200_000, 7_200_001):
                await clock.sleep_until(until, asyncio.Event())
                seen.append(clock.now_ms())

        task = asyncio.create_task(ticker())
        await clock.run_until(10_000_000)
        await task
        assert seen == [1_000, 7_200_000, 7_200_001]
        assert clock.now_ms() == 10_000_000

    asyncio.run(main())


def test_run_until_waits_for_work_in_threads_once_watched():
    """A task awaiting a worker thread calls no sleep_until: settle() takes
    it for asleep and run_until() jumps past its next deadline, unless the
    clock watches the loop's threads (as a slow fsync in the broker's group
    commit, run by asyncio.to_thread)."""
    async def main(watch: bool) -> list[tuple[str, int]]:
        clock = FakeClock(0)
        if watch:
            clock.watch_threads()
        gate = threading.Event()  # the thread's work ends when it is set
        seen = []

        def sync() -> str:
            gate.wait()
            return "synced"

        async def committer():
            seen.append((await asyncio.to_thread(sync), clock.now_ms()))
            await clock.sleep_until(1_000, asyncio.Event())
            seen.append(("woke", clock.now_ms()))

        task = asyncio.create_task(committer())
        if watch:
            threading.Timer(0.05, gate.set).start()
        await clock.run_until(5_000)
        gate.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    assert asyncio.run(main(watch=True)) == [("synced", 0), ("woke", 1_000)]
    assert asyncio.run(main(watch=False)) == []  # run_until returned with the thread still running


def test_run_until_waits_for_the_syncer_thread_once_watched():
    """The same for the group commit's own thread (broker.disk.syncer): a
    watched loop's syncs count as work in threads until answered."""
    async def main(watch: bool) -> list[tuple[str, int]]:
        clock = FakeClock(0)
        if watch:
            clock.watch_threads()
        gate = threading.Event()
        the_syncer = Syncer(gate.wait)
        seen = []

        async def committer():
            await the_syncer.sync()
            seen.append(("synced", clock.now_ms()))
            await clock.sleep_until(1_000, asyncio.Event())
            seen.append(("woke", clock.now_ms()))

        task = asyncio.create_task(committer())
        if watch:
            threading.Timer(0.05, gate.set).start()
        await clock.run_until(5_000)
        gate.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        the_syncer.close()
        return seen

    assert asyncio.run(main(watch=True)) == [("synced", 0), ("woke", 1_000)]
    assert asyncio.run(main(watch=False)) == []  # run_until returned with the sync still running


def test_monotonic_waits_timers_and_timeouts_follow_the_fake_time():
    async def main():
        clock = FakeClock(1_000)
        fired = []
        clock.call_later(0.5, lambda: fired.append(clock.now_ms()))
        cancelled = clock.call_later(0.2, lambda: fired.append("cancelled"))
        cancelled.cancel()
        slept = asyncio.create_task(clock.sleep(2))
        never = asyncio.get_running_loop().create_future()
        timed_out = asyncio.create_task(clock.wait_for(never, 1))
        quick = asyncio.get_running_loop().create_future()
        answered = asyncio.create_task(clock.wait_for(quick, 1))
        await clock.settle()
        assert clock.monotonic_s() == 1.0 and clock.next_deadline_ms() == 1_500
        quick.set_result("yes")
        assert await answered == "yes"
        await clock.run_until(1_999)
        assert fired == [1_500] and not timed_out.done()
        await clock.run_until(2_000)
        assert timed_out.done() and not slept.done()
        try:
            await timed_out
            raise AssertionError("wait_for did not time out")
        except TimeoutError:
            pass
        assert never.cancelled()
        await clock.run_until(3_000)
        assert slept.done() and clock.monotonic_s() == 3.0

    asyncio.run(main())


def test_the_system_clock_keeps_the_protocol():
    from broker.clock import SystemClock

    async def main():
        clock: Clock = SystemClock()
        fired = asyncio.Event()
        clock.call_later(0, fired.set)
        await clock.wait_for(fired.wait(), 5)
        before = clock.monotonic_s()
        await clock.sleep(0.01)
        assert clock.monotonic_s() > before
        try:
            await clock.wait_for(asyncio.Event().wait(), 0.01)
            raise AssertionError("wait_for did not time out")
        except TimeoutError:
            pass

    asyncio.run(main())


def test_the_system_clock_s_sleep_keeps_a_cancel_that_comes_with_its_wake():
    """A task woken and cancelled in the same turn of the loop is cancelled
    (asyncio.wait_for on Python 3.11 returned normally instead, and a wheel
    driver so woken and cancelled went on to wait for ever)."""
    from broker.clock import SystemClock

    async def main():
        clock, wake = SystemClock(), asyncio.Event()
        task = asyncio.create_task(clock.sleep_until(clock.now_ms() + 10_000, wake))
        await asyncio.sleep(0.01)
        wake.set()
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=2)
        assert task in done and task.cancelled()

    asyncio.run(main())
