"""A large deleteMsgs yields (docs/api.md, "Bulk calls"): past DELETE_SLICE
matches it appends one PART record a slice, the event loop free between
them, and the COMMIT record last (storage.records), so other requests are
served during the call -- counted here, not timed -- and the call stays
whole across a SIGKILL of a real `hourglass serve` at any moment of it.
A large rescheduleMsgs the same: past MOVE_SLICE matches it appends an
INTENT naming them all, a MOVE record a slice and DONE last; a node that
starts to serve carries out an INTENT whose DONE never came.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from array import array

import pytest
from serving import Server

from broker.clock import SystemClock
from broker.core.bulk_params import BulkFilter, DeleteMsgsRequest, RescheduleMsgsRequest
from broker.core.params import AckRequest, Defaults, PullRequest
from broker.disk.backend import Broker
from broker.disk.bulk import DELETE_SLICE, MOVE_SLICE
from broker.observe.metrics import Metrics
from storage.config import StoreConfig
from storage.store import NewMessage, Store

HOUR_MS = 3_600_000


def _open(tmp_path) -> tuple[SystemClock, Store, Broker]:
    """A started broker over a store in tmp_path (the one it had, reopened)."""
    clock = SystemClock()
    store = Store.open(str(tmp_path / "data"), StoreConfig(), now_ms=clock.now_ms())
    broker = Broker(store, clock, Defaults(), Metrics(), tick_path=str(tmp_path / "tick"))
    broker.start()
    return clock, store, broker


async def _sends_while(broker: Broker, clock: SystemClock, call: asyncio.Task[tuple[int, bool]]) -> int:
    """Single sends to another topic, one after another, from the call's
    first slice until it is answered: how many were answered meanwhile."""
    while broker._bulk.slices == 0:  # the call has begun changing
        await asyncio.sleep(0)
    sent = 0
    while not call.done():
        await broker.send([NewMessage("other", f"s{sent}", "y", clock.now_ms(), clock.now_ms() + HOUR_MS, 0, 3)])
        sent += 1
    return sent


def test_sends_are_answered_between_the_slices_of_one_delete(tmp_path):
    messages = 20 * DELETE_SLICE

    async def run() -> None:
        clock, store, broker = _open(tmp_path)
        now = clock.now_ms()
        for first in range(0, messages, 1000):
            await broker.send([NewMessage("t", f"m{i}", "x", now, now + HOUR_MS + i, 0, 3)
                               for i in range(first, min(first + 1000, messages))])
        delete = asyncio.create_task(broker.delete_msgs(DeleteMsgsRequest("t", BulkFilter(), messages)))
        sent = await _sends_while(broker, clock, delete)
        assert await delete == (messages, False)
        assert broker._bulk.slices == 20
        assert sent >= 2, "no send was answered while the delete ran"
        assert await broker.count_msgs("t", BulkFilter()) == 0
        await broker.stop()
        store.close()

    asyncio.run(run())


def test_sends_are_answered_between_the_slices_of_one_reschedule(tmp_path):
    messages = 20 * MOVE_SLICE

    async def run() -> None:
        clock, store, broker = _open(tmp_path)
        now = clock.now_ms()
        await broker.send([NewMessage("t", f"m{i}", "x", now, now + HOUR_MS + i, 0, 3) for i in range(messages)])
        move = asyncio.create_task(broker.reschedule_msgs(RescheduleMsgsRequest("t", BulkFilter(), messages,
                                                                                 24 * HOUR_MS, None)))
        sent = await _sends_while(broker, clock, move)
        assert await move == (messages, False)
        assert broker._bulk.slices == 20
        assert sent >= 2, "no send was answered while the reschedule ran"
        later = BulkFilter(trigger_from_ms=now + 25 * HOUR_MS)
        assert await broker.count_msgs("t", later) == messages
        assert await broker.count_msgs("t", BulkFilter()) == messages
        assert store.intents() == []
        await broker.stop()
        store.close()

    asyncio.run(run())


def test_an_intent_whose_done_never_came_is_carried_out_when_the_node_starts(tmp_path):
    """An INTENT durable, no move made (the node died at once): the next
    start moves every place still waiting, once; a place acked meanwhile
    stays where it was."""
    messages = 3 * MOVE_SLICE

    async def run(first: bool) -> tuple[int, int, int]:
        clock = SystemClock()
        store = Store.open(str(tmp_path / "data"), StoreConfig(), now_ms=clock.now_ms())
        broker = Broker(store, clock, Defaults(), Metrics(), tick_path=str(tmp_path / "tick"))
        if first:
            broker.start()
            now = clock.now_ms()
            results = await broker.send([NewMessage("t", f"m{i}", "x", now, now + HOUR_MS + i, 0, 3)
                                         for i in range(messages)])
            places = array("q", [n for m in results for n in m.location])
            broker._journal.intend(7, "t", 24 * HOUR_MS, None, places, now)
            await broker.commits.durable()
            assert [i.call_id for i in store.intents()] == [7]
            await broker.ack(AckRequest("t", "m0", True))
            await broker.stop()  # (as a crash: the intent's DONE never appended)
            store.close()
            return 0, 0, 0
        assert [i.call_id for i in store.intents()] == [7]
        broker.start()
        for _ in range(1000):
            await asyncio.sleep(0.01)
            if not store.intents():
                break
        now = clock.now_ms()
        counts = (await broker.count_msgs("t", BulkFilter(trigger_from_ms=now + 20 * HOUR_MS)),
                  await broker.count_msgs("t", BulkFilter(trigger_to_ms=now + 20 * HOUR_MS)),
                  len(store.intents()))
        await broker.stop()
        store.close()
        return counts

    asyncio.run(run(first=True))
    assert asyncio.run(run(first=False)) == (messages - 1, 0, 0)  # m0 acked: not live, not moved


def test_an_intent_is_carried_out_before_its_messages_due_meanwhile_are_released(tmp_path):
    """The INTENT of a shift by +24 h durable, the node gone before any move
    and back after the messages' old trigger time: none is delivered at
    the old time -- the wheel starts once the carry-out is done -- and all
    are at the new one."""
    messages = 2 * MOVE_SLICE

    async def run(first: bool) -> tuple[int, int]:
        clock, store, broker = _open(tmp_path)
        if first:
            now = clock.now_ms()
            results = await broker.send([NewMessage("t", f"m{i}", "x", now, now + 1_000, 0, 3)
                                         for i in range(messages)])
            places = array("q", [n for m in results for n in m.location])
            broker._journal.intend(7, "t", 24 * HOUR_MS, None, places, now)
            await broker.commits.durable()
            await broker.stop()  # (as a crash: the intent's DONE never appended)
            store.close()
            return 0, 0
        pulled = 0
        for _ in range(300):
            pulled += len(await broker.pull(PullRequest("t", 30_000, 100, ())))
            await asyncio.sleep(0.01)
            if not store.intents():
                break
        await asyncio.sleep(0.3)  # the wheel running now: anything still due would be released
        pulled += len(await broker.pull(PullRequest("t", 30_000, 100, ())))
        later = await broker.count_msgs("t", BulkFilter(trigger_from_ms=clock.now_ms() + 20 * HOUR_MS))
        await broker.stop()
        store.close()
        return pulled, later

    asyncio.run(run(first=True))
    time.sleep(1.5)  # past the old trigger time
    assert asyncio.run(run(first=False)) == (0, messages)


def test_two_sliced_deletes_at_once_both_stay_whole_on_disk(tmp_path):
    """Two large deleteMsgs of two topics run at once, their PART records
    interleaved in the log: the COMMIT of one applies its own parts and
    leaves the other's held, so both are on disk after a restart."""
    messages = 3 * DELETE_SLICE

    async def run(reopen: bool) -> tuple[int, int]:
        clock, store, broker = _open(tmp_path)
        if not reopen:
            now = clock.now_ms()
            for topic in ("a", "b"):
                await broker.send([NewMessage(topic, f"m{i}", "x", now, now + HOUR_MS + i, 0, 3)
                                   for i in range(messages)])
            answers = await asyncio.gather(*(broker.delete_msgs(DeleteMsgsRequest(topic, BulkFilter(), messages))
                                             for topic in ("a", "b")))
            assert answers == [(messages, False), (messages, False)]
            assert broker._bulk.slices == 6
        counts = (await broker.count_msgs("a", BulkFilter()), await broker.count_msgs("b", BulkFilter()))
        await broker.stop()
        store.close()
        return counts

    assert asyncio.run(run(reopen=False)) == (0, 0)
    assert asyncio.run(run(reopen=True)) == (0, 0)


def _send(server: Server, topic: str, count: int) -> None:
    now = int(time.time() * 1000)
    for first in range(0, count, 1000):
        msgs = [{"msgId": f"m{i}", "msg": "x", "triggerTime": now + HOUR_MS + i} for i in range(first, first + 1000)]
        status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        assert status == 200, body


def _count(server: Server, topic: str, status: str) -> int:
    code, body = server.get("listMsg", topic=topic, status=status, countOnly="true")
    assert code == 200, body
    return body["count"]


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_s", [0.05, 0.2, 0.4, 0.8])
def test_a_sliced_delete_all_killed_midway_is_all_or_nothing(tmp_path, kill_after_s):
    messages = 40_000
    data = tmp_path / "data"
    server = Server.start(data, "--fsync", "batch", log_path=tmp_path / "serve.log")
    _send(server, "sliced", messages)
    answered: list[tuple[int, object]] = []

    def delete() -> None:
        with contextlib.suppress(OSError):
            answered.append(server.post("deleteMsgs", topic="sliced", all="true", limit=messages))

    caller = threading.Thread(target=delete, daemon=True)
    caller.start()
    time.sleep(kill_after_s)
    server.kill()
    caller.join(timeout=30)

    for round_ in range(2):  # and once more: the COMMIT 0 that abandoned a call replays as it applied
        again = Server.start(data, "--fsync", "batch", log_path=tmp_path / f"serve{round_}.log")
        try:
            deleted, live = _count(again, "sliced", "7"), _count(again, "sliced", "1,2,3")
            assert (deleted, live) in ((0, messages), (messages, 0)), (deleted, live)
            if answered and answered[0][0] == 200:
                assert deleted == messages, answered
            if round_:
                code, body = again.post("deleteMsgs", topic="sliced", all="true", limit=messages)
                assert code == 200 and body["deleted"] == live, body
                assert _count(again, "sliced", "1,2,3") == 0
        finally:
            assert again.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize(("kill_after_s", "how"), [(0.1, "kill"), (0.4, "kill"), (0.8, "kill"), (1.5, "kill"),
                                                   (0.4, "stop"), (0.8, "stop")])
def test_a_sliced_reschedule_killed_midway_takes_effect_whole_or_not_at_all(tmp_path, kill_after_s, how):
    """rescheduleMsgs shiftMillis=+24 h of 40,000 messages, the node
    SIGKILLed -- or stopped by SIGTERM, whose last checkpoint must not pass
    the INTENT -- during it: after a restart every message is either at
    its old time or shifted once -- all of them one way -- and all of them
    shifted if the call was answered 200."""
    messages = 40_000
    data = tmp_path / "data"
    server = Server.start(data, "--fsync", "batch", log_path=tmp_path / "serve.log")
    now = int(time.time() * 1000)
    _send(server, "moved", messages)
    answered: list[tuple[int, object]] = []

    def reschedule() -> None:
        with contextlib.suppress(OSError):
            answered.append(server.post("rescheduleMsgs", topic="moved", all="true", limit=messages,
                                        shiftMillis=24 * HOUR_MS))

    caller = threading.Thread(target=reschedule, daemon=True)
    caller.start()
    time.sleep(kill_after_s)
    if how == "kill":
        server.kill()
    else:
        server.stop()
    caller.join(timeout=30)

    old_range = {"triggerFrom": now, "triggerTo": now + 12 * HOUR_MS}
    new_range = {"triggerFrom": now + 12 * HOUR_MS, "triggerTo": now + 36 * HOUR_MS}
    again = Server.start(data, "--fsync", "batch", log_path=tmp_path / "serve1.log")
    try:
        deadline = time.monotonic() + 60
        while True:  # an INTENT found is carried out in the background once the node serves
            counts = tuple(again.get("listMsg", topic="moved", countOnly="true", **r)[1]["count"]
                           for r in (old_range, new_range))
            if counts in ((messages, 0), (0, messages)) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert counts in ((messages, 0), (0, messages)), counts
        assert _count(again, "moved", "1,2,3") == messages  # none shifted twice, none lost
        if answered and answered[0][0] == 200:
            assert counts == (0, messages), answered
    finally:
        assert again.stop() == 0
