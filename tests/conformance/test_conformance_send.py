"""Sending, reading and bad input, the same on every backend (see conftest)."""

import json
import re
import time

import pytest
from serving import MonitorWatch, request

pytestmark = pytest.mark.slow

DELAY_MSG_KEYS = {"topic", "msgId", "msg", "produceTime", "triggerTime", "expireTime", "maxRetry", "retry",
                  "status", "priority", "tag", "key"}


def test_send_answers_camellia_delay_msg(api, topic):
    before = int(time.time() * 1000)
    m = api.send(topic, "hello", msgId="a", delayMillis=5000, ttlMillis=7000, maxRetry=2, priority=3, tag="x")
    assert set(m) == DELAY_MSG_KEYS
    assert (m["topic"], m["msgId"], m["msg"], m["maxRetry"], m["retry"], m["status"], m["priority"], m["tag"]) == \
        (topic, "a", "hello", 2, 0, 1, 3, "x")
    assert before <= m["produceTime"] <= int(time.time() * 1000)
    assert m["triggerTime"] == m["produceTime"] + 5000 and m["expireTime"] == m["triggerTime"] + 7000
    assert api.message(topic, "a") == m


def test_a_due_message_is_answered_ready(api, topic):
    assert api.send(topic, msgId="now")["status"] == 2  # as camellia: due now is ready at once
    assert api.message(topic, "now")["status"] == 2


def test_defaults_apply_to_absent_empty_or_negative(api, topic):
    m = api.send(topic, msgId="d", ttlMillis="", maxRetry=-1)
    assert m["maxRetry"] == 10 and m["expireTime"] - m["triggerTime"] == 3_600_000
    assert (m["priority"], m["tag"]) == (0, "")
    m = api.send(topic, msgId="d2", ttlMillis=-5, maxRetry=0)
    assert m["expireTime"] - m["triggerTime"] == 3_600_000 and m["maxRetry"] == 0


def test_server_made_ids_are_unique(api, topic):
    ids = {api.send(topic)["msgId"] for _ in range(5)}
    assert len(ids) == 5 and all(ids)


def test_duplicate_id_answers_the_stored_message_unchanged(api, topic):
    first = api.send(topic, "one", msgId="x", delayMillis=60000, priority=2)
    again = api.send(topic, "two", msgId="x", delayMillis=1, priority=9)
    assert again == first
    assert api.info(topic)["waitingQueueSize"] == 1


def test_absolute_trigger_time_wins(api, topic):
    trigger = int(time.time() * 1000) + 3_600_000
    assert api.send(topic, msgId="abs", triggerTime=trigger, delayMillis=5)["triggerTime"] == trigger


def test_json_body_and_batch_in_order_with_duplicates(api, topic):
    status, body = api.post_json("sendMsg", {"topic": topic, "msg": "j", "msgId": "j1", "delayMillis": 10})
    assert status == 200 and body["delayMsg"]["msgId"] == "j1"
    status, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "b0", "msgId": "b0"}, {"msg": "b1", "msgId": "b1", "delayMillis": 60000, "priority": 3},
        {"msg": "dup", "msgId": "j1"}, {"msg": "b0 again", "msgId": "b0"}]})
    assert status == 200
    listed = body["delayMsgList"]
    assert [m["msgId"] for m in listed] == ["b0", "b1", "j1", "b0"]
    assert [m["msg"] for m in listed] == ["b0", "b1", "j", "b0"]  # a known id: the stored message, unchanged
    assert listed[1]["priority"] == 3 and listed[3] == listed[0]


def test_a_fair_key_is_kept_and_shown_only_when_given(api, topic):
    sent = api.send(topic, msgId="f", fairKey="tenant-ä")
    assert sent["fairKey"] == "tenant-ä" and set(sent) == DELAY_MSG_KEYS | {"fairKey"}
    assert api.send(topic, msgId="n").keys() == DELAY_MSG_KEYS
    status, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "b", "msgId": "b0", "fairKey": "B"}, {"msg": "b", "msgId": "b1"}]})
    assert status == 200 and [m.get("fairKey") for m in body["delayMsgList"]] == ["B", None]
    assert api.message(topic, "f")["fairKey"] == "tenant-ä"
    assert {m["msgId"]: m.get("fairKey") for m in api.pull(topic, batch=10)} == \
        {"f": "tenant-ä", "n": None, "b0": "B", "b1": None}
    status, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "ok", "msgId": "ok"}, {"msg": "bad", "msgId": "bad", "fairKey": "x" * 65}]})
    assert status == 400 and body["msg"].startswith("msgs[1].fairKey"), body
    assert api.message(topic, "ok") == 404


def test_a_bad_batch_item_stores_nothing(api, topic):
    status, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "ok", "msgId": "ok1"}, {"msg": "bad", "msgId": "bad", "delayMillis": "soon"}]})
    assert status == 400 and body["msg"].startswith("msgs[1].delayMillis")
    assert api.message(topic, "ok1") == 404
    assert api.is_empty(topic)


@pytest.mark.parametrize(("params", "named"), [
    ({"msg": "x"}, "topic"),
    ({"topic": "T"}, "msg"),
    ({"topic": "T", "msg": ""}, "msg"),
    ({"topic": "T", "msg": "x", "delayMillis": "1.5"}, "delayMillis"),
    ({"topic": "T", "msg": "x", "ttlMillis": "abc"}, "ttlMillis"),
    ({"topic": "T", "msg": "x", "maxRetry": "x"}, "maxRetry"),
    ({"topic": "T", "msg": "x", "priority": "99999"}, "priority"),
    ({"topic": "T", "msg": "x", "triggerTime": "253402300800000"}, "triggerTime"),
    ({"topic": "T", "msg": "x", "tag": "a,b"}, "tag"),
    ({"topic": "x" * 1025, "msg": "x"}, "topic"),
])
def test_bad_send_parameters_are_named_and_nothing_is_stored(api, topic, params, named):
    params = {k: (topic if v == "T" else v) for k, v in params.items()}
    status, body = api.post("sendMsg", msgId="bad", **params)
    assert status == 400 and body["code"] == 400 and body["msg"].startswith(named), body
    assert api.server.http_status == 200  # as camellia: the code is in the body
    assert api.message(topic, "bad") == 404
    assert api.is_empty(topic)


def test_message_size_limit_counts_utf8_bytes(api, topic):
    at_limit = "é" * (api.max_msg_bytes // 2)
    assert api.send(topic, at_limit, msgId="fits")["msg"] == at_limit
    assert api.message(topic, "fits")["msg"] == at_limit
    status, body = api.post("sendMsg", topic=topic, msg=at_limit + "x", msgId="big")
    assert status == 413 and body["code"] == 413 and "msg" in body["msg"]
    assert api.server.http_status == 200
    assert api.message(topic, "big") == 404


def test_invalid_utf8_and_bad_json_are_400_and_store_nothing(api, topic):
    base = api.server.base + "/camellia/delayQueue/"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, body = request(base + "sendMsg", data=b"topic=" + topic.encode() + b"&msgId=u&msg=%ff%fe", headers=form)
    assert status == 200 and json.loads(body)["code"] == 400 and json.loads(body)["msg"].startswith("msg")
    assert api.message(topic, "u") == 404
    for raw in (b"[1,2", b"[" * 500, b'{"topic": "\xff", "msg": "x"}'):
        for endpoint in ("sendMsg", "sendMsgBatch"):
            status, body = request(base + endpoint, data=raw, headers={"Content-Type": "application/json"})
            answer = json.loads(body)
            assert status == 200 and answer["code"] == 400 and answer["msg"].startswith("body"), (raw[:10], endpoint)
    deep = b"[" * 50000  # more JSON marks than any body but a batch's may hold: HTTP 413, undecoded (broker.core.bodies)
    status, body = request(base + "sendMsg", data=deep, headers={"Content-Type": "application/json"})
    assert status == 413 and "JSON marks" in json.loads(body)["msg"]
    status, body = request(base + "sendMsgBatch", data=deep, headers={"Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["code"] == 400 and json.loads(body)["msg"].startswith("body")
    assert api.is_empty(topic)


def test_an_oversized_body_is_refused_before_it_is_read(api, topic):
    data = b"topic=" + topic.encode() + b"&msg=" + b"x" * (7 * api.max_msg_bytes + 70_000)
    status, body = request(api.server.base + "/camellia/delayQueue/sendMsg", data=data,
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 413 and json.loads(body)["code"] == 413  # HTTP 413: refused before it is read
    assert api.is_empty(topic)


def test_a_message_at_the_limit_fits_however_it_is_escaped(api, topic):
    at_limit = "\x01" * api.max_msg_bytes  # six bytes each in JSON
    status, body = api.post_json("sendMsg", {"topic": topic, "msg": at_limit, "msgId": "esc"})
    assert status == 200, body
    assert api.message(topic, "esc")["msg"] == at_limit


def test_wrong_method_and_unknown_path_answer_json(api, topic):
    status, body = api.get("sendMsg", topic=topic)
    assert status == 405 and body["code"] == 405
    status, body = api.get("noSuchEndpoint")
    assert status == 404 and body["code"] == 404


def test_pull_parameters_validated(api, topic):
    status, body = api.post("pullMsg", topic=topic, batch="many")
    assert status == 400 and body["msg"].startswith("batch")
    status, body = api.post("pullMsg", topic=topic, batch="-1", ackTimeoutMillis="")
    assert status == 200 and body["delayMsgList"] == []  # negative or empty: the default
    status, body = api.post("longPollingMsg", topic=topic, longPollingTimeoutMillis="x")
    assert status == 400 and body["msg"].startswith("longPollingTimeoutMillis")
    status, body = api.post("ackMsg", topic=topic, msgId="a", ack="maybe")
    assert status == 400 and body["msg"].startswith("ack")
    for endpoint in ("getMsg", "ackMsg", "deleteMsg"):
        status, body = api.post(endpoint, topic=topic)
        assert status == 400 and body["msg"].startswith("msgId"), (endpoint, body)


def test_unknown_message_is_404_for_get_and_delete_and_no_error_for_ack(api, topic):
    api.send(topic, msgId="other")
    for endpoint in ("getMsg", "deleteMsg"):
        status, body = api.post(endpoint, topic=topic, msgId="nope")
        assert status == 404 and body["code"] == 404, endpoint
        assert api.server.http_status == 200  # camellia's SDK: null / false, not an exception
    for ack in ("true", "false"):  # camellia answers 200 to an ack or nack of an unknown id
        status, body = api.post("ackMsg", topic=topic, msgId="nope", ack=ack)
        assert status == 200 and body["code"] == 200, body


def test_topic_info_shape_buckets_and_list(api, topic):
    minute = 60_000
    for i, delay in enumerate([0.5 * minute, 5 * minute, 20 * minute, 45 * minute, 3 * 60 * minute,
                               12 * 60 * minute, 3 * 1440 * minute, 20 * 1440 * minute, 40 * 1440 * minute]):
        api.send(topic, msgId=f"m{i}", delayMillis=int(delay))
    data = api.info(topic)
    # hourglass's fields (docs/api.md, "Topics and monitoring"), on every backend
    flow = {"dueUndelivered": 0, "oldestDueAgeMillis": 0, "paused": False,
            # the disk backend's longest-held consuming message (docs/api.md, "Leases"); Redis keeps none
            **({"longestHeldMillis": 0} if api.backend == "disk" else {})}
    assert data == {"topic": topic, "waitingQueueSize": 9, "readyQueueSize": 0, "ackQueueSize": 0, **flow,
                    "waitingQueueInfo": {
                        "sizeOf0To1min": 1, "sizeOf1minTo10min": 1, "sizeOf10minTo30min": 1,
                        "sizeOf30minTo1hour": 1, "sizeOf1hourTo6hour": 1, "sizeOf6hourTo1day": 1,
                        "sizeOf1dayTo7day": 1, "sizeOf7dayTo30day": 1, "sizeOf30dayToInfinite": 1}}
    assert list(data["waitingQueueInfo"]) == [
        "sizeOf0To1min", "sizeOf1minTo10min", "sizeOf10minTo30min", "sizeOf30minTo1hour", "sizeOf1hourTo6hour",
        "sizeOf6hourTo1day", "sizeOf1dayTo7day", "sizeOf7dayTo30day", "sizeOf30dayToInfinite"]
    status, body = api.get("getTopicInfoList")
    assert status == 200 and [d for d in body["data"] if d["topic"] == topic] == [data]
    assert api.info("never-" + topic) == {  # as camellia: 200 with zeros
        "topic": "never-" + topic, "waitingQueueSize": 0, "readyQueueSize": 0, "ackQueueSize": 0, **flow,
        "waitingQueueInfo": {name: 0 for name in data["waitingQueueInfo"]}}
    status, body = api.get("getTopicInfo")
    assert status == 400 and body["msg"].startswith("topic")


def test_topic_info_counts_ready_and_consuming(api, topic):
    api.send(topic, msgId="c")
    api.send(topic, msgId="r", priority=-1)
    api.send(topic, msgId="w", delayMillis=600_000)
    assert [m["msgId"] for m in api.pull_until(topic, 1)] == ["c"]
    api.wait_status(topic, "r", {2})
    data = api.info(topic)
    assert (data["waitingQueueSize"], data["readyQueueSize"], data["ackQueueSize"]) == (1, 1, 1)


def test_monitor_data_counts_requests_and_transitions(api, topic):
    """Per interval, as camellia's monitor: the calls' counts are summed
    over the intervals they spanned, and a later interval has none."""
    with MonitorWatch(api.server) as watch:
        api.send(topic, msgId="a")
        api.send(topic, msgId="a")  # a duplicate: camellia counts every send answered 200
        api.send(topic, msgId="b", maxRetry=0)
        assert len(api.pull_until(topic, 2)) == 2
        api.post("ackMsg", topic=topic, msgId="a")
        api.post("ackMsg", topic=topic, msgId="b", ack="false")  # maxRetry=0: ended; a nack is an ackMsg call
        api.message(topic, "a")
        totals = watch.totals(topic, {"sendMsg": 3, "pullMsg": 2, "ackMsg": 2, "getMsg": 1, "triggerMsgReady": 2,
                                      "triggerMsgEndLife": 1})
        assert totals == {"sendMsg": 3, "pullMsg": 2, "deleteMsg": 0, "ackMsg": 2, "getMsg": 1,
                          "triggerMsgReady": 2, "triggerMsgEndLife": 1, "triggerMsgTimeout": 0}
        for name in ("pullMsgTimeGapStatsList", "readyQueueTimeGapStatsList"):
            gaps = watch.sums(topic, name)
            assert set(gaps) == {"count", "avg", "max"} and gaps["count"] == 2
        later = watch.wait_intervals(1)[0]  # counts reset: nothing happened in it
        assert topic not in {s["topic"] for s in later["requestStatsList"] + later["pullMsgTimeGapStatsList"]}


def test_prometheus_counters(api, topic):
    api.send(topic, msgId="a", delayMillis=600000)
    status, text = api.get("/metrics")
    assert status == 200
    assert f'hourglass_sends_total{{topic="{topic}"}} 1' in text.decode()


def test_prometheus_gauges(api, topic):
    api.send(topic, msgId="a", delayMillis=600000)
    text = api.get("/metrics")[1].decode()
    assert f'hourglass_waiting_messages{{topic="{topic}"}} 1' in text
    assert 'hourglass_release_lateness_seconds_bucket{cause="load",' in text
    assert 'hourglass_release_lateness_seconds_count{cause="smoothing"}' in text and "hourglass_fsync_seconds_count" in text


def metric(text: str, series: str) -> float | None:
    """The value of `series` (name and labels as written) in a scrape; None: absent."""
    found = re.search("^" + re.escape(series) + " (\\S+)$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def test_due_messages_and_the_oldest_ones_age_in_topic_info_and_metrics_and_an_acks_dwell(api, topic):
    """getTopicInfo's dueUndelivered and oldestDueAgeMillis (the oldest found
    past a message of higher priority), /metrics' gauges of them (a node of
    shards: summed, the largest), and the dwell of acks of due messages only."""
    now = int(time.time() * 1000)
    api.send(topic, msgId="urgent", priority=5, triggerTime=now - 2_000)
    api.send(topic, msgId="old", triggerTime=now - 7_000)
    api.send(topic, msgId="later", delayMillis=600_000)
    deadline = time.monotonic() + 5
    while (info := api.info(topic))["dueUndelivered"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert info["dueUndelivered"] == 2 == info["readyQueueSize"], info
    assert 7_000 <= info["oldestDueAgeMillis"] < 60_000, info
    text = api.get("/metrics")[1].decode()
    assert metric(text, f'hourglass_topic_due_undelivered{{topic="{topic}"}}') == 2
    age = metric(text, f'hourglass_topic_oldest_due_age_seconds{{topic="{topic}"}}')
    assert age is not None and 7.0 <= age < 60.0, text

    before = metric(text, "hourglass_dwell_seconds_count")
    pulled = api.pull(topic, batch=1)  # the urgent one, by priority: "old" stays READY
    assert [m["msgId"] for m in pulled] == ["urgent"]
    for msg_id in ("urgent", "old", "later"):  # consuming, ready, waiting
        assert api.post("ackMsg", topic=topic, msgId=msg_id)[0] == 200
    text = api.get("/metrics")[1].decode()
    assert metric(text, "hourglass_dwell_seconds_count") == before + 2  # not the one acked before it was due
    assert metric(text, f'hourglass_topic_due_undelivered{{topic="{topic}"}}') in (0, None)


def test_get_query_string_parameters(api, topic):
    api.send(topic, msgId="q", delayMillis=600000)
    status, body = api.get("getTopicInfo", topic=topic)
    assert status == 200 and body["data"]["waitingQueueSize"] == 1
