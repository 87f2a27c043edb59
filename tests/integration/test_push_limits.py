"""Push delivery's limits against a real node (docs/api.md, "Push
delivery"; docs/security.md): subscribe's refusals answered as every API
outcome is (HTTP 200, code 403 in the body), --max-subscriptions, and the
push series of /metrics bounded by --metrics-topics."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse

import pytest
from push import Subscriber
from serving import PREFIX, Server, request, status, wait_for

from broker.client import DelayQueueClient, DelayQueueError

pytestmark = pytest.mark.slow

ACKED = 4


def raw_post(server: Server, endpoint: str, **params: object) -> tuple[int, dict]:
    """The HTTP status and the JSON answer, as a client sees them on the wire."""
    data = urllib.parse.urlencode({k: str(v) for k, v in params.items()}).encode()
    status, body = request(server.base + PREFIX + endpoint, data=data,
                           headers=server.headers({"Content-Type": "application/x-www-form-urlencoded"}))
    return status, json.loads(body)


def test_subscribe_refusals_are_http_200_with_code_403(tmp_path):
    off = Server.start(tmp_path / "off", log_path=tmp_path / "off.log")
    try:
        status, answer = raw_post(off, "subscribe", topic="t", url="http://127.0.0.1:9/hook")
        assert (status, answer["code"]) == (200, 403) and "--push-allow" in answer["msg"]

        async def client_sees() -> DelayQueueError:
            async with DelayQueueClient(off.base, retries=3) as client:
                with pytest.raises(DelayQueueError) as refused:
                    await client.subscribe("t", "http://127.0.0.1:9/hook")
                return refused.value
        error = asyncio.run(client_sees())
        assert error.code == 403 and not error.transient and "--push-allow" in error.msg
    finally:
        off.stop()
    other = Server.start(tmp_path / "other", "--push-allow", "10.0.0.0/8", log_path=tmp_path / "other.log")
    try:
        status, answer = raw_post(other, "subscribe", topic="t", url="http://127.0.0.1:9/hook")
        assert (status, answer["code"]) == (200, 403) and "--push-allow" in answer["msg"]
        status, answer = raw_post(other, "subscribe", topic="t", url="http://10.1.2.3:9/hook")
        assert (status, answer["code"]) == (200, 200)
    finally:
        other.stop()


def test_max_subscriptions_caps_the_subscribed_topics(tmp_path):
    server = Server.start(tmp_path / "data", "--push-allow", "10.0.0.0/8", "--max-subscriptions", "3",
                          log_path=tmp_path / "serve.log")
    url = "http://10.9.9.9:9/hook"  # never reached: no message is sent
    try:
        for i in range(3):
            assert server.post("subscribe", topic=f"t{i}", url=url)[0] == 200
        status, answer = raw_post(server, "subscribe", topic="t3", url=url)
        assert status == 429 and answer["code"] == 429 and "--max-subscriptions" in answer["msg"]
        assert server.get("getSubscription", topic="t3")[0] == 404  # nothing stored
        assert server.post("subscribe", topic="t1", url=url, concurrency=2)[0] == 200  # a replacement: not one more
        assert server.post("unsubscribe", topic="t0")[0] == 200
        assert server.post("subscribe", topic="t3", url=url)[0] == 200
        server.kill()  # the cap holds for the subscriptions a restart reads back
        server = Server.start(tmp_path / "data", "--push-allow", "10.0.0.0/8", "--max-subscriptions", "3",
                              log_path=tmp_path / "serve.log")
        assert raw_post(server, "subscribe", topic="t4", url=url)[0] == 429
        _, metrics = server.get("/metrics")
        assert "hourglass_push_subscriptions 3" in metrics.decode()
    finally:
        server.kill()


def test_max_subscriptions_has_a_default(tmp_path):
    """Today's finding: 200 of 200 subscriptions on made-up topics were taken."""
    server = Server.start(tmp_path / "data", "--push-allow", "10.0.0.0/8", log_path=tmp_path / "serve.log")
    try:
        codes = [server.post("subscribe", topic=f"made-up-{i}", url="http://10.9.9.9:9/hook")[0] for i in range(101)]
        assert codes == [200] * 100 + [429]
    finally:
        server.kill()


def test_push_series_obey_metrics_topics(tmp_path):
    server = Server.start(tmp_path / "data", "--push-allow", "10.0.0.0/8", "--metrics-topics", "5",
                          log_path=tmp_path / "serve.log")
    try:
        for i in range(40):
            assert server.post("subscribe", topic=f"topic-{i:02}", url="http://10.9.9.9:9/hook")[0] == 200
        _, metrics = server.get("/metrics")
        text = metrics.decode()
        topics = set(re.findall(r'^hourglass_push_\w+\{topic="([^"]*)"', text, re.MULTILINE))
        assert len(topics) == 5, sorted(topics)
        assert "hourglass_push_subscriptions 40" in text and "hourglass_push_topics_shown 5" in text
        assert "hourglass_node_push_deliveries_total 0" in text
    finally:
        server.kill()



def test_failing_subscribers_hold_no_inflight_capacity(tmp_path):
    """Two topics' subscribers answer errors; a consumer of a third topic
    still gets its messages under --max-inflight-total (today's finding: the
    backoffs stayed CONSUMING, filled the cap, and the third got nothing)."""
    server = Server.start(tmp_path / "data", "--push-allow", "127.0.0.1", "--max-inflight", "4",
                          "--max-inflight-total", "8", log_path=tmp_path / "serve.log")
    subs = [Subscriber(str(tmp_path), "fail") for _ in range(2)]
    try:
        sent: dict[str, list[str]] = {}
        for topic, sub in zip(("a", "b"), subs):
            assert server.post("subscribe", topic=topic, url=sub.url)[0] == 200
            sent[topic] = [server.post("sendMsg", topic=topic, msg=str(i), maxRetry=30)[1]["delayMsg"]["msgId"]
                           for i in range(10)]
        for sub in subs:  # --max-inflight's worth failed at least once: the backoffs have begun
            wait_for(lambda sub=sub: len({r["headers"]["Hourglass-Msg-Id"] for r in sub.received()}) >= 4, 20,
                     "a first delivery of four messages")
        ids = {server.post("sendMsg", topic="c", msg=str(i))[1]["delayMsg"]["msgId"] for i in range(6)}
        got: set[str] = set()

        def pulled() -> bool:
            _, answer = server.post("pullMsg", topic="c", batch=6)
            for m in answer.get("delayMsgList") or []:
                got.add(m["msgId"])
                assert server.post("ackMsg", topic="c", msgId=m["msgId"])[0] == 200
            return got == ids
        wait_for(pulled, 5, "pull of the third topic's messages")
        health = server.get("getSubscription", topic="a")[1]["data"]["health"]
        assert health["failures"]["status"] >= 10 and health["inFlight"] <= 4
        statuses = {status(server, "a", msg_id) for msg_id in sent["a"]}
        assert statuses <= {1, 2, 3} and 1 in statuses  # waiting for their retry time, not consuming
        for sub in subs:
            sub.mode("ok")
        for topic, msg_ids in sent.items():  # at least once: each is delivered once the subscriber answers
            for msg_id in msg_ids:
                wait_for(lambda t=topic, m=msg_id: status(server, t, m) == ACKED, 60, f"ack of {msg_id}")
    finally:
        for sub in subs:
            sub.stop()
        server.kill()
