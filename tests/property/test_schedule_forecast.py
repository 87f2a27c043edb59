"""broker.schedules.forecast: the runs folded into the console's forecast
are, for random schedules (every N seconds or milliseconds, crons in
zones, with endTime, limit, paused, pending runs due or ahead), exactly
those a walk of each schedule's own recurrence from its pending run finds
in the window, at most its runs left, and whatever the grouping; and the
work is done in bounded slices (every-second crons: 86,400 times a day
each, once worked out in one turn of the loop), a cut answer saying so."""

from __future__ import annotations

from collections.abc import Generator

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import broker.core.recurrence
import broker.schedules.forecast
from broker.core.recurrence import Misfire
from broker.schedules.forecast import SLICE_WORK, runs_by_slices
from broker.schedules.keeper import ScheduleState
from broker.schedules.params import ScheduleSpec
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
    got, cut = drive(runs_by_slices(states, NOW, until))
    assert not cut
    assert got == expected


def drive(steps: Generator[None, None, tuple[dict[int, int], bool]]) -> tuple[dict[int, int], bool]:
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def every_second(sid: str, cron: str = "* * * * * *") -> ScheduleState:
    spec = ScheduleSpec("t", sid, cron, None, "Europe/Paris", "x", 0, 0, 0, "", "", NOW - MS_PER_HOUR, None, None, 0,
                        Misfire.ONCE, 60_000, 10)
    recurrence = spec.recurrence()
    return ScheduleState(spec, recurrence, 1, False, recurrence.first_after(NOW), 1)


def test_three_every_second_crons_are_worked_out_in_bounded_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's forecast of three `* * * * * *` schedules walked each
    of the day's 86,400 times through the cron in one turn of the loop
    (5.9 s, /health waiting as long). Now: each slice makes or counts
    about SLICE_WORK times (at most an hour of one cron's, 3,600, past it)
    and takes a few instant_ms calls, never a walk of the cron's next times."""
    made: list[int] = []  # times cron_times made, in the slice under way
    instants: list[int] = []
    walks: list[int] = []
    real_times, real_instant, real_next = broker.core.recurrence.cron_times, broker.core.recurrence.instant_ms, \
        broker.core.recurrence._cron_at_or_after

    def counted_times(*args: object) -> Generator[list[int], None, None]:
        for piece in real_times(*args):  # type: ignore[arg-type]
            made.append(len(piece))
            yield piece

    def counted_instant(*args: object) -> int:
        instants.append(1)
        return real_instant(*args)  # type: ignore[arg-type]

    def counted_next(*args: object) -> int | None:
        walks.append(1)
        return real_next(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(broker.schedules.forecast, "cron_times", counted_times)
    monkeypatch.setattr(broker.core.recurrence, "instant_ms", counted_instant)
    monkeypatch.setattr(broker.core.recurrence, "_cron_at_or_after", counted_next)
    states = [every_second("a"), every_second("b"), every_second("c"), every_second("d", "*/1 * * * * *")]
    steps = runs_by_slices(states, NOW, NOW + 24 * MS_PER_HOUR)
    slices: list[tuple[int, int, int]] = []
    while True:
        made.clear(), instants.clear(), walks.clear()
        try:
            next(steps)
        except StopIteration as done:
            runs, cut = done.value
            break
        slices.append((sum(made), len(instants), len(walks)))
    assert not cut and sum(runs.values()) == 4 * (24 * 3600 - 1)  # (each pending run is a message already)
    assert len(slices) >= 2 * 2 * 24 * 3600 // (SLICE_WORK + 3600)  # two groups' times made, then counted
    assert max(made for made, _, _ in slices) <= SLICE_WORK + 3600
    assert max(calls for _, calls, _ in slices) <= 2 * (SLICE_WORK // 3600 + 2) + 6
    assert max(walked for _, _, walked in slices) == 0


def test_a_forecast_past_max_times_says_it_was_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker.schedules.forecast, "MAX_TIMES", 100_000)
    states = [every_second("a"), every_second("b", "*/1 * * * * *")]
    runs, cut = drive(runs_by_slices(states, NOW, NOW + 24 * MS_PER_HOUR))
    assert cut and 0 < sum(runs.values()) <= 100_000
