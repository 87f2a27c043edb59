"""Property tests of the id index (storage.id_index): its shard format, and
the index against a dict.

Each format example fills an index that starts with 16-slot shards (so
shards double), closes it, damages one shard file and reopens the same
directory. The state machines drive the index with keyed ids, releases,
retired hours and reopens, and check it against a dict of what was put;
one of them forces every key into one shard and its probe into the same
group (`crowded`), the worst an id can do.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from corruption import xor_byte
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import id_index
from storage.entry import Location
from storage.errors import CorruptionError
from storage.id_index import HEADER_BYTES, SLOT, SLOT_BYTES, IdIndex, pack_loc, unpack_loc

SETTINGS = settings(max_examples=50, deadline=None)
# RAM-backed where there is one: these tests are about formats, not fsync.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
INITIAL_SLOTS = 16
HOURS = [490_000, 490_001, 490_002, 2**24 - 1]  # the loc keeps 24 bits of hour

# Keys 1..8 share a shard and a probe run; random keys spread over shards.
keys = st.one_of(st.integers(1, 8), st.integers(1, 2**64 - 1))
NO_RELEASE = None
global_indexes = st.integers(0, 2**32 - 1)
puts = st.lists(st.tuples(keys, st.sampled_from(HOURS), global_indexes), max_size=120)


@contextmanager
def index_dir() -> Iterator[str]:
    with tempfile.TemporaryDirectory(dir=SCRATCH) as root:
        yield os.path.join(root, "ids")


def fill(directory: str, pairs: list[tuple[int, int, int]], dead: frozenset[int] = frozenset()) -> None:
    index = IdIndex.open(directory, INITIAL_SLOTS, lambda hour: hour not in dead, NO_RELEASE)
    try:
        for key, hour, gi in pairs:
            index.put(key, hour, gi)
    finally:
        index.close()


def expected(pairs: list[tuple[int, int, int]], dead: frozenset[int]) -> dict[int, list[Location]]:
    out: dict[int, set[Location]] = {}
    for key, hour, gi in pairs:
        out.setdefault(key, set())
        if hour not in dead:
            out[key].add(Location(hour, gi))
    return {key: sorted(locations) for key, locations in out.items()}


def find_slot(directory: str, key: int, loc: int) -> tuple[str, int]:
    """(shard path, position) of the slot holding exactly (key, loc)."""
    needle = SLOT.pack(key, loc)
    for name in sorted(n for n in os.listdir(directory) if n.endswith(".hix")):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        for position in range(HEADER_BYTES, len(data), SLOT_BYTES):
            if data[position:position + SLOT_BYTES] == needle:
                return os.path.join(directory, name), position
    raise AssertionError(f"no slot holds key {key}")


def shard_names(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".hix"))


# -- round trip -------------------------------------------------------------


@SETTINGS
@given(puts, st.frozensets(st.sampled_from(HOURS)), st.lists(keys, max_size=5))
def test_round_trip_through_doubling_and_reopen(pairs, dead, other_keys):
    want = expected(pairs, dead)
    is_live = lambda hour: hour not in dead  # noqa: E731
    with index_dir() as directory:
        fill(directory, pairs, dead)
        index = IdIndex.open(directory, INITIAL_SLOTS, is_live)
        try:
            for key, locations in want.items():
                assert sorted(index.candidates(key)) == locations
            for key in other_keys:
                if key not in want:
                    assert index.candidates(key) == []
            for shard in index.shards:
                assert shard.slot_count & (shard.slot_count - 1) == 0
                assert os.path.getsize(shard.path) == HEADER_BYTES + shard.slot_count * SLOT_BYTES
                assert shard.used <= shard.slot_count * id_index.MAX_LOAD
            # Replaying the same inserts changes nothing.
            for key, hour, gi in pairs:
                index.put(key, hour, gi)
            for key, locations in want.items():
                assert sorted(index.candidates(key)) == locations
        finally:
            index.close()


@SETTINGS
@given(keys, st.integers(0, 2**24 - 1), global_indexes)
def test_loc_codec_round_trip(key, hour, gi):
    assert unpack_loc("shard", 16, key, pack_loc(key, hour, gi)) == Location(hour, gi)


# -- truncated or grown shard -------------------------------------------------


@SETTINGS
@given(puts, st.data())
def test_shard_of_the_wrong_length_is_refused(pairs, data):
    with index_dir() as directory:
        fill(directory, pairs)
        path = os.path.join(directory, data.draw(st.sampled_from(shard_names(directory)), label="shard"))
        size = os.path.getsize(path)
        if data.draw(st.booleans(), label="grow"):
            with open(path, "ab") as f:
                f.write(bytes(data.draw(st.integers(1, 64), label="extra bytes")))
        else:
            os.truncate(path, data.draw(st.integers(0, size - 1), label="cut"))
        with pytest.raises(CorruptionError) as caught:
            IdIndex.open(directory, INITIAL_SLOTS, lambda hour: True)
        assert caught.value.path == path


# -- corrupted bytes ----------------------------------------------------------


@SETTINGS
@given(puts, st.data())
def test_corrupt_shard_header_is_refused(pairs, data):
    with index_dir() as directory:
        fill(directory, pairs)
        path = os.path.join(directory, data.draw(st.sampled_from(shard_names(directory)), label="shard"))
        position = data.draw(st.integers(0, HEADER_BYTES - 1), label="byte")
        xor_byte(path, position, data.draw(st.integers(1, 255), label="mask"))
        with pytest.raises(CorruptionError) as caught:
            IdIndex.open(directory, INITIAL_SLOTS, lambda hour: True)
        assert caught.value.path == path


@SETTINGS
@given(puts.filter(bool), st.data())
def test_corrupt_slot_check_byte_is_refused(pairs, data):
    key, hour, gi = data.draw(st.sampled_from(pairs), label="victim")
    with index_dir() as directory:
        fill(directory, pairs)
        path, position = find_slot(directory, key, pack_loc(key, hour, gi))
        xor_byte(path, position + 8, data.draw(st.integers(1, 255), label="mask"))  # loc's low byte
        index = IdIndex.open(directory, INITIAL_SLOTS, lambda hour: True)
        try:
            with pytest.raises(CorruptionError) as caught:
                index.candidates(key)
            assert (caught.value.path, caught.value.offset) == (path, position)
        finally:
            index.close()


@settings(max_examples=20, deadline=None)
@given(keys, st.integers(0, 2**24 - 1), global_indexes)
def test_slot_byte_flips_are_refused_but_for_the_8_bit_check(key, hour, gi):
    """A slot carries an 8-bit check over (key, hour, globalIndex): a flip of
    the check byte is always refused, a flip elsewhere in the slot slips
    through about once in 256 (the format's documented trade-off)."""
    slot = SLOT.pack(key, pack_loc(key, hour, gi))
    accepted = 0
    for position in range(SLOT_BYTES):
        for mask in range(1, 256):
            damaged = bytearray(slot)
            damaged[position] ^= mask
            try:
                unpack_loc("shard", HEADER_BYTES, *SLOT.unpack(damaged))
            except CorruptionError:
                continue
            assert position != 8, "a flipped check byte was accepted"
            accepted += 1
    assert accepted <= 0.02 * 15 * 255


# -- the index against a dict ---------------------------------------------------

ID_TOPICS = st.sampled_from(["orders", "ü", "a"])
ID_MSG_IDS = st.one_of(st.sampled_from(["a", "b", "bc", "c"]), st.text(min_size=1, max_size=8))


def crowded(key: int) -> int:
    """`key` made one of the worst keys there are: its top 6 bits 0 (shard
    0, which then doubles often) and its low 20 bits 0 (a probe that starts
    in group 0 of any shard of fewer than 2**20 groups, see
    `id_index.probe_start`); the 38 bits between are the key's top ones, so
    distinct ids keep distinct keys."""
    return (key >> 26) << 20 or 1 << 20


class IdIndexMachine(RuleBasedStateMachine):
    """The model: a dict (topic, msgId) -> {location: released?}, the set of
    retired hours. Every unreleased location of a live hour put under an id
    must be a candidate of its key; every candidate must be a live location
    put under that id (a released one may linger until its slot is reused);
    no candidate twice."""

    forced = False

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(dir=SCRATCH)
        self.directory = os.path.join(self.root, "ids")
        self.model: dict[tuple[str, str], dict[Location, bool]] = {}
        self.released: set[Location] = set()
        self.dead: set[int] = set()
        self.next_gi = 0
        self.index = self._open()
        self.keys: dict[tuple[str, str], int] = {}

    def _open(self) -> IdIndex:
        return IdIndex.open(self.directory, INITIAL_SLOTS, lambda hour: hour not in self.dead,
                            lambda hour, gi: Location(hour, gi) in self.released)

    def key(self, topic: str, msg_id: str) -> int:
        key = self.index.key(topic, msg_id)
        return crowded(key) if self.forced else key

    @rule(topic=ID_TOPICS, msg_id=ID_MSG_IDS, hour=st.sampled_from(HOURS))
    def put(self, topic, msg_id, hour):
        where = Location(hour, self.next_gi)
        self.next_gi += 1
        self.index.put(self.key(topic, msg_id), *where)
        self.model.setdefault((topic, msg_id), {})[where] = False

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def replay_a_put(self, data):
        topic, msg_id = data.draw(st.sampled_from(sorted(self.model)), label="id")
        where = data.draw(st.sampled_from(sorted(self.model[(topic, msg_id)])), label="location")
        self.index.put(self.key(topic, msg_id), *where)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def release(self, data):
        id_ = data.draw(st.sampled_from(sorted(self.model)), label="id")
        where = data.draw(st.sampled_from(sorted(self.model[id_])), label="location")
        self.model[id_][where] = True
        self.released.add(where)

    @precondition(lambda self: any(not r for locations in self.model.values() for r in locations.values()))
    @rule(data=st.data(), hour=st.sampled_from(HOURS), replayed=st.booleans())
    def move(self, data, hour, replayed):
        """A message filed anew (storage.refile): its old place released,
        its slot pointing at the new one (a replay moves it again)."""
        id_ = data.draw(st.sampled_from(sorted(i for i, locations in self.model.items()
                                               if not all(locations.values()))), label="id")
        old = data.draw(st.sampled_from(sorted(w for w, r in self.model[id_].items() if not r)), label="from")
        new = Location(hour, self.next_gi)
        self.next_gi += 1
        self.model[id_][old] = True
        self.released.add(old)
        self.model[id_][new] = False
        for _ in range(2 if replayed else 1):
            self.index.move(self.key(*id_), old, *new)

    @rule(hour=st.sampled_from(HOURS))
    def retire(self, hour):
        self.dead.add(hour)

    @rule()
    def reopen(self):
        keys = {id_: self.key(*id_) for id_ in self.model}
        self.index.close()
        self.index = self._open()
        assert {id_: self.key(*id_) for id_ in self.model} == keys  # the secret survives

    @invariant()
    def agrees_with_the_model(self):
        for id_, locations in self.model.items():
            found = self.index.candidates(self.key(*id_))
            assert len(found) == len(set(found))
            must = {w for w, released in locations.items() if not released and w.hour not in self.dead}
            may = {w for w in locations if w.hour not in self.dead}
            assert must <= set(found) <= may, (id_, must, found)

    def teardown(self):
        self.index.close()
        shutil.rmtree(self.root)


class ForcedIdIndexMachine(IdIndexMachine):
    forced = True


MACHINE_SETTINGS = settings(max_examples=40, stateful_step_count=60, deadline=None)
TestIdIndexAgainstADict = IdIndexMachine.TestCase
TestIdIndexAgainstADict.settings = MACHINE_SETTINGS
TestForcedIdIndexAgainstADict = ForcedIdIndexMachine.TestCase
TestForcedIdIndexAgainstADict.settings = MACHINE_SETTINGS
