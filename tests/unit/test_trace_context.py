"""broker.core.trace_context: the W3C traceparent and tracestate rules, the
spec's own examples taken, each rule's breach refused naming the
parameter, and any tracestate built by the grammar kept (without its
spaces and empty members) while one past a bound is refused."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given

from broker.core.trace_context import (
    MAX_TRACESTATE_CHARS,
    MAX_TRACESTATE_MEMBERS,
    check_traceparent,
    check_tracestate,
    trace_fields,
)
from storage.errors import InvalidRequest

SPEC_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def refusal(check, value) -> str:
    with pytest.raises(InvalidRequest) as caught:
        check(value)
    return str(caught.value)


def test_the_spec_examples_are_taken():
    assert check_traceparent(SPEC_TRACEPARENT) == SPEC_TRACEPARENT
    assert check_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
    assert check_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE") == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert check_tracestate("fw529a3039@dt=00f067aa0ba902b7") == "fw529a3039@dt=00f067aa0ba902b7"
    assert check_tracestate("a=1 , \t,b=x y  ") == "a=1,b=x y"


@pytest.mark.parametrize(("value", "reason"), [
    (SPEC_TRACEPARENT.upper(), "lower case"),
    ("ff" + SPEC_TRACEPARENT[2:], "version ff"),
    ("00-" + "0" * 32 + SPEC_TRACEPARENT[35:], "all-zero trace-id"),
    (SPEC_TRACEPARENT[:36] + "0" * 16 + SPEC_TRACEPARENT[52:], "all-zero parent-id"),
    (SPEC_TRACEPARENT + "-01", "exactly 55"),
    ("01" + SPEC_TRACEPARENT[2:] + ".x", "W3C traceparent"),  # a later version's extra needs a "-"
    (SPEC_TRACEPARENT[:-1], "W3C traceparent"),
    (SPEC_TRACEPARENT.replace("-", "_"), "W3C traceparent"),
    ("01" + SPEC_TRACEPARENT[2:] + "-" + "x" * 100, "at most 128"),
    (55, "must be a string"),
])
def test_a_traceparent_breaking_a_rule_is_refused(value, reason):
    text = refusal(check_traceparent, value)
    assert text.startswith("traceparent") and reason in text


def test_a_later_version_may_carry_more_fields():
    value = "cc" + SPEC_TRACEPARENT[2:] + "-0123-abcdef-9"
    assert check_traceparent(value) == value


@pytest.mark.parametrize("extra", ["\r\nX-Injected: 1", "\x00", "<script>", "-what-the-future-has", "-", "--01", "-01-",
                                   "-01 ", "-AB", "-01\n"])
def test_a_later_versions_fields_are_lower_case_hex_and_nothing_else(extra):
    text = refusal(check_traceparent, "cc" + SPEC_TRACEPARENT[2:] + extra)
    assert text.startswith("traceparent") and "W3C traceparent" in text


@given(st.lists(st.text(alphabet="0123456789abcdef", min_size=1, max_size=8), max_size=6))
def test_any_later_version_of_hex_fields_is_kept_as_given(fields):
    value = "01" + SPEC_TRACEPARENT[2:] + "".join("-" + field for field in fields)
    if len(value) <= 128:
        assert check_traceparent(value) == value


@pytest.mark.parametrize(("value", "reason"), [
    ("Rojo=1", "list-member 0"),
    ("a=1,=2", "list-member 1"),
    ("a=1,b", "list-member 1"),
    ("a=", "list-member 0"),
    ("a=x,", None),  # an empty member at the end is allowed
    ("a=b=c", "list-member 0"),
    ("a=b,a=c", "twice"),
    ("a=" + "v" * 257, "list-member 0"),
    ("a" * 257 + "=v", "list-member 0"),
    ("t@" + "s" * 15 + "=v", "list-member 0"),  # a system-id of 15
    ("a=é", "list-member 0"),
    (",".join(f"k{i}=v" for i in range(MAX_TRACESTATE_MEMBERS + 1)), f"at most {MAX_TRACESTATE_MEMBERS}"),
    ("a=" + "v" * 200 + ",b=" + "v" * 200 + ",c=" + "v" * 200, f"at most {MAX_TRACESTATE_CHARS}"),
    (["a=1"], "must be a string"),
])
def test_a_tracestate_breaking_a_rule_is_refused(value, reason):
    if reason is None:
        assert check_tracestate(value) == value.rstrip(",")
        return
    text = refusal(check_tracestate, value)
    assert text.startswith("tracestate") and reason in text


def test_trace_fields_take_none_and_empty_as_not_given_and_need_a_parent_for_a_state():
    assert trace_fields(None, None) == ("", "")
    assert trace_fields("", "") == ("", "")
    assert trace_fields(SPEC_TRACEPARENT, None) == (SPEC_TRACEPARENT, "")
    assert refusal(lambda v: trace_fields(None, v), "a=1").startswith("tracestate: needs a traceparent")


lcalpha = "abcdefghijklmnopqrstuvwxyz"
key_chars = lcalpha + "0123456789_-*/"
keys = st.one_of(
    st.builds(str.__add__, st.sampled_from(lcalpha), st.text(key_chars, max_size=20)),
    st.builds(lambda t, s: f"{t}@{s}", st.text(lcalpha + "0123456789", min_size=1, max_size=10),
              st.builds(str.__add__, st.sampled_from(lcalpha), st.text(key_chars, max_size=13))))
value_chars = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in ",=")
values = st.text(value_chars, min_size=1, max_size=30).filter(lambda v: not v.endswith(" "))
members = st.lists(st.tuples(keys, values), max_size=40, unique_by=lambda kv: kv[0])
spaces = st.text(" \t", max_size=2)


@given(members, st.lists(spaces, min_size=2 * 40 + 2, max_size=2 * 40 + 2))
def test_a_tracestate_of_the_grammar_is_kept_without_its_spaces_or_refused_past_a_bound(pairs, pads):
    listed = [f"{k}={v}" for k, v in pairs]
    value = ",".join(f"{pads[2 * i]}{m}{pads[2 * i + 1]}" for i, m in enumerate(listed))
    if len(value) > MAX_TRACESTATE_CHARS or len(listed) > MAX_TRACESTATE_MEMBERS:
        with pytest.raises(InvalidRequest):
            check_tracestate(value)
    else:
        assert check_tracestate(value) == ",".join(listed)
