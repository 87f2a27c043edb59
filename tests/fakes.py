"""The test doubles of the layers' interfaces: a clock, a slot source and an
election set by hand. The product never imports them; tests do (tests/ is on
pytest's pythonpath) and mypy checks this module as strictly as the layers.

    FakeClock           a `wheel.clock.Clock` that moves only when told to
    InMemorySlotSource  the reference `wheel.source.SlotSource`: storage's
                        layout held in dicts
    FakeElection        a `replication.election.Election` set by hand
    FaultyDisk          a `storage.disk.Disk` that is full, short of free
                        space or failing its syncs when a test says so
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import errno
import itertools
import math
import os
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from broker.disk import syncer
from storage.disk import Disk
from storage.entry import SECONDS_PER_HOUR, IndexEntry, Location, Status, hour_and_second
from wheel.clock import Timer

T = TypeVar("T")
P = ParamSpec("P")


class _FakeTimer:
    __slots__ = ("callback", "cancelled", "due_ms")

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
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing waits any more
            self._loop.call_soon_threadsafe(self._clock._thread_ended)


# The clock `FakeClock.watch_threads` set for a loop, told when a syncer of
# that loop (broker.disk.syncer, the group commit's fsyncs) starts a sync
# and after the future it returned is resolved: `Syncer.sync` is replaced
# by `_watched_sync` from the first watch on.
_sync_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FakeClock] = weakref.WeakKeyDictionary()
_unwatched_sync = syncer.Syncer.sync


def _watched_sync(self: syncer.Syncer) -> asyncio.Future[float]:
    future = _unwatched_sync(self)
    clock = _sync_watchers.get(self._loop)
    if clock is not None:  # (the sync's answer comes on this loop, later: the end is seen)
        clock._thread_started()
        future.add_done_callback(lambda _: self._loop.call_soon(clock._thread_ended))
    return future


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

    Work in threads: a task awaiting a worker thread (asyncio.to_thread, or
    the group commit's fsync in broker.disk.syncer's thread) calls no
    sleep_until, so `settle` would take it for asleep and `run_until` would
    jump the time past deadlines while that work, and every task waiting
    for it, is still in flight. After `watch_threads()` the loop's default
    executor and the loop's syncer count their jobs, and `settle` also
    waits (in real time) until none is running.
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
        _sync_watchers[loop] = self  # the group commit's fsyncs
        syncer.Syncer.sync = _watched_sync  # type: ignore[method-assign]

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
        except BaseException:  # the waiter cancelled: what it waited on goes too (not left pending)
            task.cancel()
            raise
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


class _Hour:
    """One hour as storage files it: entries by globalIndex, and the second
    table (count and last globalIndex of every second)."""

    __slots__ = ("counts", "entries", "last_global")

    def __init__(self) -> None:
        self.entries: list[IndexEntry] = []
        self.counts = [0] * SECONDS_PER_HOUR
        self.last_global = [-1] * SECONDS_PER_HOUR


class InMemorySlotSource:
    """The reference `SlotSource`: storage's layout held in dicts.

    Worked example (hour h = 472_000, i.e. h * 3_600_000 ms since the epoch):

        add(t + 5_250, 0, now_ms=t)   t = h's start -> (h, 5),  local 0, global 0
        add(t + 5_100, 9, now_ms=t)                  -> (h, 5),  local 1, global 1, pre 0
        add(t - 60_000, 0, now_ms=t + 7_000)  late   -> (h, 7),  local 0, global 2
        read_second(h, 5) -> [global 0, global 1]   (arrival order, not trigger order)

    `seconds_read` and `counts_read` count the calls, so tests can show what
    the wheel read and when. Not thread-safe; nothing here reads a clock.
    """

    def __init__(self) -> None:
        self._hours: dict[int, _Hour] = {}
        self._sorted_hours: list[int] = []
        self.seconds_read = 0
        self.counts_read = 0

    def add(self, trigger_ms: int, priority: int, now_ms: int, *, topic_hash: int = 0,
            tag_hash: int = 0) -> IndexEntry:
        """File a new WAITING entry under max(trigger_ms, now_ms), as storage does."""
        hour, second = hour_and_second(max(trigger_ms, now_ms))
        h = self._hours.get(hour)
        if h is None:
            h = self._hours[hour] = _Hour()
            bisect.insort(self._sorted_hours, hour)
        entry = IndexEntry(hour=hour, second=second, local_index=h.counts[second],
                           global_index=len(h.entries), pre_global_index=h.last_global[second],
                           trigger_ms=trigger_ms, priority=priority, topic_hash=topic_hash,
                           tag_hash=tag_hash, status=Status.WAITING, retry=0)
        h.entries.append(entry)
        h.counts[second] += 1
        h.last_global[second] = entry.global_index
        return entry

    def set_status(self, location: Location, status: Status) -> IndexEntry:
        """Change the status of the entry at `location`; returns the new entry."""
        h = self._hours[location.hour]
        entry = h.entries[location.global_index]._replace(status=status)
        h.entries[location.global_index] = entry
        return entry

    def get(self, location: Location) -> IndexEntry:
        return self._hours[location.hour].entries[location.global_index]

    def __iter__(self) -> Iterator[IndexEntry]:
        """Every entry, hour by hour, globalIndex ascending."""
        for hour in self._sorted_hours:
            yield from self._hours[hour].entries

    def __len__(self) -> int:
        return sum(len(h.entries) for h in self._hours.values())

    # -- SlotSource --------------------------------------------------------

    def next_hour(self, from_hour: int) -> int | None:
        i = bisect.bisect_left(self._sorted_hours, from_hour)
        return self._sorted_hours[i] if i < len(self._sorted_hours) else None

    def second_counts(self, hour: int) -> Sequence[int]:
        self.counts_read += 1
        h = self._hours.get(hour)
        return tuple(h.counts) if h is not None else (0,) * SECONDS_PER_HOUR

    def read_second(self, hour: int, second: int) -> list[IndexEntry]:
        self.seconds_read += 1
        h = self._hours.get(hour)
        if h is None:
            return []
        out = []
        global_index = h.last_global[second]
        while global_index != -1:  # walk the preGlobalIndex chain back, as storage does
            entry = h.entries[global_index]
            out.append(entry)
            global_index = entry.pre_global_index
        out.reverse()
        return out

    def __repr__(self) -> str:
        return (f"InMemorySlotSource(hours={len(self._hours)}, entries={len(self)}, "
                f"seconds_read={self.seconds_read}, counts_read={self.counts_read})")


class FakeElection:
    """An `Election` a test sets by hand: the term, whom Raft calls leader,
    and whether claims commit. A claim commits (when `claims_commit`) only
    above the highest claimed term, as the Raft one does.

        election = FakeElection("n1", term=3, leader_id="n1")
        await election.claim(3)       # True: claimed == (3, "n1")
        await election.claim(3)       # False: not above the claimed term
    """

    def __init__(self, node_id: str, term: int = 0, leader_id: str | None = None) -> None:
        self.node_id = node_id
        self.term = term
        self.leader_id = leader_id
        self.claimed: tuple[int, str | None] = (0, None)
        self.claims_commit = True
        self.claims: list[int] = []  # every term claimed, committed or not
        self.closed = False
        self.transfers = 0  # transfer_lead calls
        self.pushes: dict[str, bytes] = {}  # the subscriptions replicated
        self.schedule_entries: dict[str, bytes] = {}  # the schedules' entries replicated
        self.flow_entries: dict[str, bytes] = {}  # the topic settings' entries replicated

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.node_id

    async def claim(self, term: int) -> bool:
        self.claims.append(term)
        if not self.claims_commit or term <= self.claimed[0]:
            return False
        self.claimed = (term, self.node_id)
        return True

    def subscriptions(self) -> dict[str, bytes]:
        return dict(self.pushes)

    async def set_subscription(self, topic: str, stored: bytes | None) -> bool:
        if not self.claims_commit:
            return False
        if stored is None:
            self.pushes.pop(topic, None)
        else:
            self.pushes[topic] = stored
        return True

    def schedules(self) -> dict[str, bytes]:
        return dict(self.schedule_entries)

    async def set_schedules(self, changes: Sequence[tuple[str, bytes | None]]) -> bool:
        if not self.claims_commit:
            return False
        for key, value in changes:
            if value is None:
                self.schedule_entries.pop(key, None)
            else:
                self.schedule_entries[key] = value
        return True

    def topic_settings(self) -> dict[str, bytes]:
        return dict(self.flow_entries)

    async def set_topic_settings(self, changes: Sequence[tuple[str, bytes | None]]) -> bool:
        if not self.claims_commit:
            return False
        for key, value in changes:
            if value is None:
                self.flow_entries.pop(key, None)
            else:
                self.flow_entries[key] = value
        return True

    async def transfer_lead(self) -> bool:
        """Nobody takes the lead here: the role loop's own tests set who leads."""
        self.transfers += 1
        return False

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"FakeElection(node={self.node_id}, term={self.term}, leader={self.leader_id}, claimed={self.claimed})"


class FaultyDisk(Disk):
    """The real disk (storage.disk), with the faults a test turns on while
    a store, log or file it was handed runs, and counts of what was asked:

        full            every block reservation (allocate, preallocate)
                        fails with ENOSPC, counted in `refused`
        free            what `free_bytes` reports (None: the real figure);
                        each read's path is kept in `free_reads`
        syncfs_error    what `syncfs` reports, without syncing (None: the
                        real syncfs); its calls counted in `syncfs_calls`
        fdatasync_error raised by `fdatasync` (None: the real one); every
                        call counted in `fdatasyncs`

    `preallocated` holds the size of every file `preallocate` reserved, and
    `fsynced` the path of every file and directory `fsync` made durable.

        disk = FaultyDisk()
        store = Store.open(path, disk=disk)
        disk.full = True              # the next segment or file growth: ENOSPC
    """

    def __init__(self) -> None:
        self.full = False
        self.refused = 0
        self.free: int | None = None
        self.free_reads: list[str] = []
        self.syncfs_error: int | None = None
        self.syncfs_calls = 0
        self.fdatasync_error: OSError | None = None
        self.fdatasyncs = 0
        self.preallocated: list[int] = []
        self.fsynced: list[str] = []

    def _reserve(self) -> None:
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")

    def allocate(self, fd: int, offset: int, length: int) -> None:
        self._reserve()
        super().allocate(fd, offset, length)

    def preallocate(self, fd: int, size_bytes: int) -> None:
        self._reserve()
        super().preallocate(fd, size_bytes)
        self.preallocated.append(size_bytes)

    def free_bytes(self, path: str) -> int:
        self.free_reads.append(path)
        return super().free_bytes(path) if self.free is None else self.free

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        if self.fdatasync_error is not None:
            raise self.fdatasync_error
        super().fdatasync(fd)

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self.fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))

    def syncfs(self, path: str) -> int:
        self.syncfs_calls += 1
        return super().syncfs(path) if self.syncfs_error is None else self.syncfs_error

    def __repr__(self) -> str:
        return (f"FaultyDisk(full={self.full}, refused={self.refused}, free={self.free}, "
                f"syncfs_error={self.syncfs_error}, fdatasyncs={self.fdatasyncs})")
