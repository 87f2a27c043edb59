"""Which files a message is filed in: an hour of its own, or a coarser span.

Hourly files are right for the near future: the wheel reads an hour's
second table and walks its seconds. Far out they would multiply files (a
message an hour for ten years: 87,600 hours, three files each), so a
message more than 32 hours ahead is filed in a *span*: the same three
files (storage.delay_log, delay_index, second_table), covering 2**s
aligned hours. The span's size grows with the distance, as the levels of
a hierarchical timing wheel: a span of 2**s hours is used only while it
starts at least 2**s hours from now. When time reaches that point the span
is *due*: its waiting messages are filed again by the same rule (a record
of kind MOVE in the commit log, see storage.records), into smaller spans
or their own hours, and the span's files are retired once every entry in
them has ended. A message therefore moves at most once per level (about
log2(its delay / 32 h) times), the wheel only ever sees hours, and at any
moment at most three spans of each size hold waiting messages: under 500
files whatever the spread of trigger times (spans of 2**5 .. 2**27 hours,
23 sizes, plus up to ~64 hours of hourly files).

File ids. Hours and spans share one number space, the "hour" of a
`Location`, of the file names (`delay/<id:010d>.*`), of the files' headers,
of the checkpoint and of the id index (which holds 24 bits of it):

    bits    field
    0..15   start >> s, modulo 2**16   (only the span's index among its
                                        neighbours of the same size: the
                                        start itself is found from any
                                        entry's trigger_ms, see start_hour)
    16..20  level = s - 4, 1..23       (spans of 2**5 .. 2**27 hours)
    23      1: a span; 0: an hour (hours below 2**23: until the year 2926)

    worked example: now = hour 500,000 (2027), a message due at hour
    508,000 (8,000 h ahead): s = 12 fits (the 4,096-hour span starting at
    507,904 starts 7,904 >= 4,096 hours from now), s = 13 does not (its
    span starts at 507,904 < 500,000 + 8,192), so the file id is
    2**23 | 8 << 16 | (507,904 >> 12) % 2**16 = 8,913,020. At hour
    503,809 the span is due (507,904 < 503,809 + 4,096) and its messages
    move to spans of 2**11 hours.

Data directories written before spans existed hold only hours; their
far hours stay hourly files until they are consumed (the checkpoint's
`layout` key says which rule wrote it, see storage.checkpoint).
"""

from __future__ import annotations

from .entry import MS_PER_HOUR

# The checkpoint's `layout` under this rule (1, or no key: hours only).
LAYOUT = 2
SPAN_FLAG = 1 << 23
LEVEL_SHIFT = 16
INDEX_MASK = (1 << LEVEL_SHIFT) - 1
MIN_SHIFT = 5  # the smallest span: 32 hours
MAX_SHIFT = 27  # the largest: 2**27 hours, past any triggerTime (year 10,000 is hour 70.4 M)
SHIFT_TO_LEVEL = 4
# Messages fewer hours ahead than this are always filed in their own hour.
HOURLY_HOURS = 1 << MIN_SHIFT


def file_for(hour: int, now_hour: int) -> int:
    """The file id a message whose filing hour is `hour` goes to at `now_hour`:
    the largest span of 2**s hours (aligned) holding it that starts at least
    2**s hours after now_hour, else the hour itself."""
    ahead = hour - now_hour
    if ahead < HOURLY_HOURS:
        return hour
    shift = min(ahead.bit_length() - 1, MAX_SHIFT)
    while shift >= MIN_SHIFT:
        start = hour >> shift << shift
        if start - now_hour >= 1 << shift:
            return SPAN_FLAG | (shift - SHIFT_TO_LEVEL) << LEVEL_SHIFT | (start >> shift) & INDEX_MASK
        shift -= 1
    return hour


def is_span(file_id: int) -> bool:
    return file_id >= SPAN_FLAG


def span_shift(file_id: int) -> int:
    """log2 of the hours a span covers (0 for an hour)."""
    if file_id < SPAN_FLAG:
        return 0
    return ((file_id - SPAN_FLAG) >> LEVEL_SHIFT) + SHIFT_TO_LEVEL


def start_hour(file_id: int, trigger_ms: int) -> int:
    """The first hour of `file_id`, given the trigger time of any message
    filed in it."""
    shift = span_shift(file_id)
    return trigger_ms // MS_PER_HOUR >> shift << shift


def is_due(file_id: int, start: int, now_hour: int) -> bool:
    """A span is due (its messages must move to smaller files) once it
    starts fewer than its own size of hours from now; an hour never is."""
    return file_id >= SPAN_FLAG and start - now_hour < 1 << span_shift(file_id)


def describe(file_id: int, start: int | None = None) -> str:
    if file_id < SPAN_FLAG:
        return f"hour {file_id}"
    hours = 1 << span_shift(file_id)
    return f"span of {hours} hours" + ("" if start is None else f" from hour {start}")
