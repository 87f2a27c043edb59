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
            assert not store._hours.dirty
        assert slices == 3
        assert not store.parts_held()
        assert {e.status for e in store.hour_entries(places[0].hour)} == {Status.DELETED}
    finally:
        store.close()


def test_a_deferred_slice_applied_leaves_the_pending_states_while_another_call_is_held(tmp_path):
    """Call 7 committed and applied late while call 8's PARTs are held: the
    states of 7 leave the overlay as their slices are staged (else a
    delete-all's states piled up there until no call held parts), 8's stay,
    and a state a later record changed again stays too."""
    store = Store.open(str(tmp_path), CONFIG, now_ms=NOW)
    try:
        sent = store.send([NewMessage("t", f"m{i}", "x", NOW, NOW + 10 * MS_PER_HOUR, MS_PER_HOUR, 3)
                           for i in range(60)], NOW)
        store.commit()
        places = [r.message.location for r in sent]
        store.update([StateChange(where, Status.DELETED, 0) for where in places[:30]], NOW, part_of=7)
        store.update([StateChange(where, Status.DELETED, 0) for where in places[30:50]], NOW, part_of=8)
        store.commit_parts(7, NOW)
        store.sync_log()
        store.apply_pending(defer=True)
        assert len(store._pending.states) == 50
        while store.apply_deferred(20):
            pass
        assert store.parts_held()  # call 8's
        assert len(store._pending.states) == 20
        assert {e.status for e in store.hour_entries(places[0].hour)[:30]} == {Status.DELETED}
        assert store.read_message(places[40]).status == Status.DELETED  # held: from the overlay
        assert store.read_message(places[55]).status == Status.WAITING
    finally:
        store.close()
