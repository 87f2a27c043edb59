"""A topic's `dedupWindowMillis` (docs/api.md, "Deduplication window"),
end to end on a real server: an ended id sent again within the window
answers the ended message unchanged and stores nothing (getMsg unchanged,
nothing delivered); once the window has passed it is stored anew
(camellia's rule); the window slides (every send it answers moves it on);
sendMsgBatch judges each message; the window holds across kill -9. On every backend (Redis keeps the ended
message and its purge time: docs/redis.md, "Flow")."""

from __future__ import annotations

import time

WINDOW_MS = 1_500


def _window(api, topic: str, window_ms: int = WINDOW_MS) -> None:
    code, body = api.post("setTopicConfig", topic=topic, dedupWindowMillis=window_ms)
    assert code == 200 and body["data"]["dedupWindowMillis"] == window_ms, body


def _consume(api, topic: str, msg_id: str, msg: str = "first") -> dict:
    """Send, pull and ack it: the ended message (status 4) as getMsg answers it."""
    api.send(topic, msg, msgId=msg_id)
    [pulled] = api.pull_until(topic, 1)
    assert pulled["msgId"] == msg_id
    code, body = api.post("ackMsg", topic=topic, msgId=msg_id, ack="true")
    assert code == 200, body
    ended = api.message(topic, msg_id)
    assert isinstance(ended, dict) and ended["status"] == 4, ended
    return ended


def test_within_the_window_an_ended_id_answers_the_ended_message_and_stores_nothing(api, topic):
    _window(api, topic, 60_000)
    ended = _consume(api, topic, "order-1")
    again = api.send(topic, "second", msgId="order-1")
    assert again == ended  # the ended message, unchanged: status 4, the first body
    assert api.message(topic, "order-1") == ended
    assert api.pull_until(topic, 1, timeout_s=1) == []
    info = api.info(topic)
    assert info["waitingQueueSize"] == info["readyQueueSize"] == info["ackQueueSize"] == 0, info


def test_once_the_window_has_passed_the_id_is_stored_anew(api, topic):
    _window(api, topic)
    _consume(api, topic, "order-1")
    time.sleep(WINDOW_MS / 1000 + 0.2)
    again = api.send(topic, "second", msgId="order-1")
    assert again["status"] in (1, 2) and again["msg"] == "second", again
    [pulled] = api.pull_until(topic, 1)
    assert pulled["msgId"] == "order-1" and pulled["msg"] == "second"


def test_the_window_slides_an_id_sent_every_half_window_is_deduplicated_every_time(api, topic):
    """Sent again every X under a window of 2X: every send answers the ended
    message (a window counted from the end alone, as NATS's, would store it
    anew every other time: nats-server#7302)."""
    window_ms = 2_000
    _window(api, topic, window_ms)
    ended = _consume(api, topic, "tick")
    for _ in range(4):
        time.sleep(window_ms / 2000)
        assert api.send(topic, "again", msgId="tick") == ended
    assert api.pull_until(topic, 1, timeout_s=0.5) == []


def test_a_batch_is_judged_per_message(api, topic):
    _window(api, topic, 60_000)
    ended = _consume(api, topic, "old")
    code, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msgId": "old", "msg": "again"}, {"msgId": "new", "msg": "fresh"}]})
    assert code == 200, body
    old, new = body["delayMsgList"]
    assert old == ended and new["msgId"] == "new" and new["status"] in (1, 2), body
    assert [m["msgId"] for m in api.pull_until(topic, 2, timeout_s=1)] == ["new"]


def test_the_window_is_a_setting_of_its_topic_only(api, topic):
    _window(api, topic, 60_000)
    other = topic + "-other"
    _consume(api, other, "order-1")
    again = api.send(other, "second", msgId="order-1")
    assert again["status"] in (1, 2) and again["msg"] == "second", again  # camellia's rule there
    code, body = api.get("getTopicConfig", topic=topic)
    assert code == 200 and body["data"]["dedupWindowMillis"] == 60_000, body


def test_the_window_holds_across_kill9(serve, topic):
    api = serve("--fsync", "batch")
    _window(api, topic, 60_000)
    ended = _consume(api, topic, "order-1")
    api.server.kill()
    api = serve("--fsync", "batch")
    assert api.send(topic, "second", msgId="order-1") == ended
    assert api.pull_until(topic, 1, timeout_s=1) == []
