"""POST backupShard's `have` (broker.disk.backups.parse_have): whatever a
caller sends is the files that only grow it names, or a 400 naming `have`."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.disk.backups import parse_have
from storage.errors import InvalidRequest

DIGEST = "ab" * 32


def test_the_files_that_only_grow_are_taken_with_their_size_and_digest():
    body = json.dumps({"have": {"delay/0008652703.log": [4096, DIGEST], "commitlog/00000000000000000000.log":
                                [64, DIGEST]}}).encode()
    assert parse_have(body) == {"delay/0008652703.log": (4096, DIGEST),
                                "commitlog/00000000000000000000.log": (64, DIGEST)}
    assert parse_have(b"") == {} and parse_have(b'{"have": {}}') == {}


@pytest.mark.parametrize("have", [
    {"delay/1.idx": [1, DIGEST]},  # changes in place: never kept
    {"checkpoint": [1, DIGEST]},
    {"delay/../../etc/x.log": [1, DIGEST]},
    {"delay/1.log": [0, DIGEST]}, {"delay/1.log": [True, DIGEST]}, {"delay/1.log": [-5, DIGEST]},
    {"delay/1.log": [1, "ab"]}, {"delay/1.log": [1]}, {"delay/1.log": "ab"}, 5, "x"])
def test_anything_else_is_a_400_naming_have(have):
    with pytest.raises(InvalidRequest, match="have"):
        parse_have(json.dumps({"have": have}).encode())


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=20), inner,
                                                                                max_size=3), max_leaves=10))
def test_any_json_is_files_or_a_400(value):
    for body in (json.dumps(value).encode(), json.dumps({"have": value}).encode()):
        try:
            got = parse_have(body)
        except InvalidRequest:
            continue
        assert all(isinstance(size, int) and size > 0 and len(digest) == 64 for size, digest in got.values())


def test_a_deeply_nested_body_is_a_400_not_a_crash():
    with pytest.raises(InvalidRequest, match="have"):
        parse_have(b"[" * 100_000 + b"]" * 100_000)
