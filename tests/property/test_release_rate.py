"""broker.core.release_rate: a topic's token bucket against its promise,
for any rate and any pulls at any times -- in every window of t ms the
pulls take at most per_s * t / 1000 + burst, never a token that is not
there; a pull that waits `next_token_ms` finds one; a rate kept busy
hands out per_s a second; smoothing lateness counts only the time the
bucket held the topic back, and never more than the lateness."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from broker.core.release_rate import BURST_S, ReleaseRate, smoothing_ms

pulls = st.lists(st.tuples(st.integers(0, 400), st.integers(1, 300)), min_size=1, max_size=80)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000), pulls)
def test_no_window_takes_more_than_the_rate_and_the_burst(per_s, gaps_and_batches):
    rate = ReleaseRate(per_s, 0)
    now = 0
    taken: list[tuple[int, int]] = []
    for gap_ms, batch in gaps_and_batches:
        now += gap_ms
        n = min(batch, rate.available(now))
        rate.took(n, n < batch, now)
        assert rate.tokens >= -1e-6
        taken.append((now, n))
    burst = max(1.0, per_s * BURST_S)
    for i, (start, _) in enumerate(taken):
        for end, _ in taken[i:]:
            in_window = sum(n for at, n in taken if start <= at <= end)
            assert in_window <= per_s * (end - start) / 1000 + burst + 1e-6


@given(st.integers(1, 5000), st.integers(0, 10_000))
def test_waiting_next_token_ms_finds_a_token(per_s, now):
    rate = ReleaseRate(per_s, 0)
    rate.took(rate.available(now), True, now)
    wait = rate.next_token_ms(now)
    assert rate.available(now + wait) >= 1
    if wait > 0:
        assert ReleaseRate(per_s, 0).available(0) >= 1  # (a fresh bucket starts with its burst)


@given(st.integers(10, 5000), st.integers(2, 20))
def test_a_busy_bucket_hands_out_its_rate(per_s, seconds):
    """Pulled every 10 ms for `seconds`: per_s a second, within the burst."""
    rate = ReleaseRate(per_s, 0)
    total = 0
    for now in range(0, seconds * 1000 + 1, 10):
        n = rate.available(now)
        rate.took(n, True, now)
        total += n
    assert per_s * seconds - 1 <= total <= per_s * seconds + max(1.0, per_s * BURST_S)


@given(st.integers(0, 10**6), st.none() | st.integers(0, 10**6), st.integers(0, 10**6))
def test_smoothing_is_the_held_part_of_the_lateness(due, held_since, extra):
    now = max(due, held_since or 0) + extra
    s = smoothing_ms(due, held_since, now)
    assert 0 <= s <= now - due
    if held_since is None:
        assert s == 0
    else:
        assert s == now - max(due, held_since)


def test_held_since_starts_when_limited_and_ends_when_not():
    rate = ReleaseRate(10, 0)  # burst 1
    rate.took(rate.available(0), True, 0)
    assert rate.held_since_ms == 0
    rate.took(rate.available(50), True, 50)  # (no token yet)
    assert rate.held_since_ms == 0
    rate.took(rate.available(200), False, 200)
    assert rate.held_since_ms is None
