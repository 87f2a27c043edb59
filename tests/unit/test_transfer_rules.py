"""What an import makes of each message it reads (broker.transfer's
`pending` rules), for camellia's layout and hourglass's own lines: never
earlier than the source would deliver it, the same expiry instant, its
maxRetry and retry count, a dead one dead, and nothing the source has
ended otherwise (acked, deleted)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from broker.transfer import camellia, lines

NOW = 1_800_000_000_000
times = st.integers(NOW - 10**9, NOW + 10**11)


@st.composite
def camellia_rows(draw):
    trigger = draw(times)
    return {"topic": draw(st.text(min_size=1, max_size=8)), "msgId": draw(st.text(min_size=1, max_size=8)),
            "msg": draw(st.text(min_size=1, max_size=8)), "produceTime": trigger - 1000, "triggerTime": trigger,
            "expireTime": draw(times), "maxRetry": draw(st.integers(0, 20)), "retry": draw(st.integers(0, 22)),
            "status": draw(st.integers(0, 9))}


@given(camellia_rows(), st.none() | times)
def test_a_camellia_message_is_sent_as_camellia_would_deliver_it(row, ack_deadline):
    key = camellia.msg_key("ns", row["topic"], row["msgId"]).encode()
    outcome = camellia.pending(camellia.Found(key, row, ack_deadline), "ns", NOW)
    due = row["triggerTime"] if ack_deadline is None else max(row["triggerTime"], ack_deadline)
    if row["status"] not in (1, 2, 3):  # ended, or a status camellia does not know (it ends those)
        assert outcome == "ended"
    elif row["expireTime"] <= NOW or row["expireTime"] <= due:
        assert outcome == "expired"
    elif row["retry"] > row["maxRetry"]:
        assert outcome == "retries used"
    else:
        topic, msg, status, retry = outcome
        assert topic == row["topic"] and msg.msg_id == row["msgId"] and msg.msg == row["msg"]
        assert msg.trigger_time_ms == due >= row["triggerTime"]  # never before camellia would hand it out
        assert msg.trigger_time_ms + msg.ttl_ms == row["expireTime"] and msg.ttl_ms > 0
        assert (msg.max_retry, status, retry) == (row["maxRetry"], 1, row["retry"]) and retry <= msg.max_retry


@given(camellia_rows())
def test_a_key_is_taken_only_if_its_message_makes_exactly_that_key(row):
    row = {**row, "status": 1, "expireTime": NOW + 10**12, "retry": 0}
    other = camellia.msg_key("ns|x", row["topic"], row["msgId"]).encode()
    assert camellia.pending(camellia.Found(other, row, None), "ns", NOW) == "another namespace"
    assert camellia.pending(camellia.Found(b"k", {}, None), "ns", NOW) == "gone"
    assert camellia.pending(camellia.Found(b"k", {"unreadable": True}, None), "ns", NOW) == "unreadable"


def test_the_scan_pattern_escapes_the_namespaces_glob_characters():
    assert camellia.msg_pattern("a*b?[c]\\") == "camellia_delay_queue_msg|a\\*b\\?\\[c\\]\\\\|*"


@given(camellia_rows(), st.integers(0, 9), st.sampled_from(["", "t"]), st.sampled_from(["", "k"]))
def test_an_exported_line_keeps_its_fields_or_says_why_not(row, priority, tag, key):
    row = {**row, "priority": priority, "tag": tag, "key": key}
    outcome = lines.pending(orjson.dumps(row), NOW)
    dead = row["status"] in (5, 6)
    if row["status"] in lines.NOT_SENT:
        assert outcome == lines.NOT_SENT[row["status"]]
    elif row["status"] not in (1, 2, 3, 5, 6) or row["expireTime"] <= row["triggerTime"]:
        assert outcome == "unreadable"  # (not a status, or an expiry, a node writes)
    elif not dead and row["expireTime"] <= NOW:
        assert outcome == "expired"
    else:
        topic, msg, status, retry = outcome
        assert (topic, msg.msg_id, msg.msg, msg.trigger_time_ms) == (row["topic"], row["msgId"], row["msg"],
                                                                    row["triggerTime"])
        assert msg.trigger_time_ms + msg.ttl_ms == row["expireTime"]
        assert (msg.priority, msg.tag, msg.key, msg.max_retry) == (priority, tag or None, key or None,
                                                                  row["maxRetry"])
        if dead:
            assert status == row["status"] and retry == min(row["retry"], row["maxRetry"] + 1)
        elif row["retry"] > row["maxRetry"]:  # no delivery left: dead, as the old node ends it
            assert (status, retry) == (6, row["maxRetry"] + 1)
        else:
            assert (status, retry) == (1, row["retry"])


def test_a_line_that_is_not_a_message_is_unreadable():
    for line in (b"not json", b"[]", b'{"topic": 1}', b'{"topic": "t", "msgId": "m", "msg": "x", "status": "a"}'):
        assert lines.pending(line, NOW) == "unreadable"
