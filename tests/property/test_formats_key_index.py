"""The key index (storage.key_index): `Store.keyed(topic, key)` answers
exactly the unreleased messages sent with that key, across sends in
several hours, moves (a move's new place is found, its old one is not),
restarts that replay the commit log, checkpoints, and damage to the index's
files -- a deleted directory, a truncated or garbled shard, a garbled
secret, an index of the layout before buckets (its marker `runs`, not
`buckets`) -- each rebuilt from the delay logs at the next open --, or a
slot's check byte flipped (that lookup answers None: the caller scans).
"""

from __future__ import annotations

import os
import shutil

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR
from storage.errors import NewerFormatError
from storage.id_index import HEADER_BYTES, SLOT_BYTES
from storage.store import NewMessage, Store

CONFIG = StoreConfig(segment_bytes=64 * 1024, id_shard_initial_slots=16)
NOW = 490_000 * MS_PER_HOUR
TOPICS = ("t", "u")
KEYS = ("k1", "k2", "k3")

steps = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(TOPICS), st.sampled_from(("", *KEYS)), st.integers(0, 40)),
    st.tuples(st.just("move"), st.integers(0, 1000), st.integers(0, 40)),
    st.tuples(st.just("reopen"), st.sampled_from(("none", "checkpoint", "delete", "truncate", "garble", "secret", "older")),
              st.integers(0, 63), st.integers(0, 10_000)),
), min_size=1, max_size=25)


def _damage(directory: str, how: str, shard: int, at: int) -> None:
    keys = os.path.join(directory, "keys")
    path = os.path.join(keys, f"{shard:02x}.hix")
    if how == "delete":
        shutil.rmtree(keys)
    elif how == "truncate":
        os.truncate(path, at % os.path.getsize(path))
    elif how == "garble":
        with open(path, "r+b") as f:
            f.seek(at % HEADER_BYTES)
            f.write(b"\xff")
    elif how == "older":  # the layout before buckets: its slots read otherwise
        os.rename(os.path.join(keys, "buckets"), os.path.join(keys, "runs"))
    elif how == "secret":
        with open(os.path.join(keys, "secret"), "r+b") as f:
            f.seek(at % 40)
            f.write(b"\x00\xff")


def _version_hit(how: str, at: int) -> bool:
    """Whether `_damage` wrote over a file's u16 format version (bytes 4-5):
    a version above this build's is refused as a newer format's file
    (storage.errors.NewerFormatError), whatever its checksum says."""
    if how == "garble":
        return at % HEADER_BYTES in (4, 5)
    return how == "secret" and at % 40 in (3, 4, 5)


def _flip_a_check_byte(directory: str) -> bool:
    """Flip the check byte of the first used slot found; False if none."""
    keys = os.path.join(directory, "keys")
    for name in sorted(os.listdir(keys)):
        if not name.endswith(".hix"):
            continue
        path = os.path.join(keys, name)
        with open(path, "r+b") as f:
            data = f.read()
            for offset in range(HEADER_BYTES, len(data), SLOT_BYTES):
                if data[offset:offset + 8] != bytes(8):
                    f.seek(offset + 8)
                    f.write(bytes([data[offset + 8] ^ 0xFF]))
                    return True
    return False


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_keyed_answers_the_key_s_unreleased_messages(tmp_path_factory, steps):
    directory = str(tmp_path_factory.mktemp("keys"))
    store = Store.open(directory, CONFIG, now_ms=NOW)
    model: dict[tuple[str, str], str] = {}  # (topic, msgId) -> key
    sent = 0
    try:
        for step in steps:
            if step[0] == "send":
                _, topic, key, hours = step
                msg_id = f"m{sent}"
                sent += 1
                store.send([NewMessage(topic, msg_id, "body", NOW, NOW + hours * MS_PER_HOUR + 1000, MS_PER_HOUR,
                                       1, 0, "", key)], NOW)
                store.commit()
                model[(topic, msg_id)] = key
            elif step[0] == "move" and model:
                _, pick, hours = step
                topic, msg_id = sorted(model)[pick % len(model)]
                m = store.get(topic, msg_id)
                store.move([(m.location, NOW + hours * MS_PER_HOUR + 7, m.retry)], NOW)
                store.commit()
            elif step[0] == "reopen":
                _, how, shard, at = step
                if how == "checkpoint":
                    store.checkpoint(NOW)
                store.close()
                _damage(directory, how, shard, at)
                try:
                    store = Store.open(directory, CONFIG, now_ms=NOW)
                except NewerFormatError:  # the damage made a version above ours: refused as it is, never rebuilt
                    assert _version_hit(how, at)
                    return
            for topic in TOPICS:
                for key in KEYS:
                    found = store.keyed(topic, key)
                    want = sorted(i for (t, i), k in model.items() if t == topic and k == key)
                    assert found is not None and sorted(m.msg_id for m in found) == want, (topic, key)
                    assert all(store.get(topic, m.msg_id).location == m.location for m in found)
        if _flip_a_check_byte(directory):
            for topic in TOPICS:
                for key in KEYS:
                    found = store.keyed(topic, key)
                    want = sorted(i for (t, i), k in model.items() if t == topic and k == key)
                    assert found is None or sorted(m.msg_id for m in found) == want
    finally:
        store.close()
