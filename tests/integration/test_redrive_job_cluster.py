"""A redriveMsgs job on a real 3-node cluster (bench/cluster.py): started
through a follower, run by the leader, its record replicated (Raft); the
leader SIGKILLed midway, the next leader resumes the job from the cursor
it finds and finishes it: every dead letter back once (redriveCount 1),
none lost; getJob answers the job on every node."""

from __future__ import annotations

import time

import pytest
from cluster import NODE_IDS, Cluster

pytestmark = pytest.mark.slow

MESSAGES = 600
RATE = 150  # a second: the job takes about 4 s


def _count(cluster: Cluster, topic: str, status: str) -> int:
    count: int = cluster.answer("GET", "listMsg", topic=topic, status=status, countOnly="true")["count"]
    return count


def test_a_job_survives_the_leaders_kill_and_redrives_each_once(tmp_path):
    c = Cluster.start(tmp_path / "cluster")
    topic = "jobs"
    try:
        leader = c.wait_leader()
        c.wait_known(leader)
        follower = c.nodes[next(n for n in NODE_IDS if n != leader)]
        msgs = [{"msgId": f"m{i}", "msg": "x", "maxRetry": 0} for i in range(MESSAGES)]
        code, body = follower.post_json("sendMsgBatch", {"topic": topic, "msgs": msgs})
        assert code == 200, body
        pulled = 0
        while pulled < MESSAGES:
            code, body = follower.post("pullMsg", topic=topic, batch=1000, ackTimeoutMillis=100)
            assert code == 200, body
            pulled += len(body["delayMsgList"])
        deadline = time.monotonic() + 30
        while _count(c, topic, "6") != MESSAGES:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        code, body = follower.post("redriveMsgs", topic=topic, rate=RATE)
        assert code == 200 and body["code"] == 200, body
        job_id = body["jobId"]
        deadline = time.monotonic() + 10
        while (job := c.answer("GET", "getJob", jobId=job_id))["job"]["redriven"] < MESSAGES // 4:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert job["job"]["state"] == "running", job
        term = c.health(leader)["term"]  # type: ignore[index]
        c.kill(leader)
        c.wait_leader(exclude=leader, above_term=term)
        deadline = time.monotonic() + 60
        while (job := c.answer("GET", "getJob", jobId=job_id))["job"]["state"] == "running":
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["job"]["state"] == "done", job
        assert _count(c, topic, "5,6") == 0 and _count(c, topic, "2") == MESSAGES
        listed = c.answer("GET", "listMsg", topic=topic, status="2", limit=1000)
        assert sorted(m["msgId"] for m in listed["delayMsgList"]) == sorted(f"m{i}" for i in range(MESSAGES))
        assert {m.get("redriveCount") for m in listed["delayMsgList"]} == {1}
        for n in NODE_IDS:
            if c.alive(n):
                code, body = c.nodes[n].get("getJob")
                assert code == 200 and [j["jobId"] for j in body["jobs"]] == [job_id], body
    finally:
        c.stop()
