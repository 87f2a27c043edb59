"""Every endpoint of docs/api.md, over HTTP, on one real `hourglass serve`
process (fresh topic names per test). The transitions that wait on time
(delays, ack timeouts, ttls, long polls) are tested on a fake clock in
tests/unit/test_broker_lifecycle.py, and end to end on every backend in
tests/conformance/test_conformance_lifecycle.py."""

import json
import time
import urllib.parse
import uuid

import pytest
from serving import MonitorWatch, Server, request

pytestmark = pytest.mark.slow

MAX_MSG_BYTES = 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server.start(tmp_path_factory.mktemp("api") / "data", "--max-msg-bytes", str(MAX_MSG_BYTES),
                          "--monitor-interval-s", "1")
    yield server
    assert server.stop() == 0


@pytest.fixture
def topic():
    return "t-" + uuid.uuid4().hex[:12]


def send(server, topic, msg="m", **params):
    status, body = server.post("sendMsg", topic=topic, msg=msg, **params)
    assert status == 200, body
    return body["delayMsg"]


def pull(server, topic, **params):
    status, body = server.post("pullMsg", topic=topic, **params)
    assert status == 200, body
    return body["delayMsgList"]


def get(server, topic, msg_id):
    status, body = server.post("getMsg", topic=topic, msgId=msg_id)
    return body["delayMsg"] if status == 200 else status


def pull_until(server, topic, count, timeout_s=5, **params):
    """Long-poll until `count` messages came (or the timeout)."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        status, body = server.post("longPollingMsg", topic=topic, batch=count - len(got),
                                   longPollingTimeoutMillis=500, **params)
        assert status == 200, body
        got += body["delayMsgList"]
    return got


def info(server, topic):
    status, body = server.get("getTopicInfo", topic=topic)
    return body["data"] if status == 200 else status


# -- send ------------------------------------------------------------------------


def test_send_answers_camellia_delay_msg(server, topic):
    before = int(time.time() * 1000)
    m = send(server, topic, "hello", msgId="a", delayMillis=5000, ttlMillis=7000, maxRetry=2)
    assert set(m) == {"topic", "msgId", "msg", "produceTime", "triggerTime", "expireTime", "maxRetry", "retry",
                      "status", "priority", "tag", "key"}
    assert (m["topic"], m["msgId"], m["msg"], m["maxRetry"], m["retry"], m["status"]) == (topic, "a", "hello", 2, 0, 1)
    assert before <= m["produceTime"] <= int(time.time() * 1000)
    assert m["triggerTime"] == m["produceTime"] + 5000 and m["expireTime"] == m["triggerTime"] + 7000
    assert get(server, topic, "a") == m


def test_defaults_apply_to_absent_empty_or_negative(server, topic):
    m = send(server, topic, msgId="d", ttlMillis="", maxRetry=-1)
    assert m["maxRetry"] == 10 and m["expireTime"] - m["triggerTime"] == 3_600_000
    m = send(server, topic, msgId="d2", ttlMillis=-5)
    assert m["expireTime"] - m["triggerTime"] == 3_600_000


def test_server_made_ids_are_unique(server, topic):
    ids = {send(server, topic)["msgId"] for _ in range(5)}
    assert len(ids) == 5 and all(ids)


def test_duplicate_id_answers_the_stored_message_unchanged(server, topic):
    first = send(server, topic, "one", msgId="x", delayMillis=60000)
    again = send(server, topic, "two", msgId="x", delayMillis=1)
    assert again == first
    assert info(server, topic)["waitingQueueSize"] == 1


def test_absolute_trigger_time_wins(server, topic):
    trigger = int(time.time() * 1000) + 3_600_000
    m = send(server, topic, msgId="abs", triggerTime=trigger, delayMillis=5)
    assert m["triggerTime"] == trigger


def test_json_body_and_batch(server, topic):
    status, body = server.post_json("sendMsg", {"topic": topic, "msg": "j", "msgId": "j1", "delayMillis": 10})
    assert status == 200 and body["delayMsg"]["msgId"] == "j1"
    status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "b0", "msgId": "b0"}, {"msg": "b1", "msgId": "b1", "delayMillis": 60000, "priority": 3},
        {"msg": "dup", "msgId": "j1"}]})
    assert status == 200
    listed = body["delayMsgList"]
    assert [m["msgId"] for m in listed] == ["b0", "b1", "j1"]
    assert listed[1]["priority"] == 3 and listed[2]["msg"] == "j"  # the stored one, unchanged


def test_a_bad_batch_item_stores_nothing(server, topic):
    status, body = server.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "ok", "msgId": "ok1"}, {"msg": "bad", "msgId": "bad", "delayMillis": "soon"}]})
    assert status == 400 and "msgs[1].delayMillis" in body["msg"]
    assert get(server, topic, "ok1") == 404
    assert info(server, topic)["waitingQueueSize"] == 0


# -- pull and ack (what waits on time, on a fake clock: tests/unit/test_broker_lifecycle.py) ----


def test_ack_of_waiting_message_acks_it(server, topic):
    send(server, topic, msgId="w", delayMillis=600000)
    status, body = server.post("ackMsg", topic=topic, msgId="w")
    assert status == 200, body
    assert get(server, topic, "w")["status"] == 4


def test_pull_of_unknown_topic_is_empty(server, topic):
    assert pull(server, topic) == []


# -- delete, get ------------------------------------------------------------------------------


def test_delete_with_release_forgets_the_id(server, topic):
    send(server, topic, "old", msgId="x", delayMillis=600000)
    assert server.post("deleteMsg", topic=topic, msgId="x", release="true")[0] == 200
    assert get(server, topic, "x") == 404
    assert send(server, topic, "new", msgId="x")["msg"] == "new"


def test_unknown_message_is_404_in_the_body_and_its_ack_no_error(server, topic):
    for endpoint in ("getMsg", "deleteMsg"):
        status, body = server.post(endpoint, topic=topic, msgId="nope")
        assert status == 404 and body["code"] == 404 and server.http_status == 200
    assert server.post("ackMsg", topic=topic, msgId="nope")[0] == 200


# -- topic info, monitor data -----------------------------------------------------------------


def test_topic_info_buckets_and_list(server, topic):
    minute = 60_000
    for i, delay in enumerate([0.5 * minute, 5 * minute, 20 * minute, 45 * minute, 3 * 60 * minute,
                               12 * 60 * minute, 3 * 1440 * minute, 20 * 1440 * minute, 40 * 1440 * minute]):
        send(server, topic, msgId=f"m{i}", delayMillis=int(delay))
    data = info(server, topic)
    assert data["topic"] == topic and data["waitingQueueSize"] == 9
    assert list(data["waitingQueueInfo"].values()) == [1] * 9
    assert list(data["waitingQueueInfo"]) == [
        "sizeOf0To1min", "sizeOf1minTo10min", "sizeOf10minTo30min", "sizeOf30minTo1hour", "sizeOf1hourTo6hour",
        "sizeOf6hourTo1day", "sizeOf1dayTo7day", "sizeOf7dayTo30day", "sizeOf30dayToInfinite"]
    assert (data["readyQueueSize"], data["ackQueueSize"]) == (0, 0)
    status, body = server.get("getTopicInfoList")
    assert status == 200 and any(d["topic"] == topic and d["waitingQueueSize"] == 9 for d in body["data"])
    assert info(server, "never-" + topic)["waitingQueueSize"] == 0  # camellia: zeros


def test_topic_info_list_classifies_each_topic_apart(server, topic):
    """getTopicInfoList reads an hour that straddles a bucket edge once for
    every topic: each topic still gets only its own messages' buckets."""
    minute = 60_000
    others = [f"{topic}-{k}" for k in range(3)]
    for k, other in enumerate(others):
        for i, delay in enumerate([0.5 * minute, 5 * minute, 20 * minute, 45 * minute, 3 * 60 * minute][k:]):
            send(server, other, msgId=f"m{i}", delayMillis=int(delay))
    status, body = server.get("getTopicInfoList")
    assert status == 200
    listed = {d["topic"]: d for d in body["data"] if d["topic"] in others}
    assert sorted(listed) == others
    for other in others:
        alone = info(server, other)
        assert listed[other]["waitingQueueInfo"] == alone["waitingQueueInfo"]
        assert sum(alone["waitingQueueInfo"].values()) == alone["waitingQueueSize"] == 5 - others.index(other)


def test_monitor_data_shape(server, topic):
    with MonitorWatch(server) as watch:
        send(server, topic, msgId="a")
        pull_until(server, topic, 1)
        server.post("ackMsg", topic=topic, msgId="a")
        totals = watch.totals(topic, {"sendMsg": 1, "pullMsg": 1, "ackMsg": 1, "triggerMsgReady": 1})
    assert totals == {"sendMsg": 1, "pullMsg": 1, "deleteMsg": 0, "ackMsg": 1, "getMsg": 0,
                      "triggerMsgReady": 1, "triggerMsgEndLife": 0, "triggerMsgTimeout": 0}
    last = watch.intervals[-1]
    assert set(last) == {"requestStatsList", "pullMsgTimeGapStatsList", "readyQueueTimeGapStatsList",
                         "intervalStartTime", "intervalEndTime"}
    assert set(watch.sums(topic, "pullMsgTimeGapStatsList")) == {"count", "avg", "max"}


def test_prometheus_metrics(server, topic):
    send(server, topic, msgId="a", delayMillis=600000)
    status, text = server.get("/metrics")
    text = text.decode()
    assert status == 200
    assert f'hourglass_sends_total{{topic="{topic}"}} 1' in text
    assert f'hourglass_waiting_messages{{topic="{topic}"}} 1' in text
    assert 'hourglass_release_lateness_seconds_bucket{cause="load",' in text and "hourglass_fsync_seconds_count" in text


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("params", "named"), [
    ({"msg": "x"}, "topic"),
    ({"topic": "T"}, "msg"),
    ({"topic": "T", "msg": ""}, "msg"),
    ({"topic": "T", "msg": "x", "delayMillis": "1.5"}, "delayMillis"),
    ({"topic": "T", "msg": "x", "ttlMillis": "abc"}, "ttlMillis"),
    ({"topic": "T", "msg": "x", "priority": "99999"}, "priority"),
    ({"topic": "T", "msg": "x", "triggerTime": "253402300800000"}, "triggerTime"),
    ({"topic": "T", "msg": "x", "tag": "a,b"}, "tag"),
    ({"topic": "x" * 1025, "msg": "x"}, "topic"),
])
def test_bad_send_parameters_are_named_and_nothing_is_stored(server, topic, params, named):
    params = {k: (topic if v == "T" else v) for k, v in params.items()}
    status, body = server.post("sendMsg", msgId="bad", **params)
    assert status == 400 and body["code"] == 400 and body["msg"].startswith(named), body
    assert get(server, topic, "bad") == 404


def test_message_size_limit_counts_utf8_bytes(server, topic):
    at_limit = "é" * (MAX_MSG_BYTES // 2)
    assert send(server, topic, at_limit, msgId="fits")["msg"] == at_limit
    status, body = server.post("sendMsg", topic=topic, msg=at_limit + "x", msgId="big")
    assert status == 413 and body["code"] == 413 and "msg" in body["msg"]
    assert get(server, topic, "big") == 404


def test_oversized_body_is_refused_before_it_is_read(server, topic):
    data = b"topic=" + topic.encode() + b"&msg=" + b"x" * (4 * MAX_MSG_BYTES + 70_000)
    status, body = request(server.base + "/camellia/delayQueue/sendMsg", data=data,
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 413 and json.loads(body)["code"] == 413


def test_invalid_utf8_is_400_and_nothing_is_stored(server, topic):
    data = b"topic=" + topic.encode() + b"&msgId=u&msg=%ff%fe"
    status, body = request(server.base + "/camellia/delayQueue/sendMsg", data=data,
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200 and json.loads(body)["code"] == 400 and "msg" in json.loads(body)["msg"]
    assert get(server, topic, "u") == 404
    status, body = request(server.base + "/camellia/delayQueue/sendMsg", data=b'{"topic": "\xff"}',
                           headers={"Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["code"] == 400


def test_bad_json_and_wrong_method_answer_json(server, topic):
    status, body = request(server.base + "/camellia/delayQueue/sendMsgBatch", data=b"[1,2",
                           headers={"Content-Type": "application/json"})
    assert status == 200 and json.loads(body)["code"] == 400
    status, body = server.get("sendMsg", topic=topic)
    assert status == 405 and body["code"] == 405
    status, body = server.get("noSuchEndpoint")
    assert status == 404 and body["code"] == 404


def test_pull_parameters_validated(server, topic):
    status, body = server.post("pullMsg", topic=topic, batch="many")
    assert status == 400 and body["msg"].startswith("batch")
    status, body = server.post("pullMsg", topic=topic, batch="-1", ackTimeoutMillis="")
    assert status == 200  # negative or empty: the default
    status, body = server.post("longPollingMsg", topic=topic, longPollingTimeoutMillis="x")
    assert status == 400 and body["msg"].startswith("longPollingTimeoutMillis")


def test_get_query_string_parameters(server, topic):
    send(server, topic, msgId="q", delayMillis=600000)
    query = urllib.parse.urlencode({"topic": topic})
    status, body = request(server.base + "/camellia/delayQueue/getTopicInfo?" + query)
    assert status == 200 and json.loads(body)["data"]["waitingQueueSize"] == 1


def test_deeply_nested_json_is_refused_before_it_is_decoded(server, topic):
    status, body = request(server.base + "/camellia/delayQueue/sendMsg", data=b"[" * 50000,
                           headers={"Content-Type": "application/json"})
    assert status == 413 and "JSON marks" in json.loads(body)["msg"]  # broker.core.bodies


def test_a_message_at_the_limit_fits_however_it_is_escaped(server, topic):
    at_limit = "\x01" * MAX_MSG_BYTES  # six bytes each in JSON
    status, body = server.post_json("sendMsg", {"topic": topic, "msg": at_limit, "msgId": "esc"})
    assert status == 200, body
