"""What a node's RSS holds of the store's mapped files: `Store.shed` drops
every mapped file's resident pages (the data stays), and the checkpoint
loop sheds every interval while a checkpoint runs long
(broker.node.server.checkpoint_every)."""

from __future__ import annotations

import asyncio
import os

from broker.node.server import checkpoint_every
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, Status
from storage.id_index import PAGE_BYTES, SHED_EVERY_CALLS, SHED_MIN_CALLS, IdIndex, Residency
from storage.store import NewMessage, StateChange, Store

CONFIG = StoreConfig(segment_bytes=1 << 20, id_shard_initial_slots=4096, retention_ms=MS_PER_HOUR)
NOW = 490_000 * MS_PER_HOUR + 5_000


def resident_kb(directory: str) -> int:
    """The kB of this process's mappings of files under `directory` that
    are resident (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:  # a mapping's head line
                inside = len(fields) >= 6 and fields[5].startswith(directory + "/")
            elif inside and fields and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_shed_drops_every_mapped_files_resident_pages_and_keeps_the_data(tmp_path):
    directory = os.path.realpath(str(tmp_path))
    with Store.open(directory, CONFIG, now_ms=NOW) as store:
        store.keep_ends("t", True)  # the end index too
        sent = store.send([NewMessage("t", f"m{i}", "x" * 100, NOW, NOW, MS_PER_HOUR, 3) for i in range(3000)], NOW)
        store.commit()
        store.update([StateChange(s.message.location, Status.ACKED, 0) for s in sent[:1000]], NOW + 1)
        store.commit()
        assert resident_kb(directory) > 0
        store.shed()
        for part in ("ids", "ends", "delay"):
            assert resident_kb(os.path.join(directory, part)) == 0
        assert resident_kb(os.path.join(directory, "commitlog")) <= 4  # (the page its last fsync ended in)
        assert store.get("t", "m2999") is not None  # read again through the mappings
        assert store.ended_at(sent[0].message.location, NOW + 2) == NOW + 1


def test_a_checkpoint_longer_than_the_interval_has_the_pages_shed_meanwhile():
    async def run() -> int:
        sheds = 0
        three = asyncio.Event()

        def shed() -> None:
            nonlocal sheds
            sheds += 1
            if sheds == 3:
                three.set()

        async def slow_checkpoint() -> None:  # a syncfs on a busy disk: ends after three sheds
            await three.wait()

        failed: list[BaseException] = []
        loop = asyncio.create_task(checkpoint_every(10, slow_checkpoint, lambda e, where: failed.append(e), shed))
        await asyncio.wait_for(three.wait(), 30)
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        assert failed == []
        return sheds
    assert asyncio.run(run()) >= 3


def test_a_large_index_sheds_its_pages_every_so_many_calls_between_checkpoints(tmp_path):
    """Ids coming faster than checkpoints: an index larger than its
    threshold (here 0 bytes) keeps at most SHED_EVERY_CALLS calls' pages
    resident (here 64), with no checkpoint; a smaller one keeps them all."""
    directory = os.path.realpath(str(tmp_path))
    with Store.open(directory, CONFIG, now_ms=NOW) as store:
        ids = store.ids
        ids.shed_every_calls, ids.residency.budget_bytes = 64, 0
        for n in range(40):  # 40 commits of 50 sends: a shed every 64 puts and look-ups
            store.send([NewMessage("t", f"m{n}-{i}", "x", NOW, NOW, MS_PER_HOUR, 3) for i in range(50)], NOW)
            store.commit()
        assert ids.sheds >= 40 * 50 // 64
        # at most the pages of the calls since the last shed: 64 calls, a page or two each
        assert resident_kb(os.path.join(directory, "ids")) <= 2 * 64 * 4
        assert store.get("t", "m0-0") is not None and store.get("t", "m39-49") is not None
        ids.residency.budget_bytes = 1 << 40  # small indexes: never shed but by the checkpoints
        before = ids.sheds
        for n in range(10):
            store.send([NewMessage("t", f"k{n}-{i}", "x", NOW, NOW, MS_PER_HOUR, 3) for i in range(50)], NOW)
            store.commit()
        assert ids.sheds == before


def test_a_batch_sheds_before_its_look_ups_and_after_its_inserts(tmp_path):
    """A batch's look-ups that would pass the calls between sheds shed
    first what the calls before left resident; its inserts (the same keys)
    find their pages resident and shed after: one batch's pages at most."""
    directory = os.path.realpath(str(tmp_path)) + "/ids"
    index = IdIndex.build(directory, 8192, lambda hour: True, residency=Residency(0))
    index.publish()
    try:
        index.shed_every_calls = 64
        keys, _ = index.keys_present([("t", f"a{i}") for i in range(20)])
        index.put_many([(key, 490_000, i) for i, key in enumerate(keys)])
        assert index.sheds == 0 and resident_kb(directory) > 0  # 40 calls: no shed yet
        keys, _ = index.keys_present([("t", f"b{i}") for i in range(1000)])
        assert index.sheds == 1 and resident_kb(directory) > 0  # before the look-ups: theirs stay for the inserts
        index.put_many([(key, 490_000, 100 + i) for i, key in enumerate(keys)])
        assert index.sheds == 2 and resident_kb(directory) == 0
        keys, found = index.keys_present([("t", "a3"), ("t", "b999")])
        assert found == set(keys)
    finally:
        index.close()


def test_the_calls_between_sheds_keep_the_resident_size():
    """Half the pages of an index's share of the budget (a third: ids, keys,
    ends; a call touches one or two), never more than SHED_EVERY_CALLS nor
    fewer than SHED_MIN_CALLS."""
    small = IdIndex("unused", 4096, lambda hour: True, b"k" * 32, residency=Residency(12 << 20))
    assert small.shed_every_calls == (4 << 20) // PAGE_BYTES // 2 == 512
    assert IdIndex("unused", 4096, lambda hour: True, b"k" * 32, residency=Residency(1 << 30)).shed_every_calls == SHED_EVERY_CALLS
    assert IdIndex("unused", 4096, lambda hour: True, b"k" * 32, residency=Residency(0)).shed_every_calls == SHED_MIN_CALLS


def test_a_large_index_maps_one_page_a_probe_not_its_neighbours(tmp_path):
    """A read of an unmapped page maps its neighbours too (fault-around:
    64 kB); a large index's look-ups map their group's page alone
    (MADV_POPULATE_WRITE), so ids looked up at random keep a page or two
    each resident, not 16."""
    directory = os.path.realpath(str(tmp_path))
    with Store.open(directory, CONFIG, now_ms=NOW) as store:
        ids = store.ids
        store.send([NewMessage("t", f"m{i}", "x", NOW, NOW, MS_PER_HOUR, 3) for i in range(3000)], NOW)
        store.commit()
        ids.shed_every_calls, ids.residency.budget_bytes = 1, 0  # large from the next call on
        assert store.get("t", "m0") is not None
        ids.shed_every_calls = 1 << 30  # no shed while the look-ups below are counted
        ids.shed()
        looked = [f"m{i}" for i in range(0, 3000, 150)]  # 20 ids, spread over the shards
        for msg_id in looked:
            assert store.get("t", msg_id) is not None
        assert resident_kb(os.path.join(directory, "ids")) <= len(looked) * 2 * 4


def test_the_resident_size_comes_from_the_store_config_to_every_index(tmp_path):
    config = StoreConfig(segment_bytes=1 << 20, id_shard_initial_slots=4096, retention_ms=MS_PER_HOUR,
                         index_resident_bytes=3 << 20)
    with Store.open(str(tmp_path), config, now_ms=NOW) as store:
        store.keep_ends("t", True)
        sent = store.send([NewMessage("t", "m", "x", NOW, NOW, MS_PER_HOUR, 3)], NOW)
        store.commit()
        store.update([StateChange(sent[0].message.location, Status.ACKED, 0)], NOW + 1)
        store.commit()
        assert store.ids.residency.budget_bytes == 3 << 20
        assert store.ends is not None and store.ends.slots.residency is store.ids.residency
        assert store.keys is not None and store.keys.slots.residency is store.ids.residency


def test_the_store_s_indexes_share_one_budget(tmp_path):
    """--index-resident-mb is the store's: two indexes each under the budget
    but larger together shed their pages; under it together, neither does."""
    first = IdIndex.build(str(tmp_path / "a"), 4096, lambda hour: True, residency=Residency(0))
    budget = first.disk_bytes() + first.disk_bytes() // 2  # one index fits, two do not
    first.close()
    shared = Residency(budget)
    a = IdIndex.build(str(tmp_path / "a"), 4096, lambda hour: True, residency=shared)
    try:
        assert not shared.over()
        a.shed_every_calls = 1
        a.keys_present([("t", "x")])
        a.keys_present([("t", "y")])
        assert a.sheds == 0  # alone under the budget: resident
        b = IdIndex.build(str(tmp_path / "b"), 4096, lambda hour: True, residency=shared)
        assert shared.over()
        a.keys_present([("t", "z")])
        assert a.sheds == 1  # two together over it: shed
        b.close()  # a closed index leaves the budget
        assert not shared.over()
    finally:
        a.close()


def test_a_shard_doubled_maps_none_of_its_pages(tmp_path):
    """A doubling reads the old slots and writes the new through the file:
    neither shard's pages come into the node's RSS (a large index's shard
    doubling would otherwise make both resident at once)."""
    directory = os.path.realpath(str(tmp_path))
    with Store.open(directory, CONFIG, now_ms=NOW) as store:
        store.send([NewMessage("t", f"m{i}", "x", NOW, NOW, MS_PER_HOUR, 3) for i in range(3000)], NOW)
        store.commit()
        ids = store.ids
        ids.shed()
        shard = ids.shards[0]
        slots = shard.slot_count
        assert ids._double(shard)
        assert ids.shards[0].slot_count == 2 * slots
        assert resident_kb(os.path.join(directory, "ids")) <= 4  # (the new header's page)
        for i in range(3000):  # every id still found
            assert store.get("t", f"m{i}") is not None


def test_look_ups_by_id_keep_a_bounded_part_of_the_hours_resident(tmp_path):
    """A look-up by id reads an entry and a body at random places of the
    mapped hours (each read maps the kernel's fault-around with it): the
    reader sheds the hours every FIND_SHED_EVERY look-ups, so 3,000 look-ups
    of old ids without a checkpoint keep some MB resident, not the hours'
    files whole. Every look-up still finds its message."""
    from storage.reading import FIND_SHED_EVERY

    directory = os.path.realpath(str(tmp_path))
    body = "x" * 2000  # a message a page or so: the files far larger than the bound
    with Store.open(directory, CONFIG, now_ms=NOW) as store:
        for first in range(0, 20_000, 1000):
            store.send([NewMessage("t", f"m{i}", body, NOW, NOW + 60_000, MS_PER_HOUR, 3)
                        for i in range(first, first + 1000)], NOW)
            store.commit()
        store.shed()
        delay = os.path.join(directory, "delay")
        files_kb = sum(os.path.getsize(os.path.join(delay, n)) for n in os.listdir(delay)) // 1024
        most = 0
        for i in range(0, 20_000, 7):
            assert store.get("t", f"m{i}").msg_id == f"m{i}"
            most = max(most, resident_kb(delay))
        bound_kb = FIND_SHED_EVERY * 2 * 64 + 64  # two reads a look-up, 64 kB of fault-around each
        assert most <= bound_kb < files_kb // 4, (most, bound_kb, files_kb)
