"""Limits of what a request may make the node keep or decode, the same on
every backend (see conftest): metric labels, the topic cap, ttl maxima,
form pairs, batch size and JSON structure."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from serving import PREFIX, request

from broker.bodies import BodyLimits
from broker.params import Defaults

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
