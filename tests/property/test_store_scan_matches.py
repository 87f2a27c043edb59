"""Store.scan_matches (the bulk calls' scan) against a brute-force model,
its scan floors (storage.reading.ScanFloors), and the change marks
(Store.change_mark / changed_since).

Messages of two topics and three tags (none among them) are sent at two
moments two hours apart, with trigger times from hours before the send
(filed late, in the hour of the send) to days ahead (filed in spans);
part of them change status, committed or still pending. Then the scan
is run from a random start with small `max_scan` and `max_found`,
resuming from where each call stopped, with random statuses, tag and
trigger time range. What the calls return together must be exactly the
model's matches after the start in file order, each with its status,
retry and trigger time: the files the scan leaves out by the time range
hold none of them.

Scan floors: a scan takes up to a limit of matches, as a bulk call does,
and every match it took is DELETED; then messages are sent, and live
ones change in place as the lifecycle changes them (never back to live
from a final status, never into WAITING). A scan from the floors the
first left, cut after its last match taken, finds exactly what a scan
from the start finds.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, Location, Status
from storage.hour import Hour
from storage.reading import ScanFloors
from storage.store import NewMessage, StateChange, Store, text_hash

H0 = 490_000
NOW = H0 * MS_PER_HOUR + 1_000
SCRATCH_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
CONFIG = StoreConfig(segment_bytes=4096, id_shard_initial_slots=16)
TOPICS = ("orders", "mail")
TAGS = ("", "red", "blue")
# Trigger times relative to the send: late, due now, this hour, the next ones, a span's far ahead.
OFFSETS = (-3 * MS_PER_HOUR, -60_000, 0, 30 * 60_000, 65 * 60_000, 5 * MS_PER_HOUR, 40 * MS_PER_HOUR,
           100 * MS_PER_HOUR)
LATER = 2 * MS_PER_HOUR  # the second moment of sends
STATUSES = (Status.WAITING, Status.READY, Status.CONSUMING, Status.ACKED, Status.DELETED)

sends = st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from(TAGS), st.sampled_from(OFFSETS),
                           st.booleans()), min_size=1, max_size=30)
changes = st.lists(st.tuples(st.integers(0, 29), st.sampled_from(STATUSES[1:]), st.integers(0, 3), st.booleans()),
                   max_size=12)
bounds = st.one_of(st.none(), st.sampled_from([NOW - 4 * MS_PER_HOUR, NOW, NOW + 50 * 60_000, NOW + 3 * MS_PER_HOUR,
                                               NOW + 39 * MS_PER_HOUR, NOW + 99 * MS_PER_HOUR]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sends, changes, st.sets(st.sampled_from(STATUSES), min_size=1), st.sampled_from((None, *TAGS)), bounds,
       bounds, st.integers(1, 5), st.integers(1, 5), st.integers(0, 40))
def test_scan_matches_finds_exactly_the_matches_after_the_start(sent, changed, statuses, tag, lo, hi, max_scan,
                                                                max_found, start_at):
    directory = tempfile.mkdtemp(prefix="hourglass-scan-matches-", dir=SCRATCH_DIR)
    store = Store.open(directory, CONFIG, now_ms=NOW)
    try:
        model: dict[Location, tuple[str, str, int, int, int]] = {}  # place -> (topic, tag, trigger, status, retry)
        for i, (topic, msg_tag, offset, later) in enumerate(sent):
            now = NOW + (LATER if later else 0)
            result, = store.send([NewMessage(topic, f"m{i}", "x", now, max(0, now + offset), 48 * MS_PER_HOUR, 3, 0,
                                             msg_tag)], now)
            store.commit()
            model[result.message.location] = (topic, msg_tag, result.message.trigger_ms, int(Status.WAITING), 0)
        now = NOW + LATER
        places = sorted(model)
        for pick, status, retry, commit in changed:
            where = places[pick % len(places)]
            if model[where][3] in (Status.ACKED, Status.DELETED):
                continue
            store.update([StateChange(where, status, retry)], now)
            topic, msg_tag, trigger_ms, _, _ = model[where]
            model[where] = (topic, msg_tag, trigger_ms, int(status), retry)
            if commit:
                store.commit()
        start = places[start_at % len(places)] if start_at < len(places) else Location(0, 0)
        for topic in TOPICS:
            expected = [(where, status, retry, trigger_ms)
                        for where, (t, msg_tag, trigger_ms, status, retry) in sorted(model.items())
                        if t == topic and where >= start and status in statuses
                        and (tag is None or msg_tag == tag)
                        and (lo is None or trigger_ms >= lo) and (hi is None or trigger_ms < hi)]
            got, cursor = [], start
            while cursor is not None:
                found, cursor = store.scan_matches(text_hash(topic), sorted(statuses), cursor, max_scan, max_found,
                                                   None if tag is None else text_hash(tag), lo, hi, now)
                assert len(found) <= max_found
                got += found
            assert got == expected
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(OFFSETS[2:6]), min_size=2, max_size=10), st.data())
def test_a_change_mark_names_the_files_changed_since(offsets, data):
    directory = tempfile.mkdtemp(prefix="hourglass-change-mark-", dir=SCRATCH_DIR)
    store = Store.open(directory, CONFIG, now_ms=NOW)
    try:
        places = [r.message.location for r in store.send([NewMessage("t", f"m{i}", "x", NOW, NOW + offset,
                                                                     MS_PER_HOUR, 3) for i, offset in
                                                          enumerate(offsets)], NOW)]
        store.commit()
        mark = store.change_mark()
        files = {where.hour for where in places}
        assert not any(store.changed_since(f, mark) for f in files)
        store.send([NewMessage("t", "other", "x", NOW, NOW + offsets[0], MS_PER_HOUR, 3)], NOW)  # a send: no change
        assert not any(store.changed_since(f, mark) for f in files)
        touched = data.draw(st.sets(st.sampled_from(places), min_size=1), label="changed")
        moved = data.draw(st.sampled_from(places), label="moved")
        store.update([StateChange(where, Status.READY, 0) for where in touched], NOW)
        if moved not in touched:
            store.move([(moved, NOW + 7 * MS_PER_HOUR, 0)], NOW)
            touched = touched | {moved}
        for f in files:
            assert store.changed_since(f, mark) == any(where.hour == f for where in touched)
        store.commit()
        later = store.change_mark()
        assert not any(store.changed_since(f, later) for f in files)
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_message_filed_late_is_found_by_a_range_ending_before_its_file_begins():
    """Sent two hours after its trigger time, a message is filed in the hour
    of its send: a range ending before that hour begins still finds it,
    while an hour not yet begun holds no such message and is left out."""
    directory = tempfile.mkdtemp(prefix="hourglass-scan-late-", dir=SCRATCH_DIR)
    store = Store.open(directory, CONFIG, now_ms=NOW)
    try:
        now = NOW + LATER
        late, ahead = store.send([NewMessage("t", "late", "x", now, NOW - MS_PER_HOUR, 48 * MS_PER_HOUR, 3),
                                  NewMessage("t", "ahead", "x", now, now + 3 * MS_PER_HOUR, 48 * MS_PER_HOUR, 3)], now)
        store.commit()
        assert late.message.location.hour == H0 + 2
        found, _ = store.scan_matches(text_hash("t"), [Status.WAITING], Location(0, 0), 100, 100, None, None,
                                      NOW + 50 * 60_000, now)
        assert [m[0] for m in found] == [late.message.location]
        found, _ = store.scan_matches(text_hash("t"), [Status.WAITING], Location(0, 0), 100, 100, None,
                                      now + 3 * MS_PER_HOUR, None, now)
        assert [m[0] for m in found] == [ahead.message.location]
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


def _scan(store: Store, topic: str, statuses, tag, lo, hi, now, max_scan, max_found, floors, limit=None):
    """Matches from the start, up to `limit` (None: all) taken, as broker.disk.bulk gathers them; whether more."""
    got, cursor = [], Location(0, 0)
    while cursor is not None:
        found, cursor = store.scan_matches(text_hash(topic), sorted(statuses), cursor, max_scan, max_found,
                                           None if tag is None else text_hash(tag), lo, hi, now, floors)
        got += found
        if limit is not None and len(got) > limit:
            return got[:limit], True
    return got, False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sends, changes, sends, changes, st.sampled_from([(Status.WAITING, Status.READY, Status.CONSUMING),
                                                        (Status.WAITING,)]),
       st.sampled_from((None, *TAGS)), bounds, bounds, st.integers(1, 5), st.integers(1, 5), st.integers(1, 12))
def test_a_scan_from_the_floors_a_call_left_finds_what_a_scan_from_the_start_finds(
        sent, changed, sent_after, changed_after, statuses, tag, lo, hi, max_scan, max_found, limit):
    directory = tempfile.mkdtemp(prefix="hourglass-scan-floors-", dir=SCRATCH_DIR)
    store = Store.open(directory, CONFIG, now_ms=NOW)
    try:
        status_of: dict[Location, int] = {}
        places: list[Location] = []

        def send(batch, name: str, now: int) -> None:
            for i, (topic, msg_tag, offset, commit) in enumerate(batch):
                result, = store.send([NewMessage(topic, f"{name}{i}", "x", now, max(0, now + offset),
                                                 48 * MS_PER_HOUR, 3, 0, msg_tag)], now)
                status_of[result.message.location] = int(Status.WAITING)
                places.append(result.message.location)
                if commit:
                    store.commit()

        def change(batch, now: int) -> None:  # in place, as the lifecycle does: never into WAITING, never out of a final
            for pick, status, retry, commit in batch:
                where = places[pick % len(places)]
                if status_of[where] >= Status.ACKED:
                    continue
                store.update([StateChange(where, status, retry)], now)
                status_of[where] = int(status)
                if commit:
                    store.commit()

        send(sent, "m", NOW)
        change(changed, NOW)
        floors = ScanFloors()
        taken, more = _scan(store, "orders", statuses, tag, lo, hi, NOW, max_scan, max_found, floors, limit)
        store.update([StateChange(where, Status.DELETED, retry) for where, _, retry, _ in taken], NOW)
        for where, _, _, _ in taken:
            status_of[where] = int(Status.DELETED)
        if more:
            last = taken[-1][0]
            floors.cut(Location(last.hour, last.global_index + 1))
        now = NOW + LATER
        send(sent_after, "n", now)
        change(changed_after, now)
        for _ in ("pending", "committed"):
            expected, _ = _scan(store, "orders", statuses, tag, lo, hi, now, max_scan, max_found, None)
            got, _ = _scan(store, "orders", statuses, tag, lo, hi, now, max_scan, max_found, floors.copy())
            assert got == expected
            store.commit()
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_floor_is_of_the_file_it_was_raised_on_not_of_one_made_again_under_its_id():
    """A span's id comes back after 2**16 spans of its size: the file made
    under it then is a new Hour, read from its first entry."""
    first = Hour(H0)
    first.applied = 10
    floors = ScanFloors()
    floors.raise_to(first, 7)
    again = Hour(H0)
    again.applied = 10
    assert floors.floor(first) == 7
    assert floors.floor(again) == 0
    floors.cut(Location(H0, 4))
    assert floors.floor(first) == 4
    floors.cut(Location(H0 - 1, 0))
    assert floors.floor(first) == 0
