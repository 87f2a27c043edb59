"""An ended message's end reason (storage.delay_index, flag bit 2,
FLAG_PAUSED: a resume's `expire` ended it): a status change that adds the
flag makes the message read back with `end_reason` "paused", kept across
a commit, a replay of the commit log and a checkpoint and reopen; every
other change -- and every entry of an older directory, whose flags never
have the bit -- reads with none; the flag never hides a message (released
still reads as released, a message is still found by its id)."""

from __future__ import annotations

import os
import tarfile
import tempfile

import hypothesis.strategies as st
from hypothesis import given, settings

from storage import delay_index
from storage.config import StoreConfig
from storage.delay_index import FLAG_MOVED, FLAG_PAUSED, FLAG_RELEASED
from storage.entry import END_PAUSED, MS_PER_HOUR, Status
from storage.store import NewMessage, StateChange, Store

NOW = 490_000 * MS_PER_HOUR
CONFIG = StoreConfig(segment_bytes=64 * 1024)
FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "v1-store.tar.gz")

# What happens to each message: nothing, an expiry of a pause (flag), a ttl
# expiry (no flag), an ack, a delete with its id released.
FATES = st.sampled_from(["live", "paused", "ttl", "acked", "released"])


def _change(m, fate: str) -> StateChange | None:
    if fate == "paused":
        return StateChange(m.location, Status.EXPIRED, 0, flags=FLAG_PAUSED)
    if fate == "ttl":
        return StateChange(m.location, Status.EXPIRED, 0)
    if fate == "acked":
        return StateChange(m.location, Status.ACKED, 0)
    if fate == "released":
        return StateChange(m.location, Status.DELETED, 0, released=True)
    return None


def _check(store: Store, fates: list[str]) -> None:
    for i, fate in enumerate(fates):
        m = store.get("t", f"m{i}")
        if fate == "released":
            assert m is None
            continue
        assert m is not None
        assert m.end_reason == (END_PAUSED if fate == "paused" else ""), (i, fate, m)
        assert m.status is {"live": Status.WAITING, "paused": Status.EXPIRED, "ttl": Status.EXPIRED,
                            "acked": Status.ACKED}[fate]


@settings(max_examples=40, deadline=None)
@given(st.lists(FATES, min_size=1, max_size=12), st.booleans())
def test_the_paused_flag_reads_back_across_commit_replay_and_checkpoint(fates, checkpoint):
    with tempfile.TemporaryDirectory() as directory:
        store = Store.open(directory, CONFIG, now_ms=NOW)
        sent = [r.message for r in store.send([NewMessage("t", f"m{i}", "x", NOW, NOW + 1000, 60_000, 3)
                                               for i in range(len(fates))], NOW)]
        store.commit()
        changes = [c for m, fate in zip(sent, fates) if (c := _change(m, fate)) is not None]
        store.update(changes, NOW + 2000)
        _check(store, fates)  # pending
        store.commit()
        _check(store, fates)  # applied
        if checkpoint:
            store.checkpoint(NOW + 3000)
        store.close()
        with Store.open(directory, CONFIG, now_ms=NOW + 4000) as again:  # replayed, or checkpointed
            _check(again, fates)


@given(st.integers(0, 2**64 - 1), st.sampled_from(list(Status)), st.integers(0, 3), st.integers(0, 2**16 - 1))
def test_an_entry_of_an_older_directory_has_no_reason(trigger_ms, status, old_flags, retry):
    """Flags as an older build wrote them (bits 0 and 1 only): no end
    reason; the paused bit added reads as paused and leaves the others."""
    raw = delay_index.pack_entry(trigger_ms, 1, 2, 3, 4, 5, 6, 7, 8, 9, status, old_flags, retry)
    _, _, _, flags = delay_index.unpack_entry("idx", 0, 4, raw)
    assert not flags & FLAG_PAUSED
    raw = delay_index.pack_entry(trigger_ms, 1, 2, 3, 4, 5, 6, 7, 8, 9, status, old_flags | FLAG_PAUSED, retry)
    entry, _, _, flags = delay_index.unpack_entry("idx", 0, 4, raw)
    assert flags & FLAG_PAUSED and flags & (FLAG_RELEASED | FLAG_MOVED) == old_flags
    assert entry.status is status and entry.retry == retry


def test_an_older_directory_reads_with_no_end_reason(tmp_path):
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    with Store.open(str(tmp_path / "data"), StoreConfig(segment_bytes=4096, id_shard_initial_slots=16),
                    now_ms=NOW + 5_000) as store:
        found = [m for i in range(30) if (m := store.get("t", f"m{i}")) is not None]
        assert len(found) == 30 and {m.end_reason for m in found} == {""}
