"""The store answers for its commit log's extent (log_end_offset,
log_start_offset, log_segment_ends): what replication, metrics and
snapshots read, without reaching into the log itself."""

from __future__ import annotations

from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR
from storage.store import NewMessage, Store

NOW = 490_000 * MS_PER_HOUR + 5_000


def test_offsets_follow_appends_and_checkpoints(tmp_path):
    store = Store.open(str(tmp_path), StoreConfig(segment_bytes=4096), now_ms=NOW)
    assert (store.log_start_offset, store.log_end_offset) == (0, 0)
    for i in range(40):
        store.send([NewMessage("t", f"m{i}", "x" * 200, NOW, NOW + 1000, 60_000, 3)], NOW)
        assert store.log_end_offset == store.log_end_offset > 0  # appended, not yet committed
    store.commit()
    ends = store.log_segment_ends()
    assert len(ends) > 1 and ends == store.log_segment_ends()
    report = store.checkpoint(NOW)
    assert report.commit_offset == store.log_end_offset
    assert store.log_start_offset == store.log_start_offset > 0  # segments before the checkpoint deleted
    end = store.log_end_offset
    store.close()
    with Store.open(str(tmp_path), now_ms=NOW) as reopened:
        assert reopened.log_end_offset == end
