"""broker.core.params: examples of every rule; every refusal names its parameter."""

from __future__ import annotations

import pytest

from broker.core.params import (
    MAX_LONG_POLLING_TIMEOUT_MS,
    MAX_NAME_BYTES,
    MAX_PULL_BATCH,
    MAX_SEND_BATCH,
    MAX_TRIGGER_MS,
    AckRequest,
    Defaults,
    DeleteRequest,
    GetRequest,
    LongPollRequest,
    MessageTooLarge,
    PullRequest,
    TopicRequest,
    decode_utf8,
    parse_ack,
    parse_delete,
    parse_get,
    parse_long_poll,
    parse_pull,
    parse_send,
    parse_send_batch,
    parse_topic,
)
from storage.errors import ConfigError, InvalidRequest
from storage.store import MAX_PRIORITY, MAX_RETRY_COUNT, MIN_PRIORITY, NewMessage

NOW = 1_658_492_212_132
D = Defaults()
LIMIT = 16


def send(**params: object) -> NewMessage:
    base: dict[str, object] = {"topic": "t", "msg": "m"}
    base.update(params)
    return parse_send(base, now_ms=NOW, make_id=lambda: "made", defaults=D, max_msg_bytes=LIMIT).message


def batch(body: dict[str, object]) -> tuple[NewMessage, ...]:
    ids = iter(range(10**6))
    sends = parse_send_batch(body, now_ms=NOW, make_id=lambda: f"id{next(ids)}", defaults=D, max_msg_bytes=LIMIT)
    return tuple(s.message for s in sends)


def refused(parameter: str, fn, *args, **kwargs) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        fn(*args, **kwargs)
    assert info.value.parameter == parameter, info.value
    return info.value


# ------------------------------------------------------------------ sendMsg

def test_minimal_send_takes_every_default() -> None:
    assert send() == NewMessage("t", "made", "m", NOW, NOW, D.ttl_ms, D.max_retry, 0, "")


def test_defaults_are_camellias() -> None:
    assert (D.ttl_ms, D.max_retry, D.ack_timeout_ms, D.long_polling_timeout_ms, D.batch) == \
        (3_600_000, 10, 30_000, 10_000, 1)


def test_every_field_given_as_form_text() -> None:
    m = send(msgId="a1", delayMillis="5000", ttlMillis="20000", maxRetry="3", priority="-7", tag="vip")
    assert m == NewMessage("t", "a1", "m", NOW, NOW + 5000, 20000, 3, -7, "vip")


def test_every_field_given_as_json() -> None:
    m = send(msgId="a1", delayMillis=5000, ttlMillis=20000.0, maxRetry=0, priority=MAX_PRIORITY, tag=None)
    assert m == NewMessage("t", "a1", "m", NOW, NOW + 5000, 20000, 0, MAX_PRIORITY, "")


@pytest.mark.parametrize("value", ["0", 0, "", None, "+0"])
def test_zero_or_absent_delay_is_due_now(value: object) -> None:
    assert send(delayMillis=value).trigger_ms == NOW


@pytest.mark.parametrize("value", ["-1", -1, "-99999999"])
def test_negative_delay_is_due_now_as_camellia(value: object) -> None:
    assert send(delayMillis=value).trigger_ms == NOW  # camellia's server: triggerTime = now


def test_a_negative_delay_never_makes_a_negative_trigger_time() -> None:
    assert send(delayMillis=str(-NOW - 5)).trigger_ms == NOW


def test_strict_idempotence_is_asked_per_send_or_per_batch() -> None:
    base = {"topic": "t", "msg": "m"}
    assert not parse_send(base, now_ms=NOW, make_id=lambda: "i", defaults=D, max_msg_bytes=LIMIT).strict
    assert parse_send({**base, "strictIdempotence": "true"}, now_ms=NOW, make_id=lambda: "i", defaults=D,
                      max_msg_bytes=LIMIT).strict
    sends = parse_send_batch({"topic": "t", "strictIdempotence": True,
                              "msgs": [{"msg": "a"}, {"msg": "b", "strictIdempotence": False}]},
                             now_ms=NOW, make_id=lambda: "i", defaults=D, max_msg_bytes=LIMIT)
    assert [s.strict for s in sends] == [True, False]
    refused("msgs[0].strictIdempotence", parse_send_batch, {"topic": "t", "msgs": [{"msg": "a",
            "strictIdempotence": "maybe"}]}, now_ms=NOW, make_id=lambda: "i", defaults=D, max_msg_bytes=LIMIT)


@pytest.mark.parametrize("field", ["delayMillis", "ttlMillis", "maxRetry", "priority", "triggerTime"])
@pytest.mark.parametrize("value", ["abc", "1.5", "1e3", " 5", "5 ", "1_000", "\u0661", "0x10", "+", True, 2.5,
                                   float("nan"), float("inf"), [1], {"a": 1}, "1" * 20])
def test_a_non_number_is_refused_naming_it(field: str, value: object) -> None:
    refused(field, send, **{field: value})


@pytest.mark.parametrize("value", ["", None, "0", "-1", -5])
def test_ttl_absent_empty_zero_or_negative_is_the_default(value: object) -> None:
    assert send(ttlMillis=value).ttl_ms == D.ttl_ms


@pytest.mark.parametrize("value", ["", None, "-1", -5])
def test_max_retry_absent_empty_or_negative_is_the_default(value: object) -> None:
    assert send(maxRetry=value).max_retry == D.max_retry


def test_max_retry_zero_means_one_delivery_and_is_kept() -> None:
    assert send(maxRetry="0").max_retry == 0


def test_max_retry_above_storage_range_is_clamped() -> None:
    assert send(maxRetry=str(MAX_RETRY_COUNT - 1)).max_retry == MAX_RETRY_COUNT - 1
    assert send(maxRetry=str(MAX_RETRY_COUNT + 1)).max_retry == MAX_RETRY_COUNT - 1


def test_priority_within_storage_range() -> None:
    assert send(priority=str(MIN_PRIORITY)).priority == MIN_PRIORITY
    assert send(priority=str(MAX_PRIORITY)).priority == MAX_PRIORITY
    refused("priority", send, priority=str(MAX_PRIORITY + 1))
    refused("priority", send, priority=str(MIN_PRIORITY - 1))


def test_absolute_trigger_time_wins_over_delay() -> None:
    assert send(triggerTime=str(NOW + 7), delayMillis="5000").trigger_ms == NOW + 7


def test_delay_is_still_validated_when_trigger_time_wins() -> None:
    refused("delayMillis", send, triggerTime=str(NOW), delayMillis="x")


def test_trigger_time_in_the_past_is_due_now_not_refused() -> None:
    assert send(triggerTime="0").trigger_ms == 0


def test_trigger_time_bounds() -> None:
    assert send(triggerTime=str(MAX_TRIGGER_MS)).trigger_ms == MAX_TRIGGER_MS
    refused("triggerTime", send, triggerTime=str(MAX_TRIGGER_MS + 1))
    assert send(triggerTime="-1").trigger_ms == 0  # in the past: due now


def test_delay_of_years_is_accepted_but_not_past_year_9999() -> None:
    fifty_years_ms = 50 * 365 * 24 * 3600 * 1000
    assert send(delayMillis=str(fifty_years_ms)).trigger_ms == NOW + fifty_years_ms
    assert send(delayMillis=str(MAX_TRIGGER_MS - NOW)).trigger_ms == MAX_TRIGGER_MS
    refused("delayMillis", send, delayMillis=str(MAX_TRIGGER_MS - NOW + 1))
    refused("delayMillis", send, delayMillis="9" * 19)


def test_msg_size_counts_utf8_bytes_and_the_limit_itself_is_accepted() -> None:
    assert send(msg="é" * (LIMIT // 2)).msg == "é" * (LIMIT // 2)  # 16 bytes, 8 characters
    with pytest.raises(MessageTooLarge) as info:
        send(msg="é" * (LIMIT // 2) + "x")
    assert info.value.parameter == "msg"
    assert isinstance(info.value, InvalidRequest)


def test_empty_msg_is_refused_as_camellia() -> None:
    refused("msg", send, msg="")


@pytest.mark.parametrize("missing", ["topic", "msg"])
def test_required_parameters(missing: str) -> None:
    params: dict[str, object] = {"topic": "t", "msg": "m"}
    del params[missing]
    refused(missing, parse_send, params, now_ms=NOW, make_id=lambda: "x", defaults=D, max_msg_bytes=LIMIT)


def test_empty_topic_is_missing() -> None:
    refused("topic", send, topic="")


def test_absent_or_empty_msg_id_is_made_by_the_server() -> None:
    assert send().msg_id == "made"
    assert send(msgId="").msg_id == "made"


@pytest.mark.parametrize("field", ["topic", "msgId", "tag"])
def test_name_length_is_counted_in_utf8_bytes(field: str) -> None:
    ok = "é" * (MAX_NAME_BYTES // 2)
    assert getattr(send(**{field: ok}), {"msgId": "msg_id"}.get(field, field)) == ok
    refused(field, send, **{field: ok + "x"})


@pytest.mark.parametrize("field", ["topic", "msgId"])
def test_nul_is_refused_where_storage_joins_with_it(field: str) -> None:
    refused(field, send, **{field: "a\0b"})


def test_tag_may_hold_nul_but_not_a_comma() -> None:
    assert send(tag="a\0b").tag == "a\0b"
    refused("tag", send, tag="a,b")


@pytest.mark.parametrize("field", ["topic", "msg", "msgId", "tag"])
def test_a_json_non_string_is_refused(field: str) -> None:
    refused(field, send, **{field: 5})


@pytest.mark.parametrize("field", ["topic", "msg", "msgId", "tag"])
def test_a_lone_surrogate_is_refused(field: str) -> None:
    refused(field, send, **{field: "a\ud800"})


def test_a_fair_key_is_up_to_64_utf8_bytes_of_any_text_but_nul() -> None:
    assert send().fair_key == send(fairKey="").fair_key == ""
    ok = "é" * 32
    assert send(fairKey=ok).fair_key == ok and send(fairKey="a,b c").fair_key == "a,b c"
    assert "64 UTF-8 bytes" in refused("fairKey", send, fairKey=ok + "x").reason
    refused("fairKey", send, fairKey="a\0b")
    refused("fairKey", send, fairKey=5)
    refused("fairKey", send, fairKey="a\ud800")
    body = {"topic": "t", "msgs": [{"msg": "m", "fairKey": "A"}, {"msg": "m"}]}
    assert [m.fair_key for m in batch(body)] == ["A", ""]
    body["msgs"].append({"msg": "m", "fairKey": "x" * 65})  # type: ignore[attr-defined]
    refused("msgs[2].fairKey", batch, body)


def test_ttl_above_the_servers_maximum_is_clamped() -> None:
    assert send(ttlMillis=str(MAX_TRIGGER_MS + 1)).ttl_ms == D.max_ttl_ms
    assert send(ttlMillis=str(D.max_ttl_ms)).ttl_ms == D.max_ttl_ms


def test_unknown_keys_are_ignored() -> None:
    assert send(whatever="x") == send()


# ------------------------------------------------------------- sendMsgBatch

def test_batch_keeps_order_and_makes_distinct_ids() -> None:
    got = batch({"topic": "t", "msgs": [{"msg": "a", "delayMillis": 5}, {"msg": "b", "msgId": "B"}, {"msg": "c"}]})
    assert [(m.msg, m.msg_id, m.trigger_ms - NOW) for m in got] == [("a", "id0", 5), ("b", "B", 0), ("c", "id1", 0)]
    assert all(m.topic == "t" and m.produce_ms == NOW for m in got)


def test_batch_item_errors_name_the_index() -> None:
    items: list[object] = [{"msg": "ok"}] * 3 + [{"msg": "ok", "delayMillis": "soon"}]
    refused("msgs[3].delayMillis", batch, {"topic": "t", "msgs": items})
    refused("msgs[1].msg", batch, {"topic": "t", "msgs": [{"msg": "ok"}, {}]})
    refused("msgs[0].priority", batch, {"topic": "t", "msgs": [{"msg": "ok", "priority": 1.5}]})
    refused("msgs[2]", batch, {"topic": "t", "msgs": [{"msg": "a"}, {"msg": "b"}, "c"]})


def test_batch_item_too_large_is_message_too_large_naming_the_index() -> None:
    with pytest.raises(MessageTooLarge) as info:
        batch({"topic": "t", "msgs": [{"msg": "ok"}, {"msg": "x" * (LIMIT + 1)}]})
    assert info.value.parameter == "msgs[1].msg"


def test_batch_item_may_repeat_the_topic_but_not_change_it() -> None:
    assert batch({"topic": "t", "msgs": [{"msg": "a", "topic": "t"}]})[0].topic == "t"
    refused("msgs[0].topic", batch, {"topic": "t", "msgs": [{"msg": "a", "topic": "u"}]})


def test_batch_shape() -> None:
    refused("topic", batch, {"msgs": [{"msg": "a"}]})
    refused("msgs", batch, {"topic": "t"})
    refused("msgs", batch, {"topic": "t", "msgs": {"msg": "a"}})
    refused("msgs", batch, {"topic": "t", "msgs": []})
    refused("msgs", batch, {"topic": "t", "msgs": [{"msg": "a"}] * (MAX_SEND_BATCH + 1)})
    assert len(batch({"topic": "t", "msgs": [{"msg": "a"}] * MAX_SEND_BATCH})) == MAX_SEND_BATCH


# ------------------------------------------------------------ other endpoints

@pytest.mark.parametrize(("text", "expected"), [("true", True), ("TRUE", True), ("1", True), ("False", False),
                                                ("0", False), (True, True), (0, False), ("", False), (None, False)])
def test_delete_release_booleans(text: object, expected: bool) -> None:
    assert parse_delete({"topic": "t", "msgId": "i", "release": text}) == DeleteRequest("t", "i", expected)


@pytest.mark.parametrize("value", ["yes", "2", "tru", 2, 1.0, []])
def test_a_non_boolean_is_refused_naming_it(value: object) -> None:
    refused("release", parse_delete, {"topic": "t", "msgId": "i", "release": value})
    refused("ack", parse_ack, {"topic": "t", "msgId": "i", "ack": value})


def test_ack_defaults_to_true_and_false_is_a_nack() -> None:
    assert parse_ack({"topic": "t", "msgId": "i"}) == AckRequest("t", "i", True)
    assert parse_ack({"topic": "t", "msgId": "i", "ack": "false"}) == AckRequest("t", "i", False)


@pytest.mark.parametrize("fn", [parse_delete, parse_ack, parse_get])
def test_msg_id_is_required_where_it_names_the_message(fn) -> None:
    refused("msgId", fn, {"topic": "t"})
    refused("msgId", fn, {"topic": "t", "msgId": ""})
    refused("topic", fn, {"msgId": "i"})
    refused("msgId", fn, {"topic": "t", "msgId": "a\0"})


def test_get_and_topic_info() -> None:
    assert parse_get({"topic": "t", "msgId": "i"}) == GetRequest("t", "i")
    assert parse_topic({"topic": "t"}) == TopicRequest("t")
    refused("topic", parse_topic, {})


def test_pull_defaults() -> None:
    assert parse_pull({"topic": "t"}, D) == PullRequest("t", D.ack_timeout_ms, D.batch, ())


@pytest.mark.parametrize("field", ["ackTimeoutMillis", "batch"])
@pytest.mark.parametrize("value", ["", "0", "-1", -3, None])
def test_pull_numbers_absent_empty_or_not_positive_are_defaults(field: str, value: object) -> None:
    assert parse_pull({"topic": "t", field: value}, D) == parse_pull({"topic": "t"}, D)


def test_pull_given_values_and_bounds() -> None:
    assert parse_pull({"topic": "t", "ackTimeoutMillis": "500", "batch": "7"}, D) == PullRequest("t", 500, 7, ())
    assert parse_pull({"topic": "t", "batch": str(MAX_PULL_BATCH)}, D).batch == MAX_PULL_BATCH
    assert parse_pull({"topic": "t", "batch": str(MAX_PULL_BATCH + 1)}, D).batch == MAX_PULL_BATCH
    assert parse_pull({"topic": "t", "ackTimeoutMillis": str(10**15)}, D).ack_timeout_ms == D.max_ack_timeout_ms
    refused("batch", parse_pull, {"topic": "t", "batch": "ten"}, D)
    refused("ackTimeoutMillis", parse_pull, {"topic": "t", "ackTimeoutMillis": "1.5"}, D)


def test_pull_tags() -> None:
    assert parse_pull({"topic": "t", "tags": "a,b,,a"}, D).tags == ("a", "b")
    assert parse_pull({"topic": "t", "tags": ["x", "y"]}, D).tags == ("x", "y")
    assert parse_pull({"topic": "t", "tags": ""}, D).tags == ()
    refused("tags", parse_pull, {"topic": "t", "tags": "a," + "x" * (MAX_NAME_BYTES + 1)}, D)
    refused("tags", parse_pull, {"topic": "t", "tags": ["a", 5]}, D)
    refused("tags", parse_pull, {"topic": "t", "tags": ",".join(str(i) for i in range(65))}, D)


def test_long_poll() -> None:
    assert parse_long_poll({"topic": "t"}, D) == LongPollRequest("t", D.ack_timeout_ms, D.batch, (),
                                                                 D.long_polling_timeout_ms)
    assert parse_long_poll({"topic": "t", "longPollingTimeoutMillis": "-1"}, D).long_polling_timeout_ms == \
        D.long_polling_timeout_ms
    assert parse_long_poll({"topic": "t", "longPollingTimeoutMillis": "250"}, D).long_polling_timeout_ms == 250
    assert parse_long_poll({"topic": "t", "longPollingTimeoutMillis": str(MAX_LONG_POLLING_TIMEOUT_MS + 1)},
                           D).long_polling_timeout_ms == MAX_LONG_POLLING_TIMEOUT_MS  # clamped, not refused
    refused("longPollingTimeoutMillis", parse_long_poll, {"topic": "t", "longPollingTimeoutMillis": "x"}, D)


# ---------------------------------------------------------- UTF-8, Defaults

def test_decode_utf8() -> None:
    assert decode_utf8("é".encode(), "msg") == "é"
    error = refused("msg", decode_utf8, b"ab\xff", "msg")
    assert "byte 2" in str(error)
    refused("topic", decode_utf8, b"\xed\xa0\x80", "topic")  # an encoded surrogate


def test_defaults_reject_nonsense() -> None:
    for bad in ({"ttl_ms": 0}, {"max_retry": -1}, {"ack_timeout_ms": 0}, {"batch": MAX_PULL_BATCH + 1},
                {"long_polling_timeout_ms": 0}, {"max_ack_timeout_ms": 1}, {"max_ttl_ms": 1}):
        with pytest.raises(ConfigError, match="must be in"):
            Defaults(**bad)  # type: ignore[arg-type]
    custom = Defaults(ttl_ms=5, max_retry=0)
    m = parse_send({"topic": "t", "msg": "m"}, now_ms=0, make_id=lambda: "i", defaults=custom, max_msg_bytes=1).message
    assert (m.ttl_ms, m.max_retry) == (5, 0)
