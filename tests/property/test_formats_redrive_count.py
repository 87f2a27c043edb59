"""A delay-log body's redriveCount (storage.delay_log): packed after the
fields and the trace context, only once a redriveMsgs job re-drove the
message; every body reads back as packed, a body without one (every body
of an older log) reads as 0, its first byte, ids and serial key read as
without; a store's counted move files the body with one more, kept across
a commit and a reopen, and an uncounted move (redriveMsg, a reschedule)
keeps it.
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
from storage.errors import ContractError
from storage.key_index import KEYED_BODY
from storage.store import NewMessage, Store

names = st.text(min_size=1, max_size=30)
texts = st.text(max_size=40)
bodies = st.tuples(names, names, texts, st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**16 - 1),
                   texts, st.one_of(st.just(""), names))
traces = st.one_of(st.just(("", "")), st.tuples(st.just("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                                                st.text(max_size=20)))
counts = st.integers(0, 2**31)


@settings(max_examples=300, deadline=None)
@given(bodies, traces, counts)
def test_a_body_with_a_redrive_count_reads_back_as_packed(fields, trace, count):
    topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key = fields
    packed = delay_log.pack_body(topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key, *trace, count)
    without = delay_log.pack_body(topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key, *trace)
    assert delay_log.unpack_body(packed) == delay_log.Body(*fields, *trace, count)
    assert packed == (without + msgpack.packb(count) if count else without)
    assert packed[0] == (KEYED_BODY if key else 0x97)
    assert delay_log.id_fields(packed) == (topic.encode(), msg_id.encode())
    assert delay_log.serial_key(packed) == (topic, key)
    again = delay_log.unpack_body(delay_log.redriven(packed))
    assert again == delay_log.Body(*fields, *trace, count + 1)


@given(bodies, traces)
def test_a_body_of_an_older_log_reads_with_no_redrive(fields, trace):
    old = msgpack.packb(list(fields) if fields[7] else list(fields[:7]))
    if trace[0]:
        old += msgpack.packb(list(trace))
    body = delay_log.unpack_body(old)
    assert body.redrive_count == 0
    assert body[:10] == (*fields, *trace)


@pytest.mark.parametrize("tail", [msgpack.packb(0), msgpack.packb(-1), msgpack.packb(""),
                                  msgpack.packb("x") + msgpack.packb(3),  # (a fairKey comes after the count)
                                  msgpack.packb(3) + msgpack.packb(["00-a", ""]), msgpack.packb(2) * 2,
                                  b"\xc1"])
def test_a_body_with_anything_else_after_its_fields_is_refused(tail):
    with pytest.raises(ContractError):
        delay_log.unpack_body(msgpack.packb(["t", "i", "m", 1, 2, 3, ""]) + tail)


def test_a_store_counts_a_redrive_across_commit_and_reopen():
    now = 490_000 * MS_PER_HOUR
    config = StoreConfig(segment_bytes=64 * 1024)
    with tempfile.TemporaryDirectory() as directory:
        store = Store.open(directory, config, now_ms=now)
        sent, = [r.message for r in store.send([NewMessage("t", "a", "m", now, now + 60_000, 60_000, 3, key="k")],
                                                now)]
        store.commit()
        assert sent.redrive_count == 0
        moved, = store.move([(sent.location, now + 1000, 0)], now, redrive=True)
        assert moved.redrive_count == 1
        store.commit()
        twice, = store.move([(moved.location, now + 2000, 0)], now, redrive=True)
        store.commit()
        kept, = store.move([(twice.location, now + 3000, 0)], now)  # (a reschedule keeps it)
        store.commit()
        assert (twice.redrive_count, kept.redrive_count) == (2, 2)
        store.close()
        store = Store.open(directory, config, now_ms=now)
        got = store.get("t", "a")
        assert got is not None and got.redrive_count == 2 and got.trigger_ms == now + 3000 and got.key == "k"
        store.close()
