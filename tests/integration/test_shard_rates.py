"""A topic's releaseRate and a redriveMsgs job's rate hold for a node of
two shards (real processes), whichever shard holds the messages
(broker.shards.rates): all on one shard, they go at the rate, not at the
shard's even half of it; on both, the node never hands out more than the
rate and a burst in any second."""

from __future__ import annotations

import time

import pytest
from serving import Server

from broker.shards import placement

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # (failover deadlines, rates: not beside another worker)

RATE = 200
COUNT = 600  # 3 s at RATE; 6 s at half of it (each shard's even share)


def ids_on(shard: int, n: int, prefix: str) -> list[str]:
    found, i = [], 0
    while len(found) < n:
        msg_id = f"{prefix}-{i}"
        if placement.owner(msg_id, 2) == shard:
            found.append(msg_id)
        i += 1
    return found


def send(server: Server, topic: str, ids: list[str], **fields: object) -> None:
    for at in range(0, len(ids), 200):
        status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": [
            {"msg": "m", "msgId": msg_id, **fields} for msg_id in ids[at:at + 200]]})
        assert status == 200 and body["code"] == 200, body


def drain(server: Server, topic: str, count: int) -> tuple[float, dict[int, int], list[str]]:
    """Long polls until `count` are handed out: seconds taken, hand-outs
    per second since the first, the ids."""
    started = time.monotonic()
    seconds: dict[int, int] = {}
    got: list[str] = []
    while len(got) < count and time.monotonic() - started < 30:
        status, body = server.post("longPollingMsg", topic=topic, batch=100, longPollingTimeoutMillis=1000)
        assert status == 200 and body["code"] == 200, body
        now_ms = int(time.time() * 1000)
        for m in body["delayMsgList"]:
            assert m["triggerTime"] <= now_ms  # never early
        got += [m["msgId"] for m in body["delayMsgList"]]
        second = int(time.monotonic() - started)
        seconds[second] = seconds.get(second, 0) + len(body["delayMsgList"])
    return time.monotonic() - started, seconds, got


@pytest.fixture
def node(tmp_path):
    server = Server.start(tmp_path / "data", "--shards", "2")
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("on", ["one shard", "both shards"])
def test_a_release_rate_holds_for_the_node_wherever_its_messages_lie(node, on):
    """releaseRate=200, 600 messages due at once: handed out over about
    3 s (all on shard 1: not 6 s, its even half), each once; no second
    over the rate by more than a fifth plus the node's burst."""
    topic = f"rate-{on.split()[0]}"
    status, body = node.post("setTopicConfig", topic=topic, releaseRate=RATE)
    assert status == 200 and body["code"] == 200, body
    ids = ids_on(1, COUNT, "r") if on == "one shard" else [f"r-{i}" for i in range(COUNT)]
    assert {placement.owner(i, 2) for i in ids} == ({1} if on == "one shard" else {0, 1})
    send(node, topic, ids)
    took_s, seconds, got = drain(node, topic, COUNT)
    assert sorted(got) == sorted(ids), (len(got), seconds)
    burst = RATE * 0.1 + 2  # (a tenth of a second's worth in all, a token of each shard's own)
    assert took_s >= (COUNT - burst) / RATE * 0.9, (took_s, seconds)
    assert took_s <= COUNT / RATE * 1.3, (took_s, seconds)  # at half the rate: 6 s
    assert max(seconds.values()) <= RATE * 1.2 + burst, seconds


def test_a_redrive_job_keeps_its_rate_when_one_shard_holds_the_dead_letters(node):
    """redriveMsgs rate=40 over 120 dead letters all on shard 1: done in
    about 3 s (its half of the rate alone: 6 s), every one re-driven once."""
    topic = "dead-on-one"
    ids = ids_on(1, 120, "d")
    send(node, topic, ids, maxRetry=0)
    pulled = 0
    deadline = time.monotonic() + 30
    while pulled < len(ids) and time.monotonic() < deadline:
        status, body = node.post("pullMsg", topic=topic, batch=100, ackTimeoutMillis=100)
        pulled += len(body["delayMsgList"])
    assert pulled == len(ids)
    while time.monotonic() < deadline:  # every one ended after its one delivery
        status, body = node.get("/camellia/delayQueue/getTopicInfo", topic=topic)
        data = body["data"]
        if data["ackQueueSize"] == data["readyQueueSize"] == data["waitingQueueSize"] == 0:
            break
        time.sleep(0.05)
    started = time.monotonic()
    status, body = node.post("redriveMsgs", topic=topic, rate=40)
    assert status == 200 and body["code"] == 200, body
    job_id = body["jobId"]
    while time.monotonic() - started < 30:
        status, body = node.get("getJob", jobId=job_id)
        if body["job"]["state"] != "running":
            break
        time.sleep(0.05)
    took_s = time.monotonic() - started
    job = body["job"]
    assert (job["state"], job["redriven"], job["rate"]) == ("done", 120, 40), job
    assert 120 / 40 * 0.8 <= took_s <= 120 / 40 * 1.3, took_s  # at its even half: 6 s
