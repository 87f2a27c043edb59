"""Hypothesis properties of wheel.scheduler.Scheduler on a fake clock.

Every scheduled message is released exactly once, never before its
trigger, in (trigger, -priority) order; a scheduler woken only when it
asks (next_wakeup_ms) releases each message at its exact trigger ms and
wakes a number of times proportional to the non-empty slots, not to the
time span; a restart from a persisted tick re-releases nothing acked.
"""

from __future__ import annotations

from collections import Counter, deque

from fakes import InMemorySlotSource
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.entry import MS_PER_HOUR, MS_PER_SECOND, SECONDS_PER_HOUR, IndexEntry, Status
from wheel.scheduler import Scheduler, SchedulerConfig
from wheel.tick_state import TickState
from wheel.window import release_key

H = 472_000
T0 = H * MS_PER_HOUR
YEAR_MS = 365 * 24 * MS_PER_HOUR
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])



@st.composite
def grid(draw: st.DrawFn, low_ms: int, high_ms: int, step_ms: int = 250) -> int:
    """Times on a coarse grid, give or take 1 ms: collisions and off-by-ones."""
    n = draw(st.integers(low_ms // step_ms, high_ms // step_ms))
    return min(max(low_ms, n * step_ms + draw(st.sampled_from([0, -1, 1]))), high_ms)


delays = st.one_of(
    grid(-5_000, 0),  # already due when sent: filed into the current second
    grid(1, 30_000),  # inside or just past the preload window
    st.integers(30_000, 3 * MS_PER_HOUR),  # cascades down from the hours wheel
    st.integers(1, 3 * YEAR_MS),  # anything up to years
)
priorities = st.integers(-2, 2)


def bounded(limit: int = 100_000):
    """Loop guard: a scheduler that never stops asking to be polled is a bug."""
    yield from range(limit)
    raise AssertionError("no progress: the scheduler keeps asking to be polled")


def position(entry: IndexEntry) -> tuple[int, int]:
    return (entry.hour * SECONDS_PER_HOUR + entry.second, entry.local_index)


def check_batch(now_ms: int, batch: list[IndexEntry], limit: int | None = None) -> None:
    assert all(e.trigger_ms <= now_ms for e in batch), "released before its trigger"
    keys = [release_key(e) for e in batch]
    assert keys == sorted(keys), "a poll's batch is out of order"
    if limit is not None:
        assert len(batch) <= limit


@SETTINGS
@given(sends=st.lists(st.tuples(grid(0, 20_000), delays, priorities), max_size=40),
       preload_ms=st.sampled_from([0, 1_000, 10_000]),
       start_ms=st.integers(0, MS_PER_HOUR - 1))
def test_woken_only_when_asked_it_releases_each_message_once_at_its_exact_trigger(sends, preload_ms, start_ms):
    start = T0 + start_ms
    src = InMemorySlotSource()
    sched = Scheduler(src, None, start, SchedulerConfig(preload_ms=preload_ms, commit_lag_ms=0))
    arrivals = deque(sorted((start + at, i, delay, priority) for i, (at, delay, priority) in enumerate(sends)))
    arrived: dict = {}
    released: list[tuple[int, IndexEntry]] = []
    now = start
    for _ in bounded():
        wakeup = sched.next_wakeup_ms()
        if arrivals and (wakeup is None or arrivals[0][0] < wakeup):
            now, _, delay, priority = arrivals.popleft()
            entry = src.add(now + delay, priority, now)
            arrived[entry.location] = now
            sched.on_new(entry)
            continue
        if wakeup is None:
            break
        now = max(now, wakeup)
        batch = sched.poll(now)
        check_batch(now, batch)
        released.extend((now, e) for e in batch)

    assert Counter(e.location for _, e in released) == Counter(arrived.keys())  # each exactly once
    for at_ms, e in released:
        sent_ms = arrived[e.location]
        assert at_ms == max(e.trigger_ms, sent_ms), "not released at its exact trigger ms"
    on_time = [release_key(e) for _, e in released if e.trigger_ms > arrived[e.location]]
    assert on_time == sorted(on_time)


ops = st.lists(st.one_of(
    st.tuples(st.just("send"), delays, priorities),
    st.tuples(st.just("poll"), st.one_of(grid(-5_000, 20_000), st.integers(0, 2 * MS_PER_HOUR))),
), max_size=60)


@SETTINGS
@given(ops=ops, limit=st.integers(1, 6), preload_ms=st.sampled_from([0, 2_000, 10_000]))
def test_polled_at_arbitrary_times_never_early_never_twice_nothing_dropped(ops, limit, preload_ms):
    src = InMemorySlotSource()
    config = SchedulerConfig(preload_ms=preload_ms, max_release_per_poll=limit, commit_lag_ms=0)
    sched = Scheduler(src, None, T0, config)
    now = max_now = T0
    sent: list[IndexEntry] = []
    released: list[IndexEntry] = []
    for op in ops:
        if op[0] == "send":
            e = src.add(now + op[1], op[2], now)
            sent.append(e)
            sched.on_new(e)
        else:
            now += op[1]  # the wall clock may step back
            max_now = max(max_now, now)
            batch = sched.poll(now)
            check_batch(now, batch, limit)
            released.extend(batch)
            assert sched._wheel.loaded_below_s * MS_PER_SECOND <= max_now + preload_ms + MS_PER_SECOND  # RAM: the preload window
            assert len(sched._window) <= len(sent) - len(released)
    end = max([now, *(e.trigger_ms for e in sent)])
    for _ in bounded():
        if (wakeup := sched.next_wakeup_ms()) is None:
            break
        now = max(now, min(wakeup, end))
        batch = sched.poll(now)
        check_batch(now, batch, limit)
        released.extend(batch)
        if not batch and wakeup > end:
            break
    assert Counter(e.location for e in released) == Counter(e.location for e in sent)
    assert len(sched._window) == 0


@SETTINGS
@given(seconds=st.sets(st.integers(1, 30 * 24 * SECONDS_PER_HOUR), max_size=30),
       ms=st.lists(st.integers(0, 999), min_size=30, max_size=30))
def test_wakeups_follow_the_non_empty_slots_not_the_time_span(seconds, ms):
    src = InMemorySlotSource()
    entries = [src.add(T0 + s * MS_PER_SECOND + m, 0, T0) for s, m in zip(sorted(seconds), ms)]
    sched = Scheduler(src, None, T0, SchedulerConfig(commit_lag_ms=0))
    now = T0
    for _ in bounded():
        if (wakeup := sched.next_wakeup_ms()) is None:
            break
        now = max(now, wakeup)
        sched.poll(now)
    hours = {e.hour for e in entries}
    assert sched.stats.released == len(entries)
    assert sched.wakeups <= len(hours) + 2 * len(entries)  # an hour cascade, a preload, a release
    assert sched.stats.seconds_loaded == len(entries)
    assert sched.stats.hours_cascaded == len(hours)


@SETTINGS
@given(sends=st.lists(st.tuples(st.integers(-2_000, 120_000), priorities), max_size=40),
       crash_ms=st.integers(0, 130_000),
       downtime_ms=st.one_of(st.integers(-20_000, 0), st.integers(0, 200_000)),
       lag_ms=st.sampled_from([0, 100, 1_500]),
       data=st.data())
def test_restart_from_a_persisted_tick_re_releases_nothing_acked(sends, crash_ms, downtime_ms, lag_ms, data):
    src = InMemorySlotSource()
    config = SchedulerConfig(commit_lag_ms=lag_ms, max_release_per_poll=7)
    sched = Scheduler(src, None, T0, config)
    sent = []
    for delay, priority in sends:
        e = src.add(T0 + delay, priority, T0)
        sent.append(e)
        sched.on_new(e)
    now = T0
    before: list[IndexEntry] = []
    persisted = [sched.tick]  # what a driver would have written, one per poll
    for _ in bounded():
        if (wakeup := sched.next_wakeup_ms()) is None or wakeup > T0 + crash_ms:
            break
        now = max(now, wakeup)
        batch = sched.poll(now)
        check_batch(now, batch)
        before.extend(batch)
        persisted.append(sched.tick)
    # The crash: the last tick written may be a little stale.
    tick = persisted[-1 - data.draw(st.integers(0, min(3, len(persisted) - 1)), label="staleness")]
    acked = {e.location for e in before if data.draw(st.booleans(), label=f"ack {e.location}")}
    for location in acked:
        src.set_status(location, Status.ACKED)

    now = max(T0, T0 + crash_ms + downtime_ms)
    again = Scheduler(src, tick, now, config)
    after: list[IndexEntry] = []
    for _ in bounded():
        if (wakeup := again.next_wakeup_ms()) is None:
            break
        now = max(now, wakeup)
        batch = again.poll(now)
        check_batch(now, batch)
        after.extend(batch)

    after_locations = Counter(e.location for e in after)
    assert max(after_locations.values(), default=1) == 1
    assert not acked & set(after_locations), "an acked message was released again"
    released_before = {e.location for e in before}
    for e in after:
        if e.location in released_before:  # at-least-once: only what the tick did not cover yet
            assert position(e) >= tick.position
    assert released_before | set(after_locations) == {e.location for e in sent}
    never_before = {e.location for e in sent} - released_before
    assert never_before <= set(after_locations)


@SETTINGS
@given(per_second=st.lists(st.integers(0, 40), min_size=1, max_size=20), limit=st.integers(1, 50),
       behind_hours=st.integers(1, 48))
def test_catch_up_is_bounded_per_poll_in_memory_and_reported(per_second, limit, behind_hours):
    src = InMemorySlotSource()
    entries = [src.add(T0 + s * MS_PER_SECOND + (37 * i) % 1_000, i % 3, T0)
               for s, n in enumerate(per_second) for i in range(n)]
    now = T0 + behind_hours * MS_PER_HOUR
    sched = Scheduler(src, TickState(H, 0, 0), now, SchedulerConfig(max_release_per_poll=limit, commit_lag_ms=0))
    out = []
    for _ in bounded():
        if (wakeup := sched.next_wakeup_ms()) is None or wakeup > now:
            break
        batch = sched.poll(now)
        check_batch(now, batch, limit)
        out.extend(batch)
        assert len(sched._window) <= limit + max(per_second)
    assert out == sorted(entries, key=release_key)
    report = sched.catch_up
    if entries:
        assert report is not None and not report.active
        assert report.overdue == len(entries) and report.released == len(entries)
        assert report.max_lateness_ms == now - min(e.trigger_ms for e in entries)
