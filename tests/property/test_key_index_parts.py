"""The key index's buckets (storage.key_index) against a model: after any
sequence of puts (keys, files -- hours and spans --, trigger times, LATE
ones among them), replays of part of an earlier batch (as a crash's
replay puts them again) and file retirements, `parts` lists exactly the
non-empty parts of live files, LATE ones first and the rest by the start
of their time range, every location put under a key comes back from its
part, each once, and its trigger time lies within the part's range --
puts made one by one or a batch at a time (a batch's items of one key and
part with following globalIndexes held as one run). A part's `buckets`
come by the start of their range, and `BucketPlaces` hands each place of
a bucket out once, at most `limit` a take, each triggering within its
bucket's range. A put's probes do not grow with its key's count, and a
batch under one key is one slot a run.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from storage import spans
from storage.entry import MS_PER_HOUR
from storage.id_index import IdIndex
from storage.key_index import LATE, BucketPlaces, KeyIndex, part_of

NOW_HOUR = 490_000
HOURS = [NOW_HOUR + i for i in range(4)]
SPAN = spans.file_for(NOW_HOUR + 5_000, NOW_HOUR)  # a span far ahead
SPAN_START = spans.start_hour(SPAN, (NOW_HOUR + 5_000) * MS_PER_HOUR)


def _trigger(file_id: int, offset: int, late: bool) -> int:
    if file_id == SPAN:
        return SPAN_START * MS_PER_HOUR + offset * (MS_PER_HOUR << spans.span_shift(SPAN)) // 10_000
    start = file_id * MS_PER_HOUR
    return start - 1 - offset if late else start + offset * MS_PER_HOUR // 10_000


one_put = st.tuples(st.sampled_from(("a", "b", "c")), st.sampled_from([*HOURS, SPAN]),
                    st.integers(0, 9_999), st.booleans())
puts = st.lists(st.one_of(
    st.tuples(st.just("put"), one_put),
    st.tuples(st.just("batch"), st.lists(st.tuples(one_put, st.integers(1, 6)), min_size=1, max_size=12)),
    st.tuples(st.just("retire"), st.sampled_from(HOURS)),
    st.tuples(st.just("replay"), st.integers(0, 39), st.integers(0, 80), st.integers(0, 80)),
), min_size=1, max_size=40)


def _open(tmp_path_factory, live: set[int]) -> KeyIndex:
    directory = str(tmp_path_factory.mktemp("keys") / "keys")
    slots = IdIndex.build(directory, 16, live.__contains__)
    slots.publish()
    return KeyIndex(slots)


def _starts(live: set[int]) -> list[tuple[int, int]]:
    return [(f, SPAN_START if f == SPAN else f) for f in sorted(live)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=puts, takes=st.lists(st.integers(1, 7), min_size=1, max_size=5))
def test_parts_and_locations_match_a_model(tmp_path_factory, steps, takes):
    live = {*HOURS, SPAN}
    index = _open(tmp_path_factory, live)
    model: dict[str, dict[tuple[int, int], int]] = {}  # key -> (file, gi) -> trigger
    next_gi = dict.fromkeys(live, 0)
    history: list[list[tuple[int, int, int, int]]] = []  # the batches put
    try:
        for step in steps:
            if step[0] == "replay":
                if history:
                    batch = history[step[1] % len(history)]
                    index.put_many([item for item in batch[min(step[2], step[3]):max(step[2], step[3])]
                                    if item[1] in live])
                continue
            if step[0] in ("put", "batch"):
                batch = [step[1]] if step[0] == "put" else [  # repeats: one key's sends side by side
                    (name, file_id, min(offset + r, 9_999), late)
                    for (name, file_id, offset, late), repeat in step[1] for r in range(repeat)]
                items = []
                for name, file_id, offset, late in sorted(batch, key=lambda p: p[1]):  # a file's run, as applied
                    if file_id not in live:
                        continue
                    trigger = _trigger(file_id, offset, late and file_id != SPAN)
                    if offset % 5 == 0:
                        next_gi[file_id] += 1  # a message of no key between: a gap in the run
                    gi = next_gi[file_id]
                    next_gi[file_id] += 1
                    items.append((index.key("t", name), file_id, trigger, gi))
                    model.setdefault(name, {})[(file_id, gi)] = trigger
                if step[0] == "put":
                    for item in items:
                        index.put(*item)
                else:
                    index.put_many(items)
                    history.append(items)
            else:
                live.discard(step[1])
                for places in model.values():
                    for where in [w for w in places if w[0] == step[1]]:
                        del places[where]
        for name in ("a", "b", "c"):
            key = index.key("t", name)
            parts = index.parts(key, _starts(live))
            lates = [p for p in parts if p.part == LATE]
            assert parts[:len(lates)] == lates
            rest = parts[len(lates):]
            assert [p.low_ms for p in rest] == sorted(p.low_ms for p in rest)
            found: dict[tuple[int, int], int] = {}
            for part in parts:
                places = index.locations(key, part)
                assert len(places) == len(set(places))
                for where in places:
                    trigger = model[name][(where.hour, where.global_index)]
                    assert part_of(where.hour, trigger) == part.part
                    assert part.low_ms <= trigger < part.high_ms
                    found[(where.hour, where.global_index)] = trigger
                buckets = index.buckets(key, part)
                assert [b.low_ms for b in buckets] == sorted(b.low_ms for b in buckets)
                handed: list[tuple[int, int]] = []
                spans_handed: list[int] = []
                for bucket in buckets:
                    assert part.low_ms <= bucket.low_ms and bucket.high_ms == part.high_ms
                    reader = BucketPlaces(index, bucket, spans_handed)
                    n = 0
                    while not reader.done:
                        spans = reader.take(takes[n % len(takes)])
                        assert sum(length for _, length in spans) <= takes[n % len(takes)]
                        for first, length in spans:
                            for gi in range(first, first + length):
                                handed.append((part.file_id, gi))
                                assert bucket.low_ms <= model[name][(part.file_id, gi)] < bucket.high_ms
                        n += 1
                assert sorted(handed) == sorted(set(handed)) == sorted((w.hour, w.global_index) for w in places)
            assert found == model.get(name, {})
    finally:
        index.close()


def test_a_put_costs_the_same_for_a_key_of_one_or_of_many(tmp_path_factory):
    """Probes (slots read) of a put under a key that holds 20,000 messages
    in one part, against a put under a new key: the same order."""
    live = {NOW_HOUR}
    index = _open(tmp_path_factory, live)
    try:
        hot = index.key("t", "hot")
        trigger = NOW_HOUR * MS_PER_HOUR + 1_000
        for gi in range(20_000):
            index.put(hot, NOW_HOUR, trigger, gi)
        before = index.probes
        index.put(hot, NOW_HOUR, trigger, 20_000)
        hot_probes = index.probes - before
        before = index.probes
        index.put(index.key("t", "cold"), NOW_HOUR, trigger, 20_001)
        cold_probes = index.probes - before
        assert hot_probes <= 3 * cold_probes + 12, (hot_probes, cold_probes)
        (part,) = index.parts(hot, [(NOW_HOUR, NOW_HOUR)])
        assert part.entries == 20_001
        assert len(index.locations(hot, part)) == 20_001
    finally:
        index.close()


def test_a_batch_under_one_key_is_one_run(tmp_path_factory):
    """1,000 sends of one key into one part, put in one call with following
    globalIndexes (a sendMsgBatch's run): one run, a few slots, every
    place listed; a gap in the globalIndexes starts another run."""
    live = {NOW_HOUR}
    index = _open(tmp_path_factory, live)
    try:
        hot = index.key("t", "hot")
        trigger = NOW_HOUR * MS_PER_HOUR + 1_000
        before = index.probes
        index.put_many([(hot, NOW_HOUR, trigger, gi) for gi in range(1_000)])
        assert index.probes - before < 40
        index.put_many([(hot, NOW_HOUR, trigger, gi) for gi in (2_000, 2_001, 2_005)])
        (part,) = index.parts(hot, [(NOW_HOUR, NOW_HOUR)])
        assert part.entries == 3
        places = index.locations(hot, part)
        assert sorted(w.global_index for w in places) == [*range(1_000), 2_000, 2_001, 2_005]
        assert sum(s.used for s in index.slots.shards) == 4 + 3 + 2  # counters (file, part, sub, fine), run slots, length counters
    finally:
        index.close()
