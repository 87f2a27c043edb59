"""A large deleteMsgs yields (docs/api.md, "Bulk calls"): past DELETE_SLICE
matches it appends one PART record a slice, the event loop free between
them, and the COMMIT record last (storage.records), so other requests are
served during the call -- counted here, not timed -- and the call stays
whole across a SIGKILL of a real `hourglass serve` at any moment of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from serving import Server

from broker.bulk import DELETE_SLICE
from broker.bulk_params import BulkFilter, DeleteMsgsRequest
from broker.clock import SystemClock
from broker.disk_broker import Broker
from broker.metrics import Metrics
from broker.params import Defaults
from storage.config import StoreConfig
from storage.store import NewMessage, Store

HOUR_MS = 3_600_000


def test_sends_are_answered_between_the_slices_of_one_delete(tmp_path):
    messages = 20 * DELETE_SLICE

    async def run() -> None:
        clock = SystemClock()
        store = Store.open(str(tmp_path / "data"), StoreConfig(), now_ms=clock.now_ms())
        broker = Broker(store, clock, Defaults(), Metrics(), tick_path=str(tmp_path / "tick"))
        broker.start()
        now = clock.now_ms()
        for first in range(0, messages, 1000):
            await broker.send([NewMessage("t", f"m{i}", "x", now, now + HOUR_MS + i, 0, 3)
                               for i in range(first, min(first + 1000, messages))])
        delete = asyncio.create_task(broker.delete_msgs(DeleteMsgsRequest("t", BulkFilter(), messages)))
        while broker._bulk.slices == 0:  # the call has begun changing
            await asyncio.sleep(0)
        sent = 0
        while not delete.done():
            await broker.send([NewMessage("other", f"s{sent}", "y", clock.now_ms(), clock.now_ms() + HOUR_MS, 0, 3)])
            sent += 1
        assert await delete == (messages, False)
        assert broker._bulk.slices == 20
        assert sent >= 2, "no send was answered while the delete ran"
        assert await broker.count_msgs("t", BulkFilter()) == 0
        await broker.stop()
        store.close()

    asyncio.run(run())


def test_two_sliced_deletes_at_once_both_stay_whole_on_disk(tmp_path):
    """Two large deleteMsgs of two topics run at once, their PART records
    interleaved in the log: the COMMIT of one applies its own parts and
    leaves the other's held, so both are on disk after a restart."""
    messages = 3 * DELETE_SLICE

    async def run(reopen: bool) -> tuple[int, int]:
        clock = SystemClock()
        store = Store.open(str(tmp_path / "data"), StoreConfig(), now_ms=clock.now_ms())
        broker = Broker(store, clock, Defaults(), Metrics(), tick_path=str(tmp_path / "tick"))
        broker.start()
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
