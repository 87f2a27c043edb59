"""Leases across faults (docs/api.md, "Leases"): a stale ack or extension
is refused with code 409 and changes nothing, and the current holder's
delivery still works, across a kill -9 of a standalone node (one shard and
the default node of shards) and across a kill -9 of a 3-node cluster's
leader between the extension and the ack. Real processes, SIGKILL."""

from __future__ import annotations

import time

import pytest
from cluster import Cluster
from serving import Server

pytestmark = [pytest.mark.slow]

TOPIC = "leases"


def _ready(server, msg_id: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        code, body = server.post("getMsg", topic=TOPIC, msgId=msg_id)
        if code == 200 and body["code"] == 200 and body["delayMsg"]["status"] == 2:
            return
        time.sleep(0.02)
    raise AssertionError(f"{msg_id} not ready: {body}")


def _pull_one(server, ack_timeout_ms: int, wait_s: float = 10) -> dict:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        code, body = server.post("longPollingMsg", topic=TOPIC, ackTimeoutMillis=ack_timeout_ms,
                                 longPollingTimeoutMillis=500)
        if code == 200 and body.get("delayMsgList"):
            (got,) = body["delayMsgList"]
            return got
    raise AssertionError("nothing delivered")


def _fenced(server, path: str, msg_id: str, delivery_id: str, **params) -> dict:
    _, body = server.post(path, topic=TOPIC, msgId=msg_id, deliveryId=delivery_id, **params)
    assert isinstance(body, dict), body
    return body


def _status(server, msg_id: str) -> tuple[int, int]:
    code, body = server.post("getMsg", topic=TOPIC, msgId=msg_id)
    assert code == 200 and body["code"] == 200, body
    return body["delayMsg"]["status"], body["delayMsg"]["retry"]


@pytest.mark.parametrize("shards", ["1", "2"])
def test_a_stale_delivery_is_refused_across_a_kill_9_of_a_standalone_node(tmp_path, shards):
    server = Server.start(tmp_path / "data", "--shards", shards)
    try:
        _, body = server.post("sendMsg", topic=TOPIC, msgId="m", msg="x")
        assert body["code"] == 200, body
        _ready(server, "m")
        stale = _pull_one(server, 500)["deliveryId"]
        current = _pull_one(server, 60_000)  # the first timed out: handed over again
        assert current["retry"] == 2 and current["deliveryId"] != stale
        body = _fenced(server, "extendMsg", "m", current["deliveryId"], ackTimeoutMillis=60_000)
        assert body["code"] == 200, body  # durable before this answer
        server.kill()
        server = Server.start(tmp_path / "data", "--shards", shards)
        for path, extra in (("extendMsg", {"ackTimeoutMillis": 30_000}), ("ackMsg", {}), ("ackMsg", {"ack": "false"})):
            body = _fenced(server, path, "m", stale, **extra)
            assert body["code"] == 409 and stale in body["msg"], body
        assert _status(server, "m") == (3, 2)  # still the current holder's
        body = _fenced(server, "extendMsg", "m", current["deliveryId"], ackTimeoutMillis=30_000)
        assert body["code"] == 200, body
        assert _fenced(server, "ackMsg", "m", current["deliveryId"])["code"] == 200
        assert _status(server, "m") == (4, 2)
    finally:
        server.kill()


@pytest.mark.serial
def test_a_stale_delivery_is_refused_across_a_leader_kill_between_extension_and_ack(tmp_path):
    cluster = Cluster.start(tmp_path / "cluster")
    try:
        leader = cluster.wait_leader()
        node = cluster.nodes[leader]
        cluster.answer("POST", "sendMsg", topic=TOPIC, msgId="m", msg="x")
        _ready(node, "m")
        stale = _pull_one(node, 500)["deliveryId"]
        current = _pull_one(node, 60_000)
        assert current["deliveryId"] != stale
        assert _fenced(node, "extendMsg", "m", current["deliveryId"], ackTimeoutMillis=60_000)["code"] == 200
        cluster.kill(leader)
        new = cluster.nodes[cluster.wait_leader(exclude=leader)]
        deadline = time.monotonic() + 30
        while True:  # the new leader answers once it serves (503 until then, as docs/cluster.md says)
            code, body = new.post("extendMsg", topic=TOPIC, msgId="m", deliveryId=stale, ackTimeoutMillis=30_000)
            if code != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert code == body["code"] == 409 and stale in body["msg"], body
        assert _fenced(new, "ackMsg", "m", stale)["code"] == 409
        assert _status(new, "m") == (3, 2)
        assert _fenced(new, "ackMsg", "m", current["deliveryId"])["code"] == 200  # replicated: the holder's still
        assert _status(new, "m") == (4, 2)
    finally:
        cluster.stop()
