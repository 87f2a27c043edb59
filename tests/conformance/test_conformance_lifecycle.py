"""Pull, ack, nack, ack timeouts, ttl, delete and long polls, the same on
every backend (see conftest). Delays and timeouts are short; tests wait for
a state by polling, never by a fixed sleep that assumes a speed."""

import threading
import time

import pytest

pytestmark = pytest.mark.slow


def ids(messages):
    return [m["msgId"] for m in messages]


# -- pull order and filters ---------------------------------------------------------


def test_lifecycle_waiting_ready_consuming_acked(api, topic):
    send = api.send(topic, msgId="a", delayMillis=300)
    assert api.pull(topic) == []  # not due yet: never early
    assert api.message(topic, "a")["status"] == 1
    got = api.pull_until(topic, 1)
    assert ids(got) == ["a"] and (got[0]["status"], got[0]["retry"]) == (3, 1)  # retry counts pulls
    assert int(time.time() * 1000) >= send["triggerTime"]
    assert api.message(topic, "a")["status"] == 3
    assert api.post("ackMsg", topic=topic, msgId="a")[0] == 200
    assert api.message(topic, "a")["status"] == 4
    assert api.post("ackMsg", topic=topic, msgId="a")[0] == 200  # acking twice is harmless
    assert api.pull(topic) == []


def test_pull_order_is_priority_then_trigger_time(api, topic):
    now = int(time.time() * 1000)
    api.send(topic, msgId="late-low", triggerTime=now - 1000)
    api.send(topic, msgId="high", triggerTime=now, priority=5)
    api.send(topic, msgId="early-low", triggerTime=now - 2000)
    api.send(topic, msgId="negative", triggerTime=now - 9000, priority=-3)
    api.send(topic, msgId="higher-later", triggerTime=now - 10, priority=5)
    for msg_id in ("late-low", "high", "early-low", "negative", "higher-later"):
        api.wait_status(topic, msg_id, {2})
    got = api.pull(topic, batch=10)
    assert ids(got) == ["higher-later", "high", "early-low", "late-low", "negative"]


def test_tags_filter_pulls(api, topic):
    now = int(time.time() * 1000)
    api.send(topic, msgId="a", tag="red", triggerTime=now - 30)
    api.send(topic, msgId="b", tag="blue", triggerTime=now - 20)
    api.send(topic, msgId="g", tag="green", triggerTime=now - 25, priority=1)
    api.send(topic, msgId="c", triggerTime=now - 40)
    for msg_id in "abgc":
        api.wait_status(topic, msg_id, {2})
    assert api.pull(topic, tags="violet") == []
    got = api.pull(topic, tags="blue,green", batch=5)
    assert ids(got) == ["g", "b"] and [m["tag"] for m in got] == ["green", "blue"]
    assert ids(api.pull(topic, batch=5)) == ["c", "a"]


def test_pull_of_unknown_topic_is_empty(api, topic):
    assert api.pull(topic, batch=10) == []
    assert api.pull_until(topic, 1, timeout_s=0.3) == []


# -- ack and nack ----------------------------------------------------------------------


def test_ack_of_ready_message_acks_it(api, topic):
    api.send(topic, msgId="r")
    api.wait_status(topic, "r", {2})
    assert api.post("ackMsg", topic=topic, msgId="r")[0] == 200
    assert api.message(topic, "r")["status"] == 4
    assert api.pull(topic) == []


def test_ack_of_a_waiting_message_acks_it_and_other_acks_change_nothing(api, topic):
    api.send(topic, msgId="w", delayMillis=600000)
    api.send(topic, msgId="w2", delayMillis=600000)
    api.send(topic, msgId="e", maxRetry=0)
    assert api.post("ackMsg", topic=topic, msgId="w", ack="false") == (200, {"code": 200, "msg": "success"})
    assert api.message(topic, "w")["status"] == 1  # a nack of a waiting message: nothing to do
    assert api.post("ackMsg", topic=topic, msgId="w")[0] == 200  # as camellia: acked, never delivered
    assert api.message(topic, "w")["status"] == 4
    assert api.info(topic)["waitingQueueSize"] == 1
    assert ids(api.pull_until(topic, 1)) == ["e"]
    assert api.post("ackMsg", topic=topic, msgId="e", ack="false")[0] == 200
    assert api.message(topic, "e")["status"] == 6
    for ack in ("true", "false"):  # ended: no error, no change
        assert api.post("ackMsg", topic=topic, msgId="e", ack=ack)[0] == 200
        assert api.message(topic, "e")["status"] == 6


def test_nack_makes_it_ready_now_with_retry(api, topic):
    api.send(topic, msgId="n", maxRetry=0)
    api.send(topic, msgId="n2", maxRetry=3)
    got = api.pull_until(topic, 2, ackTimeoutMillis=600000)
    assert set(ids(got)) == {"n", "n2"}
    assert api.post("ackMsg", topic=topic, msgId="n2", ack="false")[0] == 200
    m = api.message(topic, "n2")
    assert (m["status"], m["retry"]) == (2, 1)  # delivered once so far
    assert api.post("ackMsg", topic=topic, msgId="n2", ack="false")[0] == 200  # of a ready one: no change
    assert api.message(topic, "n2") == m
    again = api.pull_until(topic, 1)
    assert ids(again) == ["n2"] and again[0]["retry"] == 2
    assert api.post("ackMsg", topic=topic, msgId="n", ack="false")[0] == 200
    assert api.message(topic, "n")["status"] == 6  # maxRetry=0: one delivery only


def test_ack_timeout_redelivers_with_retry_then_ends(api, topic):
    api.send(topic, msgId="t", maxRetry=1)
    first = api.pull_until(topic, 1, ackTimeoutMillis=200)
    assert first[0]["retry"] == 1
    second = api.pull_until(topic, 1, ackTimeoutMillis=200)
    assert ids(second) == ["t"] and second[0]["retry"] == 2
    ended = api.wait_status(topic, "t", {4, 5, 6, 7})
    assert (ended["status"], ended["retry"]) == (6, 2)  # maxRetry=1: two deliveries, then ended
    assert api.pull_until(topic, 1, timeout_s=0.4) == []
    assert (api.info(topic)["readyQueueSize"], api.info(topic)["ackQueueSize"]) == (0, 0)

# -- ttl ---------------------------------------------------------------------------------


def test_ttl_ends_a_never_delivered_message_as_5(api, topic):
    api.send(topic, msgId="e", ttlMillis=100)
    assert api.wait_status(topic, "e", {5, 6})["status"] == 5
    assert api.pull(topic) == []

def test_a_message_already_expired_when_due_ends_as_5(api, topic):
    now = int(time.time() * 1000)
    m = api.send(topic, msgId="old", triggerTime=now - 5000, ttlMillis=1000)
    assert m["status"] == 5 and m["expireTime"] < now  # due at once, and already past its ttl
    assert api.wait_status(topic, "old", {5})["status"] == 5
    assert api.pull(topic) == []


# -- delete --------------------------------------------------------------------------


def test_delete_waiting_ready_and_consuming(api, topic):
    api.send(topic, msgId="w", delayMillis=600000)
    api.send(topic, msgId="c")
    assert ids(api.pull_until(topic, 1)) == ["c"]
    api.send(topic, msgId="r")
    api.wait_status(topic, "r", {2})
    for msg_id in ("w", "r", "c"):
        assert api.post("deleteMsg", topic=topic, msgId=msg_id)[0] == 200
        assert api.message(topic, msg_id)["status"] == 7
    assert api.pull(topic, batch=5) == []
    data = api.info(topic)
    assert (data["waitingQueueSize"], data["readyQueueSize"], data["ackQueueSize"]) == (0, 0, 0)
    assert api.post("ackMsg", topic=topic, msgId="c")[0] == 200  # deleted: an ack changes nothing
    assert api.message(topic, "c")["status"] == 7


def test_delete_of_an_ended_message_is_404_and_changes_nothing(api, topic):
    api.send(topic, msgId="a")
    api.pull_until(topic, 1)
    api.post("ackMsg", topic=topic, msgId="a")
    assert api.post("deleteMsg", topic=topic, msgId="a")[0] == 404  # camellia's SDK: false
    assert api.server.http_status == 200
    assert api.message(topic, "a")["status"] == 4


def test_a_resend_of_an_ended_id_stores_the_new_message_unless_strict(api, topic):
    api.send(topic, "first", msgId="r")
    assert api.send(topic, "dup", msgId="r")["msg"] == "first"  # alive: the stored one, unchanged
    api.pull_until(topic, 1)
    api.post("ackMsg", topic=topic, msgId="r")
    strict = api.send(topic, "strict", msgId="r", strictIdempotence="true")
    assert (strict["msg"], strict["status"]) == ("first", 4)
    again = api.send(topic, "second", msgId="r", delayMillis=600000)
    assert (again["msg"], again["status"], again["retry"]) == ("second", 1, 0)  # as camellia
    assert api.message(topic, "r")["msg"] == "second"


def test_a_send_due_now_answers_ready(api, topic):
    for delay in ("0", "-5000"):
        m = api.send(topic, msgId=f"d{delay}", delayMillis=delay)
        assert m["status"] == 2, m  # camellia: <= 0 is now, and the answer says ready
    assert sorted(ids(api.pull_until(topic, 2))) == ["d-5000", "d0"]


def test_delete_with_release_forgets_the_id(api, topic):
    api.send(topic, "old", msgId="x", delayMillis=600000)
    api.send(topic, "acked", msgId="y")
    api.pull_until(topic, 1)
    api.post("ackMsg", topic=topic, msgId="y")
    for msg_id, code in (("x", 200), ("y", 404)):  # y had ended: 404, released all the same
        assert api.post("deleteMsg", topic=topic, msgId=msg_id, release="true")[0] == code
        assert api.message(topic, msg_id) == 404
    assert api.post("deleteMsg", topic=topic, msgId="x", release="true")[0] == 404
    again = api.send(topic, "new", msgId="x")
    assert (again["msg"], again["status"], again["retry"]) == ("new", 2, 0)
    assert ids(api.pull_until(topic, 1)) == ["x"]


# -- long polls ------------------------------------------------------------------------


def test_long_poll_is_answered_when_the_message_is_released(api, topic):
    api.send(topic, msgId="lp", delayMillis=700)
    started = time.monotonic()
    status, body = api.post("longPollingMsg", topic=topic, longPollingTimeoutMillis=5000)
    waited = time.monotonic() - started
    assert status == 200 and ids(body["delayMsgList"]) == ["lp"]
    assert 0.3 < waited < 4  # woken by the release, long before the poll's timeout


def test_long_poll_is_answered_by_a_send_while_it_waits(api, topic):
    answer = {}

    def poll():
        answer["got"] = api.post("longPollingMsg", topic=topic, longPollingTimeoutMillis=5000, batch=5)

    waiter = threading.Thread(target=poll)
    started = time.monotonic()
    waiter.start()
    time.sleep(0.3)
    api.send(topic, msgId="s")
    waiter.join(10)
    status, body = answer["got"]
    assert status == 200 and ids(body["delayMsgList"]) == ["s"]
    assert time.monotonic() - started < 4


def test_long_poll_times_out_empty(api, topic):
    started = time.monotonic()
    status, body = api.post("longPollingMsg", topic=topic, longPollingTimeoutMillis=300)
    assert status == 200 and body["delayMsgList"] == []
    assert 0.25 <= time.monotonic() - started < 3


def test_a_long_poll_whose_client_left_takes_nothing(api, topic):
    api.abandoned_long_poll(topic, longPollingTimeoutMillis=20000, ackTimeoutMillis=600000)
    time.sleep(0.2)  # the poll's client is gone
    api.send(topic, msgId="g", maxRetry=0)
    time.sleep(0.5)
    m = api.message(topic, "g")
    assert (m["status"], m["retry"]) == (2, 0)  # still ready, not handed to nobody
    assert ids(api.pull_until(topic, 1)) == ["g"]
