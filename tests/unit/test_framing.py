"""Edge cases of storage.framing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import framing
from storage.errors import InvalidRequest
from storage.framing import FRAME_HEADER, FrameProblem, decode_frame, encode_frame, find_valid_frame


def test_an_empty_body_cannot_be_framed():
    # Its frame would be eight zero bytes: the END marker.
    with pytest.raises(InvalidRequest):
        encode_frame(b"")


def test_a_body_over_the_limit_cannot_be_framed(monkeypatch):
    monkeypatch.setattr(framing, "MAX_BODY_BYTES", 10)
    assert decode_frame(encode_frame(b"x" * 10), 0, 18).problem is FrameProblem.OK
    with pytest.raises(InvalidRequest):
        encode_frame(b"x" * 11)


def test_decode_names_each_problem():
    frame = encode_frame(b"hello")
    assert decode_frame(bytes(16), 0, 16).problem is FrameProblem.END
    assert decode_frame(frame, 0, 7).problem is FrameProblem.SHORT_HEADER
    assert decode_frame(frame, 0, len(frame) - 1).problem is FrameProblem.TOO_LONG
    huge = FRAME_HEADER.pack(framing.MAX_BODY_BYTES + 1, 0)
    assert decode_frame(huge, 0, 2**40).problem is FrameProblem.TOO_LONG
    assert decode_frame(frame[:-1] + b"!", 0, len(frame)).problem is FrameProblem.BAD_CRC


@pytest.mark.parametrize("body_bytes", [256, 512, 65536, 2**24])
def test_find_valid_frame_finds_a_frame_whose_length_starts_with_zero_bytes(body_bytes):
    # The length is little-endian: a 256-byte body's frame starts with 0x00.
    buf = bytes(40) + encode_frame(b"z" * body_bytes)
    assert find_valid_frame(buf, 0, len(buf)) == 40
    assert find_valid_frame(buf, 37, len(buf)) == 40


def test_find_valid_frame_returns_none_without_a_frame():
    assert find_valid_frame(bytes(1000), 0, 1000) is None
    assert find_valid_frame(b"\x05" + bytes(100), 0, 101) is None
    frame = encode_frame(b"abc")
    assert find_valid_frame(frame, 1, len(frame)) is None


@given(st.binary(min_size=1, max_size=300), st.integers(0, 2**32 - 1), st.integers(0, 2**62))
def test_a_salted_frame_is_the_frame_seeded_by_its_salt_and_offset(body, salt, offset):
    # encode_salted_frame is the commit log's append in one call: the same bytes as the two calls
    assert framing.encode_salted_frame(body, salt, offset) == encode_frame(body, framing.frame_seed(salt, offset))
    frame = framing.encode_salted_frame(body, salt, offset)
    assert decode_frame(frame, 0, len(frame), framing.frame_seed(salt, offset)).problem is FrameProblem.OK
    with pytest.raises(InvalidRequest):
        framing.encode_salted_frame(b"", salt, offset)
