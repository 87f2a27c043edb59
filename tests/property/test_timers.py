"""broker.disk.timers' TimerQueue: every place set fires once, at its own due time and
with its own kind, whether it joined the timer set before it or not; a
compaction keeps exactly the places its trim keeps; the count of queued
places is what the queue holds."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.disk.timers import Timer, TimerKind, TimerQueue
from storage.entry import Location

# set(kind, due, n places) / fire everything due at `now` / compact dropping odd global indexes
_OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), st.sampled_from(list(TimerKind)), st.integers(0, 6), st.integers(1, 3)),
    st.tuples(st.just("fire"), st.integers(0, 7)),
    st.tuples(st.just("compact"),),
), min_size=1, max_size=60)


def _queued(timers: TimerQueue) -> Counter[tuple[TimerKind, int, Location]]:
    queued: list[Timer] = []
    timers._queue.retain(lambda timer, _due: queued.append(timer) is None)  # (keeps every one)
    return Counter((t.kind, t.due_ms, loc) for t in queued for loc in t.locations)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_each_place_fires_once_at_its_time_joined_or_not(ops):
    timers = TimerQueue()
    model: Counter[tuple[TimerKind, int, Location]] = Counter()  # (kind, due, place) still queued
    fired: list[tuple[TimerKind, int, Location]] = []
    next_index = 0
    now = 0
    for op in ops:
        if op[0] == "set":
            _, kind, due, n = op
            due = max(due, now + 1)  # (set after `now`: not due yet)
            places = [Location(0, next_index + i) for i in range(n)]
            next_index += n
            timers.set(kind, due, places)
            model.update((kind, due, p) for p in places)
        elif op[0] == "fire":
            now = max(now, op[1])
            due: list[Timer] = timers.due(now)
            assert all(t.due_ms <= now for t in due)
            got = [(t.kind, t.due_ms, loc) for t in due for loc in t.locations]
            fired += got
            for item in got:
                model[item] -= 1
                assert model[item] >= 0, item  # fired once
            model += Counter()  # (drops the zeros)
            assert all(d > now for (_, d, _) in model), "a place due was left queued"
        else:
            def trim(timer: Timer) -> bool:
                timer.locations[:] = [loc for loc in timer.locations if loc.global_index % 2 == 0]
                return bool(timer.locations)
            timers.compact(trim)
            model = Counter({k: c for k, c in model.items() if k[2].global_index % 2 == 0})
        assert _queued(timers) == model
        assert timers.locations == sum(model.values())


def test_places_set_one_after_another_for_one_due_time_are_one_queued_timer():
    """A batch filed together expires together: one entry of the queue,
    not one a message; another due time or kind starts another."""
    timers = TimerQueue()
    for i in range(100):
        timers.set(TimerKind.EXPIRY, 5_000, [Location(0, i)])
    timers.set(TimerKind.ACK, 5_000, [Location(0, 100)])
    timers.set(TimerKind.ACK, 6_000, [Location(0, 101)])
    assert len(timers) == 3 and timers.locations == 102
    due = timers.due(5_000)
    assert [(t.kind, len(t.locations)) for t in due] == [(TimerKind.EXPIRY, 100), (TimerKind.ACK, 1)]
