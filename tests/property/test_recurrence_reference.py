"""Fire times of broker.core.recurrence against an independent reference, over
random cron expressions in zones whose DST changes are unusual (New York,
London, Lord Howe's 30-minute change, Santiago's change at midnight),
around their DST changes.

The reference shares no code with the module: croniter (a separate cron
library) expands each field to the values it names, and the fire times
are found by walking UTC instants one step (a minute, or a second for a
6-field cron) at a time through a window around a DST change:

    an instant whose local wall time matches, first occurrence (fold 0)  fires
    an instant whose local wall time matches, second occurrence          does not
    an instant right after a gap (the clocks jumped forward) when a
    skipped wall time matches                                           fires

Day matching is Vixie cron's (both day fields restricted: either may
match; one starting with `*`: both must), as docs/api.md states it.
"""

from __future__ import annotations

import datetime as dt
import functools
import warnings
import zoneinfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.core.recurrence import Cron, Recurrence, jitter_ms, run_msg_id
from storage.errors import InvalidRequest

with warnings.catch_warnings():  # croniter may warn about its own dependencies on import
    warnings.simplefilter("ignore")
    from croniter import croniter

ZONES = ("America/New_York", "Europe/London", "Australia/Lord_Howe", "America/Santiago")
UTC = dt.UTC


@functools.cache
def transitions(name: str) -> tuple[int, ...]:
    """The instants (s) in 2024-2026 at which the zone's UTC offset changes."""
    tz = zoneinfo.ZoneInfo(name)
    found = []
    at = int(dt.datetime(2024, 1, 1, tzinfo=UTC).timestamp())
    end = int(dt.datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    offset = dt.datetime.fromtimestamp(at, tz).utcoffset()
    while at < end:
        nxt = at + 900
        o = dt.datetime.fromtimestamp(nxt, tz).utcoffset()
        if o != offset:
            low, high = at, nxt  # offset(low) is the old one, offset(high) the new one
            while high - low > 1:
                mid = (low + high) // 2
                if dt.datetime.fromtimestamp(mid, tz).utcoffset() == offset:
                    low = mid
                else:
                    high = mid
            found.append(high)
            offset = o
        at = nxt
    assert len(found) >= 5, name
    return tuple(found)


def reference_fires(expr: str, seconds: bool, name: str, start_s: int, end_s: int) -> list[int]:
    """Fire instants (ms) in [start_s, end_s) by the rules above."""
    expanded = croniter(expr, second_at_beginning=True).expanded if seconds else croniter(expr).expanded
    fields = expr.split()
    if seconds:
        minute, hour, day, month, weekday, second = expanded
        day_text, weekday_text = fields[3], fields[5]
    else:
        minute, hour, day, month, weekday = expanded
        second = [0]
        day_text, weekday_text = fields[2], fields[4]

    def values(field: list[int | str], low: int, high: int) -> set[int]:
        return set(range(low, high + 1)) if field == ["*"] else {int(v) for v in field}

    seconds_set, minutes, hours = values(second, 0, 59), values(minute, 0, 59), values(hour, 0, 23)
    days, months = values(day, 1, 31), values(month, 1, 12)
    weekdays = {v % 7 for v in values(weekday, 0, 6)}
    either = not day_text.startswith(("*", "?")) and not weekday_text.startswith(("*", "?"))

    def matches(w: dt.datetime) -> bool:
        if w.second not in seconds_set or w.minute not in minutes or w.hour not in hours or w.month not in months:
            return False
        in_day, in_weekday = w.day in days, w.isoweekday() % 7 in weekdays
        return (in_day or in_weekday) if either else (in_day and in_weekday)

    tz = zoneinfo.ZoneInfo(name)
    step = 1 if seconds else 60
    fires = []
    previous = dt.datetime.fromtimestamp(start_s - step, tz)
    for at in range(start_s, end_s, step):
        local = dt.datetime.fromtimestamp(at, tz)
        wall, previous_wall = local.replace(tzinfo=None, fold=0), previous.replace(tzinfo=None, fold=0)
        fire = matches(wall) and local.fold == 0
        if not fire and wall - previous_wall > dt.timedelta(seconds=step):  # a gap: walls skipped before `at`
            skipped = previous_wall + dt.timedelta(seconds=step)
            while skipped < wall and not fire:
                fire = matches(skipped)
                skipped += dt.timedelta(seconds=step)
        if fire:
            fires.append(at * 1000)
        previous = local
    return fires


def module_fires(expr: str, name: str, start_s: int, end_s: int) -> list[int]:
    recurrence = Recurrence(Cron.parse(expr), None, zoneinfo.ZoneInfo(name), 0)
    fires = []
    at = recurrence.first_at_or_after(start_s * 1000)
    while at is not None and at < end_s * 1000:
        fires.append(at)
        at = recurrence.first_after(at)
    return fires


def _item(low: int, high: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    named = st.sampled_from(names) if names else value.map(str)
    # (a range of one value, "1-1", croniter reads as "*": not drawn)
    ranges = st.tuples(value, value).filter(lambda ab: ab[0] != ab[1]).map(lambda ab: f"{min(ab)}-{max(ab)}")
    return st.one_of(
        value.map(str), named, ranges,
        st.tuples(ranges, st.integers(1, 7)).map(lambda rs: f"{rs[0]}/{rs[1]}"),
        st.tuples(value, st.integers(1, 20)).map(lambda vs: f"{vs[0]}/{vs[1]}"),
    )


def _field(low: int, high: int, names: tuple[str, ...] = (), star_steps: bool = True) -> st.SearchStrategy[str]:
    lists = st.lists(_item(low, high, names), min_size=1, max_size=3).map(",".join)
    stars = [st.just("*")]
    if star_steps:
        stars.append(st.integers(1, 25).map(lambda n: f"*/{n}"))
    return st.one_of(*stars, lists)


# Hours are drawn mostly from the small hours, where DST changes happen.
SMALL_HOURS = st.one_of(st.just("*"), st.lists(st.integers(0, 4), min_size=1, max_size=3).map(
    lambda hs: ",".join(map(str, hs))), _field(0, 23))
MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
WEEKDAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


@st.composite
def cron_days(draw: st.DrawFn) -> tuple[str, str]:
    """Day of month and weekday. A star with a step (`*/2`) only beside a
    plain `*`: croniter reads `*/2` as restricted, Vixie cron (and this
    module) as a star, so the two agree only there."""
    day = draw(_field(1, 31, star_steps=False))
    weekday = draw(_field(0, 6, WEEKDAYS, star_steps=False))
    if day == "*" and draw(st.booleans()):
        day = f"*/{draw(st.integers(1, 10))}"
    return day, weekday


def near_change(name: str, hours_before: int, hours_after: int) -> st.SearchStrategy[tuple[int, int]]:
    """A window [start, end) (s) starting up to `hours_before` before one of
    the zone's DST changes and ending `hours_after` after the start."""
    return st.tuples(st.sampled_from(transitions(name)), st.integers(0, hours_before * 3600 // 60)).map(
        lambda tm: (tm[0] - tm[1] * 60, tm[0] - tm[1] * 60 + hours_after * 3600))


def nominal_times(recurrence: Recurrence, after_ms: int, count: int) -> list[int]:
    """Up to `count` nominal times of `recurrence`, the first the one at or after `after_ms`."""
    times: list[int] = []
    nominal = recurrence.first_at_or_after(after_ms)
    while nominal is not None and len(times) < count:
        times.append(nominal)
        nominal = recurrence.first_after(nominal)
    return times


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(ZONES))
def test_five_field_crons_fire_as_the_reference_across_dst_changes(data: st.DataObject, name: str) -> None:
    minute = data.draw(st.one_of(st.just("0"), st.just("30"), _field(0, 59)))
    hour = data.draw(SMALL_HOURS)
    day, weekday = data.draw(cron_days())
    month = data.draw(st.one_of(st.just("*"), _field(1, 12, MONTHS)))
    expr = f"{minute} {hour} {day} {month} {weekday}"
    start, end = data.draw(near_change(name, 36, 48))
    try:
        Cron.parse(expr)
        refused = ""
    except InvalidRequest as e:
        refused = str(e)
    if refused:  # a day no month of the drawn ones has (30 of 2): refused, and it never fires
        assert "names no day" in refused, expr
        assert reference_fires(expr, False, name, start, end) == [], expr
        return
    assert module_fires(expr, name, start, end) == reference_fires(expr, False, name, start, end), expr


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), name=st.sampled_from(ZONES))
def test_six_field_crons_fire_as_the_reference_across_dst_changes(data: st.DataObject, name: str) -> None:
    second = data.draw(st.one_of(st.just("0"), st.just("*/20"), _field(0, 59)))
    minute = data.draw(st.one_of(st.just("*"), st.just("0,30"), _field(0, 59)))
    hour = data.draw(SMALL_HOURS)
    expr = f"{second} {minute} {hour} * * *"
    start, end = data.draw(near_change(name, 2, 3))
    assert module_fires(expr, name, start, end) == reference_fires(expr, True, name, start, end), expr


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(ZONES), every_s=st.integers(1, 3 * 3600), start_offset_s=st.integers(-86400, 86400),
       data=st.data())
def test_every_millis_is_an_absolute_duration_whatever_the_zone(name: str, every_s: int, start_offset_s: int,
                                                                data: st.DataObject) -> None:
    change = data.draw(st.sampled_from(transitions(name)))
    start_ms = (change + start_offset_s) * 1000
    every_ms = every_s * 1000
    recurrence = Recurrence(None, every_ms, zoneinfo.ZoneInfo(name), start_ms)
    times = nominal_times(recurrence, start_ms - 5000, 6)
    assert times == [start_ms + k * every_ms for k in range(1, 7)]
    after = data.draw(st.integers(start_ms, start_ms + 10 * every_ms))
    first = recurrence.first_after(after)
    assert first is not None and first > after and first - after <= every_ms
    assert (first - start_ms) % every_ms == 0


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(ZONES), data=st.data())
def test_start_and_end_bound_the_nominal_times(name: str, data: st.DataObject) -> None:
    change = data.draw(st.sampled_from(transitions(name))) * 1000
    start_ms = change + data.draw(st.integers(-7200_000, 7200_000))
    end_ms = start_ms + data.draw(st.integers(0, 6 * 3600_000))
    recurrence = Recurrence(Cron.parse(data.draw(st.sampled_from(("*/7 * * * *", "0 * * * *", "30 2 * * *")))),
                            None, zoneinfo.ZoneInfo(name), start_ms, end_ms)
    unbounded = Recurrence(recurrence.cron, None, recurrence.tz, 0)
    times = nominal_times(recurrence, start_ms - 3600_000, 1000)
    assert all(start_ms <= t <= end_ms for t in times)
    expected = []
    at = unbounded.first_at_or_after(start_ms)
    while at is not None and at <= end_ms:
        expected.append(at)
        at = unbounded.first_after(at)
    assert times == expected


@given(schedule_id=st.text(min_size=1, max_size=48).filter(lambda s: "\0" not in s),
       nominal_ms=st.integers(0, 253_402_300_799_999), most_ms=st.integers(0, 10**9))
def test_jitter_is_the_same_everywhere_and_within_its_bound(schedule_id: str, nominal_ms: int, most_ms: int) -> None:
    msg_id = run_msg_id(schedule_id, nominal_ms)
    jitter = jitter_ms(msg_id, most_ms)
    assert jitter == jitter_ms(msg_id, most_ms)
    assert (0 <= jitter < most_ms) if most_ms else jitter == 0
