"""Store.apply_deferred: the committed PART records of a bulk call
(storage.records) applied a slice at a time, what each slice staged
written in its own turn -- in a far hour too, whose staged bytes would
otherwise wait for the stage limit (storage.hour_table), a delete-all's
half a million states then written in one go."""

from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, StateChange, Store

NOW = 490_000 * MS_PER_HOUR + 5_000
CONFIG = StoreConfig(segment_bytes=64 * 1024, id_shard_initial_slots=16)


def test_each_slice_of_deferred_parts_is_written_in_its_turn_in_a_far_hour_too(tmp_path):
    store = Store.open(str(tmp_path), CONFIG, now_ms=NOW)
    try:
        sent = store.send([NewMessage("t", f"m{i}", "x", NOW, NOW + 10 * MS_PER_HOUR, MS_PER_HOUR, 3)
                           for i in range(50)], NOW)
        store.commit()
        places = [r.message.location for r in sent]
        assert not store._hours.is_near(places[0].hour)
        for first in (0, 25):
            store.update([StateChange(where, Status.DELETED, 0) for where in places[first:first + 25]], NOW, part_of=7)
        store.commit_parts(7, NOW)
        store.sync_log()
        store.apply_pending(defer=True)
        slices = 0
        more = True
        while more:
            more = store.apply_deferred(20)
            slices += 1
            assert store._hours.dirty_count == 0
        assert slices == 3
        assert not store.parts_held()
        assert {e.status for e in store.hour_entries(places[0].hour)} == {Status.DELETED}
    finally:
        store.close()
