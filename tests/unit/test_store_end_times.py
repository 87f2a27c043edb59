"""The store's end times for a dedup window (storage.end_index through
`Store.keep_ends`, `ended_at`, `seen_again`): only the ends of kept
topics are marked; a send again keeps the message's file -- and so its
id -- retention past its own time, not only past the end."""

from __future__ import annotations

from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, StateChange, Store

CONFIG = StoreConfig(segment_bytes=64 * 1024, id_shard_initial_slots=16, retention_ms=MS_PER_HOUR)
HOUR = 490_000
NOW = HOUR * MS_PER_HOUR + 5_000
MINUTE_MS = 60_000


def _ended(store: Store, topic: str, msg_id: str, at_ms: int):
    [sent] = store.send([NewMessage(topic, msg_id, "x", at_ms, at_ms, MS_PER_HOUR, 3)], at_ms)
    store.commit()
    store.update([StateChange(sent.message.location, Status.ACKED, 0)], at_ms + 1)
    store.commit()
    return sent.message.location


def test_only_the_ends_of_kept_topics_are_kept(tmp_path):
    with Store.open(str(tmp_path), CONFIG, now_ms=NOW) as store:
        store.keep_ends("t", True)
        kept = _ended(store, "t", "a", NOW)
        other = _ended(store, "u", "a", NOW)
        store.keep_ends("t", False)
        after = _ended(store, "t", "b", NOW + 10)
        assert store.ended_at(kept, NOW + 20) == NOW + 1
        assert store.ended_at(other, NOW + 20) is None
        assert store.ended_at(after, NOW + 20) is None


def test_a_send_again_keeps_the_file_retention_past_it(tmp_path):
    with Store.open(str(tmp_path), CONFIG, now_ms=NOW) as store:
        store.keep_ends("t", True)
        touched = _ended(store, "t", "a", NOW)
        store.seen_again([touched], NOW + 50 * MINUTE_MS)
        store.commit()
        # retention after the end (NOW + 1 h) and the hour past: the file would retire
        report = store.checkpoint((HOUR + 1) * MS_PER_HOUR + 30 * MINUTE_MS)
        assert report is not None and report.hours_retired == ()
        assert store.get("t", "a") is not None
        assert store.ended_at(touched, (HOUR + 1) * MS_PER_HOUR) == NOW + 50 * MINUTE_MS
        report = store.checkpoint(NOW + 50 * MINUTE_MS + MS_PER_HOUR)  # retention after the send again
        assert report is not None and report.hours_retired == (HOUR,)
        assert store.get("t", "a") is None
