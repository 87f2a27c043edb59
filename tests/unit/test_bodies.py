"""broker.core.bodies: body caps, form pairs and JSON marks, checked before
anything is decoded."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.core.bodies import (
    BATCH_ITEM_BYTES,
    BODY_SLACK_BYTES,
    JSON_MARKS_PER_BODY,
    JSON_MARKS_PER_ITEM,
    BodyLimits,
    check_json_marks,
)
from broker.core.params import MAX_SEND_BATCH
from storage.errors import BodyTooLarge


def exact_marks(text: str) -> int:
    """`{ [ , :` outside strings, by walking the decoded value."""
    def walk(value) -> int:
        if isinstance(value, dict):
            return 1 + 2 * len(value) - (1 if value else 0) + sum(walk(v) for v in value.values())
        if isinstance(value, list):
            return 1 + max(0, len(value) - 1) + sum(walk(v) for v in value)
        return 0
    return walk(json.loads(text))


def test_caps_derive_from_max_msg_bytes_and_the_batch_size():
    limits = BodyLimits()
    assert limits.body_bytes(1 << 20) == 6 * (1 << 20) + BODY_SLACK_BYTES
    assert limits.batch_body_bytes(1 << 20) == 6 * (1 << 20) + BODY_SLACK_BYTES + BATCH_ITEM_BYTES * MAX_SEND_BATCH
    assert BodyLimits(max_batch_msgs=10).batch_json_marks == JSON_MARKS_PER_BODY + 10 * JSON_MARKS_PER_ITEM
    assert limits.batch_body_bytes(1 << 20) < 16 * (1 << 20)  # a 16 MiB batch is refused unread


def test_nonsense_limits_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--max-batch-msgs"):
        BodyLimits(max_batch_msgs=MAX_SEND_BATCH + 1)
    with pytest.raises(ValueError, match="--max-batch-msgs"):
        BodyLimits(max_batch_msgs=0)
    with pytest.raises(ValueError, match="--max-form-pairs"):
        BodyLimits(max_form_pairs=3)


def test_form_pairs_are_counted_before_splitting():
    limits = BodyLimits(max_form_pairs=100)
    limits.check_form(b"&".join([b"a=1"] * 100), "the form body")
    limits.check_form("&".join(["a=1"] * 100), "the query string")
    with pytest.raises(BodyTooLarge, match="101 parameters, more than 100"):
        limits.check_form(b"&" * 100, "the form body")


def test_a_flood_of_empty_objects_is_refused_and_a_real_batch_is_not():
    flood = b'{"topic":"t","msgs":[' + b"{}," * 1_000_000 + b"{}]}"
    with pytest.raises(BodyTooLarge, match="more than 66112 JSON marks"):
        check_json_marks(flood, BodyLimits().batch_json_marks, "the body")
    batch = json.dumps({"topic": "t", "msgs": [
        {"msg": json.dumps({"order": i, "lines": [1, 2, 3], "note": "a,b:c{d["}), "msgId": str(i),
         "delayMillis": 1000, "ttlMillis": 60000, "maxRetry": 3, "tag": "x", "priority": 1}
        for i in range(MAX_SEND_BATCH)]})
    check_json_marks(batch.encode(), BodyLimits().batch_json_marks, "the body")
    check_json_marks(batch, BodyLimits().batch_json_marks, "msgs")  # a form's text value


def test_marks_inside_strings_do_not_count():
    text = json.dumps({"topic": "t", "msg": "{[,:" * 10_000 + '\\"' + '"'})
    check_json_marks(text.encode(), 8, "the body")
    check_json_marks(b'"' + b'\\"' * 100_000, 8, "the body")  # never ends: left to the decoder


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda children: st.lists(children) | st.dictionaries(st.text(), children), max_leaves=40))
def test_the_count_is_exact_outside_strings(value):
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        raw = text.encode("utf-8", "surrogatepass")
        marks = exact_marks(text)
        check_json_marks(text, marks, "v")
        check_json_marks(raw, marks, "v")
        if marks:
            with pytest.raises(BodyTooLarge):
                check_json_marks(text, marks - 1, "v")
            with pytest.raises(BodyTooLarge):
                check_json_marks(raw, marks - 1, "v")
