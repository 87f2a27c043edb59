"""A data directory written before the keyed id index and the position-
covering commit-log frames (tests/fixtures/v1-store.tar.gz, made by
tests/fixtures/make_v1_store.py with that code) opens with today's: its id
index is rebuilt under a new secret, its version 1 log segments are read,
and new records go to a version 2 segment."""

from __future__ import annotations

import os
import shutil
import tarfile

import pytest

from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR, Status
from storage.store import NewMessage, SendOutcome, StateChange, Store

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "v1-store.tar.gz")
NOW = 490_000 * MS_PER_HOUR + 5_000
CONFIG = StoreConfig(segment_bytes=4096, id_shard_initial_slots=16)
ALL_IDS = [f"m{i}" for i in range(30)] + [f"late{i}" for i in range(5)]


@pytest.fixture
def old_dir(tmp_path) -> str:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return str(tmp_path / "data")


def segment_versions(data_dir: str) -> list[int]:
    versions = []
    for name in sorted(os.listdir(os.path.join(data_dir, "commitlog"))):
        with open(os.path.join(data_dir, "commitlog", name), "rb") as f:
            versions.append(int.from_bytes(f.read(6)[4:6], "little"))
    return versions


def check_contents(store: Store) -> None:
    for msg_id in ALL_IDS:
        m = store.get("t", msg_id)
        assert m is not None, msg_id
        text = "again" if msg_id == "m5" else "x" * 1500 if msg_id.startswith("late") else "body"
        assert m.msg == f"{text} of {msg_id}"
    assert [store.get("t", f"m{i}").status for i in range(7)] == [Status.ACKED] * 5 + [Status.WAITING, Status.DELETED]
    assert store.get("t", "m5").location != store.get("t", "m4").location


def test_an_old_directory_opens_and_its_ids_are_found(old_dir):
    assert not os.path.exists(os.path.join(old_dir, "ids", "secret"))
    assert segment_versions(old_dir) == [1, 1, 1, 1]
    with Store.open(old_dir, CONFIG, now_ms=NOW) as store:
        check_contents(store)
        assert os.path.exists(os.path.join(old_dir, "ids", "secret"))
        assert not [n for n in os.listdir(old_dir) if n.startswith("ids.")]
        # Dedup still holds against the old messages; new ones are stored.
        results = store.send([NewMessage("t", "m7", "dup", NOW, NOW, 1000, 0),
                              NewMessage("t", "new", "fresh", NOW, NOW + 1000, 1000, 0)], NOW)
        assert [r.outcome for r in results] == [SendOutcome.DUPLICATE, SendOutcome.STORED]
        store.commit()
    assert segment_versions(old_dir)[:4] == [1, 1, 1, 1] and set(segment_versions(old_dir)[4:]) == {2}
    with Store.open(old_dir, CONFIG, now_ms=NOW) as store:  # reopening keeps the new index
        check_contents(store)
        assert store.get("t", "new").msg == "fresh"
        store.checkpoint(NOW)
    with Store.open(old_dir, CONFIG, now_ms=NOW) as store:
        check_contents(store)
        assert store.get("t", "new").msg == "fresh"


def test_an_id_released_in_the_old_directory_can_be_sent_again(old_dir):
    with Store.open(old_dir, CONFIG, now_ms=NOW) as store:
        where = store.get("t", "m5").location
        store.update([StateChange(where, Status.DELETED, 0, released=True)], NOW)
        store.commit()
        assert store.get("t", "m5") is None
        [result] = store.send([NewMessage("t", "m5", "third", NOW, NOW, 1000, 0)], NOW)
        assert result.outcome is SendOutcome.STORED
        store.commit()
    with Store.open(old_dir, CONFIG, now_ms=NOW) as store:
        assert store.get("t", "m5").msg == "third"


def test_a_lost_id_index_is_rebuilt_from_the_delay_logs(old_dir):
    with Store.open(old_dir, CONFIG, now_ms=NOW) as store:
        store.checkpoint(NOW)
    shutil.rmtree(os.path.join(old_dir, "ids"))
    with Store.open(old_dir, CONFIG, now_ms=NOW) as store:
        check_contents(store)

