"""Commit-log record bodies (storage.records): every kind's items come back
from `decode(encode(...))` as they went in, and an INTENT's places come
back from a store -- after a commit and after a reopen -- until its DONE."""

from __future__ import annotations

from array import array

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from storage import records
from storage.config import StoreConfig
from storage.entry import Location
from storage.store import Store

u32 = st.integers(0, 2**32 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u64 = st.integers(0, 2**64 - 1)
send_items = st.builds(records.SendItem, u32, u32, u32, u32, u32, u32, u32, i64, st.integers(-9, 9), u64, u64,
                       u64, st.binary(max_size=40))
state_items = st.builds(records.StateItem, u32, u32, st.integers(1, 7), u32, st.integers(0, 255),
                        st.integers(0, 7), u64, i64, u64)
move_items = st.builds(records.MoveItem, u32, u32, st.integers(1, 7), u32, send_items)
part_items = st.builds(records.PartItem, u64, st.lists(state_items, max_size=4))
commit_items = st.builds(records.CommitItem, u64)
intent_items = st.builds(records.IntentItem, u64, st.text(max_size=10), st.none() | i64, st.none() | i64,
                         st.lists(st.integers(0, 2**40), max_size=20).map(lambda xs: array("q", xs).tobytes()))
bodies = st.one_of(
    st.tuples(st.just(records.Kind.SEND), st.lists(send_items, max_size=4)),
    st.tuples(st.just(records.Kind.STATE), st.lists(state_items, max_size=4)),
    st.tuples(st.just(records.Kind.MOVE), st.lists(move_items, max_size=4)),
    st.tuples(st.just(records.Kind.PART), st.lists(part_items, max_size=3)),
    st.tuples(st.just(records.Kind.COMMIT), st.lists(commit_items, min_size=1, max_size=1)),
    st.tuples(st.just(records.Kind.INTENT), st.lists(intent_items, min_size=1, max_size=2)),
    st.tuples(st.just(records.Kind.DONE), st.lists(commit_items, min_size=1, max_size=1)),
)


@given(bodies, i64)
def test_every_kind_round_trips(body, now_ms):
    kind, items = body
    assert records.decode(records.encode(kind, now_ms, items)) == (kind, now_ms, items)


@given(st.lists(state_items, min_size=1, max_size=4), i64, st.booleans())
def test_a_state_item_written_before_deliveries_reads_as_delivery_0(items, now_ms, in_a_part):
    """A STATE (or PART) record of an older node: 8 fields an item, its
    delivery then 0 (unknown: no fenced call matches it)."""
    old = [list(item)[:8] for item in items]
    kind = records.Kind.PART if in_a_part else records.Kind.STATE
    body = records._pack((int(kind), now_ms, [[7, old]] if in_a_part else old))
    _, _, decoded = records.decode(body)
    states = decoded[0].items if in_a_part else decoded
    assert [item._replace(delivery=0) for item in items] == states
    assert all(state.delivery == 0 for state in states)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 2**30), st.integers(0, 2**31)), max_size=300), st.none() | i64)
def test_an_intent_is_held_across_a_reopen_until_its_done(tmp_path_factory, places, shift_ms):
    directory = str(tmp_path_factory.mktemp("store"))
    store = Store.open(directory, StoreConfig(), now_ms=1_700_000_000_000)
    try:
        store.intend(9, "t", shift_ms, None if shift_ms is not None else 5, array("q", [n for p in places for n in p]),
                     1_700_000_000_000)
        store.commit()
        (held,) = store.intents()
        assert held.places == [Location(*p) for p in places]
        assert (held.call_id, held.topic, held.shift_ms) == (9, "t", shift_ms)
        assert store.parts_held()  # no checkpoint meanwhile: the log keeps it
    finally:
        store.close()
    store = Store.open(directory, StoreConfig(), now_ms=1_700_000_000_000)
    try:
        assert [i.places for i in store.intents()] == [[Location(*p) for p in places]]
        store.done(9, 1_700_000_000_000)
        store.commit()
        assert store.intents() == [] and not store.parts_held()
    finally:
        store.close()
