"""Store.scan_ready and Store.consuming against brute-force models.

scan_ready: messages of three topics are filed into a few hours (some
hours left out), moved through READY / CONSUMING / ACKED / DELETED, part of
those changes committed and part still pending, part of the sends not even
applied; then each topic is scanned from a position with small
`max_scan`/`max_found` (and index slices of a few entries, the first of
them smaller still, each next one twice the last), resuming from
the returned position each time. What the scans return together must be
exactly the topic's READY entries after the position, up to `until_hour`,
in filing order (hour, then globalIndex), none twice.

consuming: the set of CONSUMING messages and their ack deadlines is kept
in the checkpoint; a store reopened after a checkpoint and more pulls,
acks and nacks replayed from the commit log has the set the model has, and
a checkpoint written before the set was kept (no `consuming` key) makes
the store find the CONSUMING entries by a scan at open (deadline unknown:
0) while those pulled after it keep the deadline their record gave.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import zlib
from unittest import mock

import hypothesis.strategies as st
import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import reading
from storage.checkpoint import HEADER, MAGIC, VERSION, Checkpoint, HourRecord
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, Location, Status
from storage.store import NewMessage, StateChange, Store, text_hash

H0 = 490_000
NOW = H0 * MS_PER_HOUR
SCRATCH_DIR = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
CONFIG = StoreConfig(segment_bytes=4096, id_shard_initial_slots=16)
TOPICS = ("orders", "mail", "ü")

# What a message may become from each status, as the broker moves them.
NEXT = {
    Status.WAITING: (Status.READY, Status.ACKED, Status.DELETED),
    Status.READY: (Status.CONSUMING, Status.ACKED, Status.DELETED, Status.EXPIRED),
    Status.CONSUMING: (Status.READY, Status.ACKED, Status.ENDED, Status.DELETED),
}


def _scratch(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=SCRATCH_DIR)


# -- scan_ready -------------------------------------------------------------------------------


@st.composite
def histories(draw):
    """(sends, change batches, unapplied sends): sends as (topic, hour offset,
    status first committed: READY mostly), each change batch a list of (send index, pick) with whether to commit
    after it; picks choose among NEXT of the status the message has then."""
    sends = draw(st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from([0, 1, 3, 4]),
                                    st.sampled_from([Status.READY, Status.READY, Status.WAITING, Status.ACKED])),
                          min_size=1, max_size=40), label="sends")
    batches = draw(st.lists(st.tuples(st.lists(st.tuples(st.integers(0, len(sends) - 1), st.integers(0, 3)),
                                               min_size=1, max_size=12), st.booleans()),
                            max_size=8), label="changes")
    unapplied = draw(st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from([0, 1, 4])), max_size=4),
                     label="unapplied sends")
    return sends, batches, unapplied


def _build(directory: str, sends, batches, unapplied) -> tuple[Store, dict[Location, tuple[str, Status]]]:
    """A store holding the history, and the model: location -> (topic, status)
    with every change, committed or pending."""
    store = Store.open(directory, CONFIG, now_ms=NOW)
    results = store.send([NewMessage(topic, f"m{i}", "x" * (i % 7), NOW, NOW + offset * MS_PER_HOUR + i, 0, 0)
                          for i, (topic, offset, _) in enumerate(sends)], NOW)
    store.commit()
    where = [r.message.location for r in results]
    store.update([StateChange(w, first, 0) for w, (_, _, first) in zip(where, sends) if first is not Status.WAITING],
                 NOW)
    store.commit()
    model = {w: (topic, first) for w, (topic, _, first) in zip(where, sends)}
    for changes, commit_after in batches:
        batch, staged = [], {}
        for index, pick in changes:
            w = where[index]
            topic, status = staged.get(w) or model[w]
            if status >= Status.ACKED:  # final: acked, expired, ended or deleted
                continue
            new = NEXT[status][pick % len(NEXT[status])]
            batch.append(StateChange(w, new, 0, deadline_ms=NOW + 5_000 if new is Status.CONSUMING else 0))
            staged[w] = (topic, new)
        store.update(batch, NOW)
        model.update(staged)
        if commit_after:
            store.commit()
    # sends appended but not applied: WAITING, and not index entries yet
    store.send([NewMessage(topic, f"late{i}", "y", NOW, NOW + offset * MS_PER_HOUR, 0, 0)
                for i, (topic, offset) in enumerate(unapplied)], NOW)
    return store, model


@contextlib.contextmanager
def built(history):
    """_build in a scratch directory, closed and removed after."""
    directory = _scratch("hourglass-scan-")
    store = None
    try:
        store, model = _build(directory, *history)
        yield store, model
    finally:
        if store is not None:
            store.close()
        shutil.rmtree(directory)


def _scan_all(store: Store, topic: str, start: Location, until_hour: int, max_scan: int,
              max_found: int) -> list:
    """Every entry the scans return, resuming where each one stopped."""
    found, position = [], start
    for _ in range(10_000):
        entries, position = store.scan_ready(text_hash(topic), position, until_hour, max_scan, max_found)
        assert len(entries) <= max_found
        found.extend(entries)
        if position is None:
            return found
    raise AssertionError(f"scan_ready made no progress from {position}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), max_scan=st.integers(1, 6), max_found=st.integers(1, 5),
       slice_entries=st.sampled_from([1, 2, 3, 4096]), first_slice=st.sampled_from([1, 2, 64]),
       until=st.sampled_from([0, 1, 3, 4, 9]))
def test_scans_from_the_start_find_every_ready_entry_once_in_filing_order(history, max_scan, max_found,
                                                                          slice_entries, first_slice, until):
    with (built(history) as (store, model), mock.patch.object(reading, "SCAN_SLICE", slice_entries),
          mock.patch.object(reading, "SCAN_FIRST_SLICE", first_slice)):
        for topic in TOPICS:
            found = _scan_all(store, topic, Location(0, 0), H0 + until, max_scan, max_found)
            expected = sorted(w for w, (t, status) in model.items()
                              if t == topic and status is Status.READY and w.hour <= H0 + until)
            assert [e.location for e in found] == expected, topic
            for entry in found:
                assert entry.status is Status.READY and entry.topic_hash == text_hash(topic)
                assert entry == store.read_entry(entry.location)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), start_hour=st.sampled_from([-1, 0, 1, 2, 3, 5]), start_index=st.integers(0, 8),
       max_scan=st.integers(1, 6), max_found=st.integers(1, 5), slice_entries=st.sampled_from([1, 3, 4096]),
       first_slice=st.sampled_from([1, 64]))
def test_a_scan_from_any_position_finds_the_ready_entries_after_it(history, start_hour, start_index, max_scan,
                                                                   max_found, slice_entries, first_slice):
    """The position may lie in an hour the store does not hold (one never
    filed into, or retired since the position was taken): everything
    filed after it is found all the same, from the next hour's first entry."""
    start = Location(H0 + start_hour, start_index)
    with (built(history) as (store, model), mock.patch.object(reading, "SCAN_SLICE", slice_entries),
          mock.patch.object(reading, "SCAN_FIRST_SLICE", first_slice)):
        for topic in TOPICS:
            found = _scan_all(store, topic, start, H0 + 9, max_scan, max_found)
            expected = sorted(w for w, (t, status) in model.items()
                              if t == topic and status is Status.READY and w >= start)
            assert [e.location for e in found] == expected, topic


def test_a_position_in_a_retired_hour_goes_on_from_the_next_hours_first_entry(tmp_path):
    """The broker keeps a spilled topic's scan position for as long as no
    refill runs; if that hour's messages all end and it retires meanwhile,
    the next hour must be read from its first entry, not from the retired
    hour's globalIndex."""
    config = StoreConfig(retention_ms=0)
    store = Store.open(str(tmp_path), config, now_ms=NOW)
    sent = store.send([NewMessage("t", f"a{i}", "x", NOW, NOW, 0, 0) for i in range(4)]
                      + [NewMessage("t", f"b{i}", "x", NOW, NOW + MS_PER_HOUR, 0, 0) for i in range(4)], NOW)
    store.commit()
    first, second = [r.message.location for r in sent[:4]], [r.message.location for r in sent[4:]]
    store.update([StateChange(w, Status.READY, 0) for w in first + second], NOW)
    position = Location(H0, 3)  # a refill took a0..a2 and stopped at a3
    store.update([StateChange(w, Status.ACKED, 0) for w in first], NOW)
    report = store.checkpoint(NOW + 2 * MS_PER_HOUR)
    assert report.hours_retired == (H0,)
    found = _scan_all(store, "t", position, H0 + 9, 100, 100)
    assert [e.location for e in found] == second
    store.close()


# -- the checkpoint's consuming set --------------------------------------------------------------


def _legacy_bytes(ck: Checkpoint) -> bytes:
    """`ck` as a checkpoint written before the consuming set was kept: the
    same map without the key."""
    body = msgpack.packb({
        "commit_offset": ck.commit_offset,
        "hours": [[h.hour, h.entries, h.log_bytes, h.ended, h.last_end_ms, h.topics] for h in ck.hours],
        "written_ms": ck.written_ms,
        "topic_names": ck.topic_names,
    })
    return HEADER.pack(MAGIC, VERSION, 0, len(body), zlib.crc32(body)) + body


def _write_legacy(path: str) -> None:
    """Rewrite the checkpoint file at `path` in the old format."""
    old = _legacy_bytes(Checkpoint.load(path))
    with open(path, "wb") as f:
        f.write(old)


u63 = st.integers(0, 2**63 - 1)
consuming_sets = st.lists(st.tuples(st.integers(0, 2**24 - 1), st.integers(0, 2**32 - 1), u63,
                                    st.integers(0, 2**64 - 1)), max_size=30).map(tuple)
checkpoints = st.builds(
    Checkpoint, commit_offset=st.integers(0, 2**64 - 1),
    hours=st.lists(st.builds(HourRecord, hour=st.integers(0, 2**24 - 1), entries=st.integers(0, 2**32 - 1),
                             log_bytes=u63, ended=st.integers(0, 2**32 - 1), last_end_ms=u63,
                             topics=st.dictionaries(st.integers(1, 2**32 - 1),
                                                    st.lists(st.integers(0, 2**32 - 1), min_size=7, max_size=7),
                                                    max_size=3)),
                   max_size=5).map(tuple),
    written_ms=u63, topic_names=st.dictionaries(st.integers(1, 2**32 - 1), st.text(max_size=8), max_size=3),
    consuming=consuming_sets)


@settings(max_examples=100, deadline=None)
@given(checkpoints)
def test_checkpoint_round_trips_with_its_consuming_set(ck):
    assert Checkpoint.decode("ck", ck.encode()) == ck


@settings(max_examples=50, deadline=None)
@given(checkpoints)
def test_a_checkpoint_without_the_consuming_key_decodes_to_unknown(ck):
    decoded = Checkpoint.decode("ck", _legacy_bytes(ck))
    assert decoded.consuming is None
    assert decoded == Checkpoint(ck.commit_offset, ck.hours, ck.written_ms, ck.topic_names, None, layout=1)


class ConsumingMachine(RuleBasedStateMachine):
    """A store driven as the broker drives it (release, pull with a
    deadline, ack, nack, end), with commits, checkpoints -- some written in
    the old format, without the consuming set -- and reopens. The model:
    every message's status, and for the CONSUMING ones the deadline the
    store can know (the record's, or 0 when only an old checkpoint's scan
    found it)."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = _scratch("hourglass-consuming-")
        self.now_ms = NOW
        self.store = Store.open(self.directory, CONFIG, now_ms=self.now_ms)
        self.status: dict[Location, Status] = {}  # committed
        self.deadline: dict[Location, int] = {}  # committed CONSUMING -> deadline the store knows
        self.pending: list[tuple[Location, Status, int]] = []  # changes appended, not committed
        self.since_checkpoint: set[Location] = set()  # made CONSUMING by a record after the last checkpoint
        self.legacy_checkpoint = False  # the last checkpoint lacks the consuming key
        self.sent = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _now_status(self, where: Location) -> Status:
        for w, status, _ in reversed(self.pending):
            if w == where:
                return status
        return self.status[where]

    def _in(self, *statuses: Status) -> list[Location]:
        return sorted(w for w in self.status if self._now_status(w) in statuses)

    def _change(self, changes: list[tuple[Location, Status, int]]) -> None:
        self.store.update([StateChange(w, s, 1, deadline_ms=d, delivery=d * 3 + 1 if d else 0) for w, s, d in changes],
                          self.now_ms)
        self.pending.extend(changes)

    def _committed(self) -> None:
        for where, status, deadline in self.pending:
            self.status[where] = status
            if status is Status.CONSUMING:
                self.deadline[where] = deadline
                self.since_checkpoint.add(where)
            else:
                self.deadline.pop(where, None)
        self.pending = []

    @rule(n=st.integers(1, 5), hours_ahead=st.integers(0, 2))
    def send(self, n, hours_ahead):
        results = self.store.send([NewMessage("t" if i % 2 else "u", f"m{self.sent + i}", "x", self.now_ms,
                                              self.now_ms + hours_ahead * MS_PER_HOUR, 0, 3) for i in range(n)],
                                  self.now_ms)
        self.sent += n
        self.store.commit()
        self._committed()
        for r in results:
            self.status[r.message.location] = Status.WAITING

    @precondition(lambda self: self._in(Status.WAITING))
    @rule(data=st.data())
    def release(self, data):
        picked = data.draw(st.lists(st.sampled_from(self._in(Status.WAITING)), min_size=1, max_size=4, unique=True))
        self._change([(w, Status.READY, 0) for w in picked])

    @precondition(lambda self: self._in(Status.READY))
    @rule(data=st.data(), timeout_ms=st.integers(1, 60_000))
    def pull(self, data, timeout_ms):
        picked = data.draw(st.lists(st.sampled_from(self._in(Status.READY)), min_size=1, max_size=4, unique=True))
        self._change([(w, Status.CONSUMING, self.now_ms + timeout_ms + i) for i, w in enumerate(picked)])

    @precondition(lambda self: self._in(Status.CONSUMING))
    @rule(data=st.data(), to=st.sampled_from([Status.ACKED, Status.READY, Status.ENDED, Status.DELETED]))
    def finish(self, data, to):
        """ack, nack (back to READY), ack timeout past the last retry, delete."""
        picked = data.draw(st.lists(st.sampled_from(self._in(Status.CONSUMING)), min_size=1, max_size=3,
                                    unique=True))
        self._change([(w, to, 0) for w in picked])

    @rule(ms=st.integers(1, 10_000))
    def tick(self, ms):
        self.now_ms += ms

    @rule()
    def commit(self):
        self.store.commit()
        self._committed()

    @rule(legacy=st.booleans())
    def checkpoint(self, legacy):
        """A checkpoint; `legacy`: rewritten as an older version wrote it."""
        self.store.checkpoint(self.now_ms)
        self._committed()
        path = os.path.join(self.directory, "checkpoint")
        if legacy:
            _write_legacy(path)
        self.legacy_checkpoint = legacy
        self.since_checkpoint = set()

    @rule()
    def reopen(self):
        self.store.close()
        self._committed()
        self.store = Store.open(self.directory, CONFIG, now_ms=self.now_ms)
        if self.legacy_checkpoint:  # found by the scan at open: deadline unknown
            for where in self.deadline:
                if where not in self.since_checkpoint:
                    self.deadline[where] = 0

    @invariant()
    def consuming_agrees(self):
        # (the delivery each change to CONSUMING gave, as `_change` made it; 0 where the deadline is unknown)
        assert self.store.consuming() == {w: (d, d * 3 + 1 if d else 0) for w, d in self.deadline.items()}
        for where, deadline in self.deadline.items():
            assert self.store.ack_deadline(where) == (deadline or None)
            assert self.store.read_entry(where).status is Status.CONSUMING or any(
                w == where for w, _, _ in self.pending)


ConsumingMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
TestConsumingAgainstModel = ConsumingMachine.TestCase


def test_an_old_checkpoint_makes_the_store_find_consuming_entries_by_scan(tmp_path):
    """Example of the machine's legacy path: CONSUMING at the old-format
    checkpoint -> found by the scan (deadline 0, ack_deadline None); pulled
    after it -> its record's deadline; acked after it -> gone."""
    store = Store.open(str(tmp_path), CONFIG, now_ms=NOW)
    sent = store.send([NewMessage("t", f"m{i}", "x", NOW, NOW, 0, 3) for i in range(4)], NOW)
    store.commit()
    a, b, c, d = (r.message.location for r in sent)
    store.update([StateChange(w, Status.READY, 0) for w in (a, b, c, d)], NOW)
    store.update([StateChange(w, Status.CONSUMING, 1, deadline_ms=NOW + 1_000) for w in (a, b)], NOW)
    store.checkpoint(NOW)
    path = os.path.join(str(tmp_path), "checkpoint")
    assert Checkpoint.load(path).consuming == ((H0, 0, NOW + 1_000, 0), (H0, 1, NOW + 1_000, 0))
    _write_legacy(path)
    store.update([StateChange(b, Status.ACKED, 1), StateChange(c, Status.CONSUMING, 1, deadline_ms=NOW + 7_000)],
                 NOW)
    store.close()
    store = Store.open(str(tmp_path), CONFIG, now_ms=NOW)
    assert store.consuming() == {a: (0, 0), c: (NOW + 7_000, 0)}
    assert store.ack_deadline(a) is None and store.ack_deadline(c) == NOW + 7_000
    store.checkpoint(NOW)  # written in today's format: the scan is not needed again
    assert sorted(Checkpoint.load(path).consuming) == [(H0, 0, 0, 0), (H0, 2, NOW + 7_000, 0)]
    store.close()
