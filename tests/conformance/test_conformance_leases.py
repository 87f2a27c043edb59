"""Leases (docs/api.md, "Leases"): every hand-over carries a `deliveryId`;
`extendMsg` keeps a consuming message with its holder; an ack, nack or
extension fenced by a deliveryId that is not the current one answers
code 409 and changes nothing. The same on every backend (see conftest)."""

import time

import pytest

pytestmark = pytest.mark.slow


def _due(api, topic, *msg_ids):
    for msg_id in msg_ids:
        api.send(topic, msgId=msg_id)
    for msg_id in msg_ids:
        api.wait_status(topic, msg_id, {2})


def test_every_hand_over_has_a_new_delivery_id_that_get_msg_does_not_show(api, topic):
    _due(api, topic, "a")
    first = api.pull(topic, ackTimeoutMillis=300)[0]
    assert len(first["deliveryId"]) == 16 and int(first["deliveryId"], 16) > 0
    assert "deliveryId" not in api.message(topic, "a")  # a hand-over's, not the message's
    second = api.pull_until(topic, 1, ackTimeoutMillis=60_000)[0]  # its ack timed out: delivered again
    assert second["retry"] == 2 and second["deliveryId"] != first["deliveryId"]


def test_a_stale_delivery_cannot_ack_nack_or_extend_the_current_holders_message(api, topic):
    _due(api, topic, "a")
    stale = api.pull(topic, ackTimeoutMillis=300)[0]["deliveryId"]
    current = api.pull_until(topic, 1, ackTimeoutMillis=60_000)[0]["deliveryId"]
    for path, extra in (("ackMsg", {}), ("ackMsg", {"ack": "false"}), ("extendMsg", {"ackTimeoutMillis": 5000})):
        status, body = api.post(path, topic=topic, msgId="a", deliveryId=stale, **extra)
        assert status == body["code"] == 409, body
        assert stale in body["msg"] and body["status"] == 3
    held = api.message(topic, "a")
    assert (held["status"], held["retry"]) == (3, 2)  # nothing changed: still the current holder's
    status, body = api.post("ackMsg", topic=topic, msgId="a", deliveryId=current)
    assert status == body["code"] == 200, body
    assert api.message(topic, "a")["status"] == 4
    status, body = api.post("ackMsg", topic=topic, msgId="a", deliveryId=current)
    assert body["code"] == 409 and body["status"] == 4  # acked: no delivery is current any more


def test_extend_keeps_the_message_past_its_ack_timeout(api, topic):
    _due(api, topic, "a")
    got = api.pull(topic, ackTimeoutMillis=600)[0]
    for _ in range(4):  # 4 extensions of 600 ms every 300 ms: held 1.2 s past its first deadline
        time.sleep(0.3)
        status, body = api.post("extendMsg", topic=topic, msgId="a", deliveryId=got["deliveryId"],
                                ackTimeoutMillis=600)
        assert status == body["code"] == 200, body
        assert body["deadline"] >= int(time.time() * 1000) + 400
        assert api.pull(topic) == []  # not delivered again meanwhile
    assert api.message(topic, "a")["retry"] == 1
    # left alone, it times out and is delivered again, under a new delivery
    again = api.pull_until(topic, 1, timeout_s=5)
    assert [m["msgId"] for m in again] == ["a"] and again[0]["deliveryId"] != got["deliveryId"]


def test_a_fenced_nack_by_the_holder_redelivers(api, topic):
    _due(api, topic, "a")
    got = api.pull(topic, ackTimeoutMillis=60_000)[0]
    status, body = api.post("ackMsg", topic=topic, msgId="a", ack="false", deliveryId=got["deliveryId"])
    assert status == body["code"] == 200, body
    again = api.pull_until(topic, 1)
    assert again[0]["retry"] == 2 and again[0]["deliveryId"] != got["deliveryId"]


def test_many_ids_answer_a_result_each(api, topic):
    _due(api, topic, "a", "b", "c")
    got = {m["msgId"]: m["deliveryId"] for m in api.pull(topic, batch=3, ackTimeoutMillis=60_000)}
    assert sorted(got) == ["a", "b", "c"]
    status, body = api.post_json("extendMsg", {"topic": topic, "msgIds": ["a", "b", "nope"],
                                               "deliveryIds": [got["a"], "1", got["c"]],
                                               "ackTimeoutMillis": 30_000})
    assert status == body["code"] == 200, body
    codes = {r["msgId"]: (r["code"], r["status"]) for r in body["results"]}
    assert codes == {"a": (200, 3), "b": (409, 3), "nope": (409, None)}
    status, body = api.post_json("ackMsg", {"topic": topic, "msgIds": ["a", "b", "c"],
                                            "deliveryIds": [got["a"], got["b"], "2"]})
    codes = {r["msgId"]: (r["code"], r["status"]) for r in body["results"]}
    assert codes == {"a": (200, 4), "b": (200, 4), "c": (409, 3)}


def test_an_ack_without_delivery_id_acks_by_msg_id_as_camellia(api, topic):
    _due(api, topic, "a")
    api.pull(topic, ackTimeoutMillis=60_000)
    assert api.post("ackMsg", topic=topic, msgId="a")[1]["code"] == 200
    assert api.message(topic, "a")["status"] == 4


@pytest.mark.parametrize(("params", "named"), [
    ({"msgId": "a"}, "deliveryId"),
    ({"msgId": "a", "deliveryId": "xyz"}, "deliveryId"),
    ({"msgId": "a", "deliveryId": "0"}, "deliveryId"),
    ({"msgId": "a", "deliveryId": "1" * 17}, "deliveryId"),
    ({"msgIds": "a,b", "deliveryIds": "1"}, "deliveryIds"),
    ({"msgIds": "a,b", "deliveryIds": "1,zz"}, "deliveryIds[1]"),
    ({"msgIds": "a,b", "deliveryId": "1"}, "deliveryId"),
    ({"deliveryId": "1"}, "msgId"),
])
def test_bad_extend_parameters_are_named_and_change_nothing(api, topic, params, named):
    _due(api, topic, "a")
    got = api.pull(topic, ackTimeoutMillis=60_000)[0]
    status, body = api.post("extendMsg", topic=topic, **params)
    assert status == body["code"] == 400 and body["msg"].startswith(named + ":"), body
    after = api.message(topic, "a")
    assert (after["status"], after["retry"]) == (3, 1)
    assert api.post("ackMsg", topic=topic, msgId="a", deliveryId=got["deliveryId"])[1]["code"] == 200


def test_a_lease_cannot_pass_max_lease_ms_since_its_hand_over(serve, topic):
    api = serve("--max-lease-ms", "1500")
    _due(api, topic, "a")
    got = api.pull(topic, ackTimeoutMillis=1000)[0]
    _, body = api.post("extendMsg", topic=topic, msgId="a", deliveryId=got["deliveryId"],
                       ackTimeoutMillis=1000)
    assert body["code"] == 200, body  # hand-over + about 1 s: within 1.5 s
    time.sleep(0.7)
    _status, body = api.post("extendMsg", topic=topic, msgId="a", deliveryId=got["deliveryId"],
                            ackTimeoutMillis=1000)
    assert body["code"] == 409 and "--max-lease-ms" in body["msg"], body
    assert api.post("ackMsg", topic=topic, msgId="a", deliveryId=got["deliveryId"])[1]["code"] == 200
