"""Flow (docs/api.md, "Flow"): setTopicConfig / getTopicConfig validated
whole, pauseTopic / resumeTopic of a topic or one serial key -- nothing
handed out while paused (pull, long poll), sends, deletes and acks still
taken, resume's `hold`, `shift` and `expire` -- and getTopicInfo's flow
fields, on every backend (fairness=fairKey too, the Redis backend's
carried out by its scripts: docs/redis.md, "Fairness on Redis")."""

from __future__ import annotations

import json
import threading
import time
import zlib

import pytest

DEFAULTS = {"releaseRate": 0, "fairness": "none", "maxDueAgeMillis": 0, "dedupWindowMillis": 0, "paused": False,
            "pause": None, "pausedKeys": [], "pausedKeyCount": 0}


def settings(api, topic: str) -> dict:
    code, body = api.get("getTopicConfig", topic=topic)
    assert code == 200, body
    return body["data"]


def call(api, path: str, **params) -> dict:
    code, body = api.post(path, **params)
    assert code == 200, body
    return body["data"]


@pytest.mark.parametrize(("params", "named", "says"), [
    ({}, "topic", "required"),
    ({"releaseRate": "-1"}, "releaseRate", "at least 0"),
    ({"releaseRate": "x"}, "releaseRate", "whole number"),
    ({"releaseRate": "10000001"}, "releaseRate", "at most"),
    ({"fairness": "roundRobin"}, "fairness", "one of"),
    ({"maxDueAgeMillis": "-5"}, "maxDueAgeMillis", "at least 0"),
    ({"dedupWindowMillis": "259200001"}, "dedupWindowMillis", "at most 259200000"),
    ({"dedupWindowMillis": "-1"}, "dedupWindowMillis", "at least 0"),
])
def test_set_topic_config_refuses_whole(api, topic, params, named, says):
    """A bad parameter: code 400 naming it, nothing stored."""
    given = params if named == "topic" else {"topic": topic, **params}
    code, body = api.post("setTopicConfig", **given)
    assert code == 400 and body["msg"].startswith(named) and says in body["msg"], body
    assert settings(api, topic) == {"topic": topic, **DEFAULTS}


def test_set_topic_config_takes_the_defaults(api, topic):
    data = call(api, "setTopicConfig", topic=topic, releaseRate=0, fairness="none", maxDueAgeMillis=0,
                dedupWindowMillis=0)
    assert data == {"topic": topic, **DEFAULTS}


def test_pause_refuses_an_unknown_policy(api, topic):
    code, body = api.post("pauseTopic", topic=topic, onResume="later")
    assert code == 400 and body["msg"].startswith("onResume") and "must be" in body["msg"], body
    assert settings(api, topic)["paused"] is False


def test_paused_topic_hands_out_nothing_until_resumed(api, topic):
    """Due messages of a paused topic: no pull, no long poll takes them;
    sends, deletes and acks are taken; hold hands them all out on resume."""
    first = [api.send(topic, f"m{i}")["msgId"] for i in range(3)]
    api.pull_until(topic, 0)
    paused = call(api, "pauseTopic", topic=topic)
    assert paused["paused"] is True and paused["pause"]["onResume"] == "hold"
    assert paused["pause"]["pausedAt"] <= int(time.time() * 1000)
    assert api.pull(topic, batch=10) == []
    code, body = api.post("longPollingMsg", topic=topic, batch=10, longPollingTimeoutMillis=500)
    assert code == 200 and body["delayMsgList"] == [], body
    later = api.send(topic, "sent while paused")["msgId"]
    assert api.post("deleteMsg", topic=topic, msgId=first[0])[0] == 200
    assert api.post("ackMsg", topic=topic, msgId=first[1])[0] == 200
    time.sleep(0.3)
    info = api.info(topic)
    assert info["paused"] is True and info["dueUndelivered"] == 2 == info["readyQueueSize"], info
    assert info["oldestDueAgeMillis"] >= 300, info
    assert api.pull(topic, batch=10) == []
    assert settings(api, topic)["paused"] is True
    resumed = call(api, "resumeTopic", topic=topic)
    assert resumed == {"topic": topic, **DEFAULTS}
    got = api.pull_until(topic, 2)
    assert sorted(m["msgId"] for m in got) == sorted([first[2], later])
    assert api.info(topic)["paused"] is False


def test_resume_wakes_a_long_poll(api, topic):
    api.send(topic, "due")
    call(api, "pauseTopic", topic=topic)
    answered: list[list[dict]] = []

    def poll() -> None:
        code, body = api.post("longPollingMsg", topic=topic, batch=1, longPollingTimeoutMillis=20_000)
        answered.append(body["delayMsgList"] if code == 200 else body)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.5)
    assert not answered  # still waiting: paused
    call(api, "resumeTopic", topic=topic)
    poller.join(15)
    assert len(answered) == 1 and len(answered[0]) == 1, answered


def test_paused_key_holds_its_messages_only(api, topic):
    """A paused serial key's messages are not handed out; other keys' and
    keyless ones are; resuming the key hands its messages out."""
    held = [api.send(topic, f"a{i}", key="a")["msgId"] for i in range(2)]
    others = [api.send(topic, "b", key="b")["msgId"], api.send(topic, "none")["msgId"]]
    data = call(api, "pauseTopic", topic=topic, key="a", onResume="hold")
    assert data["paused"] == ["a"] and data["pausedKeys"][0]["key"] == "a", data
    data = call(api, "pauseTopic", topic=topic, key="c")  # a key's answer says that key alone, and the count
    assert data["paused"] == ["c"] and [k["key"] for k in data["pausedKeys"]] == ["c"], data
    assert data["pausedKeyCount"] == 2 and settings(api, topic)["paused"] == ["a", "c"]
    data = call(api, "resumeTopic", topic=topic, key="c")
    assert data["paused"] is False and data["pausedKeys"] == [] and data["pausedKeyCount"] == 1, data
    got = api.pull_until(topic, 2)
    assert sorted(m["msgId"] for m in got) == sorted(others)
    for m in got:
        assert api.post("ackMsg", topic=topic, msgId=m["msgId"])[0] == 200
    assert api.pull(topic, batch=10) == []
    assert api.info(topic)["paused"] == ["a"]
    call(api, "resumeTopic", topic=topic, key="a")
    first = api.pull_until(topic, 1)
    assert [m["msgId"] for m in first] == [held[0]]  # one at a time: the key is serial
    assert api.post("ackMsg", topic=topic, msgId=held[0])[0] == 200
    assert [m["msgId"] for m in api.pull_until(topic, 1)] == [held[1]]


def test_shift_moves_what_fell_due_by_the_pause_length(api, topic):
    """onResume=shift: a message that fell due while paused is moved by the
    pause's length (resumedAt - pausedAt); one due before the pause is not."""
    before = api.send(topic, "due before")["msgId"]
    time.sleep(0.05)
    paused = call(api, "pauseTopic", topic=topic, onResume="shift")
    paused_at = paused["pause"]["pausedAt"]
    during = api.send(topic, "due during", delayMillis=500)
    after = api.send(topic, "due after", delayMillis=60_000)
    time.sleep(1.5)
    asked = int(time.time() * 1000)
    call(api, "resumeTopic", topic=topic)
    answered = int(time.time() * 1000)
    moved = api.message(topic, during["msgId"])
    shift_low, shift_high = asked - paused_at, answered - paused_at
    assert during["triggerTime"] + shift_low - 1000 <= moved["triggerTime"] <= during["triggerTime"] + shift_high + 1000
    assert moved["triggerTime"] > answered  # not due yet: it waits its shifted time
    assert api.message(topic, after["msgId"])["triggerTime"] == after["triggerTime"]
    assert [m["msgId"] for m in api.pull_until(topic, 1)] == [before]
    assert api.message(topic, before)["status"] == 3
    got = api.pull_until(topic, 1, timeout_s=10)
    assert [m["msgId"] for m in got] == [during["msgId"]]


def test_expire_ends_what_fell_due_while_paused(api, topic):
    """onResume=expire: each message that fell due while paused ends, status
    5, `endReason` paused (getMsg, listDeadMsg); one due before the pause
    and one due after the resume are not touched."""
    before = api.send(topic, "due before")["msgId"]
    time.sleep(0.05)
    call(api, "pauseTopic", topic=topic, onResume="expire")
    during = [api.send(topic, f"due during {i}", delayMillis=300)["msgId"] for i in range(5)]
    after = api.send(topic, "due after", delayMillis=60_000)["msgId"]
    time.sleep(1)
    assert api.pull(topic, batch=10) == []
    resumed = call(api, "resumeTopic", topic=topic)
    assert resumed["paused"] is False and resumed["pause"] is None
    for msg_id in during:
        m = api.message(topic, msg_id)
        assert m["status"] == 5 and m["endReason"] == "paused", m
    assert "endReason" not in api.message(topic, before)
    assert api.message(topic, after)["status"] == 1
    code, body = api.get("listDeadMsg", topic=topic, status=5)
    assert code == 200, body
    dead = body["delayMsgList"]
    assert sorted(m["msgId"] for m in dead) == sorted(during)
    assert all(m["endReason"] == "paused" for m in dead)
    assert [m["msgId"] for m in api.pull_until(topic, 1)] == [before]
    assert api.pull(topic, batch=10) == []


def test_expire_of_a_key_ends_that_key_only(api, topic):
    call(api, "pauseTopic", topic=topic, key="a", onResume="expire")
    keyed = api.send(topic, "a", key="a")["msgId"]
    other = api.send(topic, "b", key="b")["msgId"]
    time.sleep(0.3)
    call(api, "resumeTopic", topic=topic, key="a")
    assert api.message(topic, keyed)["status"] == 5 and api.message(topic, keyed)["endReason"] == "paused"
    assert [m["msgId"] for m in api.pull_until(topic, 1)] == [other]


def test_paused_keys_are_bounded(serve, topic):
    api = serve("--max-paused-keys", "2")
    for key in ("a", "b"):
        call(api, "pauseTopic", topic=topic, key=key)
    code, body = api.post("pauseTopic", topic=topic, key="c")
    assert code == 429 and "--max-paused-keys" in body["msg"], body
    assert settings(api, topic)["paused"] == ["a", "b"]
    call(api, "pauseTopic", topic=topic, key="a")  # one paused already: no more
    call(api, "resumeTopic", topic=topic, key="a")
    call(api, "pauseTopic", topic=topic, key="c")


def test_a_paused_topic_is_not_pushed_until_resumed(serve, tmp_path, topic):
    from serving import PushSubscriber

    api = serve("--push-allow", "127.0.0.1")
    sub = PushSubscriber(tmp_path)
    try:
        call(api, "pauseTopic", topic=topic)
        code, body = api.post("subscribe", topic=topic, url=sub.url)
        assert code == 200, body
        sent = {api.send(topic, f"m{i}")["msgId"] for i in range(3)}
        time.sleep(1.5)  # due, a pusher running: nothing POSTed while paused
        assert sub.received() == []
        assert api.info(topic)["dueUndelivered"] == 3
        call(api, "resumeTopic", topic=topic)
        assert {json.loads(r["body"])["msgId"] for r in sub.wait_received(3)} == sent
    finally:
        sub.stop()


def test_release_rate_spreads_what_falls_due_at_once(api, topic):
    """releaseRate=50: 200 messages due at once are handed out over about
    4 s (the burst is a tenth of a second's worth), pulled by long polls;
    no second of hand-outs over the rate by more than a fifth plus the
    burst; each handed out once, none before its trigger time."""
    data = call(api, "setTopicConfig", topic=topic, releaseRate=50)
    assert data["releaseRate"] == 50 and settings(api, topic)["releaseRate"] == 50
    code, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [{"msg": "m", "msgId": f"r{i:03}"}
                                                                       for i in range(200)]})
    assert code == 200, body
    started = time.monotonic()
    seconds: dict[int, int] = {}
    got: list[dict] = []
    while len(got) < 200 and time.monotonic() - started < 20:
        code, body = api.post("longPollingMsg", topic=topic, batch=100, longPollingTimeoutMillis=1000)
        assert code == 200, body
        at = time.monotonic()
        for m in body["delayMsgList"]:
            assert m["triggerTime"] <= int(time.time() * 1000)
        got += body["delayMsgList"]
        second = int(at - started)
        seconds[second] = seconds.get(second, 0) + len(body["delayMsgList"])
    took_s = time.monotonic() - started
    assert sorted(m["msgId"] for m in got) == [f"r{i:03}" for i in range(200)]
    assert took_s >= 3, (took_s, seconds)
    assert max(seconds.values()) <= 50 * 1.2 + 5 + 5, seconds  # (the burst, a token of each shard's own)
    call(api, "setTopicConfig", topic=topic, releaseRate=0)


def test_max_due_age_hands_an_old_message_out_before_priority(api, topic):
    """maxDueAgeMillis=1000: a priority-0 message due 5 s ago goes before
    priority-9 ones just due; without the cap, priority order. (One serial
    key: one shard holds them all. Redis has one shard, and hands a serial
    key's messages out in its own priority order: no key there, docs/redis.md.)"""
    now = int(time.time() * 1000)
    key = {} if api.backend == "redis" else {"key": "k"}
    for t, cap in ((topic, 1000), (topic + "-plain", 0)):
        call(api, "setTopicConfig", topic=t, maxDueAgeMillis=cap)
        assert settings(api, t)["maxDueAgeMillis"] == cap
        api.send(t, "old", msgId="old", priority=0, triggerTime=now - 5000, **key)
        for i in range(3):
            api.send(t, "new", msgId=f"new{i}", priority=9, **key)
    assert [m["msgId"] for m in api.pull_until(topic, 1)] == ["old"]
    assert [m["msgId"] for m in api.pull_until(topic + "-plain", 1)] == ["new0"]


def test_fairness_set_by_set_topic_config_takes_turns(api, topic):
    """fairness=fairKey: A's backlog and B's one message; a pull of 2 takes
    one of each. (One serial key per tenant would serialise: no key here;
    a node of shards takes turns on each shard, so A's messages are sent
    to B's shard: ids its placement, CRC-32 of the msgId, puts there.)"""
    call(api, "setTopicConfig", topic=topic, fairness="fairKey")
    assert settings(api, topic)["fairness"] == "fairKey"
    status, shard_map = api.get("getShardMap")
    count = shard_map["shards"] if status == 200 and isinstance(shard_map, dict) and "shards" in shard_map else 1
    a_ids = [i for i in (f"a{n:03}" for n in range(400)) if zlib.crc32(i.encode()) % count == zlib.crc32(b"b") % count]
    code, body = api.post_json("sendMsgBatch", {"topic": topic, "msgs": [
        {"msg": "a", "msgId": msg_id, "fairKey": "A"} for msg_id in a_ids[:40]]})
    assert code == 200, body
    api.send(topic, "b", msgId="b", fairKey="B")
    got: list[str] = []
    deadline = time.monotonic() + 5
    while "b" not in got and time.monotonic() < deadline:
        got += [m["msgId"] for m in api.pull(topic, batch=4)]
    assert "b" in got[:8], got
