"""Property tests of a fenced call's outcomes as they cross between the
shards of a node (broker.shards.views' `fencings_fields` and
`fencings_of`): through msgpack, as the shards' wire carries them, every
id gets its own outcome back, in order, and a run of one shared outcome
travels as one row."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.transitions import Fencing, Refusal
from broker.shards.views import fencings_fields, fencings_of
from storage.entry import Status

SETTINGS = settings(max_examples=200, deadline=None)

outcomes = st.builds(Fencing, st.none() | st.sampled_from(Status), st.none() | st.sampled_from(Refusal),
                     st.integers(0, 2**63 - 1))
# A call's outcomes: a few objects (a call's changed messages share theirs),
# each repeated in runs, in any order.
calls = st.lists(outcomes, min_size=1, max_size=4).flatmap(
    lambda shared: st.lists(st.tuples(st.sampled_from(shared), st.integers(1, 5)), max_size=30))


@SETTINGS
@given(calls)
def test_each_id_gets_its_outcome_back_in_order(runs):
    sent = [outcome for outcome, times in runs for _ in range(times)]
    wire = msgpack.unpackb(msgpack.packb(fencings_fields(sent)))
    assert fencings_of(wire) == sent


@SETTINGS
@given(calls)
def test_a_run_of_one_shared_outcome_travels_as_one_row(runs):
    sent = [outcome for outcome, times in runs for _ in range(times)]
    rows, at = fencings_fields(sent)
    changes = sum(1 for i, outcome in enumerate(sent) if i == 0 or outcome is not sent[i - 1])
    assert len(rows) == changes
    assert len(at) == len(sent)
    assert sorted(set(at)) == list(range(len(rows)))
