"""broker.core.recurrence's arithmetic against the walk it replaces: the runs a
downtime missed (`Recurrence.count_between`) and a cron's instants in a
window (`cron_times`, the console's forecast), for random crons, zones and
windows around DST changes.

    count_between, everyMillis              the walk's count, exactly
    count_between, a cron in a zone that
      keeps one offset in the window        the walk's count, exactly
    count_between, a cron across a change   within the runs of the hours
                                            the clocks skip or repeat
    cron_times, any zone                    the walk's instants, exactly

The walk is `first_after` from the first time to the last, one call a run.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.recurrence import Cron, Recurrence, cron_times

HOUR = 3_600_000
DAY = 24 * HOUR
# Instants near DST changes: New York's (spring, fall 2024), London's, Lord Howe's (30 min), Troll's (2 h)
CHANGES = tuple(int(dt.datetime(*d, tzinfo=dt.UTC).timestamp() * 1000) for d in (
    (2024, 3, 10, 7), (2024, 11, 3, 6), (2024, 3, 31, 1), (2024, 10, 27, 1), (2024, 4, 6, 15), (2024, 10, 5, 16)))
STEADY_ZONES = ("UTC", "Asia/Kolkata", "Asia/Tokyo", "Etc/GMT+5")
CHANGING_ZONES = ("America/New_York", "Europe/London", "Australia/Lord_Howe", "Antarctica/Troll")
CRONS = ("* * * * * *", "*/7 * * * * *", "*/15 * * * *", "0 * * * *", "30 2 * * *", "0 9 * * MON-FRI",
         "15 1,2,3 * * *", "*/20 * 1-3 * * *", "0 0 29 2 *", "0 30 1 1,15 * SUN", "5 4 * JAN,JUL *")


def walk(recurrence: Recurrence, after_ms: int, until_ms: int) -> list[int]:
    times = []
    at = recurrence.first_after(after_ms)
    while at is not None and at <= until_ms:
        times.append(at)
        at = recurrence.first_after(at)
    return times


def window(draw: st.DrawFn, cron: str) -> tuple[int, int]:
    after = draw(st.sampled_from(CHANGES)) + draw(st.integers(-30 * HOUR, 30 * HOUR))
    dense = (cron.count(" ") == 5 and cron.split()[0] != "0") or cron.startswith("*/15")
    return after, after + draw(st.integers(0, 5 * HOUR if dense else 70 * DAY))


@settings(max_examples=300, deadline=None)
@given(st.integers(1000, 10 * DAY), st.integers(0, 2 * 10**12), st.integers(-20 * DAY, 20 * DAY),
       st.integers(0, 2000), st.none() | st.integers(0, 30 * DAY))
def test_an_every_millis_count_is_the_walked_count(every: int, start: int, after_shift: int, span_runs: int,
                                                   end_after: int | None) -> None:
    end = None if end_after is None else start + end_after
    recurrence = Recurrence(None, every, dt.UTC, start, end)
    after = start + after_shift
    until = after + span_runs * every // 3 + after_shift % 997
    assert recurrence.count_between(after, until) == len(walk(recurrence, after, until))


@st.composite
def steady(draw: st.DrawFn) -> tuple[Recurrence, int, int]:
    cron = draw(st.sampled_from(CRONS))
    after, until = window(draw, cron)
    start = after - draw(st.integers(-2 * HOUR, 2 * DAY))
    return Recurrence(Cron.parse(cron), None, zoneinfo.ZoneInfo(draw(st.sampled_from(STEADY_ZONES))), start), \
        after, until


@settings(max_examples=300, deadline=None)
@given(steady())
def test_a_cron_count_in_a_zone_of_one_offset_is_the_walked_count(case: tuple[Recurrence, int, int]) -> None:
    recurrence, after, until = case
    assert recurrence.count_between(after, until) == len(walk(recurrence, after, until))


@st.composite
def changing(draw: st.DrawFn) -> tuple[Cron, dt.tzinfo, int, int]:
    cron = draw(st.sampled_from(CRONS))
    after, until = window(draw, cron)
    return Cron.parse(cron), zoneinfo.ZoneInfo(draw(st.sampled_from(CHANGING_ZONES))), after, until


@settings(max_examples=300, deadline=None)
@given(changing())
def test_a_cron_count_across_a_dst_change_is_off_by_the_hours_changed_at_most(
        case: tuple[Cron, dt.tzinfo, int, int]) -> None:
    cron, tz, after, until = case
    recurrence = Recurrence(cron, None, tz, 0)
    walked = len(walk(recurrence, after, until))
    per_hour = len(cron.minutes) * len(cron.seconds)
    changes = sum(after < c - 2 * HOUR and c + 2 * HOUR <= until for c in CHANGES) + 2  # (one may straddle an end)
    assert abs(recurrence.count_between(after, until) - walked) <= 2 * per_hour * changes


@settings(max_examples=300, deadline=None)
@given(changing(), st.integers(1, 10_000))
def test_a_crons_instants_are_the_walked_ones(case: tuple[Cron, dt.tzinfo, int, int], most: int) -> None:
    cron, tz, after, until = case
    pieces = list(cron_times(cron, tz, after, until, most))
    assert [t for piece in pieces for t in piece] == walk(Recurrence(cron, None, tz, 0), after, until)[:most]
    assert all(0 < len(piece) <= 3600 for piece in pieces)
