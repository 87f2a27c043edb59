"""Delay-log bodies (storage.delay_log) with and without trace context:
every body reads back as it was packed; one without trace context is the
array it always was, byte for byte (not one byte more), one with trace
context is that same array and the [traceparent, tracestate] array after
it, so its first byte (plain 0x97, keyed 0x98: KEYED_BODY), its topic and
msgId (`id_fields`) and its serial key read as they do without; and a
store keeps the trace context across a commit, a reopen and a move.
"""

from __future__ import annotations

import tempfile

import hypothesis.strategies as st
import msgpack
from hypothesis import given, settings

from storage import delay_log
from storage.config import StoreConfig
from storage.entry import MS_PER_HOUR
from storage.key_index import KEYED_BODY
from storage.store import NewMessage, Store

names = st.text(min_size=1, max_size=30)
texts = st.text(max_size=40)
hex_of = lambda n: st.text("0123456789abcdef", min_size=n, max_size=n)  # noqa: E731
traceparents = st.builds(lambda v, t, p, f, more: f"{v}-{t}-{p}-{f}{more}",
                         st.sampled_from(["00", "01", "fe"]), hex_of(32), hex_of(16), hex_of(2),
                         st.sampled_from(["", "-ab"]))
tracestates = st.one_of(st.just(""), st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=512))
traces = st.one_of(st.just(("", "")), st.tuples(traceparents, tracestates))
bodies = st.tuples(names, names, texts, st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**16 - 1),
                   texts, st.one_of(st.just(""), names))


@settings(max_examples=300, deadline=None)
@given(bodies, traces)
def test_a_body_reads_back_as_packed(fields, trace):
    topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key = fields
    traceparent, tracestate = trace
    packed = delay_log.pack_body(topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key, traceparent, tracestate)
    plain = delay_log.pack_body(topic, msg_id, msg, produce_ms, ttl_ms, max_retry, tag, key)
    assert delay_log.unpack_body(packed) == delay_log.Body(*fields, traceparent, tracestate)
    # without trace context: the array of old, not one byte more
    assert plain == msgpack.packb(list(fields) if key else list(fields[:7]))
    if traceparent:
        assert packed == plain + msgpack.packb([traceparent, tracestate])
    else:
        assert packed == plain
    assert packed[0] == (KEYED_BODY if key else 0x97)
    assert delay_log.id_fields(packed) == (topic.encode(), msg_id.encode())
    assert delay_log.serial_key(packed) == (topic, key)


@given(bodies)
def test_a_body_of_an_older_log_reads_without_trace_context(fields):
    old = msgpack.packb(list(fields) if fields[7] else list(fields[:7]))
    body = delay_log.unpack_body(old)
    assert (body.traceparent, body.tracestate) == ("", "")
    assert body[:8] == fields


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_store_keeps_trace_context_across_commit_reopen_and_move():
    now = 490_000 * MS_PER_HOUR
    config = StoreConfig(segment_bytes=64 * 1024)
    sent = [NewMessage("t", "traced", "m", now, now + 60_000, 60_000, 3, traceparent=TRACEPARENT,
                       tracestate="congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"),
            NewMessage("t", "keyed", "m", now, now + 60_000, 60_000, 3, key="k", traceparent=TRACEPARENT),
            NewMessage("t", "plain", "m", now, now + 60_000, 60_000, 3)]
    with tempfile.TemporaryDirectory() as directory:
        store = Store.open(directory, config, now_ms=now)
        answered = [r.message for r in store.send(sent, now)]
        store.commit()
        expect = {m.msg_id: (m.traceparent, m.tracestate) for m in sent}
        assert {m.msg_id: (m.traceparent, m.tracestate) for m in answered} == expect
        store.close()
        store = Store.open(directory, config, now_ms=now)
        got = {m.msg_id: store.get("t", m.msg_id) for m in sent}
        assert {i: (m.traceparent, m.tracestate) for i, m in got.items() if m is not None} == expect
        assert [m.msg_id for m in store.keyed("t", "k") or []] == ["keyed"]
        moved = store.move([(got["traced"].location, now + 7_200_000, 0)], now)
        store.commit()
        assert (moved[0].traceparent, moved[0].tracestate) == expect["traced"]
        again = store.get("t", "traced")
        assert again is not None and again.trigger_ms == now + 7_200_000
        assert (again.traceparent, again.tracestate) == expect["traced"]
        store.close()
