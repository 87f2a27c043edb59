"""Recurring schedules on a real 3-node cluster (bench/cluster.py): a
schedule put through a follower is replicated (Raft) and answered by every
node; only the leader makes runs; SIGKILL of the leader, twice (the killed
node restarted in between), while an every-second and a cron schedule with
misfire=once run: every nominal run is delivered, each as the one message
its msgId names (none made twice), none lost. A purge through a follower
deletes two schedules' pending runs and they go on; a send under a run's
msgId through a follower is refused."""

from __future__ import annotations

import time
from typing import Any

import pytest
from cluster import NODE_IDS, Cluster

pytestmark = pytest.mark.slow


def _others(leader: str) -> list[str]:
    return [n for n in NODE_IDS if n != leader]


def _call(cluster: Cluster, nodes: list[str], method: str, path: str, **params: Any) -> dict[str, Any] | None:
    """The first live node of `nodes` that answers 200 with code 200 (None: none did)."""
    for n in nodes:
        if not cluster.alive(n):
            continue
        try:
            status, body = (cluster.nodes[n].post if method == "POST" else cluster.nodes[n].get)(path, **params)
        except OSError:
            continue
        if status == 200 and isinstance(body, dict) and body.get("code") == 200:
            return body
    return None


def _pull(cluster: Cluster, topic: str, got: dict[str, dict[str, Any]]) -> None:
    """Pull (and ack) what is ready through any live node, keeping each run by msgId."""
    body = _call(cluster, list(NODE_IDS), "POST", "pullMsg", topic=topic, batch=100)
    if not body:
        return
    batch = body.get("delayMsgList") or []
    for m in batch:
        got.setdefault(m["msgId"], m)
    if batch:
        _call(cluster, list(NODE_IDS), "POST", "ackMsg", topic=topic, msgIds=",".join(m["msgId"] for m in batch))


def _pull_for(cluster: Cluster, seconds: float, got: dict[str, dict[str, dict[str, Any]]]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for topic, runs in got.items():
            _pull(cluster, topic, runs)
        time.sleep(0.1)


def test_leader_kills_lose_no_run_and_make_none_twice(tmp_path):
    c = Cluster.start(tmp_path / "cluster")
    try:
        leader = c.wait_leader()
        c.wait_known(leader)
        follower = c.nodes[_others(leader)[0]]
        code, body = follower.post("putSchedule", topic="s1", scheduleId="tick", everyMillis=1000, msg="tick",
                                   misfire="once")
        assert code == 200 and body["code"] == 200, body
        first = body["schedule"]["nextFireTimes"][0]
        code, body = follower.post("putSchedule", topic="s2", scheduleId="cron", cron="*/2 * * * * *", msg="cron",
                                   misfire="once")
        assert code == 200 and body["code"] == 200, body
        cron_first = body["schedule"]["nextFireTimes"][0]
        for n in NODE_IDS:  # every node answers it (a follower forwards to the leader)
            code, body = c.nodes[n].get("getSchedule", topic="s1", scheduleId="tick")
            assert code == 200 and body["schedule"]["version"] == 1, body
        got: dict[str, dict[str, dict[str, Any]]] = {"s1": {}, "s2": {}}
        _pull_for(c, 3, got)
        for _ in range(2):
            term = c.health(leader)["term"]  # type: ignore[index]
            c.kill(leader)
            new = c.wait_leader(exclude=leader, above_term=term)
            _pull_for(c, 1, got)
            c.restart(leader)  # a majority again before the next kill
            c.wait_known(new)
            leader = new
            _pull_for(c, 3, got)
        # the schedules and their versions survived both failovers
        body = _call(c, list(NODE_IDS), "GET", "getSchedule", topic="s1", scheduleId="tick")
        assert body is not None and body["schedule"]["version"] == 1 and body["schedule"]["paused"] is False
        last = int(time.time() * 1000)
        _pull_for(c, 3, got)
        for topic, start, step, sid in (("s1", first, 1000, "tick"), ("s2", cron_first, 2000, "cron")):
            runs = got[topic]
            nominal = sorted(m["scheduledTime"] for m in runs.values())
            expected = list(range(start, last + 1, step))
            assert [t for t in nominal if t <= last] == expected, (topic, sorted(set(expected) - set(nominal)))
            for msg_id, m in runs.items():
                assert msg_id == f"{sid}@{m['scheduledTime']}" and m["scheduleId"] == sid
                assert m["triggerTime"] == m["scheduledTime"]
            # each run is one message: its msgId, acked once delivered, nothing else in the topic
            listed = _call(c, list(NODE_IDS), "GET", "listMsg", topic=topic, limit=1000, status="1,2,3,4,5,6")
            assert listed is not None
            ids = [m["msgId"] for m in listed["delayMsgList"]]
            assert len(ids) == len(set(ids)) and set(runs) <= set(ids)
            assert all(i.startswith(f"{sid}@") for i in ids)
        # only the leader made runs: every node's log holds the same messages
        assert {c.health(n)["leader"] for n in NODE_IDS} == {leader}  # type: ignore[index]
    finally:
        c.stop()


def test_a_purge_through_a_follower_does_not_stop_the_schedules_and_a_run_id_is_refused(tmp_path):
    c = Cluster.start(tmp_path / "cluster")
    try:
        leader = c.wait_leader()
        c.wait_known(leader)
        follower = c.nodes[_others(leader)[0]]
        start = int(time.time() * 1000) + 3000
        first = start + 1000
        for sid in ("a", "b"):
            code, body = follower.post("putSchedule", topic="pc", scheduleId=sid, everyMillis=1000, msg=sid,
                                       startTime=start)
            assert code == 200 and body["schedule"]["nextFireTimes"][0] == first, body
        code, body = follower.post("sendMsg", topic="pc", msgId=f"a@{first + 1000}", msg="mine")
        assert code == 400 and body["msg"].startswith("msgId"), body
        code, body = follower.post_json("sendMsgBatch", {"topic": "pc", "msgs": [
            {"msgId": "fine", "msg": "x"}, {"msgId": f"b@{first + 1000}", "msg": "mine"}]})
        assert code == 400 and body["msg"].startswith("msgs[1].msgId"), body
        assert follower.post("getMsg", topic="pc", msgId="fine")[0] == 404
        code, body = follower.post("deleteMsgs", topic="pc", all="true")
        assert code == 200 and body["deleted"] == 2, body
        got: dict[str, dict[str, dict[str, Any]]] = {"pc": {}}
        _pull_for(c, max(0.0, (first + 3500) / 1000 - time.time()), got)
        for sid in ("a", "b"):
            nominal = sorted(m["scheduledTime"] for m in got["pc"].values() if m["scheduleId"] == sid)
            assert nominal[:3] == [first + 1000, first + 2000, first + 3000], (sid, nominal)
            assert all(m["msg"] == sid for m in got["pc"].values() if m["scheduleId"] == sid)
            for n in NODE_IDS:  # every node answers the schedule as the leader has it: gone on past the purge
                code, body = c.nodes[n].get("getSchedule", topic="pc", scheduleId=sid)
                assert code == 200 and body["schedule"]["nextFireTimes"][0] > first + 1000, body
                assert first not in [r["scheduledTime"] for r in body["schedule"]["lastRuns"]]
    finally:
        c.stop()
