"""rescheduleMsg, listDeadMsg and redriveMsg (extensions: docs/api.md, Rescheduling and dead letters), the same
on every backend (see conftest): a waiting or ready message gets a new
trigger time and is never delivered at the old one nor early at the new;
dead letters (5 and 6) are listed oldest first a page at a time and made
ready again with a fresh retry budget; anything else answers code 409."""

import time

import pytest

pytestmark = pytest.mark.slow


def ids(messages):
    return [m["msgId"] for m in messages]


def reschedule(api, topic, msg_id, **params):
    return api.post("rescheduleMsg", topic=topic, msgId=msg_id, **params)

def test_delay_zero_fires_a_far_message_now(api, topic):
    api.send(topic, msgId="far", delayMillis=10 * 24 * 3_600_000, priority=3, tag="x")
    code, body = reschedule(api, topic, "far", delayMillis=0)
    assert code == 200 and body["delayMsg"]["status"] == 2, body
    got = api.pull(topic)
    assert ids(got) == ["far"] and (got[0]["priority"], got[0]["tag"], got[0]["msg"]) == (3, "x", "m")
    assert api.post("ackMsg", topic=topic, msgId="far")[0] == 200
    assert api.message(topic, "far")["status"] == 4

def test_reschedule_refuses_a_consuming_or_ended_message_and_names_why(api, topic):
    api.send(topic, msgId="c")
    assert ids(api.pull_until(topic, 1)) == ["c"]
    code, body = reschedule(api, topic, "c", delayMillis=0)
    assert code == 409 and "consuming" in body["msg"], body
    assert api.message(topic, "c")["status"] == 3  # unchanged
    assert api.post("ackMsg", topic=topic, msgId="c")[0] == 200
    code, body = reschedule(api, topic, "c", delayMillis=0)
    assert code == 409 and "acked" in body["msg"], body
    assert reschedule(api, topic, "nope", delayMillis=0)[0] == 404
    code, body = reschedule(api, topic, "c")
    assert code == 400 and "delayMillis" in body["msg"], body


def test_a_rescheduled_id_is_still_one_message(api, topic):
    api.send(topic, msgId="d", delayMillis=60_000)
    assert reschedule(api, topic, "d", delayMillis=120_000)[0] == 200
    again = api.send(topic, msgId="d", msg="other", delayMillis=1)  # alive: the send is idempotent
    assert again["msg"] == "m" and again["status"] == 1
    assert api.post("deleteMsg", topic=topic, msgId="d")[0] == 200
    assert api.message(topic, "d")["status"] == 7


def make_dead(api, topic, count, prefix="x", ttl_ms=50):
    """`count` messages that expire undelivered (5) `ttl_ms` after their
    trigger time, then one that ends after its deliveries (6)."""
    for i in range(count):
        api.send(topic, msgId=f"{prefix}{i}", ttlMillis=ttl_ms)
    for i in range(count):
        assert api.wait_status(topic, f"{prefix}{i}", {5, 6})["status"] == 5
    api.send(topic, msgId=f"{prefix}-retried", maxRetry=0)
    assert ids(api.pull_until(topic, 1, ackTimeoutMillis=100)) == [f"{prefix}-retried"]
    assert api.wait_status(topic, f"{prefix}-retried", {5, 6})["status"] == 6


def test_dead_letters_are_listed_a_page_at_a_time(api, topic):
    make_dead(api, topic, 5)
    api.send(topic, msgId="alive", delayMillis=60_000)
    seen, cursor, pages = [], None, 0
    while True:
        params = {"topic": topic, "limit": 2} | ({"cursor": cursor} if cursor else {})
        code, body = api.get("listDeadMsg", **params)
        assert code == 200, body
        assert len(body["delayMsgList"]) <= 2
        seen += body["delayMsgList"]
        cursor, pages = body["cursor"], pages + 1
        if not cursor:
            break
        assert pages < 20
    assert sorted(ids(seen)) == sorted([f"x{i}" for i in range(5)] + ["x-retried"])
    assert {m["status"] for m in seen} == {5, 6}
    code, body = api.get("listDeadMsg", topic=topic, status="6")
    assert code == 200 and ids(body["delayMsgList"]) == ["x-retried"], body
    assert api.get("listDeadMsg", topic=topic, status="4")[0] == 400
    assert api.get("listDeadMsg", topic=topic, cursor="bogus")[0] == 400
    code, body = api.get("listDeadMsg", topic="t-none-" + topic)
    assert code == 200 and body["delayMsgList"] == [] and body["cursor"] is None


def test_a_redriven_message_is_ready_with_a_fresh_retry_budget(api, topic):
    make_dead(api, topic, 1)
    code, body = api.post("redriveMsg", topic=topic, msgId="x-retried")
    assert code == 200 and body["delayMsg"]["status"] == 2 and body["delayMsg"]["retry"] == 0, body
    got = api.pull(topic)
    assert ids(got) == ["x-retried"] and got[0]["retry"] == 1
    assert got[0]["expireTime"] > int(time.time() * 1000)  # its ttl counts again from the re-drive
    code, body = api.post("redriveMsg", topic=topic, msgId="x-retried")  # consuming now: not dead
    assert code == 409, body
    assert api.post("redriveMsg", topic=topic)[0] == 400  # msgId or all=true


def test_redrive_all_makes_every_dead_letter_ready_in_steps(api, topic):
    # A redriven message keeps its ttl from its new trigger time (now): 2 s, so
    # a release late on a busy machine does not expire it again before the pulls.
    make_dead(api, topic, 7, ttl_ms=2_000)
    code, body = api.post("redriveMsg", topic=topic, all="true", limit=3)
    assert code == 200 and (body["redriven"], body["more"]) == (3, True), body
    code, body = api.post("redriveMsg", topic=topic, all="true")
    assert code == 200 and (body["redriven"], body["more"]) == (5, False), body
    code, body = api.get("listDeadMsg", topic=topic)
    assert body["delayMsgList"] == [] and body["cursor"] is None
    assert sorted(ids(api.pull_until(topic, 8, ackTimeoutMillis=60_000))) == sorted(
        [f"x{i}" for i in range(7)] + ["x-retried"])
