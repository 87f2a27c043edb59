"""redriveMsgs jobs on Redis (docs/redis.md, "redriveMsgs jobs on Redis")
with real `hourglass serve --backend redis://` processes sharing one real
redis-server (the session's, this file's own database):

- one node SIGKILLed in the middle of a paced job and started again: the
  job resumes from its cursor and finishes, every dead letter back exactly
  once (READY, redriveCount 1), none lost, none re-driven twice;
- two nodes, the job made through the one that does not run it: the node
  running it (the jobs lease holder) SIGKILLed midway, the other takes the
  lease once it lapses and finishes the job, each dead letter re-driven
  once; getJob answers on the survivor throughout, and a second job made
  and cancelled through it stops.
"""

from __future__ import annotations

import time
import uuid

import pytest
from serving import Server
from test_redrive_job_kill9 import MESSAGES, RATE, _count, _job, _make_dead  # (the same dead letters, on Redis)

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")
pytestmark = pytest.mark.slow

# The Redis database this file's nodes use, flushed first (another test's
# node on database 0 could hold the jobs lease).
OWN_DB = 13
TAKEOVER_S = 30  # a killed holder's lease (10 s) lapses and the next look takes it


def own_database(redis_url: str) -> str:
    url = redis_url.rsplit("/", 1)[0] + f"/{OWN_DB}"
    import redis
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    return url


def _holds_jobs(node: Server) -> bool:
    code, text = node.get("/metrics")
    assert code == 200 and isinstance(text, bytes), text
    return b"\nhourglass_jobs_lease 1" in text


def _wait_midway(server: Server, job_id: str) -> None:
    deadline = time.monotonic() + 20
    while _job(server, job_id)["redriven"] < MESSAGES // 4:
        assert time.monotonic() < deadline, _job(server, job_id)
        time.sleep(0.05)
    before = _job(server, job_id)
    assert before["state"] == "running" and before["redriven"] < MESSAGES, before


def _finished_each_once(server: Server, topic: str, job_id: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while (job := _job(server, job_id))["state"] == "running":
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["state"] == "done" and job["skipped"] == 0, job
    # the counts may miss the slices since the last save (docs/redis.md): never more than were there
    assert 0 < job["redriven"] <= MESSAGES, job
    assert _count(server, topic, "5,6") == 0
    assert _count(server, topic, "2") == MESSAGES
    counts: dict[int, int] = {}
    cursor = None
    while True:
        params = {"topic": topic, "status": "2", "limit": 1000} | ({"cursor": cursor} if cursor else {})
        code, body = server.get("listMsg", **params)
        assert code == 200, body
        for m in body["delayMsgList"]:
            counts[m.get("redriveCount", 0)] = counts.get(m.get("redriveCount", 0), 0) + 1
            assert m["retry"] == 0, m
        cursor = body["cursor"]
        if cursor is None:
            break
    assert counts == {1: MESSAGES}, counts


def test_a_paced_job_killed_midway_resumes_and_redrives_each_once(redis_url, tmp_path):
    """...and resumes before the killed process's jobs lease would have
    lapsed: the node started again on the same --data-dir is the same node
    (its id kept there: docs/redis.md) and takes its own lease back at once."""
    from broker.redis.jobs import job_keys
    from broker.redis.keys import RedisConfig

    url = own_database(redis_url)
    server = Server.start(tmp_path / "data", "--backend", url, log_path=tmp_path / "serve.log")
    topic = "kill9-redrive-" + uuid.uuid4().hex[:8]
    try:
        _make_dead(server, topic)
        code, body = server.post("redriveMsgs", topic=topic, rate=RATE)
        assert code == 200, body
        job_id = body["jobId"]
        _wait_midway(server, job_id)
    finally:
        server.kill()
    import redis
    with redis.Redis.from_url(url) as client:
        lapse_s = time.monotonic() + int(client.pttl(job_keys(RedisConfig().key_prefix)[2])) / 1000
    again = Server.start(tmp_path / "data", "--backend", url, log_path=tmp_path / "serve2.log")
    try:
        at_start = _job(again, job_id)["redriven"]  # (as the killed process last saved it, or more)
        while _job(again, job_id)["redriven"] <= at_start:
            assert time.monotonic() < lapse_s, ("the job did not move before the dead lease lapsed", at_start)
            time.sleep(0.05)
        _finished_each_once(again, topic, job_id, TAKEOVER_S + 10)
    finally:
        assert again.stop() == 0


def test_the_holders_kill_9_passes_the_job_to_the_other_node(redis_url, tmp_path):
    url = own_database(redis_url)
    nodes = [Server.start(tmp_path / f"node{i}", "--backend", url, log_path=tmp_path / f"node{i}.log")
             for i in range(2)]
    topic = "takeover-redrive-" + uuid.uuid4().hex[:8]
    try:
        deadline = time.monotonic() + TAKEOVER_S
        while not any(_holds_jobs(node) for node in nodes):
            assert time.monotonic() < deadline, "no node took the jobs lease"
            time.sleep(0.1)
        held = 0 if _holds_jobs(nodes[0]) else 1
        holder, other = nodes[held], nodes[1 - held]
        _make_dead(other, topic)
        code, body = other.post("redriveMsgs", topic=topic, rate=RATE)  # made where it does not run
        assert code == 200, body
        job_id = body["jobId"]
        _wait_midway(other, job_id)  # (the holder's saves, read by the other)
        holder.kill()
        assert _job(other, job_id)["state"] == "running"  # answered while the dead holder's lease runs
        _finished_each_once(other, topic, job_id, TAKEOVER_S + 10)
        assert _holds_jobs(other)
        # a paced job made and cancelled through the node that now runs it: it stops
        _make_dead_few(other, topic)
        code, body = other.post("redriveMsgs", topic=topic, rate=1)
        assert code == 200, body
        code, body = other.post("cancelJob", jobId=body["jobId"])
        assert code == 200 and body["job"]["state"] == "cancelled", body
    finally:
        for node in nodes:
            node.kill()


def _make_dead_few(server: Server, topic: str) -> None:
    for i in range(5):
        server.post("sendMsg", topic=topic, msgId=f"few{i}", msg="x", maxRetry=0)
    code, body = server.post("pullMsg", topic=topic, batch=5000, ackTimeoutMillis=100)
    assert code == 200, body
    deadline = time.monotonic() + 30
    while _count(server, topic, "6") < 5:
        assert time.monotonic() < deadline, "the deliveries did not end"
        time.sleep(0.1)


def test_a_cancel_through_the_node_that_does_not_run_the_job_stops_it(redis_url, tmp_path):
    url = own_database(redis_url)
    nodes = [Server.start(tmp_path / f"node{i}", "--backend", url, log_path=tmp_path / f"node{i}.log")
             for i in range(2)]
    topic = "cancel-redrive-" + uuid.uuid4().hex[:8]
    try:
        deadline = time.monotonic() + TAKEOVER_S
        while not any(_holds_jobs(node) for node in nodes):
            assert time.monotonic() < deadline, "no node took the jobs lease"
            time.sleep(0.1)
        other = nodes[1] if _holds_jobs(nodes[0]) else nodes[0]
        _make_dead_few(other, topic)
        code, body = other.post("redriveMsgs", topic=topic, rate=1)  # one a second
        assert code == 200, body
        job_id = body["jobId"]
        deadline = time.monotonic() + 10
        while _job(other, job_id)["redriven"] < 1:
            assert time.monotonic() < deadline, _job(other, job_id)
            time.sleep(0.05)
        code, body = other.post("cancelJob", jobId=job_id)
        assert code == 200 and body["job"]["state"] == "cancelled", body
        redriven = body["job"]["redriven"]
        assert 1 <= redriven < 5, body
        time.sleep(2)  # a cancelled job re-drives no more
        assert _job(other, job_id)["redriven"] == redriven
        assert _count(other, topic, "6") == 5 - redriven
    finally:
        for node in nodes:
            node.kill()
