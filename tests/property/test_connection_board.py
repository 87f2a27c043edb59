"""The node's connection count over its shards (broker.shards.connections):
whatever the shards take and give back, in any order, the node never holds
more than the cap, a place given back is found by any shard, and a dead
shard's slot does not keep its places."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.shards.connections import SLOT, ConnectionBoard

# (shard, take) or (shard, give back one)
STEPS = st.lists(st.tuples(st.integers(0, 2), st.booleans()), max_size=60)


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(1, 6), steps=STEPS)
def test_the_node_never_holds_more_than_the_cap(tmp_path_factory, cap, steps):
    links = tmp_path_factory.mktemp("links")
    boards = [ConnectionBoard(str(links), i, 3) for i in range(3)]
    held = [0, 0, 0]
    try:
        for shard, take in steps:
            if take:
                took = boards[shard].take(held[shard], cap)
                assert took == (sum(held) < cap)
                held[shard] += took
            elif held[shard]:
                held[shard] -= 1
                boards[shard].publish(held[shard])
            assert all(board.total() == sum(held) for board in boards)
    finally:
        for board in boards:
            board.close()


def test_a_slot_of_a_process_gone_is_freed_when_it_would_refuse(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    board = ConnectionBoard(str(tmp_path), 0, 2)
    try:
        with open(tmp_path / "connections", "r+b") as f:  # shard 1 died holding 5
            f.seek(SLOT.size)
            f.write(struct.pack("=qq", int(gone.stdout), 5))
        assert board.total() == 5
        assert board.take(0, 5) and board.total() == 1
    finally:
        board.close()


def test_a_restarted_shard_starts_from_none(tmp_path):
    first = ConnectionBoard(str(tmp_path), 1, 2)
    assert first.take(0, 10) and first.take(1, 10)
    again = ConnectionBoard(str(tmp_path), 1, 2)  # (the same slot, as a shard started again)
    try:
        assert again.total() == 0
    finally:
        again.close()
        first.close()


def test_a_board_held_locked_by_a_stopped_shard_leaves_each_shard_to_its_own_count(tmp_path, caplog):
    board = ConnectionBoard(str(tmp_path), 0, 2)
    stuck = os.open(tmp_path / "connections", os.O_RDWR)
    try:
        fcntl.flock(stuck, fcntl.LOCK_EX)  # (as a shard stopped inside its step would hold it)
        started = time.monotonic()
        assert board.take(0, 1) and not board.take(1, 1)
        assert time.monotonic() - started < 1
        assert "stayed locked" in caplog.text
    finally:
        os.close(stuck)
        board.close()
