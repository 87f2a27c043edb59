"""Stateful test: the scheduler against a sorted-list model.

Rules mix sending (any delay, already due included; on_new at once or
up to commit_lag_ms later, as a group commit does), deleting, acking,
letting time pass the way the driver does (polling at every wake-up),
downtime (one late poll), the wall clock stepping back, and restarts from
the tick written to and re-read from a `TickStateFile`. The model is the
sorted list of release keys the scheduler still owes. Checked throughout:
nothing released early, twice, out of order or while not WAITING; nothing
owed left behind once its time has passed; the tick never passes a
message still owed; RAM holds only the preload window.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from fakes import InMemorySlotSource
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from sortedcontainers import SortedList

from storage.entry import MS_PER_HOUR, MS_PER_SECOND, SECONDS_PER_HOUR, IndexEntry, Location, Status
from wheel.scheduler import Scheduler, SchedulerConfig
from wheel.tick_state import TickStateFile
from wheel.window import release_key

H = 472_000
T0 = H * MS_PER_HOUR



@st.composite
def grid(draw: st.DrawFn, low_ms: int, high_ms: int, step_ms: int = 250) -> int:
    """Times on a coarse grid, give or take 1 ms: collisions and off-by-ones."""
    n = draw(st.integers(low_ms // step_ms, high_ms // step_ms))
    return min(max(low_ms, n * step_ms + draw(st.sampled_from([0, -1, 1]))), high_ms)


def bounded(limit: int = 100_000):
    """Loop guard: a scheduler that never stops asking to be polled is a bug."""
    yield from range(limit)
    raise AssertionError("no progress: the scheduler keeps asking to be polled")


delays = st.one_of(
    grid(-10_000, 0),
    grid(1, 20_000),
    st.integers(20_000, 4 * MS_PER_HOUR),
    st.integers(1, 2 * 365 * 24 * MS_PER_HOUR),
)


def position(entry: IndexEntry) -> tuple[int, int]:
    return (entry.hour * SECONDS_PER_HOUR + entry.second, entry.local_index)


class WheelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="hourglass-wheel-")
        self.path = os.path.join(self.directory, "tick")
        self.tick_file = TickStateFile(self.path)
        self.src = InMemorySlotSource()
        self.now = self.max_now = self.polled_max = T0 + 1_234
        self.owed: SortedList = SortedList()  # release keys the scheduler must still release
        self.on_time: set[Location] = set()  # reported with a trigger after every poll so far
        self.unacked: set[Location] = set()  # released, not acked or deleted yet
        self.last_on_time_key: tuple | None = None
        self.in_flight: list[tuple[int, IndexEntry]] = []  # (on_new at the latest, entry) filed, not reported

    @initialize(preload_ms=st.sampled_from([0, 1_000, 10_000]), limit=st.sampled_from([1, 3, 1_000]),
                lag_ms=st.sampled_from([0, 100, 2_000]))
    def start(self, preload_ms: int, limit: int, lag_ms: int) -> None:
        self.config = SchedulerConfig(preload_ms=preload_ms, max_release_per_poll=limit, commit_lag_ms=lag_ms)
        self.sched = Scheduler(self.src, None, self.now, self.config)

    def teardown(self) -> None:
        self.tick_file.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- what happens to messages ---------------------------------------------

    def _file(self, delay_ms: int, priority: int) -> IndexEntry:
        e = self.src.add(self.now + delay_ms, priority, self.now)
        self.owed.add(release_key(e))
        return e

    def _report(self, e: IndexEntry) -> None:
        """on_new. A message filed into its own trigger's second and reported
        before that trigger and after every poll so far must come out in key
        order with the others like it (one filed late goes out when it can)."""
        filed_ms = (e.hour * SECONDS_PER_HOUR + e.second) * MS_PER_SECOND
        if e.trigger_ms > self.polled_max and e.trigger_ms >= filed_ms:
            self.on_time.add(e.location)
        self.sched.on_new(e)

    @rule(delay_ms=delays, priority=st.integers(-2, 2))
    def send(self, delay_ms: int, priority: int) -> None:
        self._land(float("inf"))  # commits complete in filing order: earlier ones first
        self._report(self._file(delay_ms, priority))

    @precondition(lambda self: self.now == self.max_now)
    @rule(delay_ms=delays, priority=st.integers(-2, 2))
    def send_slowly(self, delay_ms: int, priority: int) -> None:
        """Storage files the message now, but its group commit calls on_new
        only up to commit_lag_ms later (a crash may come first)."""
        e = self._file(delay_ms, priority)
        self.in_flight.append((self.now + self.config.commit_lag_ms, e))

    def _land(self, up_to_ms: float) -> None:
        """Storage's commits due by up_to_ms complete: on_new for each."""
        landed = [e for deadline, e in self.in_flight if deadline <= up_to_ms]
        self.in_flight = [(deadline, e) for deadline, e in self.in_flight if deadline > up_to_ms]
        for e in landed:
            self._report(e)

    @precondition(lambda self: len(self.owed) > len(self.in_flight))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        committed = [k for k in self.owed if k not in {release_key(e) for _, e in self.in_flight}]
        key = data.draw(st.sampled_from(committed), label="delete")  # not visible before its commit
        location = Location(key[2], key[3])
        self.src.set_status(location, Status.DELETED)
        self.sched.cancel(location)
        self.owed.remove(key)

    @precondition(lambda self: len(self.unacked) > 0)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        location = data.draw(st.sampled_from(sorted(self.unacked)), label="ack")
        self.src.set_status(location, Status.ACKED)
        self.sched.cancel(location)  # a re-read copy, if the scheduler holds one, must go too
        self.unacked.discard(location)
        key = release_key(self.src.get(location))
        if key in self.owed:
            self.owed.remove(key)

    # -- what happens to time -------------------------------------------------

    @rule(delta_ms=st.one_of(grid(0, 15_000), st.integers(0, 3 * MS_PER_HOUR)))
    def advance(self, delta_ms: int) -> None:
        """The driver: poll at every wake-up up to now + delta."""
        target = self.now + delta_ms
        for _ in bounded():
            wakeup = self.sched.next_wakeup_ms()
            landing = min((deadline for deadline, _ in self.in_flight), default=None)
            if landing is not None and landing <= target and (wakeup is None or landing <= wakeup):
                self._land(landing)
                continue
            if wakeup is None or wakeup > target:
                break
            self._poll(max(self.now, wakeup))
        self._set_now(target)
        self._nothing_due_is_left()

    @rule(delta_ms=st.integers(0, 2 * MS_PER_HOUR))
    def downtime(self, delta_ms: int) -> None:
        """No poll for a while, then catch up at the new time."""
        self._set_now(self.now + delta_ms)
        self._poll(self.now)
        for _ in bounded():
            if (wakeup := self.sched.next_wakeup_ms()) is None or wakeup > self.now:
                break
            self._poll(self.now)
        self._nothing_due_is_left()

    @rule(back_ms=grid(1, 30_000))
    def step_back(self, back_ms: int) -> None:
        self._set_now(self.now - back_ms)
        self._poll(self.now)

    @rule(stale=st.booleans())
    def restart(self, stale: bool) -> None:
        tick = self.sched.tick
        if stale and self.tick_file.state is not None:  # the file may lag the memory: an older tick
            tick = min(tick, self.tick_file.state, key=lambda t: t.position)
        self.tick_file.write(tick)
        self.tick_file.close()
        self.tick_file = TickStateFile(self.path)
        assert self.tick_file.state == tick

        after_tick = {e.location: e for e in self.src
                      if e.status == Status.WAITING and position(e) >= tick.position}
        owed = {Location(k[2], k[3]) for k in self.owed}  # in-flight commits included
        assert owed <= set(after_tick), "the tick passed a message that was never released"
        self.in_flight = []  # committed: the new scheduler reads them from storage
        self.owed = SortedList(release_key(e) for e in after_tick.values())  # at-least-once
        self.last_on_time_key = None
        self.sched = Scheduler(self.src, tick, self.now, self.config)

    # -- checks ---------------------------------------------------------------

    def _set_now(self, now_ms: int) -> None:
        self.now = now_ms
        self.max_now = max(self.max_now, now_ms)

    def _poll(self, now_ms: int) -> None:
        self._land(max(self.max_now, now_ms))  # storage's commits never take longer than commit_lag_ms
        batch = self.sched.poll(now_ms)
        self.polled_max = max(self.polled_max, now_ms)
        assert len(batch) <= self.config.max_release_per_poll
        keys = [release_key(e) for e in batch]
        assert keys == sorted(keys)
        for e, key in zip(batch, keys):
            assert e.trigger_ms <= now_ms, "released before its trigger"
            assert self.src.get(e.location).status == Status.WAITING, "released while not WAITING"
            assert key in self.owed, "released twice"
            self.owed.remove(key)
            self.unacked.add(e.location)
            if e.location in self.on_time:
                assert self.last_on_time_key is None or key >= self.last_on_time_key, "out of order"
                self.last_on_time_key = key
        self.tick_file.write(self.sched.tick)

    def _nothing_due_is_left(self) -> None:
        in_flight = {release_key(e) for _, e in self.in_flight}
        for key in self.owed:
            if key[0] > self.now:
                break
            if key in in_flight:
                continue
            # Filed late into a second the clock (stepped back) is still more
            # than the preload lead before: only its read can find it, and the
            # read of that second is not due yet. Late, never early.
            entry = self.src.get(Location(key[2], key[3]))
            bucket_ms = (entry.hour * SECONDS_PER_HOUR + entry.second) * MS_PER_SECOND
            assert bucket_ms - self.config.preload_ms > self.now, "a due message was left behind"

    @invariant()
    def tick_never_passes_an_owed_message(self) -> None:
        tick = self.sched.tick.position
        for key in self.owed:
            assert position(self.src.get(Location(key[2], key[3]))) >= tick

    @invariant()
    def ram_holds_only_the_preload_window(self) -> None:
        assert self.sched._wheel.loaded_below_s * MS_PER_SECOND <= self.max_now + self.config.preload_ms + MS_PER_SECOND
        assert len(self.sched._window) <= len(self.owed)


WheelMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestWheelMachine = WheelMachine.TestCase
