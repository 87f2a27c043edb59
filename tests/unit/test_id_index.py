"""Edge cases of storage.id_index: the directory and its secret, reuse of
dead slots, interrupted doublings and swaps, and what inserts cost when ids
are chosen to collide."""

from __future__ import annotations

import os
import random
import shutil
import zlib

import pytest
from fakes import FaultyDisk

from storage import id_index
from storage.disk import DISK
from storage.entry import Location
from storage.errors import CorruptionError
from storage.id_index import HEADER_BYTES, MAX_PROBE_SLOTS, SHARDS, SLOT_BYTES, IdIndex

LIVE = 490_000
DEAD = 480_000


def open_index(directory, is_live=lambda hour: hour != DEAD, is_released=None, disk=DISK) -> IdIndex:
    return IdIndex.open(str(directory), 16, is_live, is_released, disk)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- the directory -------------------------------------------------------------------


def test_a_new_index_is_a_secret_and_64_empty_shards(tmp_path):
    path = tmp_path / "ids"
    index = open_index(path)
    try:
        assert len(index.shards) == SHARDS
        assert index.candidates(12345) == []
        assert repr(index) == f"IdIndex({str(path)!r}, used=0, slots={16 * SHARDS})"
    finally:
        index.close()
    assert sorted(os.listdir(path)) == [f"{n:02x}.hix" for n in range(SHARDS)] + ["secret"]
    assert {os.path.getsize(path / f"{n:02x}.hix") for n in range(SHARDS)} == {HEADER_BYTES + 16 * SLOT_BYTES}
    assert os.listdir(tmp_path) == ["ids"]  # nothing left of the build


def test_keys_depend_on_the_secret_and_survive_reopening(tmp_path):
    a, b = open_index(tmp_path / "a"), open_index(tmp_path / "b")
    try:
        assert a.key("t", "id-1") != b.key("t", "id-1")
        assert a.key("ab", "c") != a.key("a", "bc")  # the topic's length is hashed
        assert a.key("t", "é") == a.key_of_bytes(b"t", "é".encode())
        key = a.key("t", "id-1")
    finally:
        a.close()
        b.close()
    a = open_index(tmp_path / "a")
    try:
        assert a.key("t", "id-1") == key
    finally:
        a.close()


def test_a_shard_of_another_index_is_refused(tmp_path):
    open_index(tmp_path / "a").close()
    open_index(tmp_path / "b").close()
    shutil.copy(tmp_path / "b" / "05.hix", tmp_path / "a" / "05.hix")
    with pytest.raises(CorruptionError) as caught:
        open_index(tmp_path / "a")
    assert (caught.value.path, caught.value.offset) == (str(tmp_path / "a" / "05.hix"), 12)


def test_an_index_from_before_the_keyed_hash_is_refused(tmp_path):
    path = tmp_path / "ids"
    path.mkdir()
    (path / "00.hix").write_bytes(b"HGID\x01\x00" + bytes(10))  # version 1, no secret
    with pytest.raises(CorruptionError, match="keyed hash"):
        open_index(path)


def test_an_interrupted_build_is_discarded(tmp_path):
    path = tmp_path / "ids"
    index = open_index(path)
    key = index.key("t", "a")
    index.put(key, LIVE, 0)
    index.close()
    building = IdIndex.build(str(path), 16, lambda hour: True)
    building.put(building.key("t", "b"), LIVE, 1)
    building.close()  # never published: no secret in ids.new
    index = open_index(path)
    try:
        assert index.candidates(key) == [Location(LIVE, 0)]
        assert not os.path.exists(str(path) + ".new")
    finally:
        index.close()


@pytest.mark.parametrize("moved_aside", [False, True])
def test_a_swap_interrupted_after_the_secret_was_written_is_finished(tmp_path, moved_aside):
    path = tmp_path / "ids"
    open_index(path).close()
    building = IdIndex.build(str(path), 16, lambda hour: True)
    key = building.key("t", "b")
    building.put(key, LIVE, 1)
    # What publish does up to the swap: shards durable, the secret written.
    for shard in building.shards:
        shard.mm.flush()
    id_index.atomic_write(os.path.join(building.directory, id_index.SECRET_FILE),
                          id_index.encode_secret(building._secret))
    building.close()
    if moved_aside:  # the crash came between the two renames
        os.rename(path, str(path) + ".old")
    index = open_index(path)
    try:
        assert index.candidates(key) == [Location(LIVE, 1)]
        assert sorted(os.listdir(tmp_path)) == ["ids"]
    finally:
        index.close()


# -- inserts ------------------------------------------------------------------------


def test_put_is_idempotent_and_dead_hours_are_not_candidates(tmp_path):
    index = open_index(tmp_path / "ids")
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
    path = tmp_path / "ids"
    index = open_index(path)
    try:
        index.put(1, DEAD, 0)
        index.put(1, LIVE, 0)  # takes the dead slot
        assert index._shard(1).used == 1
        index.put(2, DEAD, 0)
        for gi in range(1, 12):  # 12 live + 1 dead > 70% of 16: the shard doubles
            index.put(1, LIVE, gi)
        shard = index._shard(1)
        assert (shard.slot_count, shard.used) == (32, 12)
        assert sorted(index.candidates(1)) == [Location(LIVE, gi) for gi in range(12)]
    finally:
        index.close()
    assert not [name for name in os.listdir(path) if name.endswith(".new")]
    index = open_index(path)
    try:
        assert len(index.candidates(1)) == 12
    finally:
        index.close()


def test_an_id_sent_and_released_over_and_over_keeps_one_slot(tmp_path):
    released: set[Location] = set()
    index = open_index(tmp_path / "ids", is_released=lambda hour, gi: Location(hour, gi) in released)
    try:
        key = index.key("t", "again")
        for gi in range(1000):
            index.put(key, LIVE, gi)
            released.add(Location(LIVE, gi))
        assert index.candidates(key) == [Location(LIVE, 999)]
        assert index._shard(key).used == 1
    finally:
        index.close()


def test_a_doubling_interrupted_before_publishing_leaves_the_old_shard(tmp_path):
    path = tmp_path / "ids"
    index = open_index(path)
    try:
        index.put(1, LIVE, 0)
    finally:
        index.close()
    (path / "00.hix.new").write_bytes(b"half-built")
    index = open_index(path)
    try:
        assert index.candidates(1) == [Location(LIVE, 0)]
    finally:
        index.close()


def test_a_full_disk_while_doubling_keeps_the_shard_and_tries_again(tmp_path):
    disk = FaultyDisk()
    index = open_index(tmp_path / "ids", disk=disk)
    try:
        disk.full = True
        for gi in range(13):  # past 70% of 16 slots
            index.put(gi + 1, LIVE, gi)
        assert index.shards[0].slot_count == 16 and disk.refused > 0
        assert not [n for n in os.listdir(tmp_path / "ids") if n.endswith(".new")]
        disk.full = False
        index.put(100, LIVE, 100)
        assert index.shards[0].slot_count == 32
        assert all(index.candidates(gi + 1) == [Location(LIVE, gi)] for gi in range(13))
    finally:
        index.close()


@pytest.mark.parametrize("bad", ["00.hix", "05.hix", "3f.hix", "secret"])
def test_a_refused_open_leaks_no_file_descriptor(tmp_path, bad):
    path = tmp_path / "ids"
    open_index(path).close()
    with open(path / bad, "r+b") as f:
        f.write(b"XXXX")
    before = open_fds()
    for _ in range(3):
        with pytest.raises(CorruptionError) as caught:
            open_index(path)
        assert caught.value.path == str(path / bad)
    assert open_fds() == before


# -- what colliding ids cost ---------------------------------------------------------
# Costs are counted in slots read (IdIndex.probes), not time.

COUNT = 3000


def crc32_colliding_ids(topic: str, count: int) -> list[str]:
    """`count` distinct msgIds whose f"{topic}\\0{msgId}" all share one CRC32,
    the key the index used before it was keyed. CRC32 is affine over GF(2)
    for inputs of one length, so flipping 'a' <-> 'b' at a set of positions
    whose CRC deltas XOR to zero keeps the CRC: such sets are the kernel of
    a 32 x 48 bit matrix, found by elimination."""
    base = "a" * 48
    crc = zlib.crc32(f"{topic}\0{base}".encode())
    deltas = [zlib.crc32(f"{topic}\0{base[:i]}b{base[i + 1:]}".encode()) ^ crc for i in range(48)]
    pivots: dict[int, tuple[int, int]] = {}  # top bit -> (vector, positions it combines)
    kernel = []
    for i, delta in enumerate(deltas):
        vector, positions = delta, 1 << i
        while vector:
            top = vector.bit_length() - 1
            if top not in pivots:
                pivots[top] = (vector, positions)
                break
            vector, positions = vector ^ pivots[top][0], positions ^ pivots[top][1]
        if not vector:
            kernel.append(positions)
    assert len(kernel) >= 16
    ids = []
    for n in range(1, count + 1):
        flips = 0
        for j, positions in enumerate(kernel):
            if n >> j & 1:
                flips ^= positions
        ids.append("".join("b" if flips >> i & 1 else "a" for i in range(48)))
    return ids


def probes_per_insert(index: IdIndex, keys: list[int]) -> float:
    before = index.probes
    for gi, key in enumerate(keys):
        index.put(key, LIVE, gi)
    return (index.probes - before) / len(keys)


def test_ids_crafted_to_share_a_crc32_cost_what_random_ones_cost(tmp_path):
    colliding = crc32_colliding_ids("t", COUNT)
    assert len(set(colliding)) == COUNT
    assert len({zlib.crc32(f"t\0{i}".encode()) for i in colliding}) == 1  # one slot, one shard before
    index = open_index(tmp_path / "a")
    try:
        crafted = probes_per_insert(index, [index.key("t", i) for i in colliding])
        assert len({index.key("t", i) >> id_index.SHARD_SHIFT for i in colliding}) == SHARDS  # spread out
    finally:
        index.close()
    index = open_index(tmp_path / "b")
    try:
        rng = random.Random(1)
        plain = probes_per_insert(index, [index.key("t", f"{rng.getrandbits(64):x}") for _ in range(COUNT)])
    finally:
        index.close()
    assert crafted <= 5 * plain, (crafted, plain)


def test_keys_forced_into_one_group_cost_at_most_5x_random(tmp_path):
    """The worst a key can do without knowing the secret, and more: every
    key starts its probe in the same group of the same shard (keys whose
    top 6 bits are 0, the shard, and whose low 20 bits are 0, the first
    group of any shard of fewer than 2**20 groups: see `probe_start`). The
    stride, from other bits, still parts them."""
    rng = random.Random(2)
    keys = [rng.getrandbits(58) | 1 for _ in range(COUNT)]  # top bits 0: all in shard 0
    index = open_index(tmp_path / "random")
    try:
        plain = probes_per_insert(index, keys)
    finally:
        index.close()
    crowded = [key << 20 for key in rng.sample(range(1, 2**38), COUNT)]
    assert {id_index.probe_start(key, 2**12 - 1)[0] for key in crowded} == {0}
    index = open_index(tmp_path / "forced")
    try:
        forced = probes_per_insert(index, crowded)
        for gi, key in enumerate(crowded):
            assert index.candidates(key) == [Location(LIVE, gi)]
        lookups = index.probes
        index.candidates(rng.randrange(1, 2**38) << 20)
        assert index.probes - lookups <= MAX_PROBE_SLOTS
    finally:
        index.close()
    assert forced <= 5 * plain, (forced, plain)



def _mapped_rss_kb(path: str) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's head line
                inside = line.rstrip().endswith(path)
            elif inside and first == "Rss:":
                total += int(line.split()[1])
    return total


def test_reopening_counts_the_slots_in_use_without_making_the_shards_resident(tmp_path):
    """A shard larger than one opening read (id_index.OPEN_READ_BYTES) is
    counted whole; its mapped pages are not touched by the count."""
    slots = 2 * id_index.OPEN_READ_BYTES // SLOT_BYTES  # 2 reads a shard (128 MB in all)
    index = IdIndex.open(str(tmp_path / "ids"), slots, lambda hour: True, None, DISK)
    rng = random.Random(5)
    keys = [rng.getrandbits(64) | 1 for _ in range(20_000)]
    try:
        index.put_many([(key, LIVE, gi) for gi, key in enumerate(keys)])
        used = [shard.used for shard in index.shards]
        assert sum(used) == len(set(keys))
    finally:
        index.close()
    index = IdIndex.open(str(tmp_path / "ids"), slots, lambda hour: True, None, DISK)
    try:
        assert [shard.used for shard in index.shards] == used
        resident = sum(_mapped_rss_kb(shard.path) for shard in index.shards)
        assert resident * 1024 < sum(os.path.getsize(shard.path) for shard in index.shards) / 16, resident
        assert index.candidates(keys[0]) == [Location(LIVE, 0)]
    finally:
        index.close()


def test_a_doubling_in_slices_keeps_every_key_and_maps_no_page(tmp_path):
    """A shard whose doubling spans two slices of DOUBLING_SLICE_BYTES: the
    keys fill their home groups slice by slice, the ones whose home group is
    full (here many: a crowd sharing one group at the end of the first
    slice, their strides reaching into the second) are placed after, and
    every key is found again, in the new shard and after a reopening. The
    doubling goes through the files: the shards' mappings hold no page."""
    slots = id_index.DOUBLING_SLICE_BYTES // SLOT_BYTES  # doubled: two slices
    index = IdIndex.open(str(tmp_path / "ids"), slots, lambda hour: True, None, DISK)
    rng = random.Random(7)
    last_group = id_index.DOUBLING_SLICE_BYTES // id_index.GROUP_BYTES - 1  # of the doubled shard's first slice
    crowd = [rng.getrandbits(38) << 20 | last_group for _ in range(200)]  # shard 0, one home group
    plain = [rng.getrandbits(58) | 1 for _ in range(int(slots * 0.69) - len(crowd))]
    keys = list(dict.fromkeys(crowd + plain))
    try:
        index.put_many([(key, LIVE, gi) for gi, key in enumerate(keys)])
        shard = index.shards[0]
        assert shard.slot_count == slots
        index.shed()
        assert index._double(shard)
        shard = index.shards[0]
        assert shard.slot_count == 2 * slots and shard.used == len(keys)
        assert sum(_mapped_rss_kb(s.path) for s in index.shards) <= 4  # (the new header page, written mapped)
        for gi, key in enumerate(keys):
            assert index.candidates(key) == [Location(LIVE, gi)], gi
    finally:
        index.close()
    index = IdIndex.open(str(tmp_path / "ids"), slots, lambda hour: True, None, DISK)
    try:
        assert index.shards[0].used == len(keys)
        for gi, key in enumerate(keys[::7]):
            assert index.candidates(key) == [Location(LIVE, gi * 7)]
    finally:
        index.close()
