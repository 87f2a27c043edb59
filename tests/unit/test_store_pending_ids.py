"""A store whose sends never pause: each applied record's messages leave
the pending ids (storage.pending) while later records pend, and are found
by the id index from there -- a get, and a duplicate send, see them."""

from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR
from storage.store import NewMessage, Store
from storage.types import SendOutcome

NOW = 490_000 * MS_PER_HOUR + 5_000
CONFIG = StoreConfig(segment_bytes=64 * 1024, id_shard_initial_slots=16)


def test_an_applied_send_is_found_by_the_id_index_while_a_later_one_pends(tmp_path):
    store = Store.open(str(tmp_path), CONFIG, now_ms=NOW)
    try:
        first = store.send([NewMessage("t", "m1", "x", NOW, NOW + 60_000, MS_PER_HOUR, 3)], NOW)
        store.send([NewMessage("t", "m2", "y", NOW, NOW + 60_000, MS_PER_HOUR, 3)], NOW)
        store.sync_log()
        store.apply_pending(1)  # m1's record applied, m2's still pending
        assert store.get("t", "m1") == first[0].message
        again = store.send([NewMessage("t", "m1", "z", NOW, NOW + 60_000, MS_PER_HOUR, 3)], NOW)
        assert again[0].outcome is SendOutcome.DUPLICATE and again[0].message.msg == "x"
        assert store.get("t", "m2") is not None and store.get("t", "m2").msg == "y"
        store.commit()
        assert store.get("t", "m1").msg == "x" and store.get("t", "m2").msg == "y"
    finally:
        store.close()
