"""Far-future messages are filed in spans of hours and moved nearer in time.

The rule (storage.spans.file_for) is checked on its own: a span holds the
hour, starts at least its size ahead, is not due when chosen, fits the id
index's 24 bits, and as time passes a message's file only gets smaller
(so it moves at most once per span size). Then the store: messages spread
over up to 20 years, time stepped forward in jumps, `refile()` run to the
end at each step, then a crash (records appended, fsync'ed, not applied)
and a reopen: every message is still found by its id with its fields,
every message within 32 hours sits in its own hour (where the wheel reads
it), the wheel's `next_hour` never names a span, and the number of files
stays bounded whatever the spread.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from storage import spans
from storage.entry import MS_PER_HOUR, Location, Status
from storage.store import NewMessage, StateChange, Store, text_hash

NOW_HOUR = 500_000
MAX_HOUR = 253_402_300_799_999 // MS_PER_HOUR


def hours_range(file_id: int, trigger_ms: int) -> tuple[int, int]:
    """[first, last] hour of the file (one hour for an hour)."""
    if file_id < spans.SPAN_FLAG:
        return file_id, file_id
    start = spans.start_hour(file_id, trigger_ms)
    return start, start + (1 << spans.span_shift(file_id)) - 1


@given(st.integers(0, spans.SPAN_FLAG - 2 * spans.HOURLY_HOURS), st.integers(0, 3 * 10**7))
def test_file_for_holds_the_hour_and_is_not_due(now_hour, ahead):
    """(For any now before the year 2926: hour numbers from 2**23 name spans.)"""
    hour = now_hour + ahead
    file_id = spans.file_for(hour, now_hour)
    if ahead < spans.HOURLY_HOURS:
        assert file_id == hour
    if not spans.is_span(file_id):
        assert file_id == hour and ahead < 2 * spans.HOURLY_HOURS
        return
    assert file_id < 1 << 24  # the id index keeps 24 bits of it
    first, last = hours_range(file_id, hour * MS_PER_HOUR)
    assert first <= hour <= last
    assert first - now_hour >= last - first + 1  # starts at least its size ahead
    assert not spans.is_due(file_id, first, now_hour)


@given(st.integers(0, MAX_HOUR - NOW_HOUR), st.lists(st.integers(1, 10**6), min_size=1, max_size=30))
def test_a_message_only_moves_to_smaller_files(ahead, steps):
    hour = NOW_HOUR + ahead
    now = NOW_HOUR
    file_id = spans.file_for(hour, now)
    for step in steps:
        now = min(now + step, hour)
        first, _ = hours_range(file_id, hour * MS_PER_HOUR)
        if not spans.is_due(file_id, first, now):
            continue  # it stays where it is
        moved_to = spans.file_for(hour, now)
        assert spans.span_shift(moved_to) < spans.span_shift(file_id)
        file_id = moved_to


@given(st.integers(0, 2**22), st.lists(st.integers(0, MAX_HOUR), min_size=1, max_size=2000))
def test_files_in_use_do_not_grow_with_the_spread(now_hour, hours):
    ids = {spans.file_for(max(h, now_hour), now_hour) for h in hours}
    per_size: dict[int, int] = {}
    for file_id in ids:
        if spans.is_span(file_id):
            per_size[spans.span_shift(file_id)] = per_size.get(spans.span_shift(file_id), 0) + 1
    assert all(n <= 3 for n in per_size.values())
    assert sum(1 for i in ids if not spans.is_span(i)) <= 2 * spans.HOURLY_HOURS


def _crash(store: Store) -> None:
    """Stop as a killed process would after the fsync: the records are in
    the log, not applied (the files it closes may be longer than their
    data: a reopen cuts them to the checkpoint and replays)."""
    store._pending.records.clear()
    store.close()


def _all_moved(store: Store, now_ms: int) -> None:
    while store.refile(now_ms, max_moves=7):
        store.commit()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.sampled_from([24, 24 * 365, 24 * 365 * 20]),
       st.lists(st.integers(1, 24 * 400), min_size=1, max_size=12))
def test_store_moves_far_messages_in_time_across_a_crash(seed, spread_hours, jumps):
    rnd = random.Random(seed)
    directory = tempfile.mkdtemp()
    try:
        now = NOW_HOUR * MS_PER_HOUR + rnd.randrange(MS_PER_HOUR)
        store = Store.open(directory, now_ms=now)
        sent = {}
        for b in range(3):
            batch = [NewMessage("t" + str(i % 3), f"m{b}-{i}", f"body {b} {i}", now,
                                now + rnd.randrange(spread_hours * MS_PER_HOUR), 60_000, 3, rnd.randrange(-3, 3))
                     for i in range(40)]
            store.send(batch, now)
            sent.update({(m.topic, m.msg_id): m for m in batch})
        store.commit()
        # some of them deleted while still far out: they must not come back
        deleted = set(rnd.sample(sorted(sent), 10))
        store.update([StateChange(store.get(*k).location, Status.DELETED, 0, released=True) for k in deleted], now)
        store.commit()
        for i, jump in enumerate(jumps):
            now += jump * MS_PER_HOUR
            if i == len(jumps) // 2:  # a crash: moves appended and fsync'ed, not applied
                store.refile(now, max_moves=5)
                store.sync_log()
                _crash(store)
                store = Store.open(directory, now_ms=now)
            _all_moved(store, now)
            now_hour = now // MS_PER_HOUR
            for key, m in sent.items():
                found = store.get(*key)
                if key in deleted:
                    assert found is None
                    continue
                assert found is not None and found.msg == m.msg and found.trigger_ms == m.trigger_ms
                assert found.priority == m.priority and found.status is Status.WAITING
                filing_hour = max(m.trigger_ms, m.produce_ms) // MS_PER_HOUR
                if filing_hour < now_hour + spans.HOURLY_HOURS:  # the wheel finds it in its hour
                    assert filing_hour <= found.location.hour <= max(filing_hour, now_hour)
            hour = store.next_hour(0)
            assert hour is None or not spans.is_span(hour)
            files = {h for h, _, _ in store.hours()}
            assert sum(1 for h in files if spans.is_span(h)) <= 3 * 23 + 1
            store.checkpoint(now)
        store.close()
    finally:
        shutil.rmtree(directory)


def test_messages_over_ten_years_make_few_files(tmp_path):
    """100,000 messages spread uniformly over ten years (batches of 1,000):
    few files and a small checkpoint. Files depend on the spread, not the
    count (bench/spans.py runs the million)."""
    now = NOW_HOUR * MS_PER_HOUR
    rnd = random.Random(7)
    store = Store.open(str(tmp_path), now_ms=now)
    for b in range(100):
        store.send([NewMessage("t", f"{b}-{i}", "x", now, now + rnd.randrange(87_660 * MS_PER_HOUR), 0, 0)
                    for i in range(1000)], now)
        store.commit()
    store.checkpoint(now)
    names = os.listdir(os.path.join(str(tmp_path), "delay"))
    assert len(names) < 600, len(names)
    assert os.path.getsize(os.path.join(str(tmp_path), "checkpoint")) < 64 * 1024
    store.close()


def test_the_largest_trigger_time_is_stored(tmp_path):
    """Its hour (70 M) does not fit the id index's 24 bits: a span's id does."""
    now = NOW_HOUR * MS_PER_HOUR
    store = Store.open(str(tmp_path), now_ms=now)
    store.send([NewMessage("t", "last", "x", now, MAX_HOUR * MS_PER_HOUR + MS_PER_HOUR - 1, 0, 0)], now)
    store.commit()
    store.close()
    store = Store.open(str(tmp_path), now_ms=now)
    assert store.get("t", "last").trigger_ms == 253_402_300_799_999
    store.close()


def test_a_follower_applies_the_moves_it_is_sent(tmp_path):
    """MOVE records reach a follower as any record does (read_log,
    append_replicated): it ends with the leader's files and finds every
    message where the leader does."""
    now = NOW_HOUR * MS_PER_HOUR
    leader = Store.open(str(tmp_path / "leader"), now_ms=now)
    follower = Store.open(str(tmp_path / "follower"), now_ms=now)
    leader.send([NewMessage("t", f"m{h}", str(h), now, now + h * MS_PER_HOUR, 0, 0) for h in (50, 300, 9000)], now)
    leader.commit()
    later = now + 250 * MS_PER_HOUR
    while leader.refile(later):
        leader.commit()
    for offset, body in leader.read_log(0, leader.log_end_offset, 1 << 20):
        follower.append_replicated(offset, body)
    follower.commit()
    assert follower.hours() == leader.hours()
    for h in (50, 300, 9000):
        assert follower.get("t", f"m{h}") == leader.get("t", f"m{h}")
    assert not spans.is_span(leader.get("t", "m50").location.hour)
    leader.close()
    follower.close()


def test_an_old_directory_with_an_hour_that_now_names_a_span_is_refused(tmp_path):
    """Before spans an hour of 2**23 or more (after the year 2926) was an
    hour; opened now it would read as a span: the store refuses it and says
    how to migrate."""
    from unittest import mock

    from storage.checkpoint import Checkpoint
    from storage.errors import CorruptionError

    now = NOW_HOUR * MS_PER_HOUR
    far = (spans.SPAN_FLAG + 5) * MS_PER_HOUR
    with mock.patch.object(spans, "file_for", lambda hour, now_hour: hour):  # the old rule: an hour each
        store = Store.open(str(tmp_path), now_ms=now)
        store.send([NewMessage("t", "far", "x", now, far, 0, 0)], now)
        store.checkpoint(now)
        store.close()
    path = str(tmp_path / "checkpoint")
    old = Checkpoint.load(path)
    Checkpoint(old.commit_offset, old.hours, old.written_ms, old.topic_names, old.consuming, layout=1).save(path)
    with pytest.raises(CorruptionError, match="to migrate"):
        Store.open(str(tmp_path), now_ms=now)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.sampled_from([24 * 30, 24 * 365, 24 * 365 * 20]),
       st.lists(st.integers(1, 24 * 400), min_size=1, max_size=6), st.integers(1, 40))
def test_a_walk_from_the_last_file_down_meets_every_message_as_spans_move(seed, spread_hours, jumps, page):
    """exportMsg's walk (scan_matches `descending`, a page at a time from
    the place the last stopped): time jumps and far spans come due between
    pages, their messages filed again in nearer files (whose ids are always
    lower: still ahead of the walk), and still every message is met at
    least once -- a move from behind the walk may meet one twice."""
    rnd = random.Random(seed)
    directory = tempfile.mkdtemp()
    try:
        now = NOW_HOUR * MS_PER_HOUR + rnd.randrange(MS_PER_HOUR)
        store = Store.open(directory, now_ms=now)
        batch = [NewMessage("t" + str(i % 2), f"m{i}", f"body {i}", now,
                            now + rnd.randrange(spread_hours * MS_PER_HOUR), 60_000, 3) for i in range(120)]
        store.send(batch, now)
        store.commit()
        want = {m.msg_id for m in batch if m.topic == "t0"}
        met: list[str] = []
        where = Location(1 << 24, 0)
        steps = iter(jumps)
        topic_hash = text_hash("t0")
        while True:
            found, after = store.scan_matches(topic_hash, [Status.WAITING], where, 1024, page, descending=True)
            met += [store.read_message(place).msg_id for place, _, _, _ in found]
            if after is None:
                break
            where = after
            jump = next(steps, None)
            if jump is not None:  # between two pages: time goes on, due spans move
                now += jump * MS_PER_HOUR
                _all_moved(store, now)
        assert set(met) >= want and set(met) <= want
        store.close()
    finally:
        shutil.rmtree(directory)
