"""broker.params: a message's fields read in one frame when they are plain
(`_message`'s first branch) give exactly what the checks field by field
give (`_checked_message`, the statement of the rules): the same message,
or the same refusal."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from broker.params import Defaults, _checked_message, _message
from storage.errors import InvalidRequest

DEFAULTS = Defaults()
NOW = 1_700_000_000_000

numbers = st.one_of(st.none(), st.integers(-10, 10**19), st.booleans(), st.floats(allow_nan=True),
                    st.sampled_from(["", "0", "12", "-3", "007", "1e3", " 5", "x", "9" * 18, "9" * 19, "١٢"]),
                    st.text(max_size=4))
names = st.one_of(st.none(), st.just(""), st.text(max_size=6), st.sampled_from(["a,b", "a\0b", "é", "k" * 1025]),
                  st.integers(0, 3))
fields = st.fixed_dictionaries({}, optional={
    "msg": st.one_of(st.none(), st.just(""), st.text(max_size=12), st.sampled_from(["x" * 64, "é" * 20]),
                     st.integers()),
    "msgId": names, "tag": names, "key": names,
    "delayMillis": numbers, "triggerTime": numbers, "ttlMillis": numbers, "maxRetry": numbers,
    "priority": numbers,
})


def _outcome(parse, params):
    ids = iter(range(10))
    try:
        return parse(params, "", "t", NOW, lambda: f"auto{next(ids)}", DEFAULTS, 40)
    except InvalidRequest as e:
        return (type(e), e.parameter, e.reason)


@settings(max_examples=3000, deadline=None)
@given(params=fields)
def test_the_one_frame_branch_agrees_with_the_rules(params):
    assert _outcome(_message, params) == _outcome(_checked_message, params)
