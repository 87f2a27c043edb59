"""broker.core.params.parse_json reads a body exactly as json.loads does (it tries
orjson first, for speed)."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.params import has_long_digits, parse_json

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_parse_json_reads_what_json_reads(body):
    raw = json.dumps(body).encode()
    got = parse_json(raw)
    assert got == json.loads(raw)
    assert repr(got) == repr(json.loads(raw))  # the same types too: an int stays an int


def test_integers_past_64_bits_stay_exact():
    raw = b'{"topic":"t","msgs":[{"msg":"x","priority":-9223372036854775809,"ttlMillis":18446744073709551616}]}'
    assert parse_json(raw) == json.loads(raw)
    assert parse_json(raw)["msgs"][0]["priority"] == -9223372036854775809


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from([b"0", b"9", b"5", b"x", b" ", b"\xd9", b"\x00", b"123456789"]), max_size=60)
       .map(b"".join))
def test_a_run_of_19_digits_is_found_as_a_regular_expression_finds_it(raw):
    assert has_long_digits(raw) == (re.search(rb"[0-9]{19}", raw) is not None)
