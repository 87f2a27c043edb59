"""broker.bulk on a real Store and a FakeClock (tests/broker_harness.py):
what a sliced bulk call reads again, counted. A slice re-reads the state
of its matches only in files another request changed since the gather
read them -- never because of the call's own PART records -- and takes
each as it now is (the model test, test_broker_bulk_model.py, checks the
outcomes of random calls; this one the reads and one race at a time)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from broker_harness import BrokerHarness

import broker.bulk
from broker.bulk_params import BulkFilter, DeleteMsgsRequest
from broker.params import Defaults, DeleteRequest, NewSend
from broker.ready import QueueLimits
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


class _CountingStore:
    """The broker's store as the bulk calls reach it, their `live_state`
    reads counted (a compiled Store's methods cannot be replaced)."""

    def __init__(self, store, reads: list[int]) -> None:
        self._store = store
        self._reads = reads

    def live_state(self, where):
        self._reads[0] += 1
        return self._store.live_state(where)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def _count_state_reads(h: BrokerHarness, monkeypatch) -> list[int]:
    reads = [0]
    monkeypatch.setattr(h.broker._bulk, "_store", _CountingStore(h.store, reads))
    return reads


def test_a_sliced_delete_reads_no_state_again_that_only_its_own_parts_changed(h, monkeypatch):
    monkeypatch.setattr(broker.bulk, "DELETE_SLICE", 4)
    _send(h, "r", 8, 0)  # READY, in the hour of now
    _send(h, "w", 8, 2 * MS_PER_HOUR)  # WAITING, two hours on
    reads = _count_state_reads(h, monkeypatch)
    deleted, more = h.run(h.broker.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), 100)))
    assert (deleted, more) == (16, False)
    assert h.broker._bulk.slices == 4
    assert reads[0] == 0
    assert all(_status(h, f"{p}{i}") is DELETED for p in "rw" for i in range(8))


def test_a_change_between_the_slices_has_its_file_read_again_and_the_delete_takes_it_as_it_is(h, monkeypatch):
    """Between the first slice and the second, a deleteMsg and a reschedule
    land on two messages of the second slice (in the hour of now): the
    second slice reads its four again (one deleted already, one moved
    away: neither changed twice), the slices in the other file none."""
    monkeypatch.setattr(broker.bulk, "DELETE_SLICE", 4)
    _send(h, "r", 8, 0)
    _send(h, "w", 8, 2 * MS_PER_HOUR)
    b = h.broker
    between = asyncio.Event()  # the delete has appended its first slice and yields
    go_on = asyncio.Event()

    async def first_yield_waits(_: float) -> None:
        if not between.is_set():
            between.set()
            await go_on.wait()
    monkeypatch.setattr(broker.bulk, "asyncio", SimpleNamespace(sleep=first_yield_waits))

    async def meanwhile():
        await between.wait()
        assert b._bulk.slices == 1
        await b.delete(DeleteRequest(TOPIC, "r6", False))
        await b.reschedule(TOPIC, "r7", START_MS + 3 * MS_PER_HOUR)
        go_on.set()

    async def both():
        return await asyncio.gather(b.delete_msgs(DeleteMsgsRequest(TOPIC, BulkFilter(), 100)), meanwhile())

    reads = _count_state_reads(h, monkeypatch)
    (deleted, more), _ = h.run(both())
    h.run(h.quiesce())
    assert (deleted, more) == (14, False)
    assert reads[0] == 4  # r4..r7, in the file the two requests changed; w0..w7 not
    assert all(_status(h, msg_id) is DELETED for msg_id in [f"r{i}" for i in range(7)] + [f"w{i}" for i in range(8)])
    moved = h.run(b.get(TOPIC, "r7"))
    assert (moved.status, moved.trigger_ms) == (WAITING, START_MS + 3 * MS_PER_HOUR)
