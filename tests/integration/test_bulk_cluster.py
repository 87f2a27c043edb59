"""Bulk calls on a real 3-node cluster (bench/cluster.py): a bulk
reschedule and a bulk delete made on the leader live in the replicated
log, so after SIGKILL of the leader the new one delivers the moved
messages at their new time only (never at the old one), never delivers
the deleted ones, and finds messages by key through its own key index."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from cluster import Cluster

pytestmark = pytest.mark.slow

MOVED, DROPPED = 20, 10


@pytest.fixture
def cluster(tmp_path):
    c = Cluster.start(tmp_path / "cluster")
    yield c
    c.stop()


def _wait(predicate, wait_s: float = 15, what: str = "condition"):
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {wait_s} s")


def test_a_bulk_reschedule_and_delete_survive_a_leader_kill(cluster):
    leader = cluster.wait_leader()
    cluster.wait_known(leader)
    term = cluster.health(leader)["term"]
    node = cluster.nodes[leader]
    msgs = [{"msgId": f"mv{i}", "msg": "x", "tag": "move", "delayMillis": 1_500, "key": f"K{i % 2}"}
            for i in range(MOVED)]
    msgs += [{"msgId": f"dr{i}", "msg": "x", "tag": "drop", "delayMillis": 1_500} for i in range(DROPPED)]
    status, body = node.post_json("sendMsgBatch", {"topic": "bulk", "msgs": msgs})
    assert status == 200, body
    now = int(time.time() * 1000)
    code, body = node.post("rescheduleMsgs", topic="bulk", tag="move", triggerTime=now + 9_000)
    assert code == 200 and body["rescheduled"] == MOVED, body
    code, body = node.post("deleteMsgs", topic="bulk", tag="drop")
    assert code == 200 and body["deleted"] == DROPPED, body
    _wait(lambda: len(set(cluster.log_ends().values())) == 1, what="logs converging")
    cluster.kill(leader)
    new = cluster.wait_leader(exclude=leader, above_term=term)
    cluster.wait_known(new)
    n = cluster.nodes[new]

    code, body = n.get("listMsg", topic="bulk", key="K1", limit=100)
    assert code == 200 and sorted(m["msgId"] for m in body["delayMsgList"]) == sorted(
        f"mv{i}" for i in range(1, MOVED, 2)), body
    assert all(m["triggerTime"] == now + 9_000 for m in body["delayMsgList"])
    code, body = n.get("listMsg", topic="bulk", tag="drop", status="7", countOnly="true")
    assert code == 200 and body["count"] == DROPPED, body

    delivered: list[str] = []
    while int(time.time() * 1000) < now + 8_500:  # past the old time, before the new one: nothing
        code, body = n.post("pullMsg", topic="bulk", batch=100)
        assert code == 200, body
        delivered += [m["msgId"] for m in body["delayMsgList"]]
        time.sleep(0.1)
    assert delivered == []

    others: list[tuple[int, object]] = []  # answers that were not a pull's messages

    def pull_and_ack() -> bool:  # (a key's messages come one at a time: each acked before the next)
        nonlocal n
        code, body = n.post("pullMsg", topic="bulk", batch=100)
        if code != 200 or not isinstance(body, dict) or "delayMsgList" not in body:
            # (a second election under the machine's load: the pulls go on where the leader is now)
            others.append((code, body))
            n = cluster.nodes[cluster.wait_leader(exclude=leader)]
            return False
        got = [m["msgId"] for m in body["delayMsgList"]]
        delivered.extend(got)
        for msg_id in got:
            assert n.post("ackMsg", topic="bulk", msgId=msg_id)[0] == 200
        return len(delivered) >= MOVED
    try:
        _wait(pull_and_ack, wait_s=30, what="the moved messages")
    except AssertionError as e:
        raise AssertionError(f"{e}; delivered {delivered}; answers other than messages: {others}") from None
    assert int(time.time() * 1000) >= now + 9_000
    assert sorted(delivered) == sorted(f"mv{i}" for i in range(MOVED))


def test_a_large_reschedule_cut_short_by_a_leader_kill_takes_effect_whole_or_not_at_all(cluster):
    """rescheduleMsgs shiftMillis=+24 h of 20,000 messages (an INTENT, a
    MOVE a slice, DONE: storage.records), the leader SIGKILLed during it:
    the new leader ends with every message at its old time or every one
    shifted once, carrying out an INTENT it holds whose DONE never came."""
    messages = 20_000
    leader = cluster.wait_leader()
    cluster.wait_known(leader)
    term = cluster.health(leader)["term"]
    node = cluster.nodes[leader]
    now = int(time.time() * 1000)
    for first in range(0, messages, 1000):
        msgs = [{"msgId": f"m{i}", "msg": "x", "triggerTime": now + 3_600_000 + i} for i in range(first, first + 1000)]
        status, body = node.post_json("sendMsgBatch", {"topic": "big", "msgs": msgs})
        assert status == 200, body
    answered: list[tuple[int, object]] = []

    def reschedule() -> None:
        with contextlib.suppress(OSError):
            answered.append(node.post("rescheduleMsgs", topic="big", all="true", limit=messages,
                                      shiftMillis=24 * 3_600_000))

    caller = threading.Thread(target=reschedule, daemon=True)
    caller.start()
    time.sleep(0.5)
    cluster.kill(leader)
    caller.join(timeout=30)
    new = cluster.wait_leader(exclude=leader, above_term=term)
    cluster.wait_known(new)
    n = cluster.nodes[new]

    def settled() -> tuple[int, int] | None:
        counts = tuple(n.get("listMsg", topic="big", countOnly="true", triggerFrom=lo, triggerTo=hi)[1]["count"]
                       for lo, hi in ((now, now + 12 * 3_600_000), (now + 12 * 3_600_000, now + 36 * 3_600_000)))
        return counts if counts in ((messages, 0), (0, messages)) else None  # type: ignore[return-value]
    counts = _wait(settled, wait_s=60, what="every message at one time")
    code, body = n.get("listMsg", topic="big", countOnly="true")
    assert code == 200 and body["count"] == messages, body  # none shifted twice, none lost
    if answered and answered[0][0] == 200:
        assert counts == (0, messages), answered
