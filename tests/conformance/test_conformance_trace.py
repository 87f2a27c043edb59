"""W3C trace context on both backends (docs/api.md, "Trace context"): a
send's `traceparent` and `tracestate` -- fields of sendMsg or of a
sendMsgBatch item, or sendMsg's HTTP headers -- kept with the message and
answered in its delayMsg by every call that answers one (send, get, pull,
long poll, reschedule, dead letters, redrive, retries, listMsg, and after
a rescheduleMsgs), sent on as headers
with a push to a real subscriber; a malformed one refused with code 400
naming it, nothing stored; a message without trace context answers no
such key."""

from __future__ import annotations

import json
import urllib.parse

import pytest
from serving import PREFIX, request
from serving import PushSubscriber as Subscriber

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
ACKED, ENDED = 4, 6


def trace_of(delay_msg: dict) -> tuple[str | None, str | None]:
    return delay_msg.get("traceparent"), delay_msg.get("tracestate")


def send_with_headers(api, headers: dict[str, str], **params: object) -> dict:
    """sendMsg (a form) with extra HTTP headers: the answer's body."""
    data = urllib.parse.urlencode({k: str(v) for k, v in params.items()}).encode()
    status, body = request(api.server.base + PREFIX + "sendMsg", data=data, headers=api.server.headers(
        {"Content-Type": "application/x-www-form-urlencoded", **headers}))
    assert status == 200, body
    return json.loads(body)


def test_trace_context_is_kept_and_answered(api, topic):
    sent = api.send(topic, msgId="a", traceparent=TRACEPARENT, tracestate=TRACESTATE, delayMillis=60_000)
    assert trace_of(sent) == (TRACEPARENT, TRACESTATE)
    assert trace_of(api.message(topic, "a")) == (TRACEPARENT, TRACESTATE)
    only_parent = api.send(topic, msgId="b", traceparent=OTHER)
    assert trace_of(only_parent) == (OTHER, None)
    plain = api.send(topic, msgId="c")
    assert "traceparent" not in plain and "tracestate" not in plain
    assert "traceparent" not in api.message(topic, "c")
    pulled = {m["msgId"]: m for m in api.pull(topic, batch=10)}
    assert trace_of(pulled["b"]) == (OTHER, None) and "traceparent" not in pulled["c"]
    status, body = api.post("rescheduleMsg", topic=topic, msgId="a", delayMillis=0)
    assert status == 200 and trace_of(body["delayMsg"]) == (TRACEPARENT, TRACESTATE)
    got, = api.pull_until(topic, 1)
    assert got["msgId"] == "a" and trace_of(got) == (TRACEPARENT, TRACESTATE)


def test_a_json_body_and_a_batch_carry_it_per_message(api, topic):
    status, body = api.post_json("sendMsg", {"topic": topic, "msg": "m", "msgId": "j", "traceparent": TRACEPARENT,
                                             "tracestate": TRACESTATE})
    assert status == 200 and trace_of(body["delayMsg"]) == (TRACEPARENT, TRACESTATE)
    status, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "1", "msgId": "x", "traceparent": TRACEPARENT},
        {"msg": "2", "msgId": "y"},
        {"msg": "3", "msgId": "z", "traceparent": OTHER, "tracestate": "k=v"}]})
    assert status == 200, body
    assert [trace_of(m) for m in body["delayMsgList"]] == [(TRACEPARENT, None), (None, None), (OTHER, "k=v")]
    assert trace_of(api.message(topic, "z")) == (OTHER, "k=v")
    assert "traceparent" not in api.message(topic, "y")


def test_sendmsg_headers_apply_unless_the_parameters_give_it(api, topic):
    body = send_with_headers(api, {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}, topic=topic, msg="m",
                             msgId="h")
    assert trace_of(body["delayMsg"]) == (TRACEPARENT, TRACESTATE)
    assert trace_of(api.message(topic, "h")) == (TRACEPARENT, TRACESTATE)
    body = send_with_headers(api, {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}, topic=topic, msg="m",
                             msgId="p", traceparent=OTHER)
    assert trace_of(body["delayMsg"]) == (OTHER, None)  # the parameter's pair, not a mix
    body = send_with_headers(api, {"traceparent": "00-bad"}, topic=topic, msg="m", msgId="bad")
    assert body["code"] == 400 and "traceparent" in body["msg"]
    assert api.message(topic, "bad") == 404


def test_bulk_calls_list_and_move_it(api, topic):
    api.send(topic, msgId="t", delayMillis=600_000, traceparent=TRACEPARENT, tracestate=TRACESTATE)
    api.send(topic, msgId="u", delayMillis=600_000)
    status, body = api.post("listMsg", topic=topic)
    assert status == 200, body
    assert {m["msgId"]: trace_of(m) for m in body["delayMsgList"]} == {"t": (TRACEPARENT, TRACESTATE),
                                                                      "u": (None, None)}
    status, body = api.post("rescheduleMsgs", topic=topic, all="true", delayMillis=0)
    assert status == 200 and body["rescheduled"] == 2, body
    got = {m["msgId"]: trace_of(m) for m in api.pull_until(topic, 2)}
    assert got == {"t": (TRACEPARENT, TRACESTATE), "u": (None, None)}


def test_retries_dead_letters_and_redrive_keep_it(api, topic):
    api.send(topic, msgId="r", maxRetry=1, traceparent=TRACEPARENT, tracestate=TRACESTATE)
    for _ in range(2):  # two deliveries, each nacked: the second one ends it
        got, = api.pull_until(topic, 1)
        assert trace_of(got) == (TRACEPARENT, TRACESTATE)
        assert api.post("ackMsg", topic=topic, msgId="r", ack="false")[0] == 200
    assert api.wait_status(topic, "r", {ENDED})["status"] == ENDED
    status, body = api.get("listDeadMsg", topic=topic)
    assert status == 200 and [trace_of(m) for m in body["delayMsgList"]] == [(TRACEPARENT, TRACESTATE)]
    status, body = api.post("redriveMsg", topic=topic, msgId="r")
    assert status == 200 and trace_of(body["delayMsg"]) == (TRACEPARENT, TRACESTATE)
    got, = api.pull_until(topic, 1)
    assert trace_of(got) == (TRACEPARENT, TRACESTATE)


BAD_TRACEPARENTS = [
    TRACEPARENT.upper(),  # upper-case hex
    "ff" + TRACEPARENT[2:],  # version ff
    TRACEPARENT[:3] + "0" * 32 + TRACEPARENT[35:],  # all-zero trace-id
    TRACEPARENT[:36] + "0" * 16 + TRACEPARENT[52:],  # all-zero parent-id
    TRACEPARENT + "-00",  # version 00 is exactly 55 characters
    TRACEPARENT[:-1],  # short
    "00-" + "a" * 31 + "g-00f067aa0ba902b7-01",  # not hex
    "01-" + TRACEPARENT[3:] + "-" + "x" * 200,  # longer than the bound
    "01-" + TRACEPARENT[3:] + "\r\nX-Injected: 1",  # a later version: CR LF after the flags
    "01-" + TRACEPARENT[3:] + "-01\x00",  # NUL in a later version's field
    "01-" + TRACEPARENT[3:] + "-<script>",  # markup in a later version's field
]
BAD_TRACESTATES = [
    "Upper=1",  # keys are lower case
    "a=1,a=2",  # a key twice
    "a=",  # an empty value
    "a=b=c",  # '=' in a value
    "a=1 ,b",  # not key=value
    ",".join(f"k{i}=v" for i in range(33)),  # 33 list-members
    "a=" + "v" * 257,  # a value of 257 characters
    "k=" + "v" * 250 + "," + "l=" + "v" * 250 + ",m=" + "v" * 5,  # over 512 characters
]


@pytest.mark.parametrize("bad", BAD_TRACEPARENTS)
def test_a_malformed_traceparent_is_refused_naming_it(api, topic, bad):
    status, body = api.post("sendMsg", topic=topic, msg="m", msgId="x", traceparent=bad)
    assert status == 400 and body["msg"].startswith("traceparent"), body
    status, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "1", "msgId": "ok"}, {"msg": "2", "msgId": "x", "traceparent": bad}]})
    assert status == 400 and body["msg"].startswith("msgs[1].traceparent"), body
    assert api.message(topic, "x") == 404 and api.message(topic, "ok") == 404  # nothing stored


@pytest.mark.parametrize("bad", BAD_TRACESTATES)
def test_a_malformed_tracestate_is_refused_naming_it(api, topic, bad):
    status, body = api.post("sendMsg", topic=topic, msg="m", msgId="x", traceparent=TRACEPARENT, tracestate=bad)
    assert status == 400 and body["msg"].startswith("tracestate"), body
    assert api.message(topic, "x") == 404


def test_a_tracestate_needs_a_traceparent(api, topic):
    status, body = api.post("sendMsg", topic=topic, msg="m", msgId="x", tracestate=TRACESTATE)
    assert status == 400 and body["msg"].startswith("tracestate"), body
    body = send_with_headers(api, {"tracestate": TRACESTATE}, topic=topic, msg="m", msgId="x")
    assert body["code"] == 400 and body["msg"].startswith("tracestate")
    assert api.message(topic, "x") == 404


def test_the_spec_bounds_are_taken(api, topic):
    """A tracestate of 32 list-members, 512 characters, spaces and empty
    members around them (kept without), and a later version's traceparent."""
    members = [f"k{i:02d}=" + "v" * 11 for i in range(32)]  # 32 x 15 + 31 commas = 511
    state = ",".join(members)
    sent = api.send(topic, traceparent="cc" + TRACEPARENT[2:] + "-e0f1", tracestate=" " + state)
    assert len(state) + 1 == 512 and trace_of(sent) == ("cc" + TRACEPARENT[2:] + "-e0f1", state)
    sent = api.send(topic, traceparent=TRACEPARENT, tracestate="a@b=1 ,\t, c=x y")
    assert sent["tracestate"] == "a@b=1,c=x y"


def test_a_push_sends_it_as_headers(serve, tmp_path, topic):
    api = serve("--push-allow", "127.0.0.1")
    sub = Subscriber(tmp_path)
    try:
        assert api.post("subscribe", topic=topic, url=sub.url)[0] == 200
        api.send(topic, msgId="traced", traceparent=TRACEPARENT, tracestate=TRACESTATE)
        got, = sub.wait_received(1)
        api.send(topic, msgId="plain")
        later = sub.wait_received(2)[1]
    finally:
        sub.stop()
    headers = {k.lower(): v for k, v in got["headers"].items()}
    assert (headers["traceparent"], headers["tracestate"]) == (TRACEPARENT, TRACESTATE)
    assert trace_of(json.loads(got["body"])) == (TRACEPARENT, TRACESTATE)
    headers = {k.lower(): v for k, v in later["headers"].items()}
    assert "traceparent" not in headers and "tracestate" not in headers
    assert "traceparent" not in json.loads(later["body"])
    assert api.wait_status(topic, "traced", {ACKED})["status"] == ACKED
