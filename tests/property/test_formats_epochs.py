"""Property tests of the epoch file (replication.epochs): its bytes, and the
prefix check a leader makes of a follower's log."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from replication.epochs import EpochFileError, Epochs
from storage.errors import NewerFormatError

SETTINGS = settings(max_examples=150, deadline=None)
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@st.composite
def epoch_files(draw):
    epochs = sorted(set(draw(st.lists(st.integers(1, 2**40), max_size=12))))
    offsets = sorted(draw(st.lists(st.integers(0, 2**50), min_size=len(epochs), max_size=len(epochs))))
    promised = draw(st.integers(0, 2**63 - 1))
    return Epochs(promised, tuple(zip(epochs, offsets)))


@SETTINGS
@given(epoch_files())
def test_round_trip_through_a_file(epochs):
    with tempfile.TemporaryDirectory(dir=SCRATCH) as directory:
        path = Epochs.path(directory)
        assert Epochs.load(path) == Epochs()  # no file yet: nothing promised, no history
        epochs.save(path)
        assert Epochs.load(path) == epochs
        assert os.listdir(directory) == ["epochs"]


@SETTINGS
@given(epoch_files(), st.data())
def test_any_changed_byte_or_length_is_refused(epochs, data):
    raw = epochs.encode()
    position = data.draw(st.integers(0, len(raw) - 1))
    flipped = bytearray(raw)
    flipped[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises((EpochFileError, NewerFormatError)) as refused:
        Epochs.decode(bytes(flipped), "epochs")
    if isinstance(refused.value, NewerFormatError):  # only a version above 1: a newer hourglass's, said so
        assert position in (4, 5) and int.from_bytes(flipped[4:6], "little") > 1
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(EpochFileError):
        Epochs.decode(raw[:cut], "epochs")
    with pytest.raises(EpochFileError):
        Epochs.decode(raw + b"\0", "epochs")


def _history(record_epochs: list[int]) -> tuple[tuple[int, int], ...]:
    history = []
    for offset, epoch in enumerate(record_epochs):
        if not history or history[-1][0] != epoch:
            history.append((epoch, offset))
    return tuple(history)


@SETTINGS
@given(st.lists(st.integers(1, 6), max_size=30).map(sorted), st.data())
def test_a_follower_diverges_exactly_when_it_holds_records_the_leader_replaced(leader_records, data):
    """Logs as lists of record epochs (offset = index). The leader of epoch
    `current` (above every record) began at the end of its log. A follower
    holds a prefix of it, plus `extra` records of an older leader's epoch
    `tail_epoch` that a later leader did not keep: the leader's record at
    that offset (or its own start) is of a later epoch."""
    current = (leader_records[-1] if leader_records else 0) + data.draw(st.integers(1, 3))
    history = (*_history(leader_records), (current, len(leader_records)))
    keep = data.draw(st.integers(0, len(leader_records)))
    low = leader_records[keep - 1] if keep else 1
    high = leader_records[keep] if keep < len(leader_records) else current
    extra = data.draw(st.integers(0, 5))
    if extra:
        assume(low < high)
        tail_epoch = data.draw(st.integers(low, high - 1))
        last_epoch = tail_epoch
    else:
        last_epoch = leader_records[keep - 1] if keep else 0
    leader = Epochs(current, history)
    assert leader.diverges(last_epoch, keep + extra, len(leader_records)) == (extra > 0)
    # and so does one whose last records are of an epoch this leader has none of, wherever they
    # end: an older leader's, begun inside an epoch this leader kept on (KIP-279's case)
    absent = [e for e in range(1, current) if all(e != h for h, _ in history)]
    if absent:
        inside = data.draw(st.integers(0, len(leader_records)))
        assert leader.diverges(data.draw(st.sampled_from(absent)), inside + data.draw(st.integers(1, 5)),
                               len(leader_records))
    # and a follower's own history, taken from the leader, names its last epoch
    follower = Epochs().follow(history)
    if not extra:
        assert follower.last_epoch(keep) == last_epoch


@SETTINGS
@given(epoch_files(), st.integers(1, 2**41), st.integers(0, 2**51))
def test_begin_keeps_history_rising_and_promises_the_new_epoch(epochs, epoch, start):
    assume(all(e != epoch for e, _ in epochs.history))
    began = epochs.begin(epoch, start)
    assert began.history[-1] == (epoch, start)
    assert began.promised >= epoch
    assert Epochs.decode(began.encode()) == began
