"""listMsg, deleteMsgs and rescheduleMsgs (extensions: docs/api.md, Bulk
calls), the same on every backend (see conftest): messages found by key,
tag, msgId prefix, status and trigger time range, listed a page at a time in (trigger
time, msgId) order or counted, deleted or moved in one call; a bad
parameter answers code 400 naming it, and changes nothing."""

import time

import pytest

pytestmark = pytest.mark.slow

HOUR_MS = 3_600_000


def ids(messages):
    return [m["msgId"] for m in messages]


def listing(api, topic, **params):
    code, body = api.get("listMsg", topic=topic, **params)
    assert code == 200, body
    return body


def every_page(api, topic, **params):
    out, cursor = [], None
    while True:
        body = listing(api, topic, **params, **({"cursor": cursor} if cursor else {}))
        out += body["delayMsgList"]
        cursor = body["cursor"]
        if cursor is None:
            return out


def seed(api, topic):
    """12 waiting messages: a0..a5 tag x, b0..b5 tag y, triggers an hour
    apart from now + 1 h, in an order unlike their ids'."""
    now = int(time.time() * 1000)
    triggers = {}
    for i in range(6):
        for letter, tag in (("a", "x"), ("b", "y")):
            msg_id = f"{letter}{i}"
            triggers[msg_id] = now + HOUR_MS * (1 + (5 - i if letter == "a" else i))
            api.send(topic, msgId=msg_id, tag=tag, triggerTime=triggers[msg_id])
    return triggers


def test_list_pages_in_trigger_then_id_order_and_counts(api, topic):
    triggers = seed(api, topic)
    want = sorted(triggers, key=lambda i: (triggers[i], i))
    assert ids(every_page(api, topic, limit=5)) == want
    assert listing(api, topic, countOnly="true")["count"] == 12
    assert ids(every_page(api, topic, tag="x", limit=4)) == [i for i in want if i.startswith("a")]
    assert listing(api, topic, tag="y", countOnly="true")["count"] == 6
    assert ids(every_page(api, topic, msgIdPrefix="b")) == [i for i in want if i.startswith("b")]
    lo, hi = triggers["b1"], triggers["b3"]
    ranged = [i for i in want if lo <= triggers[i] < hi]
    assert ids(every_page(api, topic, triggerFrom=lo, triggerTo=hi)) == ranged
    assert listing(api, topic, triggerFrom=lo, triggerTo=hi, tag="y", countOnly="true")["count"] == 2
    assert listing(api, topic, status="4,5,6,7", countOnly="true")["count"] == 0
    code, body = api.post("listMsg", topic=topic, tag="x", limit=2)  # POST takes the same parameters
    assert code == 200 and len(body["delayMsgList"]) == 2 and body["cursor"], body
    assert listing(api, "no-such-" + topic)["delayMsgList"] == []


def test_delete_by_filter_ends_matches_and_nothing_else(api, topic):
    seed(api, topic)
    code, body = api.post("deleteMsgs", topic=topic, tag="x", limit=4)
    assert code == 200 and (body["deleted"], body["more"]) == (4, True), body
    code, body = api.post("deleteMsgs", topic=topic, tag="x")
    assert (body["deleted"], body["more"]) == (2, False), body
    assert all(api.message(topic, f"a{i}")["status"] == 7 for i in range(6))
    assert all(api.message(topic, f"b{i}")["status"] == 1 for i in range(6))
    assert listing(api, topic, countOnly="true")["count"] == 6
    assert listing(api, topic, status="7", countOnly="true")["count"] == 6
    code, body = api.post("deleteMsgs", topic=topic, all="true")
    assert body["deleted"] == 6 and listing(api, topic, countOnly="true")["count"] == 0


def test_a_deleted_consuming_message_is_never_delivered_and_its_ack_is_harmless(api, topic):
    api.send(topic, msgId="c", tag="z")
    assert ids(api.pull_until(topic, 1, ackTimeoutMillis=300)) == ["c"]
    code, body = api.post("deleteMsgs", topic=topic, tag="z")
    assert code == 200, body
    assert body["deleted"] == 1, body
    assert api.post("ackMsg", topic=topic, msgId="c")[1]["code"] == 200
    assert api.post("ackMsg", topic=topic, msgId="c", ack="false")[1]["code"] == 200
    time.sleep(0.5)  # past its ack timeout: not redelivered
    assert api.pull(topic) == [] and api.message(topic, "c")["status"] == 7


def test_reschedule_shifts_waiting_matches_and_fires_them_at_the_new_time(api, topic):
    triggers = seed(api, topic)
    code, body = api.post("rescheduleMsgs", topic=topic, tag="y", shiftMillis=HOUR_MS)
    assert code == 200 and (body["rescheduled"], body["more"]) == (6, False), body
    for i in range(6):
        assert api.message(topic, f"b{i}")["triggerTime"] == triggers[f"b{i}"] + HOUR_MS
        assert api.message(topic, f"a{i}")["triggerTime"] == triggers[f"a{i}"]
    code, body = api.post("rescheduleMsgs", topic=topic, msgIdPrefix="a", delayMillis=0)
    assert body["rescheduled"] == 6, body
    got = api.pull_until(topic, 6)
    assert sorted(ids(got)) == [f"a{i}" for i in range(6)]
    code, body = api.post("rescheduleMsgs", topic=topic, msgIdPrefix="a", delayMillis=0)  # consuming: not moved
    assert body["rescheduled"] == 0, body
    assert api.pull(topic) == []


@pytest.mark.parametrize(("call", "params", "named"), [
    ("deleteMsgs", {}, "all"),
    ("rescheduleMsgs", {"shiftMillis": 5}, "all"),
    ("deleteMsgs", {"status": "8"}, "status"),
    ("deleteMsgs", {"status": "1,x"}, "status"),
    ("deleteMsgs", {"triggerFrom": 10, "triggerTo": 10}, "triggerFrom"),
    ("deleteMsgs", {"all": "true", "limit": 0}, "limit"),
    ("deleteMsgs", {"all": "true", "limit": 1_000_001}, "limit"),
    ("rescheduleMsgs", {"all": "true"}, "shiftMillis"),
    ("rescheduleMsgs", {"all": "true", "shiftMillis": 1, "delayMillis": 1}, "shiftMillis"),
    ("listMsg", {"cursor": "nonsense"}, "cursor"),
    ("listMsg", {"limit": 1001}, "limit"),
    ("listMsg", {"status": "0"}, "status"),
    ("listMsg", {"triggerFrom": 5, "triggerTo": 1}, "triggerFrom"),
])
def test_bad_input_is_400_naming_the_parameter_and_changes_nothing(api, topic, call, params, named):
    api.send(topic, msgId="keep", tag="t")
    code, body = api.post(call, topic=topic, **params)
    assert code == 400 and named in body["msg"], body
    m = api.message(topic, "keep")
    assert m["status"] == 2 and m["triggerTime"] <= int(time.time() * 1000)


def test_topic_is_required(api):
    for call in ("listMsg", "deleteMsgs", "rescheduleMsgs"):
        code, body = api.post(call, all="true", shiftMillis=1)
        assert code == 400, body
        assert body["code"] == 400 and "topic" in body["msg"], body


def test_key_filter(api, topic):
    for i in range(4):
        api.send(topic, msgId=f"k{i}", key="order-42" if i % 2 else "order-7", delayMillis=HOUR_MS)
    assert ids(every_page(api, topic, key="order-42")) == ["k1", "k3"]
    assert listing(api, topic, key="order-7", countOnly="true")["count"] == 2
    code, body = api.post("deleteMsgs", topic=topic, key="order-42")
    assert code == 200, body
    assert body["deleted"] == 2, body
    assert [api.message(topic, f"k{i}")["status"] for i in range(4)] == [1, 7, 1, 7]
