"""Push delivery end to end on the disk backend, with a real subscriber
process (bench/push_subscriber.py): a failed delivery of a keyed message
waiting for its retry time out of flight, and a node killed with SIGKILL while a delivery is in flight
(delivered again after the restart: at least once, never lost)."""

from __future__ import annotations

import pytest
from push import Subscriber
from serving import Server, status, wait_for

pytestmark = pytest.mark.slow

ACKED = 4




def test_a_failed_delivery_of_a_key_waits_out_of_flight_and_frees_the_key(tmp_path):
    server = Server.start(tmp_path / "data", "--push-allow", "127.0.0.1", log_path=tmp_path / "serve.log")
    sub = Subscriber(str(tmp_path), "fail")
    try:
        assert server.post("subscribe", topic="k", url=sub.url, concurrency=8)[0] == 200
        assert server.post("subscribe", topic="other", url=sub.url, secret="hidden-secret")[0] == 200
        assert server.post("unsubscribe", topic="other")[0] == 200
        first = server.post("sendMsg", topic="k", msg="1", key="order-1", msgId="a")[1]["delayMsg"]
        server.post("sendMsg", topic="k", msg="2", key="order-1", msgId="b", triggerTime=first["triggerTime"] + 1)
        wait_for(lambda: len(sub.received()) >= 2, 20, "two deliveries")
        ids = [r["headers"]["Hourglass-Msg-Id"] for r in sub.received()]
        assert ids[:2] == ["a", "b"]  # a failed: it waits for its retry time as a nack with a delay, the key free
        wait_for(lambda: status(server, "k", "a") == 1, 10, "a waiting")  # not CONSUMING: no in-flight capacity held
        sub.mode("ok")
        wait_for(lambda: status(server, "k", "b") == ACKED, 30, "ack of b")
        wait_for(lambda: status(server, "k", "a") == ACKED, 30, "ack of a")
        _, console = server.get("/console/api/subscriptions")
        shown, = console["subscriptions"]
        assert (shown["topic"], shown["url"], shown["signed"]) == ("k", sub.url, False)
        assert shown["health"]["deliveries"] == 2 and shown["health"]["failures"]["status"] >= 2
    finally:
        sub.stop()
        server.kill()


def test_a_delivery_in_flight_at_sigkill_is_delivered_after_the_restart(tmp_path):
    port_flags = ("--push-allow", "127.0.0.1")
    server = Server.start(tmp_path / "data", *port_flags, log_path=tmp_path / "serve.log")
    sub = Subscriber(str(tmp_path), "hang")
    try:
        assert server.post("subscribe", topic="kill", url=sub.url, timeoutMillis=60_000)[0] == 200
        server.post("sendMsg", topic="kill", msg="once", msgId="m1")
        wait_for(lambda: sub.received(), 10, "the first delivery")  # in flight: never answered
        server.kill()
        sub.mode("ok")
        server = Server.start(tmp_path / "data", *port_flags, log_path=tmp_path / "serve.log")
        wait_for(lambda: status(server, "kill", "m1") == ACKED, 90, "redelivery after the restart")
        received = [r["headers"]["Hourglass-Msg-Id"] for r in sub.received()]
        assert received == ["m1", "m1"]  # at least once: again after the crash, then acked
    finally:
        sub.stop()
        server.kill()


@pytest.mark.parametrize("shards", ["1", "2"])
def test_a_push_body_is_the_message_as_getmsg_answers_it_redrive_count_and_all(tmp_path, shards):
    """A dead letter that a redriveMsgs job put back (redriveCount 1),
    with a tag, a key, a priority and a trace context, is pushed with the
    body getMsg answers for it: the same fields, the same values (its
    status is the push's moment's: consuming)."""
    import json

    server = Server.start(tmp_path / "data", "--shards", shards, "--push-allow", "127.0.0.1",
                          log_path=tmp_path / "serve.log")
    sub = Subscriber(str(tmp_path), "ok")
    try:
        sent = {"topic": "p", "msgId": "m1", "msg": "body", "maxRetry": 0, "tag": "t1", "key": "k1", "priority": 3,
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
        assert server.post("sendMsg", **sent)[1]["code"] == 200
        assert [m["msgId"] for m in server.post("pullMsg", topic="p", batch=1)[1]["delayMsgList"]] == ["m1"]
        assert server.post("ackMsg", topic="p", msgId="m1", ack="false")[1]["code"] == 200
        wait_for(lambda: status(server, "p", "m1") in (5, 6), 10, "m1 dead")
        assert server.post("redriveMsgs", topic="p")[1]["code"] == 200
        wait_for(lambda: status(server, "p", "m1") == 2, 20, "m1 re-driven")
        stored = server.post("getMsg", topic="p", msgId="m1")[1]["delayMsg"]
        assert stored["redriveCount"] == 1
        assert server.post("subscribe", topic="p", url=sub.url)[0] == 200
        wait_for(lambda: sub.received(), 20, "the push")
        pushed = json.loads(sub.received()[0]["body"])
        assert pushed["status"] == 3
        assert len(pushed.pop("deliveryId")) == 16  # the push is a hand-over: its delivery (docs/api.md, "Leases")
        assert {**pushed, "status": None} == {**stored, "status": None, "retry": pushed["retry"]}
        assert pushed["retry"] == stored["retry"] + 1  # (the push is a delivery)
    finally:
        sub.stop()
        server.kill()
