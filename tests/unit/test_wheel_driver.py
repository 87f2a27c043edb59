"""wheel.driver.WheelDriver on a FakeClock: wake-ups, early wake, ticks, stop."""

import asyncio
import itertools
import logging

import pytest
from fakes import FakeClock, InMemorySlotSource

from storage.entry import MS_PER_HOUR, IndexEntry
from storage.errors import ContractError, Unavailable
from wheel.driver import WheelDriver
from wheel.scheduler import Scheduler, SchedulerConfig
from wheel.tick_state import TickState, TickStateFile, parse
from wheel.window import release_key

H = 472_000
T0 = H * MS_PER_HOUR
EXACT = SchedulerConfig(commit_lag_ms=0)


class Rig:
    """A scheduler, a fake clock, and a driver recording what it does."""

    def __init__(self, tick: TickState | None = None, now_ms: int = T0, config: SchedulerConfig = EXACT,
                 source: InMemorySlotSource | None = None) -> None:
        self.clock = FakeClock(now_ms)
        self.source = source if source is not None else InMemorySlotSource()
        self.sched = Scheduler(self.source, tick, now_ms, config)
        self.delivered: list[tuple[int, IndexEntry]] = []
        self.persisted: list[tuple[int, TickState]] = []
        self.driver = WheelDriver(self.sched, self.clock, self.deliver, persist_tick=self.persist)

    async def deliver(self, batch: list[IndexEntry]) -> None:
        now = self.clock.now_ms()
        self.delivered.extend((now, e) for e in batch)
        await asyncio.sleep(0)

    def persist(self, tick: TickState) -> None:
        self.persisted.append((self.clock.now_ms(), tick))

    def send(self, trigger_ms: int, priority: int = 0) -> IndexEntry:
        entry = self.source.add(trigger_ms, priority, self.clock.now_ms())
        self.sched.on_new(entry)
        return entry

    def start(self) -> asyncio.Task:
        return asyncio.create_task(self.driver.run())

    async def stop(self, task: asyncio.Task) -> None:
        self.driver.stop()
        await task


def test_idle_with_one_message_two_hours_ahead_sleeps_the_whole_gap():
    async def main():
        rig = Rig()
        e = rig.send(T0 + 2 * MS_PER_HOUR + 300_250)
        task = rig.start()
        await rig.clock.run_until(T0 + 3 * MS_PER_HOUR)
        await rig.stop(task)
        assert rig.delivered == [(e.trigger_ms, e)]
        assert rig.driver.wakeups == 4  # start, cascade the hour, preload the second, release
        assert rig.clock.sleeps <= 5
        assert len(rig.persisted) <= 5

    asyncio.run(main())


def test_an_earlier_message_wakes_the_sleeping_driver():
    async def main():
        rig = Rig()
        rig.send(T0 + 2 * MS_PER_HOUR)
        task = rig.start()
        await rig.clock.run_until(T0 + 1_000)
        assert rig.clock.next_deadline_ms() == T0 + 2 * MS_PER_HOUR - 10_000
        soon = rig.send(T0 + 3_000)
        await rig.clock.settle()
        assert rig.clock.next_deadline_ms() == T0 + 3_000
        await rig.clock.run_until(T0 + 5_000)
        assert rig.delivered == [(T0 + 3_000, soon)]
        assert rig.sched.stats.early_wakes >= 1
        await rig.stop(task)

    asyncio.run(main())


def test_a_clock_stepping_back_never_delivers_early():
    async def main():
        rig = Rig()
        e = rig.send(T0 + 20_000)
        task = rig.start()
        await rig.clock.run_until(T0 + 15_000)
        rig.clock.set(T0 + 5_000)  # NTP stepped the wall clock back 10 s
        await rig.clock.run_until(T0 + 19_999)
        assert rig.delivered == []
        await rig.clock.run_until(T0 + 25_000)
        assert rig.delivered == [(T0 + 20_000, e)]
        await rig.stop(task)

    asyncio.run(main())


def test_the_tick_is_persisted_within_the_interval_and_not_more_often():
    async def main():
        rig = Rig()
        for i in range(100):
            rig.send(T0 + 1_000 + 10 * i)
        task = rig.start()
        await rig.clock.run_until(T0 + 2_500)
        times = [t for t, _ in rig.persisted]
        assert all(b - a >= 50 for a, b in itertools.pairwise(times))
        assert rig.persisted[-1][1] == rig.sched.tick  # nothing changed since: all written
        last_release = rig.delivered[-1][0]
        assert any(last_release <= t <= last_release + 50 for t in times)
        assert len(rig.delivered) == 100
        await rig.stop(task)

    asyncio.run(main())


def test_stop_persists_the_final_tick_to_a_file(tmp_path):
    async def main():
        with TickStateFile(tmp_path / "tick") as f:
            rig = Rig()
            rig.driver = WheelDriver(rig.sched, rig.clock, rig.deliver, persist_tick=f.write)
            for i in range(10):
                rig.send(T0 + 2_000 + 333 * i)
            task = rig.start()
            await rig.clock.run_until(T0 + 3_000)
            rig.send(T0 + 3_000)  # due now, delivered before stopping
            await rig.stop(task)
            assert f.state == rig.sched.tick
        assert parse((tmp_path / "tick").read_bytes())[1] == rig.sched.tick  # the newest state written

    asyncio.run(main())


def test_a_failing_delivery_stops_the_loop_without_persisting_that_batch():
    async def main():
        rig = Rig()

        def deliver(batch):
            raise RuntimeError("ready queue is gone")

        rig.driver = WheelDriver(rig.sched, rig.clock, deliver, persist_tick=rig.persist)
        rig.send(T0 + 1_000)
        task = rig.start()
        await rig.clock.run_until(T0 + 2_000)
        with pytest.raises(RuntimeError, match="ready queue is gone"):
            await task
        assert all(tick.position <= TickState(H, 1, 0).position for _, tick in rig.persisted)

    asyncio.run(main())


def test_catch_up_after_downtime_is_batched_in_order_and_logged(caplog):
    async def main():
        source = InMemorySlotSource()
        entries = [source.add(T0 + 3 * i, i % 4, T0) for i in range(1_000)]
        rig = Rig(tick=TickState(H, 0, 0), now_ms=T0 + MS_PER_HOUR, source=source,
                  config=SchedulerConfig(max_release_per_poll=100, commit_lag_ms=0))
        task = rig.start()
        await rig.clock.run_until(T0 + MS_PER_HOUR + 10)
        await rig.stop(task)
        assert [e for _, e in rig.delivered] == sorted(entries, key=release_key)
        assert rig.driver.wakeups >= 10
        report = rig.sched.catch_up
        assert report is not None and report.overdue == 1_000 and not report.active

    with caplog.at_level(logging.WARNING, logger="hourglass.wheel"):
        asyncio.run(main())
    assert any("caught up" in r.getMessage() and "1000 overdue" in r.getMessage() for r in caplog.records)


def test_run_twice_and_bad_interval_are_refused():
    async def main():
        rig = Rig()
        task = rig.start()
        await rig.clock.settle()
        with pytest.raises(ContractError, match="already running"):
            await rig.driver.run()
        await rig.stop(task)
        assert "stopping=True" in repr(rig.driver)

    asyncio.run(main())
    with pytest.raises(ValueError, match="tick_interval_ms"):
        WheelDriver(Rig().sched, FakeClock(), lambda batch: None, tick_interval_ms=0)


def test_with_a_commit_lag_the_tick_covering_a_release_is_written_soon_after():
    async def main():
        rig = Rig(config=SchedulerConfig(commit_lag_ms=100))
        e = rig.send(T0 + 2 * MS_PER_HOUR + 300_050)  # within 100 ms of its second's start
        task = rig.start()
        await rig.clock.run_until(T0 + 3 * MS_PER_HOUR)
        assert rig.delivered == [(e.trigger_ms, e)]
        assert rig.driver.wakeups == 5
        at_ms, tick = rig.persisted[-1]
        assert at_ms == e.trigger_ms + 101 and tick.position > (e.hour * 3600 + e.second, e.local_index)
        await rig.stop(task)

    asyncio.run(main())


def test_a_slow_tick_persist_delays_no_release():
    """A persist that waits (a cluster's, for a quorum's acknowledgement)
    runs beside the loop: messages due meanwhile are released at their
    times, one write is under way at a time, and the last tick is written
    when the driver stops."""
    async def main():
        rig = Rig()
        unblock = asyncio.Event()
        writes: list[tuple[int, TickState]] = []
        under_way = 0
        most = 0

        async def slow_persist(tick: TickState) -> None:
            nonlocal under_way, most
            under_way += 1
            most = max(most, under_way)
            await unblock.wait()
            writes.append((rig.clock.now_ms(), tick))
            under_way -= 1

        rig.driver = WheelDriver(rig.sched, rig.clock, rig.deliver, persist_tick=slow_persist)
        entries = [rig.send(T0 + 1_000 * i) for i in range(1, 6)]
        task = rig.start()
        await rig.clock.run_until(T0 + 6_000)
        assert [(at, e) for at, e in rig.delivered] == [(e.trigger_ms, e) for e in entries]  # none late
        assert writes == [] and most == 1
        unblock.set()
        await rig.clock.run_until(T0 + 7_000)
        await rig.stop(task)
        assert most == 1 and writes and writes[-1][1] == rig.sched.tick

    asyncio.run(main())


def test_a_driver_stopped_and_cancelled_at_once_ends_even_if_its_sleep_swallowed_the_cancel():
    """Broker.abandon stops the driver and cancels its task together. If the
    sleep it was in ends normally anyway (on Python 3.11, asyncio.wait_for
    whose wait ended as the cancel came in did so), the loop sees it must
    stop; the last tick persist, which would wait for commits that will
    never come, is skipped: the task ends (a fault drill saw a node stuck
    for good in such a wait, never following again)."""
    class Swallowing(FakeClock):
        async def sleep_until(self, wall_ms, wake):
            try:
                await wake.wait()
            except asyncio.CancelledError:
                return  # the cancel swallowed

    async def main():
        clock = Swallowing(T0)
        sched = Scheduler(InMemorySlotSource(), None, T0, EXACT)
        never = asyncio.get_running_loop().create_future()

        async def persist(tick: TickState) -> None:
            await never  # the commits it waits for are gone

        driver = WheelDriver(sched, clock, lambda batch: None, persist_tick=persist)
        task = asyncio.create_task(driver.run())
        await asyncio.sleep(0.01)
        driver.stop()
        task.cancel()
        await asyncio.wait([task], timeout=2)
        assert task.done()

    asyncio.run(main())


@pytest.mark.parametrize(("error", "warned"), [
    (Unavailable("the commit log failed: this node stopped leading"), False),  # the stand-down: nothing new
    (OSError(28, "No space left on device"), True),  # the tick file's own write: said in the log
])
def test_a_tick_persist_that_failed_as_the_driver_was_cancelled_is_no_unretrieved_error(error, warned, caplog):
    """A node standing down fails its commits and cancels the driver: a
    persist under way beside the loop ends with Unavailable, and the loop
    is cancelled before it looks. That error goes with the driver; it is
    not left for asyncio to report as "Task exception was never retrieved"
    (a fault drill's leaders logged one at every stand-down). Another
    error of that persist is logged as a warning."""
    import gc

    reported: list[dict] = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
        rig = Rig()
        fail = asyncio.Event()

        async def failing_persist(tick: TickState) -> None:
            await fail.wait()
            raise error

        rig.driver = WheelDriver(rig.sched, rig.clock, rig.deliver, persist_tick=failing_persist)
        rig.send(T0 + 1_000)
        task = rig.start()
        await rig.clock.run_until(T0 + 1_500)  # released: a persist under way
        fail.set()
        await asyncio.sleep(0)  # the persist fails; the loop has not looked yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        del task
        gc.collect()

    with caplog.at_level(logging.WARNING, logger="hourglass.wheel"):
        asyncio.run(main())
        gc.collect()
    assert [c for c in reported if "exception" in c] == []
    assert any("tick persist failed" in r.getMessage() for r in caplog.records) == warned
