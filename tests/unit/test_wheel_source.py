"""InMemorySlotSource (tests/fakes.py): storage's filing rule and second chains."""

from fakes import InMemorySlotSource

from storage.entry import MS_PER_HOUR, SECONDS_PER_HOUR, Location, Status
from wheel.source import SlotSource

H = 472_000
T0 = H * MS_PER_HOUR


def test_docstring_example():
    src = InMemorySlotSource()
    a = src.add(T0 + 5_250, 0, T0)
    b = src.add(T0 + 5_100, 9, T0)
    late = src.add(T0 - 60_000, 0, T0 + 7_000)
    assert (a.hour, a.second, a.local_index, a.global_index, a.pre_global_index) == (H, 5, 0, 0, -1)
    assert (b.hour, b.second, b.local_index, b.global_index, b.pre_global_index) == (H, 5, 1, 1, 0)
    assert (late.hour, late.second, late.local_index, late.global_index) == (H, 7, 0, 2)
    assert late.trigger_ms == T0 - 60_000  # filed late, keeps its trigger
    assert src.read_second(H, 5) == [a, b]
    assert src.read_second(H, 6) == []


def test_counts_and_next_hour():
    src = InMemorySlotSource()
    src.add(T0 + 3 * MS_PER_HOUR + 1_000, 0, T0)
    src.add(T0 + 3 * MS_PER_HOUR + 1_500, 0, T0)
    src.add(T0 + 10, 0, T0)
    assert src.next_hour(0) == H
    assert src.next_hour(H + 1) == H + 3
    assert src.next_hour(H + 4) is None
    counts = src.second_counts(H + 3)
    assert len(counts) == SECONDS_PER_HOUR and counts[1] == 2 and sum(counts) == 2
    assert sum(src.second_counts(H + 1)) == 0
    assert src.counts_read == 2


def test_set_status_is_seen_by_reads():
    src = InMemorySlotSource()
    e = src.add(T0 + 1_000, 0, T0)
    src.set_status(e.location, Status.ACKED)
    assert src.read_second(H, 1)[0].status is Status.ACKED
    assert src.get(Location(H, 0)).status is Status.ACKED
    assert src.seconds_read == 1


def test_years_ahead_is_one_hour_file():
    src = InMemorySlotSource()
    e = src.add(T0 + 5 * 365 * 24 * MS_PER_HOUR, 0, T0)
    assert src.next_hour(H) == e.hour == H + 5 * 365 * 24
    assert len(src) == 1 and list(src) == [e]


def test_satisfies_the_protocol():
    src: SlotSource = InMemorySlotSource()
    assert src.next_hour(0) is None
    assert "entries=0" in repr(src)
