"""kill -9 of a real `hourglass serve` in the middle of a bulk delete
(docs/api.md, Bulk calls): the call is all or nothing.

Each round sends MESSAGES waiting messages of one tag to a fresh topic,
starts `deleteMsgs tag=..` (one call for all of them) and SIGKILLs the
server at a different moment of it; the server started again on the same
data directory holds either every one of them DELETED or none -- and
every one if the call had been answered -- and a later pull delivers none
of the deleted.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from serving import Server

pytestmark = pytest.mark.slow

MESSAGES = 12_000
HOUR_MS = 3_600_000


def _send(server: Server, topic: str) -> None:
    now = int(time.time() * 1000)
    for first in range(0, MESSAGES, 1000):
        msgs = [{"msgId": f"m{i}", "msg": "x", "tag": "gone", "triggerTime": now + HOUR_MS + i}
                for i in range(first, first + 1000)]
        status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        assert status == 200, body


def _count(server: Server, topic: str, status: str) -> int:
    code, body = server.get("listMsg", topic=topic, status=status, countOnly="true")
    assert code == 200, body
    return body["count"]


@pytest.mark.parametrize("kill_after_s", [0.02, 0.1, 0.25])
def test_a_bulk_delete_killed_midway_is_all_or_nothing(tmp_path, kill_after_s):
    data = tmp_path / "data"
    server = Server.start(data, "--fsync", "batch", log_path=tmp_path / "serve.log")
    topic = "kill9-bulk"
    _send(server, topic)
    answered: list[tuple[int, object]] = []

    def delete() -> None:
        with contextlib.suppress(OSError):  # the connection may die with the server
            answered.append(server.post("deleteMsgs", topic=topic, tag="gone", limit=MESSAGES))

    caller = threading.Thread(target=delete, daemon=True)
    caller.start()
    time.sleep(kill_after_s)
    server.kill()
    caller.join(timeout=30)

    again = Server.start(data, "--fsync", "batch", log_path=tmp_path / "serve2.log")
    try:
        deleted, live = _count(again, topic, "7"), _count(again, topic, "1,2,3")
        assert (deleted, live) in ((0, MESSAGES), (MESSAGES, 0)), (deleted, live)
        if answered and answered[0][0] == 200:
            assert deleted == MESSAGES, answered
        if deleted:
            code, body = again.post("rescheduleMsgs", topic=topic, status="7", delayMillis=0)
            assert code == 200 and body["rescheduled"] == 0, body  # nothing to move: all ended
            code, body = again.post("pullMsg", topic=topic, batch=1000)
            assert code == 200 and body["delayMsgList"] == [], body
    finally:
        assert again.stop() == 0
