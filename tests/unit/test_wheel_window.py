"""wheel.window.PreloadWindow: two-stage holding, order, progress, dedupe."""

from storage.entry import MS_PER_HOUR, SECONDS_PER_HOUR, IndexEntry, Location, Status
from wheel.window import PreloadWindow, release_key

H = 472_000
S5 = H * SECONDS_PER_HOUR + 5  # absolute second 5 of hour H
T5 = H * MS_PER_HOUR + 5_000  # its start, ms


def entry(local: int, trigger_ms: int, priority: int = 0, *, second: int = 5, global_index: int | None = None,
          status: Status = Status.WAITING) -> IndexEntry:
    gi = local + 100 * second if global_index is None else global_index
    return IndexEntry(H, second, local, gi, -1, trigger_ms, priority, 0, 0, status, 0)


def test_docstring_example():
    w = PreloadWindow()
    x, y, z = entry(0, T5 + 800), entry(1, T5 + 200), entry(2, T5 + 200, 9)
    assert w.load(S5, [x, y, z]) == 3
    assert w.next_due_ms() == T5 + 200
    w.activate(T5 + 200)
    assert w.pop_due(T5 + 200, 100) == [z, y]
    assert w.prefix_of(S5) == 0 and w.first_unreleased() == (S5, 0)
    w_ = entry(3, T5 + 300)
    assert w.add(w_) == T5 + 300
    assert w.next_due_ms() == T5 + 300
    assert w.pop_due(T5 + 800, 100) == [w_, x]
    assert w.prefix_of(S5) == 4 and w.first_unreleased() is None
    assert len(w) == 0


def test_pending_second_is_not_released_before_activation_or_trigger():
    w = PreloadWindow()
    w.load(S5, [entry(0, T5 + 500)])
    assert w.pop_due(T5 + 499, 10) == []
    w.activate(T5 + 499)
    assert w.pop_due(T5 + 499, 10) == []
    w.activate(T5 + 500)
    assert [e.local_index for e in w.pop_due(T5 + 500, 10)] == [0]


def test_an_entry_filed_after_its_trigger_goes_straight_to_the_heap():
    w = PreloadWindow()
    late = entry(0, T5 - 60_000)
    w.add(late)
    assert w.next_due_ms() == T5 - 60_000
    assert w.pop_due(T5, 10) == [late]  # no activation needed


def test_limit_and_order_across_seconds():
    w = PreloadWindow()
    a = [entry(i, T5 + 10 * (5 - i)) for i in range(5)]
    b = [entry(i, T5 + 1_000 + i, second=6) for i in range(3)]
    w.load(S5, a)
    w.load(S5 + 1, b)
    w.activate(T5 + 2_000)
    first = w.pop_due(T5 + 2_000, 4)
    rest = w.pop_due(T5 + 2_000, 100)
    assert first + rest == sorted(a + b, key=release_key)
    assert len(first) == 4


def test_same_entry_from_load_and_add_is_held_once():
    w = PreloadWindow()
    e0, e1 = entry(0, T5 + 1), entry(1, T5 + 2)
    w.load(S5, [e0, e1])
    assert w.add(e1) is None
    e2 = entry(2, T5 + 3)
    assert w.add(e2) == T5 + 3
    assert w.load(S5, [e0, e1, e2]) == 0
    w.activate(T5 + 10)
    assert w.pop_due(T5 + 10, 10) == [e0, e1, e2]
    assert w.add(e0) is None  # released already: still known


def test_entries_not_waiting_are_skipped_but_count_as_done():
    w = PreloadWindow()
    acked = entry(0, T5 + 1, status=Status.ACKED)
    waiting = entry(1, T5 + 2)
    assert w.load(S5, [acked, waiting]) == 1
    assert w.prefix_of(S5) == 1
    w.activate(T5 + 2)
    assert w.pop_due(T5 + 2, 10) == [waiting]
    assert w.prefix_of(S5) == 2


def test_cancel():
    w = PreloadWindow()
    e0, e1 = entry(0, T5 + 1), entry(1, T5 + 2)
    w.load(S5, [e0, e1])
    assert w.cancel(e0.location) is True
    assert w.cancel(e0.location) is False
    assert w.cancel(Location(H, 99_999)) is False
    assert w.next_due_ms() == T5 + 1  # activation time; the heap skips e0 lazily
    w.activate(T5 + 1)
    assert w.next_due_ms() == T5 + 2
    assert w.pop_due(T5 + 5, 10) == [e1]
    assert w.prefix_of(S5) == 2


def test_a_gap_in_local_indexes_holds_progress_back():
    w = PreloadWindow()
    e1 = entry(1, T5 + 1)
    w.add(e1)  # local 0 not reported yet
    w.activate(T5 + 1)
    assert w.pop_due(T5 + 1, 10) == [e1]
    assert w.first_unreleased() == (S5, 0)
    e0 = entry(0, T5 + 2)
    w.add(e0)
    w.activate(T5 + 2)
    assert w.pop_due(T5 + 2, 10) == [e0]
    assert w.first_unreleased() is None and w.prefix_of(S5) == 2


def test_open_second_marks_a_restored_prefix_done():
    w = PreloadWindow()
    w.open_second(S5, 2)
    entries = [entry(i, T5 + i) for i in range(4)]
    assert w.load(S5, entries) == 2
    w.activate(T5 + 10)
    assert [e.local_index for e in w.pop_due(T5 + 10, 10)] == [2, 3]


def test_retire_drops_only_complete_seconds_before_the_bound():
    w = PreloadWindow()
    w.load(S5, [entry(0, T5 + 1)])
    w.load(S5 + 1, [])
    w.load(S5 + 2, [])
    assert w.retire(S5 + 2) == 1  # S5 is incomplete, S5+2 is not before the bound
    assert w.tracked_seconds == 2
    w.activate(T5 + 1)
    w.pop_due(T5 + 1, 10)
    assert w.retire(S5 + 2) == 1
    assert "held=0, tracked_seconds=1" in repr(w)
