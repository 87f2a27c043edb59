"""A running broker delivers far-future messages on time after they have
moved from span to span (storage.spans): the clock (a FakeClock) runs
through months, the span mover and the wheel wake only when there is work,
and each message is pulled once, at its trigger time, never before. Across
a stop that outlasts a span's due point, the restarted broker moves the
overdue messages and delivers them at once.
"""

from __future__ import annotations

import asyncio
import os

from fakes import FakeClock

from broker.core.params import Defaults, NewSend, PullRequest
from broker.disk.backend import Broker
from broker.observe.metrics import Metrics
from storage import spans
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR
from storage.store import NewMessage, Store

START_MS = 500_000 * MS_PER_HOUR + 123_456
HOURS = (1, 40, 100, 777, 5_000, 24 * 365 * 3)


def open_broker(directory: str, clock: FakeClock) -> tuple[Store, Broker]:
    store = Store.open(directory, StoreConfig(), now_ms=clock.now_ms())
    broker = Broker(store, clock, Defaults(), Metrics(), tick_path=os.path.join(directory, "tick"))
    broker.start()
    return store, broker


def far_sends(ttl_ms: int = 3_600_000) -> list[NewSend]:
    return [NewSend(NewMessage("t", f"h{h}", f"due in {h} h", START_MS, START_MS + h * MS_PER_HOUR + 17,
                               ttl_ms, 3), False) for h in HOURS]


async def pull_all(broker: Broker) -> list[str]:
    return [m.msg_id for m in await broker.pull(PullRequest("t", 60_000, 100, ()))]


def test_far_messages_arrive_on_time_after_moving_between_spans(tmp_path):
    directory = str(tmp_path)
    clock = FakeClock(START_MS)

    async def body() -> list[tuple[str, int]]:
        clock.watch_threads()  # a slow fsync runs in a thread: no jump while it does
        store, broker = open_broker(directory, clock)
        sent = await broker.send(far_sends())
        assert [spans.is_span(m.location.hour) for m in sent] == [h >= 40 for h in HOURS]
        got = []
        for h in HOURS:
            due = START_MS + h * MS_PER_HOUR + 17
            await clock.run_until(due - 1)
            assert await pull_all(broker) == [], f"h{h} early"
            await clock.run_until(due)
            await clock.settle()  # the release, and the commit (its fsync in a thread) that makes it ready
            ids = await pull_all(broker)
            got += [(i, clock.now_ms() - due) for i in ids]
        await broker.stop()
        store.close()
        return got

    got = asyncio.run(body())
    assert [i for i, _ in got] == [f"h{h}" for h in HOURS]
    assert all(late == 0 for _, late in got)


def test_overdue_span_messages_are_delivered_after_a_restart(tmp_path):
    directory = str(tmp_path)
    clock = FakeClock(START_MS)

    async def body() -> list[str]:
        clock.watch_threads()
        store, broker = open_broker(directory, clock)
        await broker.send(far_sends(ttl_ms=90 * 24 * MS_PER_HOUR))  # (so they outlive the outage)
        await broker.stop()
        store.checkpoint(clock.now_ms())
        store.close()
        clock.set(START_MS + 800 * MS_PER_HOUR)  # down for a month: the 777 h one is overdue
        store, broker = open_broker(directory, clock)
        await clock.settle()
        ids = await pull_all(broker)
        left = {h for h, _, _ in store.hours() if spans.is_span(h)}
        await broker.stop()
        store.close()
        assert len(left) >= 1  # the 5,000 h and 3-year ones still wait in spans
        return ids

    assert asyncio.run(body()) == ["h1", "h40", "h100", "h777"]
