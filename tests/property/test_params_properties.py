"""Hypothesis properties of broker.core.params.

Any valid sendMsg (form text or JSON values) becomes exactly the NewMessage
a small independent model predicts; corrupting any one field raises
InvalidRequest naming exactly that field (`msgs[i].field` inside a batch);
and arbitrary mappings never raise anything but InvalidRequest.
"""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.params import (
    MAX_DURATION_MS,
    MAX_TRIGGER_MS,
    Defaults,
    MessageTooLarge,
    parse_ack,
    parse_delete,
    parse_get,
    parse_long_poll,
    parse_pull,
    parse_send,
    parse_send_batch,
    parse_topic,
)
from storage.errors import InvalidRequest
from storage.store import MAX_PRIORITY, MAX_RETRY_COUNT, MIN_PRIORITY, NewMessage

SETTINGS = settings(max_examples=150, deadline=None)
NOW = 1_700_000_000_000
D = Defaults()
MAX_MSG_BYTES = 64

# At most 64 characters of at most 4 UTF-8 bytes: always within 256 bytes.
names = st.text(st.characters(blacklist_characters="\0,", codec="utf-8"), min_size=1, max_size=64)
msgs = st.text(min_size=1, max_size=16)  # at most 64 bytes, never empty
NUMBER = re.compile(r"[+-]?[0-9]+")
non_numbers = st.one_of(
    st.sampled_from(["abc", "1.5", "1e3", " 1", "1 ", "1_0", "0x1", "\u0662", "+", "-"]),
    st.text(min_size=1).filter(lambda s: not NUMBER.fullmatch(s)),
)
json_non_numbers = st.sampled_from([True, False, 1.5, -0.25, float("nan"), [], {}, [1]])


def encode(draw: st.DrawFn, value: int | None, json: bool) -> object:
    """How a client might send `value`: absent handled by the caller."""
    if value is None:
        return draw(st.sampled_from(["", None])) if not json else None
    if json:
        return draw(st.sampled_from([value, float(value), str(value)]))
    return str(value)


@st.composite
def valid_send(draw: st.DrawFn) -> tuple[dict[str, object], NewMessage]:
    json = draw(st.booleans())
    fields = {
        "msgId": draw(st.none() | names),
        "delayMillis": draw(st.none() | st.integers(-2 * NOW, 10**12)),
        "triggerTime": draw(st.none() | st.integers(-10**6, MAX_TRIGGER_MS)),
        "ttlMillis": draw(st.none() | st.integers(-10**6, MAX_DURATION_MS)),
        "maxRetry": draw(st.none() | st.integers(-100, MAX_RETRY_COUNT + 5)),
        "priority": draw(st.none() | st.integers(MIN_PRIORITY, MAX_PRIORITY)),
        "tag": draw(st.none() | names),
    }
    params: dict[str, object] = {"topic": draw(names), "msg": draw(msgs)}
    for key, value in fields.items():
        if value is None and draw(st.booleans()):
            continue  # absent rather than empty
        if isinstance(value, str):
            params[key] = value
        elif value is None and key in ("msgId", "tag"):
            params[key] = "" if not json else draw(st.sampled_from(["", None]))
        else:
            params[key] = encode(draw, value, json)
    ttl, retry = fields["ttlMillis"], fields["maxRetry"]
    expected = NewMessage(
        topic=params["topic"], msg_id=fields["msgId"] or "made", msg=params["msg"], produce_ms=NOW,
        trigger_ms=max(0, fields["triggerTime"] if fields["triggerTime"] is not None
                       else NOW + max(0, fields["delayMillis"] or 0)),
        ttl_ms=min(ttl, D.max_ttl_ms) if ttl is not None and ttl > 0 else D.ttl_ms,
        max_retry=min(retry, MAX_RETRY_COUNT - 1) if retry is not None and retry >= 0 else D.max_retry,
        priority=fields["priority"] or 0, tag=fields["tag"] or "")  # type: ignore[arg-type]
    return params, expected


def corruptions(field: str) -> st.SearchStrategy[object]:
    """Values that make `field` alone invalid, whatever the other fields hold."""
    too_long = st.text(st.characters(blacklist_characters="\0,", codec="utf-8"), min_size=1025, max_size=1100)
    by_field: dict[str, st.SearchStrategy[object]] = {
        "topic": st.one_of(st.just(""), names.map(lambda s: s + "\0"), too_long, st.integers()),
        "msgId": st.one_of(names.map(lambda s: "\0" + s), too_long, st.integers()),
        "msg": st.one_of(st.text(min_size=MAX_MSG_BYTES + 1), st.integers(), st.just("")),
        "tag": st.one_of(names.map(lambda s: s + ","), too_long, st.integers()),
        "delayMillis": st.nothing(),  # any whole number is a delay (<= 0: now)
        "triggerTime": st.integers(MAX_TRIGGER_MS + 1, 10**19 - 1).map(str),
        "ttlMillis": st.nothing(),  # any whole number: defaulted or clamped
        "maxRetry": st.nothing(),
        "priority": st.one_of(st.integers(max_value=MIN_PRIORITY - 1), st.integers(min_value=MAX_PRIORITY + 1)),
    }
    numeric = field in ("delayMillis", "triggerTime", "ttlMillis", "maxRetry", "priority")
    return st.one_of(by_field[field], non_numbers, json_non_numbers) if numeric else by_field[field]


FIELDS = ["topic", "msgId", "msg", "tag", "delayMillis", "triggerTime", "ttlMillis", "maxRetry", "priority"]


def send(params: dict[str, object]) -> NewMessage:
    return parse_send(params, now_ms=NOW, make_id=lambda: "made", defaults=D, max_msg_bytes=MAX_MSG_BYTES).message


@SETTINGS
@given(valid_send())
def test_a_valid_send_becomes_the_predicted_message(case: tuple[dict[str, object], NewMessage]) -> None:
    params, expected = case
    assert send(params) == expected


@SETTINGS
@given(valid_send(), st.sampled_from(FIELDS), st.data())
def test_one_corrupted_field_is_refused_naming_it(case: tuple[dict[str, object], NewMessage], field: str,
                                                  data: st.DataObject) -> None:
    params = dict(case[0])
    params[field] = data.draw(corruptions(field))
    with pytest.raises(InvalidRequest) as caught:
        send(params)
    e = caught.value
    assert e.parameter == field, e
    assert isinstance(e, MessageTooLarge) == (field == "msg" and isinstance(params["msg"], str)
                                              and params["msg"] != "")


@SETTINGS
@given(st.lists(valid_send(), min_size=1, max_size=8), st.sampled_from(FIELDS[1:]), st.data())
def test_a_batch_is_all_or_nothing_naming_the_bad_index(cases: list[tuple[dict[str, object], NewMessage]],
                                                        field: str, data: st.DataObject) -> None:
    topic = cases[0][1].topic
    items = [dict(params, topic=topic) for params, _ in cases]
    expected = [m._replace(topic=topic) for _, m in cases]
    ids = iter(range(100))

    def parse() -> tuple[NewMessage, ...]:
        return tuple(s.message for s in parse_send_batch({"topic": topic, "msgs": items}, now_ms=NOW,
                                                         make_id=lambda: f"made{next(ids)}", defaults=D,
                                                         max_msg_bytes=MAX_MSG_BYTES))

    got = parse()
    assert [m._replace(msg_id="") for m in got] == [m._replace(msg_id="") for m in expected]
    assert [g.msg_id for g, e, (p, _) in zip(got, expected, cases) if p.get("msgId")] == \
        [e.msg_id for e, (p, _) in zip(expected, cases) if p.get("msgId")]

    index = data.draw(st.integers(0, len(items) - 1))
    items[index][field] = data.draw(corruptions(field))
    with pytest.raises(InvalidRequest) as caught:
        parse()
    assert caught.value.parameter == f"msgs[{index}].{field}", caught.value


KEYS = ["topic", "msg", "msgId", "delayMillis", "ttlMillis", "maxRetry", "priority", "triggerTime", "tag",
        "release", "ack", "ackTimeoutMillis", "batch", "tags", "longPollingTimeoutMillis", "msgs"]
form_values = st.one_of(st.text(), st.integers(-10**20, 10**20).map(str), st.sampled_from(["", "true", "0", "-1"]))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | st.text(), inner, max_size=4),
    max_leaves=12)


def every_parser(params: dict[str, object]) -> None:
    parsers = [
        lambda: send(params),
        lambda: parse_send_batch(params, now_ms=NOW, make_id=lambda: "m", defaults=D, max_msg_bytes=MAX_MSG_BYTES),
        lambda: parse_delete(params), lambda: parse_pull(params, D), lambda: parse_long_poll(params, D),
        lambda: parse_ack(params), lambda: parse_get(params), lambda: parse_topic(params),
    ]
    for parser in parsers:
        with contextlib.suppress(InvalidRequest):
            parser()


@SETTINGS
@given(st.dictionaries(st.text(), st.text()))
def test_arbitrary_text_mappings_raise_only_invalid_request(params: dict[str, object]) -> None:
    every_parser(params)


@SETTINGS
@given(st.dictionaries(st.sampled_from(KEYS), form_values))
def test_arbitrary_values_of_real_keys_raise_only_invalid_request(params: dict[str, object]) -> None:
    every_parser(params)


@SETTINGS
@given(st.dictionaries(st.sampled_from(KEYS), json_values))
def test_arbitrary_json_raises_only_invalid_request(params: dict[str, object]) -> None:
    every_parser(params)


# -- messages --------------------------------------------------------------------------------------------------------

@SETTINGS
@given(st.lists(st.fixed_dictionaries({"msg": msgs}, optional={
    "msgId": names, "delayMillis": st.integers(-10**6, 10**12), "priority": st.integers(-(2**15), 2**15 - 1),
    "tag": names.filter(lambda t: "," not in t), "maxRetry": st.integers(-5, 10**6)}), min_size=1, max_size=20))
def test_a_plain_batch_matches_its_items_sent_alone(items):
    """A batch of plain items equals each item parsed alone."""
    from broker.core.params import _message
    made = iter(f"gen{i}" for i in range(100))
    batch = parse_send_batch({"topic": "t", "msgs": items}, now_ms=NOW, make_id=lambda: next(made), defaults=D,
                             max_msg_bytes=MAX_MSG_BYTES)
    made = iter(f"gen{i}" for i in range(100))
    assert [s.message for s in batch] == [_message(item, "", "t", NOW, lambda: next(made), D, MAX_MSG_BYTES)
                                         for item in items]


@SETTINGS
@given(st.integers(0, MAX_RETRY_COUNT), st.sampled_from([None, "", -1, "3", 5, 10**9]))
def test_max_retry_is_capped_at_what_a_message_can_count(default_retry, given_retry):
    """A maxRetry, given or the server's default, above what a message can
    count is capped (retry counts deliveries: up to max_retry + 1)."""
    from dataclasses import replace

    from broker.core.params import _message
    defaults = replace(D, max_retry=default_retry)
    made = _message({"msg": "m", "msgId": "i", "maxRetry": given_retry}, "", "t", NOW, lambda: "x", defaults,
                    MAX_MSG_BYTES)
    wanted = default_retry if given_retry in (None, "", -1) else int(given_retry)
    assert made.max_retry == min(wanted, MAX_RETRY_COUNT - 1)


# -- a form's escapes --------------------------------------------------------------------------

FORM_BYTES = st.binary(max_size=40) | st.lists(
    st.sampled_from([b"%", b"+", b"%2", b"%7C", b"%7c", b"%zz", b"%e2%82%ac", b"a", b"=", b"&", b"%%41"]),
    max_size=12).map(b"".join)


@settings(max_examples=500)
@given(FORM_BYTES)
def test_a_forms_part_unescapes_as_urllib_does(raw):
    import urllib.parse

    from broker.core.params import unquote_plus
    assert unquote_plus(raw) == urllib.parse.unquote_to_bytes(raw.replace(b"+", b" "))


@settings(max_examples=300)
@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=20), min_size=1, max_size=5))
def test_a_form_escaped_by_any_client_reads_back_as_sent(fields):
    import urllib.parse

    from broker.core.params import parse_form
    for encode in (urllib.parse.urlencode, lambda f: urllib.parse.urlencode(f, quote_via=urllib.parse.quote)):
        try:
            raw = encode(fields).encode()
        except UnicodeEncodeError:  # (a lone surrogate: no client can send it)
            return
        assert parse_form(raw) == fields
