"""Limits of what a request may make the node keep or decode, the same on
every backend (see conftest): metric labels, the topic cap, the size of
/metrics, ttl maxima, form pairs, batch size and JSON structure."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
import uuid

import pytest
from serving import PREFIX, request

from broker.core.bodies import BodyLimits
from broker.core.params import Defaults

pytestmark = pytest.mark.slow


def metrics_topics(api) -> set[str]:
    status, text = api.get("/metrics")
    assert status == 200
    return set(re.findall(r'topic="([^"]*)"', text.decode()))


def test_calls_on_unknown_topics_add_no_metric_labels(api, topic):
    api.send(topic, msgId="a")
    assert api.message(topic, "a")["msgId"] == "a"
    before = metrics_topics(api)
    assert topic in before
    unknown = [f"nowhere-{uuid.uuid4().hex}" for _ in range(200)]
    for name in unknown:
        for call in ("getMsg", "pullMsg", "ackMsg"):
            code, body = api.post(call, topic=name, msgId="x")
            assert api.server.http_status == 200 and code in (200, 404), body
    after = metrics_topics(api)
    assert after.isdisjoint(unknown)
    _, body = api.get("getMonitorData")
    assert {s["topic"] for s in body["data"]["requestStatsList"]}.isdisjoint(unknown)
    _, text = api.get("/metrics")
    assert re.search(rf'hourglass_gets_total{{topic="{topic}"}} 1\b', text.decode())  # real topics still count


def test_a_send_to_a_new_topic_past_max_topics_is_429_and_stores_nothing(serve, topic):
    api = serve("--max-topics", "2", own_state=True)
    one, two, three = (f"{topic}-{i}" for i in range(3))
    api.send(one, msgId="a")
    api.send(two, msgId="b", delayMillis=600_000)
    status, body = api.post("sendMsg", topic=three, msgId="c", msg="m")
    assert (status, api.server.http_status) == (429, 429) and body["code"] == 429, body
    assert "--max-topics is 2" in body["msg"]
    status, body = api.post_json("sendMsgBatch", {"topic": three, "msgs": [{"msg": "m", "msgId": "d"}]})
    assert status == 429 and body["code"] == 429 and "--max-topics" in body["msg"], body
    assert api.message(three, "c") == 404 and api.message(three, "d") == 404
    assert api.is_empty(three)
    _, body = api.get("getTopicInfoList")
    assert sorted(info["topic"] for info in body["data"]) == [one, two]
    api.send(one, msgId="again")  # the topics it has still take sends
    assert re.search(rb"^hourglass_topics 2$", api.get("/metrics")[1], re.MULTILINE)


TOPICS = 3_000  # with 1 KiB names: /metrics was 86 MB, and took the loop for 0.7 s
SHOWN = 100  # --metrics-topics, default
METRICS_BOUND_BYTES = 1_000_000


def send_all(server, sends: list[dict]) -> None:
    """sendMsg of each, on one kept-alive connection."""
    host, port = server.base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        for params in sends:
            conn.request("POST", PREFIX + "sendMsg", urllib.parse.urlencode(params),
                         {"Content-Type": "application/x-www-form-urlencoded"})
            answer = conn.getresponse()
            body = json.loads(answer.read())
            assert answer.status == 200 and body["code"] == 200, body
    finally:
        conn.close()


def test_metrics_stay_bounded_with_thousands_of_long_topic_names(serve):
    """3,000 topics of 1 KiB names: /metrics shows the --metrics-topics
    (100) with the largest backlogs, their labels cut to 128 characters,
    and counts every topic in the node's sums; it stays under 1 MB."""
    api = serve(own_state=True)

    def name(kind: str, i: int) -> str:
        return f"{kind}-{i:05d}-".ljust(1024, "x")
    heavy = [name("heavy", i) for i in range(SHOWN)]  # two messages each; the others one
    sends = [{"topic": t, "msg": "m", "msgId": f"{n}", "delayMillis": 600_000} for t in heavy for n in range(2)]
    sends += [{"topic": name("light", i), "msg": "m", "delayMillis": 600_000} for i in range(TOPICS - SHOWN)]
    send_all(api.server, sends)

    status, text = api.get("/metrics")
    assert status == 200 and len(text) < METRICS_BOUND_BYTES, len(text)
    text = text.decode()
    labels = re.findall(r'topic="((?:[^"\\]|\\.)*)"', text)
    assert labels and max(len(label) for label in labels) <= 128
    assert {label[:12] for label in labels} == {t[:12] for t in heavy}  # only the largest backlogs
    for family in ("hourglass_waiting_messages", "hourglass_sends_total", "topic_info"):
        shown = set(re.findall(rf'^{family}{{topic="([^"]*)"', text, re.MULTILINE))
        assert len(shown) == SHOWN, family
    node = dict(re.findall(r"^(hourglass_(?:topics\w*|node_sends_total|node_waiting_messages)) (\d+)$", text,
                           re.MULTILINE))
    assert node == {"hourglass_topics": str(TOPICS), "hourglass_topics_shown": str(SHOWN),
                    "hourglass_node_sends_total": str(len(sends)), "hourglass_node_waiting_messages": str(len(sends))}


def test_ttl_above_the_maximum_is_clamped_not_refused(api, topic):
    m = api.send(topic, msgId="long", ttlMillis=253_402_300_799_999)
    assert m["expireTime"] - m["triggerTime"] == Defaults().max_ttl_ms


def test_a_form_with_more_pairs_than_the_cap_is_413(api, topic):
    pairs = BodyLimits().max_form_pairs
    status, body = api.post("sendMsg", topic=topic, msg="m", **{f"k{i}": "" for i in range(pairs - 2)})
    assert status == 200 and body["code"] == 200, body
    status, body = api.post("sendMsg", topic=topic, msg="m", **{f"k{i}": "" for i in range(pairs - 1)})
    assert status == 413 and body["code"] == 413 and "--max-form-pairs" in body["msg"]


def test_a_batch_of_more_messages_than_the_cap_is_413_and_stores_nothing(api, topic):
    most = BodyLimits().max_batch_msgs
    status, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [{"msg": "m", "msgId": f"i{i}"} for i in range(most + 1)]})
    assert status == 413 and body["code"] == 413 and "--max-batch-msgs" in body["msg"]
    assert api.post("getMsg", topic=topic, msgId="i0")[0] == 404  # none of it stored
    status, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [{"msg": "m"}] * most})
    assert status == 200 and len(body["delayMsgList"]) == most


def test_a_batch_of_empty_objects_is_refused_before_it_is_decoded(api, topic):
    flood = b'{"topic":"' + topic.encode() + b'","msgs":[' + b"{}," * 300_000 + b"{}]}"
    status, raw = request(api.server.base + PREFIX + "sendMsgBatch", data=flood,
                          headers={"Content-Type": "application/json"})
    answer = json.loads(raw)
    assert status == 413 and answer["code"] == 413 and "JSON marks" in answer["msg"]
