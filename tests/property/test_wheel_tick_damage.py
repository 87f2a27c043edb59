"""Hypothesis: the tick-state file round-trips, and damage never reads as garbage.

A damaged file either raises TickStateError or yields one of the two last
records written (the other slot survives a torn write); it never yields a
state nobody wrote.
"""

from __future__ import annotations

import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from storage.errors import NewerFormatError
from wheel.tick_state import FILE_SIZE, VERSION, TickState, TickStateError, TickStateFile, parse

states = st.builds(TickState, st.integers(0, 2**40), st.integers(0, 3599), st.integers(0, 2**32 - 1))


@settings(max_examples=100, deadline=None)
@given(writes=st.lists(states, min_size=1, max_size=8), reopen_after=st.sets(st.integers(0, 7)))
def test_the_last_write_is_what_reopening_reads(writes, reopen_after):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tick")
        f = TickStateFile(path)
        try:
            for i, state in enumerate(writes):
                f.write(state)
                if i in reopen_after:
                    f.close()
                    f = TickStateFile(path)
                    assert f.state == state and f.sequence == i + 1
        finally:
            f.close()
        with TickStateFile(path) as again:
            assert again.state == writes[-1]


damage = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, FILE_SIZE - 1), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, FILE_SIZE - 1), st.just(0)),
    st.tuples(st.just("extend"), st.integers(1, 64), st.just(0)),
    st.tuples(st.just("tear"), st.integers(16, FILE_SIZE - 1), st.integers(1, 32)),
)


@settings(max_examples=200, deadline=None)
@given(writes=st.lists(states, min_size=1, max_size=5), hurt=st.lists(damage, min_size=1, max_size=3))
def test_damage_is_refused_or_reads_one_of_the_last_two_records(writes, hurt):
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "tick")
        with TickStateFile(path) as f:
            for state in writes:
                f.write(state)
        with open(path, "rb") as raw:
            data = bytearray(raw.read())
    for kind, at, value in hurt:
        if kind == "flip":
            if at < len(data):
                data[at] ^= value
        elif kind == "truncate":
            del data[at:]
        elif kind == "extend":
            data += bytes(at)
        elif at < len(data):  # a torn write: part of a slot zeroed
            end = min(len(data), at + value)
            data[at:end] = bytes(end - at)
    try:
        sequence, state = parse(bytes(data), "t")
    except NewerFormatError:  # the damage made a version above ours: refused as a newer format's file
        assert len(data) >= 6 and int.from_bytes(data[4:6], "little") > VERSION
        return
    except TickStateError as err:
        assert err.path == "t" and 0 <= err.offset <= FILE_SIZE and err.reason  # noqa: PT017 (damage may be refused or not)
        return
    allowed = {(len(writes), writes[-1])}
    if len(writes) >= 2:
        allowed.add((len(writes) - 1, writes[-2]))
    if bytes(data[16:80]) == bytes(64):  # every record zeroed whole: reads as never written
        allowed.add((0, None))
    assert (sequence, state) in allowed
