"""Push delivery on both backends (docs/api.md, "Push delivery"):
subscribe / unsubscribe / getSubscription, a due message POSTed to a real
subscriber process (bench/push_subscriber.py) and signed, a 2xx acking
it, failures retried until the message is dead, and the refusals that keep
outbound requests to what --push-allow names."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.parse

import pytest
from serving import PREFIX, request
from serving import PushSubscriber as Subscriber

ACKED, ENDED = 4, 6


@pytest.fixture
def subscriber(tmp_path):
    started: list[Subscriber] = []

    def start(mode: str = "ok") -> Subscriber:
        started.append(Subscriber(tmp_path, mode))
        return started[-1]
    yield start
    for s in started:
        s.stop()


def http_status(api, endpoint: str, **params: object) -> int:
    """The HTTP status of a POST (api.post answers the code in the body)."""
    data = urllib.parse.urlencode({k: str(v) for k, v in params.items()}).encode()
    return request(api.server.base + PREFIX + endpoint, data=data, headers=api.server.headers())[0]


def test_push_is_off_without_push_allow(api, topic):
    code, body = api.post("subscribe", topic=topic, url="http://127.0.0.1:9/hook")
    assert code == 403 and "--push-allow" in body["msg"]
    assert http_status(api, "subscribe", topic=topic, url="http://127.0.0.1:9/hook") == 200  # as every API outcome
    code, body = api.get("getSubscription", topic=topic)
    assert code == 404
    code, body = api.post("unsubscribe", topic=topic)
    assert code == 404


def test_subscribe_get_unsubscribe_never_shows_the_secret(serve, subscriber, topic, tmp_path):
    api = serve("--push-allow", "127.0.0.1")
    sub = subscriber()
    code, body = api.post("subscribe", topic=topic, url=sub.url, secret="s3cret-key", concurrency=4, rateLimit=10)
    assert code == 200, body
    assert "s3cret-key" not in json.dumps(body)
    assert body["data"] == {"topic": topic, "url": sub.url, "signed": True, "concurrency": 4, "rateLimit": 10,
                            "timeoutMillis": 10_000, "maxBodyBytes": 65536}
    code, body = api.get("getSubscription", topic=topic)
    assert code == 200 and body["data"]["signed"] is True and "s3cret-key" not in json.dumps(body)
    for bad in ({"url": "ftp://127.0.0.1/x"}, {"url": sub.url, "concurrency": 0},
                {"url": sub.url, "concurrency": 257}, {"url": "http://u:p@127.0.0.1/x"}):
        code, body = api.post("subscribe", topic=topic, **bad)
        assert code == 400, (bad, body)
    assert api.post("unsubscribe", topic=topic)[0] == 200
    assert api.get("getSubscription", topic=topic)[0] == 404
    assert "s3cret-key" not in (tmp_path / "serve.log").read_text()


def test_a_due_message_is_posted_signed_and_acked(serve, subscriber, topic):
    api = serve("--push-allow", "127.0.0.1")
    sub = subscriber()
    assert api.post("subscribe", topic=topic, url=sub.url, secret="k")[0] == 200
    sent = api.send(topic, msg="hello", delayMillis=300)
    got, = sub.wait_received(1)
    headers = {k.lower(): v for k, v in got["headers"].items()}
    assert got["receivedMs"] >= sent["triggerTime"]  # never early
    assert headers["content-type"] == "application/json"
    assert headers["hourglass-topic"] == topic and headers["hourglass-msg-id"] == sent["msgId"]
    assert headers["hourglass-retry"] == "1"
    expected = hmac.new(b"k", headers["hourglass-timestamp"].encode() + b"." + got["body"].encode(),
                        hashlib.sha256).hexdigest()
    assert headers["hourglass-signature"] == "sha256=" + expected
    body = json.loads(got["body"])
    assert body["msgId"] == sent["msgId"] and body["msg"] == "hello"
    assert api.wait_status(topic, sent["msgId"], {ACKED})["status"] == ACKED
    _, metrics = api.get("/metrics")
    text = metrics.decode()
    assert f'hourglass_push_deliveries_total{{topic="{topic}"}} 1' in text
    assert f'hourglass_push_latency_seconds_count{{topic="{topic}"}} 1' in text
    assert api.server.stop() == 0  # SIGTERM with a pusher running: a clean stop


def test_failed_deliveries_are_retried_until_dead(serve, subscriber, topic):
    api = serve("--push-allow", "127.0.0.1")
    sub = subscriber("fail")
    assert api.post("subscribe", topic=topic, url=sub.url)[0] == 200
    sent = api.send(topic, msg="x", maxRetry=1)
    got = sub.wait_received(2)
    assert [g["headers"]["Hourglass-Retry"] for g in got] == ["1", "2"]
    assert api.wait_status(topic, sent["msgId"], {ENDED}, timeout_s=10)["status"] == ENDED
    _, body = api.get("getSubscription", topic=topic)
    assert body["data"]["health"]["failures"] == {"status": 2} and "500" in body["data"]["health"]["lastError"]


def test_a_recovered_subscriber_gets_the_backlog(serve, subscriber, topic):
    api = serve("--push-allow", "127.0.0.1")
    sub = subscriber("fail")
    assert api.post("subscribe", topic=topic, url=sub.url)[0] == 200
    ids = {api.send(topic, msg=str(i))["msgId"] for i in range(5)}
    sub.wait_received(5)
    sub.mode("ok")
    for msg_id in ids:
        assert api.wait_status(topic, msg_id, {ACKED}, timeout_s=15)["status"] == ACKED


def test_a_subscription_survives_a_kill(serve, subscriber, topic):
    api = serve("--push-allow", "127.0.0.1")
    sub = subscriber()
    assert api.post("subscribe", topic=topic, url=sub.url)[0] == 200
    api.server.kill()
    api = serve("--push-allow", "127.0.0.1")
    sent = api.send(topic, msg="after")
    sub.wait_received(1)
    assert api.wait_status(topic, sent["msgId"], {ACKED})["status"] == ACKED


def test_a_host_not_allowed_is_refused(serve, subscriber, topic):
    api = serve("--push-allow", "10.0.0.0/8")
    code, body = api.post("subscribe", topic=topic, url="http://127.0.0.1:9/hook")
    assert code == 403 and "--push-allow" in body["msg"]
    assert http_status(api, "subscribe", topic=topic, url="http://127.0.0.1:9/hook") == 200


def test_a_name_resolving_to_an_address_not_allowed_is_refused_at_connect_time(serve, subscriber, topic):
    api = serve("--push-allow", "10.0.0.0/8")
    sub = subscriber()
    url = f"http://localhost:{sub.port}/hook"  # allowed by no name; resolves to loopback, not in 10/8
    assert api.post("subscribe", topic=topic, url=url)[0] == 200
    api.send(topic, msg="x")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = api.get("getSubscription", topic=topic)[1]["data"]["health"]
        if health and health["failures"].get("not allowed"):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("no refusal recorded")
    assert sub.received() == []


def test_a_redirect_is_not_followed(serve, subscriber, topic):
    api = serve("--push-allow", "127.0.0.1")
    sub = subscriber("redirect")
    assert api.post("subscribe", topic=topic, url=sub.url)[0] == 200
    api.send(topic, msg="x")
    sub.wait_received(1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = api.get("getSubscription", topic=topic)[1]["data"]["health"]
        if health and health["failures"].get("redirect"):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("no redirect failure recorded")
    assert all(g["path"] == "/hook" for g in sub.received())


def test_a_failed_delivery_waits_for_its_retry_out_of_flight(serve, subscriber, topic):
    """A failed delivery goes back to waiting (status 1) for its retry time,
    as a nack with a delay: nothing of it in flight meanwhile; delivered
    again, and acked, once the subscriber answers 2xx."""
    api = serve("--push-allow", "127.0.0.1")
    sub = subscriber("fail")
    assert api.post("subscribe", topic=topic, url=sub.url)[0] == 200
    sent = api.send(topic, msg="x", maxRetry=10)
    sub.wait_received(1)
    waiting = api.wait_status(topic, sent["msgId"], {1}, timeout_s=10)
    assert waiting["status"] == 1 and waiting["retry"] >= 1 and waiting["triggerTime"] > sent["triggerTime"]
    health = api.get("getSubscription", topic=topic)[1]["data"]["health"]
    assert health["inFlight"] == 0 and health["failures"]["status"] >= 1
    sub.mode("ok")
    assert api.wait_status(topic, sent["msgId"], {ACKED}, timeout_s=15)["status"] == ACKED
    assert len(sub.received()) >= 2
