"""wheel.clock: FakeClock, and the rule that nothing in wheel/ reads a clock."""

import asyncio
import pathlib
import re

from wheel.clock import Clock, FakeClock

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
