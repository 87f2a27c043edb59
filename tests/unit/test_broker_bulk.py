"""broker.disk.bulk on a real Store and a FakeClock (tests/broker_harness.py):
what a bulk call reads, counted (the model test, test_broker_bulk_model.py,
checks the outcomes of random calls; this one the reads and one race at a
time).

- A slice re-reads the state of its matches only in files another
  request changed since the gather read them -- never because of the
  call's own PART records -- and takes each as it now is.
- The calls of a delete-all each scan from where the last stopped (the
  scan floors), so none passes what the calls before it deleted; a
  message sent below a floor meanwhile is found all the same.
- Floors are kept only for statuses no message enters in place
  (`IN_PLACE`, checked here against the lifecycle's table): a READY
  delete's next call finds a message released below where it stopped.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from broker_harness import BrokerHarness

import broker.disk.bulk
import storage.reading
from broker.core import transitions
from broker.core.bulk_params import LIVE, BulkFilter, DeleteMsgsRequest, ListMsgRequest
from broker.core.params import Defaults, DeleteRequest, NewSend
from broker.disk.bulk import IN_PLACE, resumable
from broker.disk.ready import QueueLimits
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage

START_MS = 490_000 * MS_PER_HOUR + 1_000
TOPIC = "t"
WAITING, READY, DELETED = Status.WAITING, Status.READY, Status.DELETED


@pytest.fixture
def h():
    h = BrokerHarness("hourglass-bulk-", START_MS, QueueLimits(), Defaults())
    h.open_broker()
    try:
        yield h
    finally:
        h.teardown()


def _send(h: BrokerHarness, prefix: str, count: int, delay_ms: int) -> None:
    now = h.clock.now_ms()

    async def send():
        await h.broker.send([NewSend(NewMessage(TOPIC, f"{prefix}{i}", "m", now, now + delay_ms, MS_PER_HOUR * 9, 3), False)
                             for i in range(count)])
        await h.quiesce()
    h.run(send())


def _status(h: BrokerHarness, msg_id: str) -> Status:
    return h.run(h.broker.get(TOPIC, msg_id)).status


class _Counted:
    """The store as the bulk calls see it, counting their calls of `names`
    (a wrapper Bulk is handed in the store's stead: the compiled Store's
    methods cannot be replaced)."""

    def __init__(self, store, names: tuple[str, ...]) -> None:
        self._store = store
        self._names = names
        self.calls = {name: 0 for name in names}

    def __getattr__(self, name: str):
        found = getattr(self._store, name)
        if name not in self._names:
            return found

        def counted(*args):
            self.calls[name] += 1
            return found(*args)
        return counted


def _count(h: BrokerHarness, monkeypatch, *names: str) -> _Counted:
    counted = _Counted(h.store, names)
    monkeypatch.setattr(h.broker._bulk, "_store", counted)
    return counted


def test_a_sliced_delete_reads_no_state_again_that_only_its_own_parts_changed(h, monkeypatch):
    monkeypatch.setattr(broker.disk.bulk, "DELETE_SLICE", 4)
    _send(h, "r", 8, 0)  # READY, in the hour of now
    _send(h, "w", 8, 2 * MS_PER_HOUR)  # WAITING, two hours on
    counted = _count(h, monkeypatch, "live_state")
    deleted, more = h.run(h.broker.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), 100)))
    assert (deleted, more) == (16, False)
    assert h.broker._bulk.slices == 4
    assert counted.calls["live_state"] == 0
    assert all(_status(h, f"{p}{i}") is DELETED for p in "rw" for i in range(8))


def test_a_change_between_the_slices_has_its_file_read_again_and_the_delete_takes_it_as_it_is(h, monkeypatch):
    """Between the first slice and the second, a deleteMsg and a reschedule
    land on two messages of the second slice (in the hour of now): the
    second slice reads its four again (one deleted already, one moved
    away: neither changed twice), the slices in the other file none."""
    monkeypatch.setattr(broker.disk.bulk, "DELETE_SLICE", 4)
    _send(h, "r", 8, 0)
    _send(h, "w", 8, 2 * MS_PER_HOUR)
    b = h.broker
    between = asyncio.Event()  # the delete has appended its first slice and yields
    go_on = asyncio.Event()

    async def first_yield_waits(_: float) -> None:
        if not between.is_set():
            between.set()
            await go_on.wait()
    monkeypatch.setattr(broker.disk.bulk, "asyncio", SimpleNamespace(sleep=first_yield_waits))

    async def meanwhile():
        await between.wait()
        assert b._bulk.slices == 1
        await b.delete(DeleteRequest(TOPIC, "r6", False))
        await b.reschedule(TOPIC, "r7", START_MS + 3 * MS_PER_HOUR)
        go_on.set()

    async def both():
        return await asyncio.gather(b.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), 100)), meanwhile())

    counted = _count(h, monkeypatch, "live_state")
    (deleted, more), _ = h.run(both())
    h.run(h.quiesce())
    assert (deleted, more) == (14, False)
    assert counted.calls["live_state"] == 4  # r4..r7, in the file the two requests changed; w0..w7 not
    assert all(_status(h, msg_id) is DELETED for msg_id in [f"r{i}" for i in range(7)] + [f"w{i}" for i in range(8)])
    moved = h.run(b.get(TOPIC, "r7"))
    assert (moved.status, moved.trigger_ms) == (WAITING, START_MS + 3 * MS_PER_HOUR)


def test_the_calls_of_a_delete_all_each_scan_on_from_where_the_last_stopped(h, monkeypatch):
    """Calls of 16 over 80 messages in two files, scanned 8 entries a
    slice: every call reads three slices (16 matches and the one that
    says more remain), however many the calls before it deleted. A
    message sent between two calls to the first file, below where they
    stopped, is deleted by a later call."""
    monkeypatch.setattr(broker.disk.bulk, "BULK_SCAN", 8)
    monkeypatch.setattr(storage.reading, "SCAN_SLICE", 8)  # (entries read at once: a slice stops at 8 read)
    monkeypatch.setattr(broker.disk.bulk, "DELETE_SLICE", 4)
    _send(h, "r", 40, 0)
    _send(h, "w", 40, 2 * MS_PER_HOUR)
    counted = _count(h, monkeypatch, "scan_matches")
    calls = []
    more = True
    while more:
        counted.calls["scan_matches"] = 0
        deleted, more = h.run(h.broker.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), 16)))
        calls.append((deleted, counted.calls["scan_matches"]))
        if len(calls) == 2:
            _send(h, "late", 1, 0)  # the first file, whose first 32 entries the calls have deleted
    assert calls == [(16, 3)] * 5 + [(1, 1)]
    assert all(_status(h, msg_id) is DELETED for msg_id in
               [f"r{i}" for i in range(40)] + [f"w{i}" for i in range(40)] + ["late0"])
    counted.calls["scan_matches"] = 0
    assert h.run(h.broker.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), 16))) == (0, False)
    assert counted.calls["scan_matches"] == 1  # every file read past its end: one slice, of nothing


def test_a_ready_delete_finds_next_call_a_message_released_below_where_it_stopped(h, monkeypatch):
    """A message enters READY in place (released): a delete of READY ones
    keeps no floors, and its next call finds the one released meanwhile
    at an entry before its last match."""
    monkeypatch.setattr(broker.disk.bulk, "BULK_SCAN", 4)
    _send(h, "w", 1, 1_000)  # entry 0 of the hour: due in a second
    _send(h, "r", 10, 0)  # entries 1..10, READY
    ready = BulkFilter(statuses=frozenset({READY}))
    assert h.run(h.broker.delete_msgs(DeleteMsgsRequest(TOPIC, ready, 5))) == (5, True)
    h.advance_to(START_MS + 1_000)
    assert _status(h, "w0") is READY
    assert h.run(h.broker.delete_msgs(DeleteMsgsRequest(TOPIC, ready, 100))) == (6, False)
    assert _status(h, "w0") is DELETED


def _events(now: int) -> dict[type, list]:
    """Events of every kind the lifecycle's table has, some of each way they may fall."""
    sent = transitions.MessageState(WAITING, 0, 3, now, MS_PER_HOUR)
    return {
        transitions.Send: [transitions.Send(sent), transitions.Send(sent, strict=True)],
        transitions.Release: [transitions.RELEASE],
        transitions.Pull: [transitions.Pull(now + 30_000, 1)],
        transitions.Ack: [transitions.ACK, transitions.Ack(1)],
        transitions.Nack: [transitions.NACK, transitions.Nack(1)],
        transitions.Extend: [transitions.Extend(now + 30_000, 1, MS_PER_HOUR)],
        transitions.AckTimeout: [transitions.AckTimeout(0), transitions.AckTimeout(now)],
        transitions.Ttl: [transitions.TTL],
        transitions.Delete: [transitions.Delete(), transitions.Delete(release=True)],
        transitions.Reschedule: [transitions.Reschedule(now - 1), transitions.Reschedule(now + MS_PER_HOUR)],
        transitions.Redrive: [transitions.REDRIVE],
        transitions.RetryAt: [transitions.RetryAt(now - 1), transitions.RetryAt(now + MS_PER_HOUR)],
        transitions.GiveBack: [transitions.GIVE_BACK],
        transitions.EndPaused: [transitions.END_PAUSED],
    }


def test_every_status_change_the_lifecycle_makes_at_a_messages_entry_is_in_in_place():
    """IN_PLACE is what `resumable` trusts: every step that changes a
    message's status without filing it anew (MOVE, or a send's REPLACE:
    a new entry) is listed in it."""
    now = START_MS
    events = _events(now)
    assert set(events) == set(transitions.TABLE)
    made = set()
    for status in Status:
        for retry in (0, 1, 4):
            for trigger_ms, ttl_ms in ((now - 10, 5), (now - 10, MS_PER_HOUR), (now + 10, MS_PER_HOUR)):
                for deadline_ms in (0, now):
                    state = transitions.MessageState(status, retry, 3, trigger_ms, ttl_ms, deadline_ms,
                                                     1 if status is Status.CONSUMING else 0)
                    for event in (e for es in events.values() for e in es):
                        done = transitions.step(state, event, now)
                        moved = transitions.Effect.MOVE in done.effects or transitions.Effect.REPLACE in done.effects
                        if done.state is not None and not moved and done.state.status is not status:
                            made.add((status, done.state.status))
    assert made == IN_PLACE
    assert resumable(LIVE) and resumable(frozenset({WAITING}))
    assert not resumable(frozenset({READY})) and not resumable(frozenset({WAITING, READY}))


# -- a hot key: its places read a slice a turn, its first page bounded -----------------------------------


class _Reads:
    """The store's reader as the store sees it, counting the entries and
    messages read (a bulk call by key reads through it), and the reads of
    each turn of the loop that broker.disk.bulk lets through."""

    def __init__(self, reader) -> None:
        self._reader = reader
        self.reads = 0
        self.turns: list[int] = []  # reads between two turns

    def __getattr__(self, name: str):
        found = getattr(self._reader, name)
        if name not in ("read_message", "live_entry"):
            return found

        def counted(where):
            self.reads += 1
            return found(where)
        return counted

    async def sleep(self, delay: float) -> None:
        self.turns.append(self.reads - sum(self.turns))
        await asyncio.sleep(delay)

    def per_turn(self) -> list[int]:
        return [*self.turns, self.reads - sum(self.turns)]


def _reads(h: BrokerHarness, monkeypatch) -> _Reads:
    reads = _Reads(h.store._reader)
    try:
        monkeypatch.setattr(h.store, "_reader", reads)
    except TypeError:  # (a compiled Store's attribute takes a Reader only)
        pytest.skip("the compiled build's Store takes no counting reader: the reads are counted on the sources "
                    "(the same code, interpreted)")
    monkeypatch.setattr(broker.disk.bulk, "asyncio", SimpleNamespace(sleep=reads.sleep))
    return reads


def _send_hot_key(h: BrokerHarness, batches: int, per_batch: int) -> None:
    """`batches` batches of `per_batch` sends under key "hot", 20 ms of
    trigger time apart, all half an hour ahead in the hour of now: one
    part of the key index (as 100 batches due now of one busy sender)."""
    now = h.clock.now_ms()

    async def send():
        for b in range(batches):
            trigger = now + MS_PER_HOUR // 2 + b * 20
            await h.broker.send([NewSend(NewMessage(TOPIC, f"h{b:03d}-{i:04d}", "m", now, trigger, MS_PER_HOUR * 9, 3,
                                                    key="hot"), False) for i in range(per_batch)])
        await h.quiesce()
    h.run(send())


@pytest.mark.sources("counts the store's reads by handing it a counting reader, which a compiled Store's "
                     "attribute refuses (it takes a Reader only)")
def test_a_hot_keys_places_are_read_a_bounded_slice_a_turn_of_the_loop(h, monkeypatch):
    """3,000 messages of one key in one part: a count, a page of all of
    them and a delete by the key each read at most KEY_SLICE entries or
    messages between two turns of the loop, however many the key holds."""
    monkeypatch.setattr(broker.disk.bulk, "KEY_SLICE", 256, raising=False)
    _send_hot_key(h, 15, 200)
    hot = BulkFilter(key="hot")
    reads = _reads(h, monkeypatch)
    assert h.run(h.broker.count_msgs(TOPIC, hot)) == 3_000
    assert max(reads.per_turn()) <= 256, reads.per_turn()

    reads = _reads(h, monkeypatch)
    page, _ = h.run(h.broker.list_msgs(ListMsgRequest(TOPIC, hot, None, 1_000, False)))
    assert len(page) == 1_000
    assert max(reads.per_turn()) <= 2 * 256, reads.per_turn()  # an entry and the message it holds

    reads = _reads(h, monkeypatch)
    assert h.run(h.broker.delete_msgs(DeleteMsgsRequest(TOPIC, hot, 100_000))) == (3_000, False)
    assert max(reads.per_turn()) <= 256, reads.per_turn()


@pytest.mark.sources("counts the store's reads by handing it a counting reader, which a compiled Store's "
                     "attribute refuses (it takes a Reader only)")
@pytest.mark.parametrize("batches", [10, 100])
def test_the_first_page_by_a_hot_key_reads_the_same_whatever_the_keys_size(h, monkeypatch, batches):
    """A first page of one by a key of 10 or 100 batches of 200 in one part
    reads its first batch (its entries, and the messages that could enter
    the page): the same count for 2,000 messages as for 20,000."""
    _send_hot_key(h, batches, 200)
    reads = _reads(h, monkeypatch)
    page, cursor = h.run(h.broker.list_msgs(ListMsgRequest(TOPIC, BulkFilter(key="hot"), None, 1, False)))
    assert [m.msg_id for m in page] == ["h000-0000"] and cursor is not None
    assert reads.reads <= 2 * 200, reads.reads
