"""After a restart every ready message is on disk (the window starts empty,
refilled in filing order): the first pull must still pick by priority among
all of a topic's ready messages that fit its window, even when it comes
before the background refill has run. (A CI run of the HTTP model caught a
pull that took the first message filed instead.)"""

from __future__ import annotations

import asyncio
import os

from fakes import FakeClock

from broker.core.params import Defaults, NewSend, PullRequest
from broker.disk.backend import Broker
from broker.disk.ready import QueueLimits
from broker.observe.metrics import Metrics
from storage.config import StoreConfig
from storage.store import NewMessage, Store

START_MS = 490_000 * 3_600_000 + 1_000


def open_broker(directory: str, clock: FakeClock, limits: QueueLimits) -> tuple[Store, Broker]:
    store = Store.open(directory, StoreConfig(), now_ms=clock.now_ms())
    return store, Broker(store, clock, Defaults(), Metrics(), tick_path=os.path.join(directory, "tick"),
                         limits=limits)


async def fill(directory: str, clock: FakeClock, limits: QueueLimits, sends: list[NewSend]) -> None:
    """Send them due now on a running broker, stop it, close the store."""
    store, broker = open_broker(directory, clock, limits)
    broker.start()
    await broker.send(sends)
    await broker.stop()
    store.checkpoint(clock.now_ms())
    store.close()


def test_the_first_pull_after_a_restart_picks_by_priority(tmp_path):
    directory = str(tmp_path)
    clock = FakeClock(START_MS)
    limits = QueueLimits(window=8, window_total=8)

    async def body() -> list[str]:
        # filed first: low priorities; filed last: the highest
        await fill(directory, clock, limits, [NewSend(NewMessage("t", f"p{p}", "x", START_MS, START_MS,
                                                                 3_600_000, 3, priority=p), False)
                                              for p in (1, 2, 3, 9, 4)])
        store, broker = open_broker(directory, clock, limits)  # restarted; not started: no refill has run
        assert broker.window_total == 0 and broker.topics["t"].spilled
        got = [m.msg_id for m in await broker.pull(PullRequest("t", 60_000, 1, ()))]
        got += [m.msg_id for m in await broker.pull(PullRequest("t", 60_000, 4, ()))]
        store.close()
        return got

    assert asyncio.run(body()) == ["p9", "p4", "p3", "p2", "p1"]


def test_a_backlog_beyond_the_window_comes_out_whole_and_once(tmp_path):
    """Twenty ready messages, a window of four: after a restart they all come
    out, each once, every pull ordered by priority among what it saw."""
    directory = str(tmp_path)
    clock = FakeClock(START_MS)
    limits = QueueLimits(window=4, window_total=4)

    async def body() -> list[str]:
        await fill(directory, clock, limits, [NewSend(NewMessage("t", f"m{i:02d}", "x", START_MS, START_MS,
                                                                 3_600_000, 3, priority=i % 3), False)
                                              for i in range(20)])
        store, broker = open_broker(directory, clock, limits)
        got = []
        while batch := await broker.pull(PullRequest("t", 60_000, 3, ())):
            assert [m.priority for m in batch] == sorted((m.priority for m in batch), reverse=True)
            got += [m.msg_id for m in batch]
        store.close()
        return got

    got = asyncio.run(body())
    assert sorted(got) == [f"m{i:02d}" for i in range(20)] and len(set(got)) == 20


def test_a_send_after_a_restart_does_not_jump_older_better_messages(tmp_path):
    """After a restart, older ready messages wait on disk; a new due-now
    message of lower priority goes straight into the window. A pull must
    still take the older, better one first. (A CI run of the HTTP model
    caught the new one served first.)"""
    directory = str(tmp_path)
    clock = FakeClock(START_MS)
    limits = QueueLimits(window=8, window_total=8)

    async def body() -> list[str]:
        await fill(directory, clock, limits, [NewSend(NewMessage("t", "old", "x", START_MS, START_MS, 3_600_000, 3,
                                                                 priority=7), False)])
        store, broker = open_broker(directory, clock, limits)
        broker.start()
        await broker.send([NewSend(NewMessage("t", "new", "x", START_MS, START_MS, 3_600_000, 3, priority=0),
                                   False)])
        got = [m.msg_id for m in await broker.pull(PullRequest("t", 60_000, 1, ()))]
        got += [m.msg_id for m in await broker.pull(PullRequest("t", 60_000, 1, ()))]
        await broker.stop()
        store.close()
        return got

    assert asyncio.run(body()) == ["old", "new"]
