"""The end index (storage.end_index) through the store: `Store.ended_at`
answers, for each ended message of a topic whose ends are kept, the
latest of its end and the times it was sent again (`seen_again`) -- None
for a topic whose ends are not kept, or a time 2**31 ms or more before
now's high part -- across times that cross the 2**31 ms steps of a slot's
key, restarts that replay the commit log, checkpoints, and damage to the
index's files (a deleted directory, a truncated or garbled shard, a
garbled secret): then it is made again empty at the next open, and
only the ends the log replays are known again, never a wrong one. A
slot's check byte flipped answers that look-up as forgotten."""

from __future__ import annotations

import os
import shutil

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from storage.config import StoreConfig
from storage.end_index import HI_SHIFT, EndIndex
from storage.entry import MS_PER_HOUR, Location, Status
from storage.id_index import HEADER_BYTES, SLOT_BYTES
from storage.store import NewMessage, StateChange, Store

# Retention longer than every run's time, so no file retires under the model.
CONFIG = StoreConfig(segment_bytes=64 * 1024, id_shard_initial_slots=16, retention_ms=400 * 24 * MS_PER_HOUR)
NOW = 490_000 * MS_PER_HOUR
DAY_MS = 24 * MS_PER_HOUR

steps = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from(("t", "u")), st.integers(1, 3)),
    st.tuples(st.just("end"), st.integers(0, 1000), st.sampled_from((Status.ACKED, Status.DELETED, Status.EXPIRED))),
    st.tuples(st.just("again"), st.integers(0, 1000)),
    st.tuples(st.just("wait"), st.one_of(st.integers(1, 5_000), st.integers(1, 30 * DAY_MS))),
    st.tuples(st.just("reopen"), st.sampled_from(("none", "checkpoint", "delete", "truncate", "garble", "secret")),
              st.integers(0, 63), st.integers(0, 10_000)),
), min_size=1, max_size=30)


def _damage(directory: str, how: str, shard: int, at: int) -> bool:
    """Damage the end index's files; whether the next open must make it
    again. (No index yet -- no end kept so far: it is made with the first
    -- nothing to damage.)"""
    ends = os.path.join(directory, "ends")
    path = os.path.join(ends, f"{shard:02x}.hix")
    if not os.path.exists(path):
        return False
    if how == "delete":
        shutil.rmtree(ends)
    elif how == "truncate":
        os.truncate(path, at % os.path.getsize(path))
    elif how in ("garble", "secret"):  # a byte of the header flipped (not the version's: a newer one is refused)
        position = at % (HEADER_BYTES if how == "garble" else 40)
        position = 0 if position in (4, 5) else position
        with open(path if how == "garble" else os.path.join(ends, "secret"), "r+b") as f:
            f.seek(position)
            old = f.read(1)
            f.seek(position)
            f.write(bytes([old[0] ^ 0xFF]))
    return how in ("delete", "truncate", "garble", "secret")


def _expected(times: list[int], now_ms: int) -> int | None:
    hi = now_ms >> HI_SHIFT
    near = [t for t in times if t >> HI_SHIFT in (hi, hi - 1)]
    return max(near) if near else None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=steps)
def test_ended_at_answers_the_latest_end_or_send_again_kept(tmp_path_factory, steps):
    directory = str(tmp_path_factory.mktemp("ends"))
    now = NOW
    store = Store.open(directory, CONFIG, now_ms=now)
    store.keep_ends("t", True)
    live: list[tuple[str, str, Location]] = []  # (topic, msgId, place) of messages not ended
    ended: dict[Location, str] = {}  # place -> topic
    # each kept time: (place, time, checkpoints taken before it was kept)
    kept: list[tuple[Location, int, int]] = []
    checkpoints = 0
    sent = 0
    try:
        for step in steps:
            if step[0] == "send":
                _, topic, n = step
                batch = [NewMessage(topic, f"m{sent + i}", "x", now, now, 400 * DAY_MS, 3) for i in range(n)]
                sent += n
                for result in store.send(batch, now):
                    live.append((topic, result.message.msg_id, result.message.location))
                store.commit()
            elif step[0] == "end" and live:
                topic, _, where = live.pop(step[1] % len(live))
                store.update([StateChange(where, step[2], 0)], now)
                store.commit()
                ended[where] = topic
                if topic == "t":
                    kept.append((where, now, checkpoints))
            elif step[0] == "again" and ended:
                where = sorted(ended)[step[1] % len(ended)]
                store.seen_again([where], now)
                store.commit()
                kept.append((where, now, checkpoints))
            elif step[0] == "wait":
                now += step[1]
                store.advance(now)
            elif step[0] == "reopen":
                _, how, shard, at = step
                if how == "checkpoint":
                    store.checkpoint(now)
                    checkpoints += 1
                store.close()
                had = os.path.isdir(os.path.join(directory, "ends"))
                damaged = _damage(directory, how, shard, at)
                if damaged:  # what the last checkpoint held is forgotten
                    kept = [k for k in kept if k[2] >= checkpoints]
                store = Store.open(directory, CONFIG, now_ms=now)
                if had and how != "delete":  # (else none on disk: made again by the first end replayed or kept)
                    assert store.ends is not None and (store.ends.rebuilt is not None) == damaged, how
                store.keep_ends("t", True)
            for where in ended:
                assert store.ended_at(where, now) == _expected([t for w, t, _ in kept if w == where], now), where
    finally:
        store.close()


def test_a_slot_whose_check_byte_fails_is_answered_as_forgotten(tmp_path):
    store = Store.open(str(tmp_path), CONFIG, now_ms=NOW)
    store.keep_ends("t", True)
    [sent] = store.send([NewMessage("t", "a", "x", NOW, NOW, DAY_MS, 3)], NOW)
    store.commit()
    store.update([StateChange(sent.message.location, Status.ACKED, 0)], NOW + 1)
    store.commit()
    assert store.ended_at(sent.message.location, NOW + 2) == NOW + 1
    store.checkpoint(NOW + 2)  # (else the reopening replays the ack, and meets the slot too)
    store.close()
    ends = tmp_path / "ends"
    flipped = 0
    for name in sorted(os.listdir(ends)):
        if name.endswith(".hix"):
            data = bytearray((ends / name).read_bytes())
            for offset in range(HEADER_BYTES, len(data), SLOT_BYTES):
                if data[offset:offset + 8] != bytes(8):
                    data[offset + 8] ^= 0xFF
                    flipped += 1
            (ends / name).write_bytes(bytes(data))
    assert flipped == 1
    store = Store.open(str(tmp_path), CONFIG, now_ms=NOW + 2)
    try:
        assert store.ended_at(sent.message.location, NOW + 2) is None
        assert isinstance(store.ends, EndIndex) and store.ends.damaged == 1
    finally:
        store.close()
