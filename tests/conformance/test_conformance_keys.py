"""Serial keys (docs/api.md, Tags and serial keys) over HTTP: messages of one (topic, key) are
consumed one at a time, across pulls; other keys and unkeyed messages are
not held back. The same on both backends."""

import pytest

pytestmark = pytest.mark.slow


def ids(messages):
    return sorted(m["msgId"] for m in messages)


def test_one_message_of_a_key_is_consuming_at_a_time(api, topic):
    for msg_id, key in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("n1", "")):
        m = api.send(topic, msgId=msg_id, key=key)
        assert m["key"] == key and m["status"] == 2
    got = api.pull(topic, batch=10, ackTimeoutMillis=60_000)
    assert len(got) == 3 and ids(got)[1:] == ["b1", "n1"] and ids(got)[0] in ("a1", "a2")
    first_a = ids(got)[0]
    assert api.pull(topic, batch=10) == []  # the other A waits for the first
    assert api.message(topic, "a2" if first_a == "a1" else "a1")["status"] == 2
    assert api.post("ackMsg", topic=topic, msgId=first_a, ack="false")[0] == 200  # a nack frees the key too
    again = api.pull(topic, batch=10, ackTimeoutMillis=60_000)
    assert len(again) == 1
    assert api.post("ackMsg", topic=topic, msgId=again[0]["msgId"])[0] == 200
    last = api.pull(topic, batch=10, ackTimeoutMillis=60_000)
    assert [m["msgId"] for m in last] == [x for x in ("a1", "a2") if x != again[0]["msgId"]]
    code, body = api.post("sendMsg", topic=topic, msg="x", key="k" * 1025)
    assert code == 400 and body["msg"].startswith("key"), body
