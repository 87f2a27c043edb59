"""Recurring schedules on Redis with real `hourglass serve --backend
redis://` processes sharing one real redis-server (the session's): two
nodes, an every-second schedule (misfire=once, 60 s grace), a consumer
long-polling both; the node holding the schedules lease is SIGKILLed and
restarted twice, the other taking the lease once it lapses. Every nominal
second from the first run to the last is delivered (no run lost), each
run's message was made once (one produceTime per msgId, the drill
checker's rule: bench/drill_history.py), and none before its nominal
time. A purge through the node that does not hold the lease deletes the
pending runs and the schedules go on; that node refuses a send under a
run's msgId, asking Redis. The API's schedule calls are covered on Redis by
the conformance suite (tests/conformance/test_conformance_schedules.py)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from drill_history import Delivery, History, check
from serving import Server

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")
pytestmark = pytest.mark.slow

HOLDER_WAIT_S = 25  # a killed holder's lease (10 s) lapses, and the next renewal round (3.3 s) takes it


def _tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"({e})"


def holder(nodes: list[Server], wait_s: float = HOLDER_WAIT_S) -> int:
    """The index of the node serving the schedules (the others answer 503)."""
    deadline = time.monotonic() + wait_s
    while True:
        for i, node in enumerate(nodes):
            try:
                if node.get("listSchedules", topic="none")[0] == 200:
                    return i
            except OSError:
                pass
        if time.monotonic() > deadline:
            logs = "".join(f"\n--- {node.log_path} (end)\n{_tail(node.log_path)}" for node in nodes)
            raise AssertionError(f"no node took the schedules lease within {wait_s} s{logs}")
        time.sleep(0.1)


# The Redis database this file's nodes use, flushed first: database 0 of the
# session's server may hold another test's node, and with it the schedules
# lease (the conformance suite's shared node), which these nodes would wait on.
OWN_DB = 14


def own_database(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + f"/{OWN_DB}"
    import redis
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    return url


def test_kill_9_of_the_lease_holder_loses_no_run_and_makes_none_twice(redis_url, tmp_path):
    topic = "sched-" + uuid.uuid4().hex[:8]
    redis_url = own_database(redis_url)
    nodes = [Server.start(tmp_path / f"node{i}", "--backend", redis_url, log_path=tmp_path / f"node{i}.log")
             for i in range(2)]
    history = History()
    stop = threading.Event()

    def consume(which: int) -> None:
        while not stop.is_set():
            node = nodes[which]
            try:
                start = int(time.time() * 1000)
                code, answer = node.post("longPollingMsg", topic=topic, batch=50, longPollingTimeoutMillis=500,
                                         ackTimeoutMillis=30_000)
                if code != 200:
                    time.sleep(0.05)
                    continue
                end = int(time.time() * 1000)
                batch = answer["delayMsgList"]
                for m in batch:
                    history.deliveries.append(Delivery(topic, m["msgId"], start, end, m["retry"], m["triggerTime"],
                                                       None, 30_000, m["produceTime"], m["scheduledTime"]))
                if batch:
                    node.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in batch))
            except OSError:
                time.sleep(0.05)

    consumers = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(2)]
    try:
        first = holder(nodes)
        code, answer = nodes[first].post("putSchedule", topic=topic, scheduleId="s", everyMillis=1000, msg="run")
        assert code == 200, answer
        assert nodes[1 - first].post("putSchedule", topic=topic, scheduleId="x", everyMillis=1000,
                                     msg="run")[0] == 503  # the other node: not the holder
        for c in consumers:
            c.start()
        for _ in range(2):
            time.sleep(2.5)
            held = holder(nodes)
            port = int(nodes[held].base.rsplit(":", 1)[1])
            nodes[held].kill()
            took = holder([nodes[1 - held]])  # the survivor, once the dead node's lease lapsed
            assert took == 0
            nodes[held] = Server.start(tmp_path / f"node{held}", "--backend", redis_url, port=port,
                                       log_path=tmp_path / f"node{held}.log")
        time.sleep(4)
        stop.set()
        for c in consumers:
            c.join(timeout=10)
        nominal = sorted({d.scheduled_ms for d in history.deliveries})
        deadline = time.monotonic() + 5
        while True:  # the holder sees a release a moment after it (its watch): the last one delivered too
            now = nodes[holder(nodes)]
            pending = now.get("getSchedule", topic=topic, scheduleId="s")[1]["schedule"]["nextFireTimes"][0]
            if pending > nominal[-1] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # runs released since the last poll wait READY (2), not lost; the pending one waits (1)
        since = [now.post("getMsg", topic=topic, msgId=f"s@{t}")[1]["delayMsg"]["status"]
                 for t in range(nominal[-1] + 1000, pending + 1000, 1000)]
    finally:
        stop.set()
        for node in nodes:
            node.kill()
    assert len(nominal) >= 20
    assert nominal == list(range(nominal[0], nominal[-1] + 1000, 1000)), "a run was lost"
    assert all(s == 2 for s in since[:-1]) and since[-1] in (1, 2), since
    found = check(history)
    assert found.runs_twice == 0 and found.runs_early == 0 and found.failed == [], found.as_dict()


def test_a_purge_and_a_run_id_send_through_the_other_node(redis_url, tmp_path):
    topic = "sched-" + uuid.uuid4().hex[:8]
    redis_url = own_database(redis_url)
    nodes = [Server.start(tmp_path / f"node{i}", "--backend", redis_url, log_path=tmp_path / f"node{i}.log")
             for i in range(2)]
    try:
        held = holder(nodes)
        other = nodes[1 - held]
        start = int(time.time() * 1000) + 2000
        first = start + 1000
        for sid in ("a", "b"):
            code, answer = nodes[held].post("putSchedule", topic=topic, scheduleId=sid, everyMillis=1000, msg=sid,
                                            startTime=start)
            assert code == 200 and answer["schedule"]["nextFireTimes"][0] == first, answer
        code, refused = other.post("sendMsg", topic=topic, msgId=f"a@{first + 1000}", msg="mine")
        assert code == 400 and refused["msg"].startswith("msgId"), refused
        code, refused = other.post_json("sendMsgBatch", {"topic": topic, "msgs": [
            {"msgId": "fine", "msg": "x"}, {"msgId": f"b@{first + 1000}", "msg": "mine"}]})
        assert code == 400 and refused["msg"].startswith("msgs[1].msgId"), refused
        assert other.post("getMsg", topic=topic, msgId="fine")[0] == 404
        code, purged = other.post("deleteMsgs", topic=topic, all="true")
        assert code == 200 and purged["deleted"] == 2, purged
        got = []
        while time.time() * 1000 < first + 3500:
            code, answer = other.post("longPollingMsg", topic=topic, batch=10, longPollingTimeoutMillis=300)
            assert code == 200, answer
            got += [(m, int(time.time() * 1000)) for m in answer["delayMsgList"]]
            if answer["delayMsgList"]:
                other.post("ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in answer["delayMsgList"]))
        for sid in ("a", "b"):
            runs = [(m, at) for m, at in got if m["scheduleId"] == sid and m["scheduledTime"] <= first + 3000]
            assert [m["scheduledTime"] for m, _ in runs] == [first + 1000, first + 2000, first + 3000], (sid, got)
            assert all(at >= m["triggerTime"] and m["msg"] == sid for m, at in runs)
            schedule = nodes[held].get("getSchedule", topic=topic, scheduleId=sid)[1]["schedule"]
            assert first not in [r["scheduledTime"] for r in schedule["lastRuns"]]
    finally:
        for node in nodes:
            node.kill()
