"""The disk Store against InMemoryStore, with reopens and crashes.

Every rule applies one operation to both; after every step they must agree
on lookups by id, the entries of every second ever filed, the per-second
counts and the list of hours. Reopening closes the store and opens a new
one on the same directory. Crashing abandons the store without closing it
(as kill -9 would: appends already sit in the page cache) and then tears
the commit log's tail: truncated, zeroed or garbled at a random point after
the last committed byte. Records cut there are lost, whole records before
it survive, and the model is told how many survived.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import weakref

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from memory_store import InMemoryStore

from storage import spans
from storage.config import StoreConfig
from storage.disk import Disk
from storage.entry import MS_PER_HOUR, Location, Status
from storage.errors import CorruptionError, InvalidRequest
from storage.store import MAX_PRIORITY, MAX_RETRY_COUNT, MIN_PRIORITY, NewMessage, StateChange, Store

MS_PER_DAY = 24 * MS_PER_HOUR
START_MS = 490_000 * MS_PER_HOUR - 30_000  # 30 s before an hour boundary
RETENTION_MS = 90_000
# fsync costs milliseconds on a disk and nothing on tmpfs; crashes here are
# simulated, so the file system's own durability is not under test.
SCRATCH_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

CONFIG = StoreConfig(
    segment_bytes=4096,  # the smallest allowed: batches roll segments often
    retention_ms=RETENTION_MS,
    id_shard_initial_slots=16,
    open_far_hours=4,  # far hours' files are evicted and reopened
)

TOPICS = st.sampled_from(["orders", "mail", "ü"])
MSG_IDS = st.one_of(st.sampled_from("abcdefgh"), st.text(min_size=1, max_size=6))
BODIES = st.one_of(st.text(max_size=20), st.just("x" * 1500))
DELAYS_MS = st.one_of(
    st.sampled_from([0, 1, 999, 1000, 30_000, MS_PER_HOUR]),
    st.integers(-10_000, 10_000),  # overdue (filed under now) or due within seconds
    st.integers(0, 3 * MS_PER_HOUR),
    st.integers(0, 4 * MS_PER_DAY),
)
TICKS_MS = st.one_of(st.sampled_from([1, 1000, 30_000, RETENTION_MS, MS_PER_HOUR, MS_PER_DAY]),
                     st.integers(0, 2 * MS_PER_DAY))
MESSAGE_SPECS = st.tuples(TOPICS, MSG_IDS, BODIES, DELAYS_MS, st.integers(0, 10**9), st.integers(0, 16),
                          st.one_of(st.just(0), st.integers(MIN_PRIORITY, MAX_PRIORITY)),
                          st.sampled_from(["", "vip", "ü"]))
CHANGE_KINDS = st.sampled_from(["ack", "delete", "release", "retry", "consume"])


def _change(kind: str, where: Location, retry: int) -> StateChange:
    if kind == "ack":
        return StateChange(where, Status.ACKED, retry)
    if kind == "delete":
        return StateChange(where, Status.DELETED, retry, released=False)
    if kind == "release":
        return StateChange(where, Status.DELETED, retry, released=True)
    if kind == "retry":
        return StateChange(where, Status.READY, retry + 1)
    return StateChange(where, Status.CONSUMING, retry)


def _release_fds(directory: str, disk_ref: weakref.ref) -> None:
    """Close the file descriptors an abandoned store leaked (os.open fds have
    no finaliser), once it is gone and nothing can close them behind our back.
    `disk_ref`: the Disk made for that store alone (a compiled Store takes
    no weak reference; the Disk, interpreted, does): the store and each
    part holding its descriptors keep it, so once it is gone, so are they."""
    if not os.path.isdir("/proc/self/fd"):
        return
    directory = os.path.realpath(directory)
    if disk_ref() is not None:
        gc.collect()  # only needed if the store sits in a reference cycle
    if disk_ref() is not None:
        return  # still referenced somewhere: leak rather than risk closing a reused fd
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(directory + os.sep):
            os.close(int(name))


class StoreMachine(RuleBasedStateMachine):
    """One Store (replaced by a new one on each reopen or crash) and one
    InMemoryStore, driven alike with a fake clock `now_ms` that only grows."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="hourglass-model-", dir=SCRATCH_DIR)
        self.now_ms = START_MS
        self.store = Store.open(self.directory, CONFIG, now_ms=self.now_ms, disk=Disk())
        self.model = InMemoryStore(CONFIG)
        self.keys: set[tuple[str, str]] = set()  # every (topic, msgId) ever sent
        self.seconds: set[tuple[int, int]] = set()  # every (hour, second) ever filed into
        self.committed_end = self.store.log_end_offset  # log offset as of the last commit
        self.pending_ends: list[int] = []  # end offset of each record appended since

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------

    def _appended(self, before: int) -> None:
        if self.store.log_end_offset != before:
            self.pending_ends.append(self.store.log_end_offset)
        assert len(self.pending_ends) == self.model.pending_records

    def _both_update(self, changes: list[StateChange]) -> None:
        before = self.store.log_end_offset
        self.store.update(changes, self.now_ms)
        self.model.update(changes, self.now_ms)
        self._appended(before)

    def _committed(self) -> None:
        self.committed_end = self.store.log_end_offset
        self.pending_ends = []

    def _reopen(self, with_now: bool) -> None:
        self.store = Store.open(self.directory, CONFIG, now_ms=self.now_ms if with_now else None, disk=Disk())
        self.model.reopen()
        self._committed()

    # -- writing -------------------------------------------------------------------

    @rule(specs=st.lists(MESSAGE_SPECS, min_size=1, max_size=6))
    def send(self, specs):
        self._send_both(specs)

    def _send_both(self, specs) -> None:
        batch = [NewMessage(topic, msg_id, body, self.now_ms, self.now_ms + delay_ms, ttl_ms, max_retry,
                            priority, tag)
                 for topic, msg_id, body, delay_ms, ttl_ms, max_retry, priority, tag in specs]
        before = self.store.log_end_offset
        got = self.store.send(batch, self.now_ms)
        expected = self.model.send(batch, self.now_ms)
        assert got == expected
        self._appended(before)
        for m, result in zip(batch, expected):
            self.keys.add((m.topic, m.msg_id))
            self.seconds.add((result.message.location.hour,
                              self.model.read_entry(result.message.location).second))

    @precondition(lambda self: self.model.locations())
    @rule(data=st.data(), kinds=st.lists(CHANGE_KINDS, min_size=1, max_size=4))
    def change_state(self, data, kinds):
        locations = self.model.locations()
        changes = []
        for kind in kinds:
            where = data.draw(st.sampled_from(locations), label="location")
            changes.append(_change(kind, where, self.model.read_entry(where).retry))
        self._both_update(changes)

    @precondition(lambda self: self.model.locations())
    @rule(data=st.data(), kind=st.sampled_from(["ack", "delete", "release"]))
    def end_an_hour(self, data, kind):
        """End every message of one hour, so that retention can retire it."""
        hour = data.draw(st.sampled_from(sorted({where.hour for where in self.model.locations()})), label="hour")
        changes = [_change(kind, where, self.model.read_entry(where).retry)
                   for where in self.model.locations() if where.hour == hour]
        self._both_update(changes)

    @precondition(lambda self: self.model.locations())
    @rule(kind=st.sampled_from(["ack", "release"]), margin_ms=st.sampled_from([-1, 0, 1]))
    def outlive_the_first_hour(self, kind, margin_ms):
        """End the first hour's messages, let time pass to about when
        retention allows retiring it, and checkpoint."""
        hour = self.model.locations()[0].hour
        self._both_update([_change(kind, where, self.model.read_entry(where).retry)
                           for where in self.model.locations() if where.hour == hour])
        self.now_ms = max(self.now_ms, (hour + 1) * MS_PER_HOUR) + RETENTION_MS + margin_ms
        self._checkpoint_both()

    @precondition(lambda self: any(self.model.get(*key) for key in self.keys))
    @rule(data=st.data(), resends=st.integers(1, 3), commit_between=st.booleans())
    def release_and_send_again(self, data, resends, commit_between):
        """A released id is free again, and taken again by the first resend."""
        topic, msg_id = data.draw(st.sampled_from(sorted(k for k in self.keys if self.model.get(*k))), label="key")
        where = self.model.get(topic, msg_id).location
        self._both_update([_change("release", where, 0)])
        if commit_between:
            self._commit_both()
        for i in range(resends):
            self._send_both([(topic, msg_id, f"again {i}", i * 1000, 0, 0, 0, "")])

    @precondition(lambda self: self.model.locations())
    @rule(data=st.data(), bad_retry=st.booleans())
    def update_with_a_bad_change(self, data, bad_retry):
        """One bad change (unknown location, retry out of range) refuses the
        whole batch: nothing changes, not even the pending view."""
        where = data.draw(st.sampled_from(self.model.locations()), label="location")
        bad = (StateChange(where, Status.READY, MAX_RETRY_COUNT + 1) if bad_retry
               else StateChange(Location(where.hour, 10**6), Status.ACKED, 0))
        changes = [StateChange(where, Status.ACKED, 0), bad]
        before = self.store.log_end_offset
        with pytest.raises(InvalidRequest):
            self.store.update(changes, self.now_ms)
        with pytest.raises(InvalidRequest):
            self.model.update(changes, self.now_ms)
        self._appended(before)

    @rule()
    def commit(self):
        self._commit_both()

    def _commit_both(self) -> None:
        assert self.store.commit() == self.model.commit()
        self._committed()

    @rule(delta_ms=TICKS_MS)
    def tick(self, delta_ms):
        self.now_ms += delta_ms

    @rule()
    def checkpoint(self):
        self._checkpoint_both()

    def _checkpoint_both(self) -> None:
        got = self.store.checkpoint(self.now_ms)
        expected = self.model.checkpoint(self.now_ms)
        assert got.hours_retired == expected.hours_retired
        if got.hours_retired:
            event("checkpoint retired hours")
        assert got.commit_offset == self.store.log_end_offset
        self._committed()

    # -- restarts ----------------------------------------------------------------------

    @rule(with_now=st.booleans())
    def reopen(self, with_now):
        self.store.close()
        self.model.close()
        self._reopen(with_now)

    @rule(data=st.data(), mode=st.sampled_from(["keep", "truncate", "zero", "garble"]), with_now=st.booleans())
    def crash(self, data, mode, with_now):
        log = self.store.log
        segment = log._segments[-1]
        end = log.end_offset
        # Only bytes after the last commit may be torn; earlier segments were
        # synced when the log rolled past them.
        low = max(self.committed_end, segment.base_offset)
        cut = end if mode == "keep" else data.draw(st.integers(low, end), label="cut")
        path, cut_pos, end_pos, capacity = segment.path, segment.position(cut), segment.position(end), segment.capacity
        if mode == "zero":
            # Zeroing bytes that were zero changes nothing: if the rest of the
            # record holding the cut was zeros already, that record survives.
            with open(path, "rb") as f:
                f.seek(cut_pos)
                region = f.read(end_pos - cut_pos)
            record_end = min((e for e in self.pending_ends if e >= cut), default=None)
            if record_end is not None and not region[:record_end - cut].strip(b"\0"):
                cut_pos += record_end - cut
                cut = record_end
        del log, segment
        # kill -9: drop the store without closing it; nothing is flushed or committed
        disk_ref, self.store = weakref.ref(self.store.disk), None
        _release_fds(self.directory, disk_ref)
        if mode == "truncate":
            os.truncate(path, cut_pos)
        elif mode in ("zero", "garble"):
            garbage = b""
            if mode == "garble":
                noise = data.draw(st.binary(min_size=1, max_size=64), label="noise")
                with open(path, "rb") as f:
                    f.seek(cut_pos)
                    old = f.read(len(noise))
                # xor with a non-zero byte: every garbled byte really changes
                garbage = bytes(o ^ (n or 0x5A) for o, n in zip(old, noise))
            with open(path, "r+b") as f:
                f.seek(cut_pos)
                f.write(garbage + bytes(max(0, min(end_pos, capacity) - cut_pos - len(garbage))))
        kept = sum(1 for record_end in self.pending_ends if record_end <= cut)
        if self.pending_ends:
            event(f"crash ({mode}) kept {'all' if kept == len(self.pending_ends) else 'some' if kept else 'none'} "
                  f"of the pending records")
        self.model.crash(kept)
        self._reopen(with_now)

    # -- reading -------------------------------------------------------------------

    @precondition(lambda self: self.model.locations(committed=True))
    @rule(data=st.data())
    def read_by_location(self, data):
        where = data.draw(st.sampled_from(self.model.locations(committed=True)), label="location")
        assert self.store.read_entry(where) == self.model.read_entry(where)
        assert self.store.read_message(where) == self.model.read_message(where)

    @invariant()
    def lookups_agree(self):
        for topic, msg_id in sorted(self.keys):
            assert self.store.get(topic, msg_id) == self.model.get(topic, msg_id), (topic, msg_id)

    @invariant()
    def seconds_agree(self):
        for hour, second in sorted(self.seconds):
            assert self.store.read_second(hour, second) == self.model.read_second(hour, second), (hour, second)
        for hour in sorted({hour for hour, _ in self.seconds}):
            assert list(self.store.second_counts(hour)) == list(self.model.second_counts(hour)), hour

    @invariant()
    def hours_agree(self):
        assert self.store.hours() == self.model.hours()
        walked, hour = [], self.store.next_hour(0)
        while hour is not None:
            walked.append(hour)
            hour = self.store.next_hour(hour + 1)
        assert walked == [hour for hour, _, _ in self.model.hours() if not spans.is_span(hour)]
        assert self.store.next_hour(0) == self.model.next_hour(0)

    @invariant()
    def topic_counts_agree(self):
        names = self.store.topic_names()
        assert names == self.model.topic_names()
        for topic_hash in sorted(names):
            assert self.store.topic_hours(topic_hash) == self.model.topic_hours(topic_hash)
            assert self.store.topic_counts(topic_hash) == self.model.topic_counts(topic_hash)
        assert self.store.topic_count() == self.model.topic_count() == len(names)
        every_topic = {topic_hash: self.store.topic_counts(topic_hash) for topic_hash in names}
        assert summed(self.store.hour_topic_counts()) == summed(self.model.hour_topic_counts()) == every_topic
        for hour, _, _ in self.model.hours():
            assert self.store.hour_entries(hour) == self.model.hour_entries(hour), hour

    def __repr__(self) -> str:
        return f"StoreMachine(now_ms={self.now_ms}, {self.store!r}, {self.model!r})"


def summed(hour_topic_counts) -> dict[int, list[int]]:
    """hour_topic_counts summed per topic: each topic's topic_counts."""
    totals: dict[int, list[int]] = {}
    for pairs in hour_topic_counts:
        for topic_hash, counts in pairs:
            before = totals.get(topic_hash, [0] * len(counts))
            totals[topic_hash] = [a + b for a, b in zip(before, counts)]
    return totals


StoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestStoreAgainstModel = StoreMachine.TestCase


# -- corruption of committed bytes is refused, not repaired ------------------------------


@settings(max_examples=25, deadline=None)
@given(victim=st.integers(0, 2), byte=st.integers(0, 10**6), mask=st.integers(1, 255))
def test_corrupt_committed_record_is_refused(victim, byte, mask):
    """A bad record followed by valid ones is not a torn tail: Store.open
    raises CorruptionError instead of truncating committed data."""
    directory = tempfile.mkdtemp(prefix="hourglass-corrupt-", dir=SCRATCH_DIR)
    store = Store.open(directory, CONFIG, now_ms=START_MS)
    spans = []
    for i in range(4):
        start = store.log_end_offset
        store.send([NewMessage("t", f"id{i}", "body" * i, START_MS, START_MS + i * 1000, 0, 0)], START_MS)
        store.commit()
        spans.append((start, store.log_end_offset))
    segment = store.log._segments[-1]
    assert segment.base_offset <= spans[0][0]
    start, end = spans[victim]  # never the last record: valid records follow it
    pos = segment.position(start) + byte % (end - start)
    path = segment.path
    store.close()
    with open(path, "r+b") as f:
        f.seek(pos)
        old = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([old ^ mask]))
    try:
        with pytest.raises(CorruptionError):
            Store.open(directory, CONFIG)
    finally:
        shutil.rmtree(directory)


# -- regressions the machine found, pinned as plain examples -----------------------------


def _both(directory: str) -> tuple[Store, InMemoryStore]:
    return Store.open(directory, CONFIG, now_ms=START_MS), InMemoryStore(CONFIG)


def test_released_id_is_taken_by_the_first_resend_before_commit():
    """Store._find stopped at a released pending copy, so every resend of
    the id in the same commit window was STORED again."""
    directory = tempfile.mkdtemp(prefix="hourglass-resend-", dir=SCRATCH_DIR)
    try:
        for store in _both(directory):
            first = store.send([NewMessage("t", "a", "one", START_MS, START_MS, 0, 0)], START_MS)[0]
            store.update([StateChange(first.message.location, Status.DELETED, 0, released=True)], START_MS)
            again = store.send([NewMessage("t", "a", "two", START_MS, START_MS, 0, 0)] * 2, START_MS)
            assert [r.outcome.value for r in again] == ["stored", "duplicate"]
            assert store.get("t", "a") == again[0].message
            store.commit()
            assert store.get("t", "a") == again[0].message
            assert store.hours()[0][1] == 2
            store.close()
    finally:
        shutil.rmtree(directory)


def test_refused_update_leaves_no_pending_change():
    """Store.update published each change before checking the next; a
    refused batch left its first changes visible but never logged."""
    directory = tempfile.mkdtemp(prefix="hourglass-refused-", dir=SCRATCH_DIR)
    try:
        for store in _both(directory):
            sent = store.send([NewMessage("t", "a", "one", START_MS, START_MS, 0, 0)], START_MS)[0]
            where = sent.message.location
            for bad in (StateChange(Location(where.hour, 99), Status.ACKED, 0),
                        StateChange(where, Status.READY, MAX_RETRY_COUNT + 1)):
                with pytest.raises(InvalidRequest):
                    store.update([StateChange(where, Status.ACKED, 0), bad], START_MS)
                assert store.get("t", "a").status is Status.WAITING
            store.commit()
            assert store.get("t", "a").status is Status.WAITING
            store.close()
    finally:
        shutil.rmtree(directory)
