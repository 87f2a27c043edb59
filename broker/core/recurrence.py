"""Recurring schedules' time rules, pure: no I/O, no clock (every time is a
parameter). What putSchedule's `cron`, `timeZone`, `everyMillis`,
`startTime`, `endTime`, `limit`, `jitterMillis` and `misfire` mean
(docs/api.md, "Recurring schedules"); broker.schedules.keeper keeps the schedules
and creates their runs by these rules.

    Cron.parse(text)          5 fields (minute hour day month weekday), or 6
                              with seconds first; InvalidRequest("cron") if bad
    Cron.next_wall(wall)      the first local wall time >= `wall` it names
    instant_ms(wall, zone)    the instant a local wall time fires at (DST rules)
    Recurrence                a cron in a zone, or everyMillis; startTime, endTime
      .first_at_or_after(ms)  the first nominal time >= ms (None: past endTime)
      .first_after(ms)        the first nominal time > ms
      .count_between(a, b)    how many in (a, b]: worked out, never walked
    cron_times(...)           a cron's instants in a window, an hour at a time
    run_msg_id(id, nominal)   "<scheduleId>@<nominal ms>": a run's msgId
    jitter_ms(msg_id, most)   in [0, most), from the msgId: every node agrees
    released(...)             a run released at some time: missed or not, and
                              the run after it (Misfire: skip, once, all)

Time zones are the standard library's `zoneinfo` (the system's zone files,
or the tzdata package where it has none). Instants are ms since the epoch,
UTC. A cron names local wall times; each is fired at one instant:

    the wall time exists once      that instant
    it exists twice (fall back)    its first occurrence only: 01:30 EDT, not
                                   01:30 EST, on a November night in New York
    it does not exist (spring      the first instant after the gap: 02:30 on
    forward)                       a March night in New York fires at 03:00
                                   EDT (= 07:00 UTC); 02:00, 02:15 and 02:45
                                   fire at that instant too, so `*/15 * * * *`
                                   fires once there, not four times

so the instants a cron names are a set (wall times mapping to one instant
fire once) and the map from wall time to instant never goes back: the next
run after an instant is found by walking wall times forward from that
instant's own wall time. `everyMillis` is an absolute duration (startTime
+ k * everyMillis, k >= 1): a DST change does not move it.

Day matching follows Vixie cron (the cron of most Linux systems): when the
day-of-month and the weekday are both restricted (neither field starts
with `*` or `?`), a day matches if either does; otherwise both must.
Weekday 0 and 7 are Sunday; months and weekdays may be named (JAN, MON).
Not supported (code 400): L, W, #, @yearly-style nicknames.
"""

from __future__ import annotations

import bisect
import calendar
import datetime as dt
import enum
import functools
import hashlib
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from storage.errors import InvalidRequest

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1)
MS_PER_SECOND = 1000
# A cron whose fields name no time within this many years names none (a
# February 30th): 8 covers the longest gap between leap days (2096 -> 2104).
SEARCH_YEARS = 8
# The latest nominal time any schedule may have: the last trigger time a
# message may have (broker.core.params.MAX_TRIGGER_MS, 9999-12-31).
LAST_MS = 253_402_300_799_999
MS_PER_HOUR = 3_600_000
# Wall hours a zone's clocks may step back or forward at once, and more
# (Antarctica/Troll steps 2 h): cron_times looks this far past each end.
STEP_HOURS = 3
# A scheduleId's length, in characters; a run's msgId adds "@" and the
# nominal time's digits (at most 15) to it.
MAX_SCHEDULE_ID_CHARS = 48

_MONTHS = {name: i + 1 for i, name in enumerate(
    ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"))}
_WEEKDAYS = {name: i for i, name in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}


class _Field(NamedTuple):
    """One cron field's bounds and names."""

    name: str
    low: int
    high: int
    names: dict[str, int]


_SECOND = _Field("second", 0, 59, {})
_MINUTE = _Field("minute", 0, 59, {})
_HOUR = _Field("hour", 0, 23, {})
_DAY = _Field("day of month", 1, 31, {})
_MONTH = _Field("month", 1, 12, _MONTHS)
_WEEKDAY = _Field("weekday", 0, 7, _WEEKDAYS)


def _bad(reason: str) -> InvalidRequest:
    return InvalidRequest("cron", reason)


def _value(text: str, field: _Field) -> int:
    named = field.names.get(text.upper())
    if named is not None:
        return named
    if not text.isdigit() or not text.isascii():
        if text and (text[-1] in "LWlw" or "#" in text):
            raise _bad(f"{field.name} {text!r}: L, W and # are not supported")
        raise _bad(f"{field.name} {text!r} is not a number{' or a name' if field.names else ''}")
    value = int(text)
    if not field.low <= value <= field.high:
        raise _bad(f"{field.name} {value} is outside {field.low}..{field.high}")
    return value


def _parse_field(text: str, field: _Field) -> tuple[tuple[int, ...], bool]:
    """The values a field names, sorted, and whether it starts with `*` or `?`."""
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise _bad(f"{field.name} field {text!r} has an empty item")
        body, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or not step_text.isascii() or int(step_text) < 1:
                raise _bad(f"{field.name} step {step_text!r} must be a whole number of at least 1")
            step = int(step_text)
        # a weekday's "*" and "a/n" end at Saturday (6): 7, Sunday again, only when named
        end = 6 if field is _WEEKDAY else field.high
        if body in ("*", "?"):
            if body == "?" and field not in (_DAY, _WEEKDAY):
                raise _bad(f"? is only for the day of month or the weekday, not the {field.name}")
            low, high = field.low, end
        elif "-" in body:
            first, _, last = body.partition("-")
            low, high = _value(first, field), _value(last, field)
            if low > high:
                raise _bad(f"{field.name} range {body!r} runs backwards")
        else:
            low = _value(body, field)
            high = end if slash else low  # "5/15": from 5 to the end, every 15
        values.update(range(low, high + 1, step))
    if field is _WEEKDAY and 7 in values:
        values.discard(7)
        values.add(0)
    return tuple(sorted(values)), text[0] in "*?"


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression: the values each field names (sorted)."""

    text: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    days_star: bool  # the day-of-month field starts with * or ?
    weekdays_star: bool

    def __hash__(self) -> int:
        # (equal crons have equal texts: hashing the text alone keeps the
        # cache of next times, `_cron_at_or_after`, from hashing every field)
        return hash(self.text)

    @classmethod
    def parse(cls, text: str) -> Cron:
        """The parsed expression, one object a text however many schedules
        name it (a Cron is about 1.5 KB: 100,000 schedules of one
        expression held 150 MB of copies)."""
        return _parse_cached(text)

    @classmethod
    def _parse(cls, text: str) -> Cron:
        fields = text.split()
        if len(fields) == 5:
            fields = ["0", *fields]
        elif len(fields) != 6:
            raise _bad(f"must have 5 fields (minute hour day month weekday) or 6 (seconds first), got {len(fields)}")
        seconds, _ = _parse_field(fields[0], _SECOND)
        minutes, _ = _parse_field(fields[1], _MINUTE)
        hours, _ = _parse_field(fields[2], _HOUR)
        days, days_star = _parse_field(fields[3], _DAY)
        months, _ = _parse_field(fields[4], _MONTH)
        weekdays, weekdays_star = _parse_field(fields[5], _WEEKDAY)
        cron = cls(text, seconds, minutes, hours, days, months, weekdays, days_star, weekdays_star)
        if days_star or not weekdays_star:
            return cron
        if not any(day <= _longest_month(month) for month in months for day in days):
            raise _bad(f"names no day: {fields[3]!r} of {fields[4]!r} never comes")
        return cron

    def day_matches(self, day: dt.date) -> bool:
        in_days = day.day in self.days
        in_weekdays = day.isoweekday() % 7 in self.weekdays
        if self.days_star or self.weekdays_star:
            return in_days and in_weekdays
        return in_days or in_weekdays

    def matches(self, wall: dt.datetime) -> bool:
        """Whether a local wall time (whole seconds) is one the fields name."""
        return (wall.second in self.seconds and wall.minute in self.minutes and wall.hour in self.hours
                and wall.month in self.months and self.day_matches(wall.date()))

    def next_wall(self, wall: dt.datetime) -> dt.datetime | None:
        """The first wall time >= `wall` (naive; a fraction of a second
        rounds up) the fields name; None if none within SEARCH_YEARS."""
        if wall.microsecond:
            wall = wall.replace(microsecond=0) + dt.timedelta(seconds=1)
        last_year = wall.year + SEARCH_YEARS
        found: dt.datetime | None = wall
        while found is not None and found.year <= last_year:
            wall = found
            if wall.month not in self.months:
                i = bisect.bisect_left(self.months, wall.month)
                if i < len(self.months):
                    found = dt.datetime(wall.year, self.months[i], 1)
                elif wall.year < dt.MAXYEAR:
                    found = dt.datetime(wall.year + 1, self.months[0], 1)
                else:
                    found = None
            elif not self.day_matches(wall.date()):
                found = _next_day(wall)
            elif wall.hour not in self.hours:
                i = bisect.bisect_left(self.hours, wall.hour)
                found = wall.replace(hour=self.hours[i], minute=0, second=0) if i < len(self.hours) \
                    else _next_day(wall)
            elif wall.minute not in self.minutes:
                i = bisect.bisect_left(self.minutes, wall.minute)
                found = wall.replace(minute=self.minutes[i], second=0) if i < len(self.minutes) \
                    else wall.replace(minute=0, second=0) + dt.timedelta(hours=1)
            elif wall.second not in self.seconds:
                i = bisect.bisect_left(self.seconds, wall.second)
                found = wall.replace(second=self.seconds[i]) if i < len(self.seconds) \
                    else wall.replace(second=0) + dt.timedelta(minutes=1)
            else:
                return wall
        return None


def _longest_month(month: int) -> int:
    return 29 if month == 2 else 30 if month in (4, 6, 9, 11) else 31


def _next_day(wall: dt.datetime) -> dt.datetime | None:
    if wall.date() == dt.date.max:
        return None
    return dt.datetime.combine(wall.date() + dt.timedelta(days=1), dt.time())


def zone(name: str) -> zoneinfo.ZoneInfo:
    """An IANA zone by name; InvalidRequest("timeZone") if there is none."""
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name or "\0" in name:
        raise InvalidRequest("timeZone", f"{name[:64]!r} is not an IANA time zone name")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidRequest("timeZone", f"{name[:64]!r} is not an IANA time zone this node knows") from None


def wall_of(ms: int, tz: dt.tzinfo) -> dt.datetime:
    """The local wall time (naive) of an instant."""
    return (EPOCH.replace(tzinfo=UTC) + dt.timedelta(milliseconds=ms)).astimezone(tz).replace(tzinfo=None)


def _ms(instant: dt.datetime) -> int:
    delta = instant.astimezone(UTC).replace(tzinfo=None) - EPOCH
    return (delta.days * 86_400 + delta.seconds) * MS_PER_SECOND + delta.microseconds // 1000


def instant_ms(wall: dt.datetime, tz: dt.tzinfo) -> int:
    """The instant a local wall time fires at: itself if it exists once, its
    first occurrence if it exists twice, and the first instant after the
    gap if the clocks skip it (see the module docstring)."""
    first = wall.replace(tzinfo=tz, fold=0)
    first_ms = _ms(first)
    if wall_of(first_ms, tz) == wall:
        later_ms = _ms(wall.replace(tzinfo=tz, fold=1))
        return min(first_ms, later_ms)  # both exist (fall back): the earlier; or the same instant
    # In a gap: fold=1 reads it with the offset after the change (an instant
    # before the gap), fold=0 with the one before (after it); the change is
    # the first instant in between whose wall time is past the wall time.
    low = _ms(wall.replace(tzinfo=tz, fold=1)) // MS_PER_SECOND  # wall_of(low) < wall
    high = first_ms // MS_PER_SECOND  # wall_of(high) > wall
    if low > high:
        low, high = high, low
    while high - low > 1:
        middle = (low + high) // 2
        if wall_of(middle * MS_PER_SECOND, tz) < wall:
            low = middle
        else:
            high = middle
    return high * MS_PER_SECOND


@functools.lru_cache(maxsize=4096)
def _parse_cached(text: str) -> Cron:
    return Cron._parse(text)


class Misfire(enum.Enum):
    """What a run released more than misfireGraceMillis after its nominal
    time (a missed run: the node was down or far behind) does."""

    SKIP = "skip"  # not delivered (status 5); the next run is the first after now
    ONCE = "once"  # delivered, standing for every run missed; then the first after now
    ALL = "all"  # delivered, and each later missed run, up to maxCatchUp in all


@dataclass(frozen=True, slots=True)
class Recurrence:
    """When a schedule's runs are: its cron in `tz`, or every `every_ms`
    from `start_ms`; never before `start_ms` nor after `end_ms`."""

    cron: Cron | None
    every_ms: int | None
    tz: dt.tzinfo
    start_ms: int
    end_ms: int | None = None

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise InvalidRequest("cron", "or everyMillis is required, not both")
        if self.every_ms is not None and self.every_ms < 1:
            raise InvalidRequest("everyMillis", f"must be at least 1, got {self.every_ms}")

    def first_at_or_after(self, ms: int) -> int | None:
        """The first nominal time >= `ms` (and >= startTime, <= endTime);
        None if there is none."""
        ms = max(ms, self.start_ms)
        nominal: int | None
        if self.every_ms is not None:
            k = max(1, -(-(ms - self.start_ms) // self.every_ms))  # ceil, k >= 1
            nominal = self.start_ms + k * self.every_ms
        else:
            nominal = self._cron_at_or_after(ms)
        if nominal is None or nominal > LAST_MS or (self.end_ms is not None and nominal > self.end_ms):
            return None
        return nominal

    def first_after(self, ms: int) -> int | None:
        """The first nominal time > `ms`."""
        return self.first_at_or_after(ms + 1)

    def _cron_at_or_after(self, ms: int) -> int | None:
        assert self.cron is not None
        return _cron_at_or_after(self.cron, self.tz, ms)

    def count_between(self, after_ms: int, until_ms: int) -> int:
        """How many nominal times are in (after_ms, until_ms], worked out
        rather than walked (a day of every-second runs is 86,400 times; a
        restart follows thousands of such schedules): for everyMillis
        exactly; for a cron, the local wall times it names between the wall
        times of the two instants (`cron_wall_count`), which is exact but
        across a DST change, where the wall times the clocks skip count one
        each (they fire as one run) and those they repeat may count twice:
        off by at most an hour's runs a change."""
        until_ms = min(until_ms, LAST_MS if self.end_ms is None else self.end_ms)
        if self.every_ms is not None:
            # start + k * every, k >= 1, in (after_ms, until_ms]
            first_k = max(1, (after_ms - self.start_ms) // self.every_ms + 1)
            last_k = (until_ms - self.start_ms) // self.every_ms
            return max(0, last_k - first_k + 1)
        assert self.cron is not None
        after_ms = max(after_ms, self.start_ms - 1)
        if until_ms <= after_ms:
            return 0
        return cron_wall_count(self.cron, wall_of(after_ms, self.tz), wall_of(until_ms, self.tz))


# Next times a cron names (`_cron_at_or_after`) kept: schedules of one
# cron and zone whose runs fell at one instant ask for the same next time,
# worked out once (100,000 every-minute schedules: one walk a minute, not
# 100,000).
CRON_NEXT_CACHE = 8192


@functools.lru_cache(maxsize=CRON_NEXT_CACHE)
def _cron_at_or_after(cron: Cron, tz: dt.tzinfo, ms: int) -> int | None:
    """The first instant >= `ms` a cron names in `tz` (before startTime,
    endTime and LAST_MS are applied: Recurrence.first_at_or_after)."""
    # Walking wall times forward from the wall time of the instant just
    # before (a fraction of a second rounds up): the map to instants
    # never goes back, so the first that lands at or after `ms` is the
    # answer. (From `ms`'s own wall time, an `ms` at the end of a gap
    # would miss the wall times in the gap, which fire at `ms`.)
    wall = wall_of(ms - 1, tz)
    while True:
        found = cron.next_wall(wall)
        if found is None:
            return None
        at_ms = instant_ms(found, tz)
        if at_ms >= ms:
            return at_ms
        wall = found + dt.timedelta(seconds=1)


def cron_wall_count(cron: Cron, after: dt.datetime, until: dt.datetime) -> int:
    """Local wall times (whole seconds) in (after, until] that `cron`
    names, by arithmetic: the times of a day it names are the product of
    its hours, minutes and seconds, so a day is counted by bisection and
    the days between by months (`_month_days`, kept): a day behind costs a
    few dozen operations, a year behind a few hundred. 0 if until <= after."""
    after, until = after.replace(microsecond=0), until.replace(microsecond=0)
    if until <= after:
        return 0
    per_day = len(cron.hours) * len(cron.minutes) * len(cron.seconds)
    first, last = after.date(), until.date()
    if first == last:
        return (_upto(cron, until) - _upto(cron, after)) if _day_named(cron, first) else 0
    n = per_day - _upto(cron, after) if _day_named(cron, first) else 0
    n += _upto(cron, until) if _day_named(cron, last) else 0
    return n + per_day * _days_named(cron, first + dt.timedelta(days=1), last)


def _day_named(cron: Cron, day: dt.date) -> bool:
    return day.month in cron.months and cron.day_matches(day)


def _upto(cron: Cron, wall: dt.datetime) -> int:
    """Times of a day the cron names at or before `wall`'s time of day."""
    seconds, minutes = cron.seconds, cron.minutes
    n = bisect.bisect_left(cron.hours, wall.hour) * len(minutes) * len(seconds)
    if wall.hour in cron.hours:
        n += bisect.bisect_left(minutes, wall.minute) * len(seconds)
        if wall.minute in minutes:
            n += bisect.bisect_right(seconds, wall.second)
    return n


def _days_named(cron: Cron, first: dt.date, end: dt.date) -> int:
    """Days in [first, end) the cron names: whole months from `_month_days`,
    the days of a month begun or ended part way one by one (62 at most)."""
    n = 0
    day = first
    while day < end:
        following = dt.date(day.year + (day.month == 12), day.month % 12 + 1, 1) if day < dt.date(9999, 12, 1) \
            else dt.date.max
        if day.day == 1 and following <= end:
            n += _month_days(cron, day.year, day.month)
            day = following
            continue
        stop = min(following, end)
        while day < stop:
            n += _day_named(cron, day)
            if day == dt.date.max:
                return n
            day += dt.timedelta(days=1)
    return n


@functools.lru_cache(maxsize=4096)
def _month_days(cron: Cron, year: int, month: int) -> int:
    """Days of a month the cron names."""
    if month not in cron.months:
        return 0
    length = calendar.monthrange(year, month)[1]
    return sum(cron.day_matches(dt.date(year, month, d)) for d in range(1, length + 1))


@functools.lru_cache(maxsize=256)
def _hour_offsets_ms(cron: Cron) -> tuple[int, ...]:
    """The ms into an hour of the times the cron names in each hour it names."""
    return tuple((m * 60 + s) * MS_PER_SECOND for m in cron.minutes for s in cron.seconds)


def cron_times(cron: Cron, tz: dt.tzinfo, after_ms: int, until_ms: int, most: int) -> Iterator[list[int]]:
    """The instants `cron` names in `tz` in (after_ms, until_ms], ascending,
    at most `most`: one list an hour of wall time it names (at most 3,600
    times; the caller may stop between them).

    An hour whose next hour starts exactly 3,600,000 ms after it has one
    offset throughout: its times are its start plus their ms into the hour
    (`_hour_offsets_ms`), two `instant_ms` calls an hour, not one walk of
    `first_after` a time. Any other hour (the clocks change in it) takes
    each wall time through `instant_ms`, the rule itself; the instants
    never go back as the wall times go on, so a time the clocks skip that
    lands on one already made is dropped. Hours are looked at from
    STEP_HOURS before the first instant's wall time to STEP_HOURS after
    the last's (a wall time may repeat)."""
    if until_ms <= after_ms or most <= 0:
        return
    offsets = _hour_offsets_ms(cron)
    hour = wall_of(after_ms, tz).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=STEP_HOURS)
    end = wall_of(until_ms, tz).replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=STEP_HOURS)
    one_hour = dt.timedelta(hours=1)
    last = after_ms
    while hour <= end and most > 0:
        if not _day_named(cron, hour.date()):
            if hour.date() >= dt.date(9999, 12, 31):
                return
            hour = dt.datetime.combine(hour.date() + dt.timedelta(days=1), dt.time())
            continue
        if hour.hour not in cron.hours:
            hour += one_hour
            continue
        start = instant_ms(hour, tz)
        times: list[int]
        if instant_ms(hour + one_hour, tz) - start == MS_PER_HOUR:
            lo = bisect.bisect_right(offsets, last - start)
            hi = min(bisect.bisect_right(offsets, until_ms - start), lo + most)
            times = [start + o for o in offsets[lo:hi]]
        else:
            times = []
            for o in offsets:
                at = instant_ms(hour + dt.timedelta(milliseconds=o), tz)
                if at > until_ms or len(times) >= most:
                    break
                if at > last and (not times or at > times[-1]):
                    times.append(at)
        if times:
            last = times[-1]
            most -= len(times)
            yield times
        hour += one_hour


def run_msg_id(schedule_id: str, nominal_ms: int) -> str:
    """A run's msgId: the same run is the same message wherever it is made."""
    return f"{schedule_id}@{nominal_ms}"


def parse_run_msg_id(msg_id: str) -> tuple[str, int] | None:
    """(scheduleId, nominal ms) of a msgId in a run's form; None if it is not."""
    schedule_id, at, nominal = msg_id.rpartition("@")
    if not at or not 0 < len(schedule_id) <= MAX_SCHEDULE_ID_CHARS or not nominal.isdigit() \
            or not nominal.isascii() or len(nominal) > 15:
        return None
    return schedule_id, int(nominal)


def add_run_fields(delay_msg: dict[str, object]) -> dict[str, object]:
    """A delayMsg (its msgId a run's) with `scheduleId` and `scheduledTime`
    added: what a message answered or pushed says of the run it is. Any
    msgId of the form `<1..48 characters>@<digits>` reads as a run's."""
    msg_id = delay_msg["msgId"]
    run = parse_run_msg_id(msg_id) if isinstance(msg_id, str) else None
    if run is not None:
        delay_msg["scheduleId"], delay_msg["scheduledTime"] = run
    return delay_msg


def jitter_ms(msg_id: str, most_ms: int) -> int:
    """A run's jitter: in [0, most_ms), from a hash of its msgId, so every
    node (and every restart) computes the same trigger time; 0 when most_ms
    is 0."""
    if most_ms <= 0:
        return 0
    digest = hashlib.sha256(msg_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % most_ms


class Released(NamedTuple):
    """What a run's release means (`released`)."""

    missed: bool  # released more than the grace after its nominal time
    deliver: bool  # False: ended unseen (status 5), a skipped run
    next_nominal: int | None  # the run to create next (None: the schedule has no more)
    catch_up: int  # missed runs delivered in a row so far (misfire=all)
    # runs counted as missed: this one if missed, and those never created
    # (Recurrence.count_between: a cron's across a DST change is an estimate)
    missed_runs: int


def released(recurrence: Recurrence, misfire: Misfire, grace_ms: int, max_catch_up: int, nominal_ms: int,
             released_ms: int, catch_up: int) -> Released:
    """A run (nominal time `nominal_ms`) released at `released_ms`: whether
    it missed, whether it is delivered, and the nominal time of the run to
    create next. `catch_up`: missed runs delivered in a row before it."""
    if released_ms - nominal_ms <= grace_ms:
        return Released(False, True, recurrence.first_after(nominal_ms), 0, 0)
    if misfire is Misfire.ALL and catch_up + 1 < max_catch_up:
        return Released(True, True, recurrence.first_after(nominal_ms), catch_up + 1, 1)
    never_made = recurrence.count_between(nominal_ms, released_ms)  # due meanwhile, never created: counted, not walked
    return Released(True, misfire is not Misfire.SKIP, recurrence.first_after(released_ms), 0, 1 + never_made)
