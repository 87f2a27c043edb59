"""A redriveMsgs job's slices on Redis (lua/backend/redrive_slice.lua,
broker.redis.requests' `redrive_slice`) against a model, on the session's
real redis-server: dead letters of random ids, tags, keys and end times,
many sharing one purge time (the dead set's score: ties ordered by id),
a random filter, random slice sizes and scan lengths, and slices run again
from an older cursor (a crash before the job saved its cursor). The slices
re-drive exactly the dead letters the filter matches, each once (its
redriveCount 1, READY with retry 0, due at the trigger given), and leave
the others dead; the scan ends."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.entry import Status
from storage.types import NewMessage

pytest.importorskip("redis", reason="the redis extra is not installed (pip install 'hourglass[redis]')")

OWN_DB = 12  # this file's Redis database, flushed at each example

letters = st.builds(
    lambda i, tag, key, ttl, batch: (f"{i}", tag, key, ttl, batch),
    st.text("abc", min_size=1, max_size=4), st.sampled_from(["", "red", "blue"]), st.sampled_from(["", "k1", "k2"]),
    st.integers(1, 6), st.integers(0, 2))
filters = st.builds(
    lambda key, tag, prefix, statuses, lo, hi: (key, tag, prefix, statuses, lo, hi),
    st.sampled_from([None, "k1", ""]), st.sampled_from([None, "red", "blue"]), st.sampled_from([None, "a", "ab", "c"]),
    st.sampled_from([[5], [5, 6], [6]]), st.sampled_from([None, 1002, 1004]), st.sampled_from([None, 1003, 1006]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dead=st.lists(letters, max_size=30, unique_by=lambda d: d[0]), flt=filters,
       moves=st.lists(st.integers(1, 5), min_size=1, max_size=8), scan=st.integers(1, 7),
       replays=st.lists(st.booleans(), max_size=8), later=st.booleans())
def test_slices_redrive_each_match_once_and_nothing_else(redis_url, dead, flt, moves, scan, replays, later):
    import redis

    from broker.clock import SystemClock
    from broker.core.bulk_params import DeadFilter
    from broker.core.params import Defaults
    from broker.observe.metrics import Metrics
    from broker.redis import requests
    from broker.redis.backend import RedisBroker
    from broker.redis.keys import RedisConfig

    url = redis_url.rsplit("/", 1)[0] + f"/{OWN_DB}"
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    topic = "slices"
    dead_filter = DeadFilter.of([flt[0], flt[1], flt[2], flt[3], flt[4], flt[5]])
    clock = SystemClock()
    trigger_ms = clock.now_ms() + 3_600_000 if later else None

    async def main() -> None:
        broker = RedisBroker.from_url(url, clock, Defaults(), Metrics(), RedisConfig(key_prefix="slices"))
        await broker.start()
        try:
            base_ms = clock.now_ms()  # (purged at base_ms + the retention: not during the test)
            for batch in range(3):  # a batch: one purge time (the dead set's score) for all its letters
                msgs = [NewMessage(topic, i, "x", 1, 1000, ttl, 0, tag=tag, key=key)
                        for i, tag, key, ttl, b in dead if b == batch]
                if msgs:
                    stored = await broker.send(msgs, now_ms=base_ms + batch)
                    assert {m.status for m in stored} == {Status.EXPIRED}
            expected = {i for i, *_ in dead
                        if dead_filter.matches(await broker.get(topic, i))}
            cursor: tuple[int, int | str] = (0, 0)
            redriven_total = 0
            turn = 0
            while True:
                before = cursor
                matched, redriven, after, settled = await broker.redrive_slice(
                    topic, dead_filter, trigger_ms, cursor, moves[turn % len(moves)])
                assert settled is None and matched == redriven  # (one script: a match is moved where found)
                redriven_total += redriven
                if turn < len(replays) and replays[turn]:  # a crash before the cursor was saved: run again
                    _, again, after, _ = await broker.redrive_slice(topic, dead_filter, trigger_ms, before,
                                                                    moves[turn % len(moves)])
                    redriven_total += again
                turn += 1
                assert turn < 1000, "the scan did not end"
                if after is None:
                    break
                cursor = after
            assert redriven_total == len(expected)
            for i, *_ in dead:
                m = await broker.get(topic, i)
                if i in expected:
                    want = Status.WAITING if later else Status.READY
                    assert (m.status, m.retry, m.redrive_count) == (want, 0, 1), m
                    if later:
                        assert m.trigger_ms == trigger_ms
                else:
                    assert (m.status, m.redrive_count) == (Status.EXPIRED, 0), m
        finally:
            await broker.stop()

    saved = requests.JOB_SCAN
    requests.JOB_SCAN = scan
    try:
        asyncio.run(main())
    finally:
        requests.JOB_SCAN = saved
        with contextlib.suppress(Exception), redis.Redis.from_url(url) as client:
            client.flushdb()
