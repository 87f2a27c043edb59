"""broker.core.recurrence: the DST examples docs/api.md states, the cron forms
taken and refused, and what a released run means under each misfire rule.
The fire times against an independent reference: property/test_recurrence_reference.py."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest

from broker.core.recurrence import (
    Cron,
    Misfire,
    Recurrence,
    instant_ms,
    parse_run_msg_id,
    released,
    run_msg_id,
    zone,
)
from storage.errors import InvalidRequest

NY = zoneinfo.ZoneInfo("America/New_York")


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, tz: dt.tzinfo = dt.UTC,
       fold: int = 0) -> int:
    return int(dt.datetime(year, month, day, hour, minute, tzinfo=tz, fold=fold).timestamp() * 1000)


def nominal_times(recurrence: Recurrence, after_ms: int, count: int) -> list[int]:
    """Up to `count` nominal times of `recurrence`, the first the one at or after `after_ms`."""
    times: list[int] = []
    nominal = recurrence.first_at_or_after(after_ms)
    while nominal is not None and len(times) < count:
        times.append(nominal)
        nominal = recurrence.first_after(nominal)
    return times


def fires(expr: str, tz_name: str, after_ms: int, count: int) -> list[str]:
    tz = zoneinfo.ZoneInfo(tz_name)
    times = nominal_times(Recurrence(Cron.parse(expr), None, tz, 0), after_ms, count)
    return [dt.datetime.fromtimestamp(t / 1000, tz).isoformat() for t in times]


def test_a_time_the_clocks_skip_fires_at_the_first_instant_after_the_gap() -> None:
    assert fires("30 2 * * *", "America/New_York", ms(2024, 3, 9, 12), 2) == [
        "2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"]
    # every quarter hour: the four skipped ones fire once, at 03:00 EDT
    assert fires("*/15 * * * *", "America/New_York", ms(2024, 3, 10, 1, 40, NY), 3) == [
        "2024-03-10T01:45:00-05:00", "2024-03-10T03:00:00-04:00", "2024-03-10T03:15:00-04:00"]


def test_a_time_the_clocks_pass_twice_fires_once_at_its_first_occurrence() -> None:
    assert fires("30 1 * * *", "America/New_York", ms(2024, 11, 2, 12), 2) == [
        "2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"]
    # asked from inside the second pass, the next is after it, not its repeat
    assert fires("*/30 * * * *", "America/New_York", ms(2024, 11, 3, 1, 10, NY, fold=1), 2) == [
        "2024-11-03T02:00:00-05:00", "2024-11-03T02:30:00-05:00"]


def test_lord_howe_moves_half_an_hour_and_santiago_skips_midnight() -> None:
    # Lord Howe: 02:00 -> 02:30 on the first Sunday of October
    assert fires("15 2 * * *", "Australia/Lord_Howe", ms(2024, 10, 5, 0), 2) == [
        "2024-10-06T02:30:00+11:00", "2024-10-07T02:15:00+11:00"]
    # ... and 02:00 -> 01:30 in April: 01:45 comes twice and fires once
    assert fires("45 1 * * *", "Australia/Lord_Howe", ms(2024, 4, 6, 0), 2) == [
        "2024-04-07T01:45:00+11:00", "2024-04-08T01:45:00+10:30"]
    # Santiago: 24:00 -> 01:00 on the first Sunday of September; midnight fires at 01:00
    assert fires("0 0 * * *", "America/Santiago", ms(2024, 9, 7, 12), 2) == [
        "2024-09-08T01:00:00-03:00", "2024-09-09T00:00:00-03:00"]


def test_instant_of_an_ordinary_wall_time_is_itself() -> None:
    assert instant_ms(dt.datetime(2024, 7, 1, 12, 0), NY) == ms(2024, 7, 1, 16)


def test_six_fields_put_the_seconds_first() -> None:
    assert fires("15,45 0 12 * * *", "UTC", ms(2024, 1, 1), 3) == [
        "2024-01-01T12:00:15+00:00", "2024-01-01T12:00:45+00:00", "2024-01-02T12:00:15+00:00"]


def test_day_fields_follow_vixie_cron() -> None:
    # both restricted: the 13th or a Friday
    assert fires("0 0 13 * FRI", "UTC", ms(2024, 9, 1), 4) == [
        "2024-09-06T00:00:00+00:00", "2024-09-13T00:00:00+00:00", "2024-09-20T00:00:00+00:00",
        "2024-09-27T00:00:00+00:00"]
    # one a star: both must hold (odd days that are Mondays)
    assert fires("0 0 */2 * mon", "UTC", ms(2024, 9, 1), 2) == [
        "2024-09-09T00:00:00+00:00", "2024-09-23T00:00:00+00:00"]
    assert fires("0 0 * * 7", "UTC", ms(2024, 9, 1), 1) == ["2024-09-01T00:00:00+00:00"]  # 7 is Sunday
    # a weekday's "a/n" ends at Saturday: Friday and Saturday, not Sunday
    assert fires("0 0 * * 5/1", "UTC", ms(2024, 9, 1), 3) == [
        "2024-09-06T00:00:00+00:00", "2024-09-07T00:00:00+00:00", "2024-09-13T00:00:00+00:00"]


@pytest.mark.parametrize(("expr", "words"), [
    ("* * * *", "5 fields"),
    ("* * * * * * *", "5 fields"),
    ("60 * * * *", "minute 60 is outside 0..59"),
    ("* 24 * * *", "hour 24"),
    ("* * 0 * *", "day of month 0"),
    ("* * * 13 *", "month 13"),
    ("* * * * 8", "weekday 8"),
    ("5-1 * * * *", "runs backwards"),
    ("*/0 * * * *", "step"),
    ("* * L * *", "L, W and # are not supported"),
    ("* * * * 5#2", "not supported"),
    ("* * 30 FEB *", "names no day"),
    ("? * * * *", "? is only for"),
    ("a * * * *", "not a number"),
    ("1,,2 * * * *", "empty item"),
])
def test_bad_crons_are_refused_naming_cron(expr: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        Cron.parse(expr)
    assert refused.value.parameter == "cron"
    assert words in str(refused.value)


def test_unknown_zones_are_refused_naming_time_zone() -> None:
    for name in ("Mars/Olympus", "../../etc/passwd", "", "/etc/localtime"):
        with pytest.raises(InvalidRequest) as refused:
            zone(name)
        assert refused.value.parameter == "timeZone"
    assert zone("Europe/London").key == "Europe/London"


def test_a_run_msg_id_reads_back() -> None:
    assert run_msg_id("nightly@eu", 1_700_000_000_000) == "nightly@eu@1700000000000"
    assert parse_run_msg_id("nightly@eu@1700000000000") == ("nightly@eu", 1_700_000_000_000)
    assert parse_run_msg_id("no-at-sign") is None
    assert parse_run_msg_id("x@12a") is None
    assert parse_run_msg_id("@12") is None


MINUTE = 60_000
EVERY_MINUTE = Recurrence(None, MINUTE, dt.UTC, 0)


def test_a_run_released_within_the_grace_is_not_missed() -> None:
    r = released(EVERY_MINUTE, Misfire.SKIP, 5000, 10, 10 * MINUTE, 10 * MINUTE + 5000, 0)
    assert r == (False, True, 11 * MINUTE, 0, 0)


def test_skip_ends_a_missed_run_and_goes_on_after_now() -> None:
    # down from 10:00 to 15:30: the 10:00 run is released then
    r = released(EVERY_MINUTE, Misfire.SKIP, 5000, 10, 10 * MINUTE, 15 * MINUTE + 30_000, 0)
    assert r == (True, False, 16 * MINUTE, 0, 6)  # the 10:00 run and 11..15, never made


def test_once_delivers_one_run_for_all_missed() -> None:
    r = released(EVERY_MINUTE, Misfire.ONCE, 5000, 10, 10 * MINUTE, 15 * MINUTE + 30_000, 0)
    assert r == (True, True, 16 * MINUTE, 0, 6)


def test_all_delivers_each_missed_run_up_to_max_catch_up() -> None:
    now = 15 * MINUTE + 30_000
    nominal, catch_up, delivered = 10 * MINUTE, 0, []
    while True:
        r = released(EVERY_MINUTE, Misfire.ALL, 5000, 3, nominal, now, catch_up)
        assert r.missed and r.deliver
        delivered.append(nominal)
        assert r.next_nominal is not None
        nominal, catch_up = r.next_nominal, r.catch_up
        if catch_up == 0:
            break
    assert delivered == [10 * MINUTE, 11 * MINUTE, 12 * MINUTE]  # three in all
    assert nominal == 16 * MINUTE  # then the first after now


def test_end_time_ends_the_runs() -> None:
    bounded = Recurrence(None, MINUTE, dt.UTC, 0, end_ms=3 * MINUTE)
    assert nominal_times(bounded, 0, 10) == [MINUTE, 2 * MINUTE, 3 * MINUTE]
    assert released(bounded, Misfire.ONCE, 5000, 10, 3 * MINUTE, 3 * MINUTE, 0).next_nominal is None


def test_cron_and_every_millis_exclude_each_other() -> None:
    with pytest.raises(InvalidRequest):
        Recurrence(Cron.parse("* * * * *"), MINUTE, dt.UTC, 0)
    with pytest.raises(InvalidRequest):
        Recurrence(None, None, dt.UTC, 0)
