"""broker.schedule_forecast: the runs folded into the console's forecast
are, for random schedules (every N seconds or milliseconds, crons in
zones, with endTime, limit, paused, pending runs due or ahead), exactly
those a walk of each schedule's own recurrence from its pending run finds
in the window, at most its runs left, and whatever the grouping."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from broker.recurrence import Misfire
from broker.schedule_forecast import future_runs
from broker.schedule_params import ScheduleSpec
from broker.schedules import ScheduleState
from storage.entry import MS_PER_HOUR

NOW = 490_000 * MS_PER_HOUR + 777_123
CRONS = ("* * * * *", "*/15 * * * *", "0 * * * *", "30 2 * * *", "*/20 * * * * *", "0 9 * * MON-FRI")
ZONES = ("UTC", "America/New_York", "Australia/Lord_Howe")


@st.composite
def schedules(draw) -> ScheduleState:  # type: ignore[no-untyped-def]
    cron = draw(st.none() | st.sampled_from(CRONS))
    every = None if cron is not None else draw(st.sampled_from([1000, 60_000, 300_000, 7_000, 61_500]))
    start = NOW - draw(st.integers(0, 10 * MS_PER_HOUR))
    end = draw(st.none() | st.integers(NOW, NOW + 30 * MS_PER_HOUR))
    limit = draw(st.none() | st.integers(1, 50))
    spec = ScheduleSpec("t", f"s{draw(st.integers(0, 10**6))}", cron, every, draw(st.sampled_from(ZONES)), "x", 0, 0,
                        0, "", "", start, end, limit, 0, Misfire.ONCE, 60_000, 10)
    recurrence = spec.recurrence()
    pending = recurrence.first_at_or_after(NOW - draw(st.integers(-MS_PER_HOUR, 2 * MS_PER_HOUR)))
    runs = 0 if pending is None else draw(st.integers(1, limit or 50))
    return ScheduleState(spec, recurrence, 1, pending is None or draw(st.integers(0, 5)) == 0, pending, runs)


def walk(state: ScheduleState, after_ms: int, until_ms: int) -> list[int]:
    if state.paused or state.pending is None:
        return []
    left = state.runs_left()
    times, made = [], 0
    at = state.recurrence.first_after(state.pending)
    while at is not None and at <= until_ms and (left is None or made < left):
        made += 1  # a run before the window counts against the limit too
        if at > after_ms:
            times.append(at)
        at = state.recurrence.first_after(at)
    return times


@settings(max_examples=60, deadline=None)
@given(st.lists(schedules(), max_size=12))
def test_the_folded_runs_are_each_schedules_own(states):
    until = NOW + 6 * MS_PER_HOUR
    expected: dict[int, int] = {}
    for state in states:
        for at in walk(state, NOW, until):
            # whole-second every schedules are counted at their second's start
            key = at - at % 1000 if state.spec.every_ms is not None and state.spec.every_ms % 1000 == 0 else at
            expected[key] = expected.get(key, 0) + 1
    got, cut = future_runs(states, NOW, until)
    assert not cut
    assert got == expected
