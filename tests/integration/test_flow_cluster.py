"""A topic's pause on a real 3-node cluster (bench/cluster.py): paused on
the leader (replicated through Raft), the leader SIGKILLed, the new leader
keeps it paused -- nothing of the topic handed out through any node --
until resumed, and then hands every message out once."""

from __future__ import annotations

import time

import pytest
from cluster import NODE_IDS, Cluster

pytestmark = pytest.mark.slow

MESSAGES = 10


def test_a_pause_survives_the_leaders_kill(tmp_path):
    c = Cluster.start(tmp_path / "cluster")
    try:
        leader = c.wait_leader()
        c.wait_known(leader)
        topic = "paused"
        code, body = c.nodes[leader].post("pauseTopic", topic=topic)
        assert code == 200 and body["code"] == 200 and body["data"]["paused"] is True, body
        for i in range(MESSAGES):
            code, body = c.nodes[leader].post("sendMsg", topic=topic, msgId=f"m{i}", msg="x")
            assert code == 200 and body["code"] == 200, body
        term = c.health(leader)["term"]  # type: ignore[index]
        c.kill(leader)
        new = c.wait_leader(exclude=leader, above_term=term)
        c.wait_known(new)
        assert c.answer("GET", "getTopicConfig", topic=topic)["data"]["paused"] is True
        for n in NODE_IDS:
            if c.alive(n):
                code, body = c.nodes[n].post("pullMsg", topic=topic, batch=MESSAGES)
                assert code == 200 and body["code"] == 200 and body["delayMsgList"] == [], (n, body)
        info = c.answer("GET", "getTopicInfo", topic=topic)["data"]
        assert info["paused"] is True and info["dueUndelivered"] == MESSAGES, info
        assert c.answer("POST", "resumeTopic", topic=topic)["data"]["paused"] is False
        got: set[str] = set()
        deadline = time.monotonic() + 20
        while len(got) < MESSAGES and time.monotonic() < deadline:
            body = c.answer("POST", "longPollingMsg", topic=topic, batch=MESSAGES, longPollingTimeoutMillis=300)
            got |= {m["msgId"] for m in body["delayMsgList"]}
        assert got == {f"m{i}" for i in range(MESSAGES)}
    finally:
        c.stop()


@pytest.mark.parametrize("misfire", ["skip", "once"])
def test_a_schedules_run_held_by_a_pause_survives_the_leaders_kill(tmp_path, misfire):
    """A schedule every second on a paused topic: its due run held back,
    waiting, no later run made; the leader SIGKILLed, the new leader holds
    it too; on resume it is judged by the misfire rule (grace 1 s: missed)
    -- skip: ended unseen, once: delivered alone -- and the next run is the
    first after the resume."""
    c = Cluster.start(tmp_path / "cluster")
    try:
        leader = c.wait_leader()
        c.wait_known(leader)
        topic = "ticks"
        put = c.answer("POST", "putSchedule", topic=topic, scheduleId="s", everyMillis=1000, msg="tick",
                       misfire=misfire, misfireGraceMillis=1000)["schedule"]
        first = put["nextFireTimes"][0]
        c.answer("POST", "pauseTopic", topic=topic)
        time.sleep(max(0.0, (first + 1500) / 1000 - time.time()))
        term = c.health(leader)["term"]  # type: ignore[index]
        c.kill(leader)
        new = c.wait_leader(exclude=leader, above_term=term)
        c.wait_known(new)
        time.sleep(max(0.0, (first + 3300) / 1000 - time.time()))
        held = c.answer("GET", "getSchedule", topic=topic, scheduleId="s")["schedule"]
        assert held["runs"] == 1 and held["nextFireTimes"][0] == first, held
        assert c.answer("POST", "getMsg", topic=topic, msgId=f"s@{first}")["delayMsg"]["status"] == 1
        resumed_ms = int(time.time() * 1000)
        c.answer("POST", "resumeTopic", topic=topic)
        deadline = time.monotonic() + 10
        while True:
            got = c.answer("GET", "getSchedule", topic=topic, scheduleId="s")["schedule"]
            if got["nextFireTimes"][0] > resumed_ms or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        following = got["nextFireTimes"][0]
        assert following > resumed_ms and (following - first) % 1000 == 0, (got, resumed_ms)
        nominal: list[int] = []
        deadline = time.monotonic() + following / 1000 - time.time() + 10
        while following not in nominal and time.monotonic() < deadline:
            body = c.answer("POST", "longPollingMsg", topic=topic, batch=10, longPollingTimeoutMillis=300)
            nominal += [m["scheduledTime"] for m in body["delayMsgList"]]
        assert [n for n in nominal if n < resumed_ms] == ([] if misfire == "skip" else [first]), nominal
        assert following in nominal
        status = c.answer("POST", "getMsg", topic=topic, msgId=f"s@{first}")["delayMsg"]["status"]
        assert status == (5 if misfire == "skip" else 3)
    finally:
        c.stop()
