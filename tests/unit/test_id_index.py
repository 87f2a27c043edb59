"""Edge cases of storage.id_index."""

from __future__ import annotations

import os

import pytest

from storage.entry import Location
from storage.errors import CorruptionError
from storage.id_index import HEADER_BYTES, SHARDS, SLOT_BYTES, IdIndex

LIVE = 490_000
DEAD = 480_000


def open_index(directory, is_live=lambda hour: hour != DEAD) -> IdIndex:
    return IdIndex.open(str(directory), 16, is_live)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_new_index_is_64_empty_shards(tmp_path):
    index = open_index(tmp_path)
    try:
        assert len(index.shards) == SHARDS
        assert index.candidates(12345) == []
        assert repr(index) == f"IdIndex({str(tmp_path)!r}, used=0, slots={16 * SHARDS})"
    finally:
        index.close()
    assert sorted(os.listdir(tmp_path)) == [f"{n:02x}.hix" for n in range(SHARDS)]
    assert {os.path.getsize(tmp_path / name) for name in os.listdir(tmp_path)} == {HEADER_BYTES + 16 * SLOT_BYTES}


def test_put_is_idempotent_and_dead_hours_are_not_candidates(tmp_path):
    index = open_index(tmp_path)
    try:
        index.put(7, LIVE, 1)
        index.put(7, LIVE, 1)
        index.put(7, DEAD, 2)
        index.put(7, LIVE, 3)  # reuses the dead hour's slot
        assert sorted(index.candidates(7)) == [Location(LIVE, 1), Location(LIVE, 3)]
        assert sum(shard.used for shard in index.shards) == 2
    finally:
        index.close()


def test_a_dead_slot_is_reused_and_dropped_when_the_shard_doubles(tmp_path):
    index = open_index(tmp_path)
    try:
        index.put(1, DEAD, 0)
        index.put(1, LIVE, 0)  # takes the dead slot
        shard = index._shard(1)
        assert shard.used == 1
        for gi in range(1, 12):  # 12 > 70% of 16: the shard doubles
            index.put(1, LIVE, gi)
        shard = index._shard(1)
        assert (shard.slot_count, shard.used) == (32, 12)
        assert sorted(index.candidates(1)) == [Location(LIVE, gi) for gi in range(12)]
    finally:
        index.close()
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".new")]
    index = open_index(tmp_path)
    try:
        assert len(index.candidates(1)) == 12
    finally:
        index.close()


def test_a_doubling_interrupted_before_publishing_leaves_the_old_shard(tmp_path):
    index = open_index(tmp_path)
    try:
        index.put(1, LIVE, 0)
    finally:
        index.close()
    (tmp_path / "00.hix.new").write_bytes(b"half-built")
    index = open_index(tmp_path)
    try:
        assert index.candidates(1) == [Location(LIVE, 0)]
    finally:
        index.close()


@pytest.mark.parametrize("bad", ["00.hix", "05.hix", "3f.hix"])
def test_a_refused_open_leaks_no_file_descriptor(tmp_path, bad):
    open_index(tmp_path).close()
    with open(tmp_path / bad, "r+b") as f:
        f.write(b"XXXX")
    before = open_fds()
    for _ in range(3):
        with pytest.raises(CorruptionError) as caught:
            open_index(tmp_path)
        assert caught.value.path == str(tmp_path / bad)
    assert open_fds() == before
