"""A delay-log body's fairKey (storage.delay_log): packed last, after the
trace context and the redriveCount, only when the sender gave one; every
body reads back as packed, a body without one (every body of an older log)
reads as "", its first byte, ids and serial key read as without; a store
keeps it across a send, a move (a re-drive counts on, the key stays), a
commit and a reopen.
"""

from __future__ import annotations

import tempfile

import hypothesis.strategies as st
import msgpack
import pytest
from hypothesis import given, settings

from storage import delay_log
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR
from storage.errors import ContractError, InvalidRequest
from storage.key_index import KEYED_BODY
from storage.store import MAX_FAIR_KEY_BYTES, NewMessage, Store

names = st.text(min_size=1, max_size=30)
texts = st.text(max_size=40)
bodies = st.tuples(names, names, texts, st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**16 - 1),
                   texts, st.one_of(st.just(""), names))
traces = st.one_of(st.just(("", "")), st.tuples(st.just("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                                                st.text(max_size=20)))
counts = st.one_of(st.just(0), st.integers(1, 2**31))
fair_keys = st.one_of(st.just(""), st.text(min_size=1, max_size=20))


@settings(max_examples=300, deadline=None)
@given(bodies, traces, counts, fair_keys)
def test_a_body_with_a_fair_key_reads_back_as_packed(fields, trace, count, fair_key):
    topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key = fields
    packed = delay_log.pack_body(topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key, *trace, count, fair_key)
    without = delay_log.pack_body(topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key, *trace, count)
    assert delay_log.unpack_body(packed) == delay_log.Body(*fields, *trace, count, fair_key)
    assert packed == (without + msgpack.packb(fair_key) if fair_key else without)
    assert packed[0] == (KEYED_BODY if key else 0x97)
    assert delay_log.id_fields(packed) == (topic.encode(), msg_id.encode())
    assert delay_log.serial_key(packed) == (topic, key)
    again = delay_log.unpack_body(delay_log.redriven(packed))
    assert again == delay_log.Body(*fields, *trace, count + 1, fair_key)


@given(bodies, traces, counts)
def test_a_body_of_an_older_log_reads_with_no_fair_key(fields, trace, count):
    old = msgpack.packb(list(fields) if fields[7] else list(fields[:7]))
    if trace[0]:
        old += msgpack.packb(list(trace))
    if count:
        old += msgpack.packb(count)
    body = delay_log.unpack_body(old)
    assert body.fair_key == ""
    assert body[:11] == (*fields, *trace, count)


@pytest.mark.parametrize("tail", [msgpack.packb("a") * 2, msgpack.packb("a") + msgpack.packb(2),
                                  msgpack.packb("a") + msgpack.packb(["00-a", ""])])
def test_a_fair_key_out_of_its_place_is_refused(tail):
    with pytest.raises(ContractError):
        delay_log.unpack_body(msgpack.packb(["t", "i", "m", 1, 2, 3, ""]) + tail)


def test_a_store_keeps_a_fair_key_across_moves_commit_and_reopen():
    now = 490_000 * MS_PER_HOUR
    config = StoreConfig(segment_bytes=64 * 1024)
    with tempfile.TemporaryDirectory() as directory:
        store = Store.open(directory, config, now_ms=now)
        sent, plain = [r.message for r in store.send(
            [NewMessage("t", "a", "m", now, now + 60_000, 60_000, 3, key="k", fair_key="tenant-ä"),
             NewMessage("t", "b", "m", now, now + 60_000, 60_000, 3)], now)]
        store.commit()
        assert (sent.fair_key, plain.fair_key) == ("tenant-ä", "")
        moved, = store.move([(sent.location, now + 1000, 0)], now, redrive=True)
        store.commit()
        kept, = store.move([(moved.location, now + 2000, 0)], now)
        store.commit()
        assert (moved.fair_key, moved.redrive_count, kept.fair_key) == ("tenant-ä", 1, "tenant-ä")
        store.close()
        store = Store.open(directory, config, now_ms=now)
        got, other = store.get("t", "a"), store.get("t", "b")
        assert got is not None and (got.fair_key, got.redrive_count, got.key) == ("tenant-ä", 1, "k")
        assert other is not None and other.fair_key == ""
        store.close()


def test_a_store_refuses_a_fair_key_over_its_bytes():
    now = 490_000 * MS_PER_HOUR
    with tempfile.TemporaryDirectory() as directory:
        store = Store.open(directory, StoreConfig(segment_bytes=64 * 1024), now_ms=now)
        with pytest.raises(InvalidRequest, match="fairKey"):
            store.send([NewMessage("t", "a", "m", now, now, 60_000, 3, fair_key="é" * (MAX_FAIR_KEY_BYTES // 2 + 1))],
                       now)
        assert store.get("t", "a") is None
        store.close()
