"""HourTable: the far hours' file cache and the near pair."""

import os

from storage.disk import DISK
from storage.entry import MS_PER_HOUR
from storage.hour_files import hour_paths
from storage.hour_table import NO_HOUR, HourTable

NOW_HOUR = 490_000


def table(tmp_path, far_limit=2):
    t = HourTable(str(tmp_path), far_limit, DISK)
    t.advance(NOW_HOUR * MS_PER_HOUR)
    return t


def open_hours(t):
    return [h.hour for h in t.ascending() if h.files is not None]


def test_the_least_recently_used_far_hour_is_closed_first(tmp_path):
    """The worked example of the module docstring."""
    t = table(tmp_path)
    a, b, c, d = (t.get_or_add(NOW_HOUR + n) for n in (10, 11, 12, 13))
    for h in (a, b, c):
        t.files(h)
    assert open_hours(t) == [b.hour, c.hour]
    t.files(b)
    t.files(d)
    assert open_hours(t) == [b.hour, d.hour]
    t.close()


def test_near_hours_are_mapped_and_reopened_plainly_once_passed(tmp_path):
    t = table(tmp_path)
    near = t.get_or_add(NOW_HOUR + 1)
    assert t.files(near).mapped and t.is_near(near.hour)
    t.advance((NOW_HOUR + 2) * MS_PER_HOUR)
    assert near.files is None and not t.is_near(near.hour)
    assert not t.files(near).mapped
    t.close()


def test_an_hour_only_an_unappended_record_made_goes_with_its_files(tmp_path):
    t = table(tmp_path)
    t.files(t.get_or_add(NOW_HOUR))
    t.discard_unapplied(NOW_HOUR)
    assert NOW_HOUR not in t and len(t) == 0
    assert not any(os.path.exists(p) for p in hour_paths(str(tmp_path), NOW_HOUR))


def test_before_any_advance_there_is_no_hour(tmp_path):
    assert HourTable(str(tmp_path), 4, DISK).now_hour == NO_HOUR
