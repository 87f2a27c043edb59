"""broker.shards.rates: the split of a node's rate over its shards and the
board's grants, for any demands and any order of reports -- the targets
sum to the rate, each at least the floor (nothing to a shard that is
out); the shares the shards hold never sum over the rate, whichever
shard reports when; a lone busy shard holds all but the floors within two
rounds of reports; a bucket whose rate moves keeps its promise."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from broker.core.release_rate import BURST_S, ReleaseRate
from broker.shards.rates import FLOOR, JOB, SAME, STALE_S, RateBoard, grant, split


class PlainBoard:
    """The board written plainly: every shard's default and `split` over
    all shards for every key, each report (RateBoard keeps sums instead)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.reports: dict[int, tuple[float, dict[str, tuple[float, float, float]]]] = {}
        self.gone: set[int] = set()
        self.since_s: float | None = None

    def report(self, shard, rows, now_s):
        entries = {str(r[0]): (float(r[1]), float(r[2]), float(r[3])) for r in rows}
        self.reports[shard] = (now_s, entries)
        self.gone.discard(shard)
        self.since_s = now_s if self.since_s is None else self.since_s
        raising = len(self.reports) + len(self.gone) >= self.count or now_s - self.since_s >= STALE_S
        for other in [s for s, (at_s, _) in self.reports.items() if now_s - at_s > STALE_S]:
            del self.reports[other]
            self.gone.add(other)
        keys: dict[str, float] = {}
        for _, reported in self.reports.values():
            for key, (rate, _, _) in reported.items():
                keys[key] = rate
        moved = []
        for key, rate in keys.items():
            if key[0] == JOB and key not in entries:
                continue
            rate = entries[key][0] if key in entries else rate
            demands, shares = [], []
            for i in range(self.count):
                got = self.reports.get(i)
                entry = None if got is None else got[1].get(key)
                if entry is not None:
                    demands.append(entry[1])
                    shares.append(entry[2])
                elif key[0] == JOB:
                    demands.append(None)
                    shares.append(rate / self.count if got is None and i not in self.gone else 0.0)
                else:
                    demands.append(0.0)
                    shares.append(rate * FLOOR / self.count if i in self.gone else rate / self.count)
            mine = shares[shard]
            new = grant(rate, split(rate, demands)[shard], mine, sum(shares) - mine)
            if new > mine and not raising:
                continue
            if abs(new - mine) > SAME * max(1.0, rate):
                moved.append([key, new])
                entries[key] = (rate, demands[shard] or 0.0, new)
        return moved


demands = st.lists(st.one_of(st.none(), st.integers(0, 100_000).map(float)), min_size=1, max_size=16)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 10_000_000).map(float), demands)
def test_split_sums_to_the_rate_with_a_floor_each(rate, wanted):
    targets = split(rate, wanted)
    assert len(targets) == len(wanted)
    floor = rate * FLOOR / len(wanted)
    inside = [t for t, d in zip(targets, wanted) if d is not None]
    for target, demand in zip(targets, wanted):
        if demand is None:
            assert target == 0
        else:
            assert target >= floor * (1 - 1e-9)
    if inside:
        assert abs(sum(targets) - rate) <= rate * 1e-9
        idle = [t for t, d in zip(targets, wanted) if d == 0]
        if any(d for d in wanted if d is not None) and idle:  # an idle shard keeps its floor alone
            assert max(idle) <= floor * (1 + 1e-9)
    else:
        assert sum(targets) == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 1_000_000).map(float), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_grant_never_takes_what_others_hold(rate, target_part, share_part, others_part):
    target, share = rate * target_part, rate * share_part
    others = (rate - share) * others_part
    new = grant(rate, target, share, others)
    assert new <= max(share, target)
    if new > share:  # raised only into what the others leave
        assert new + others <= rate * (1 + 1e-9)
    if target <= share:
        assert new == target


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 6), st.integers(10, 100_000).map(float),
       st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(0, 1000)), min_size=1, max_size=60))
def test_the_shares_held_never_sum_over_the_rate(count, rate, steps):
    """Shards report in any order, each its demand of the moment; each
    carries its grants out at once (as RateShares does): the shares they
    hold sum to at most the rate after every report."""
    board = RateBoard(count)
    held = [rate / count] * count
    demand = [0] * count
    for now_s, (who, busy, amount) in enumerate(steps):
        shard = who % count
        demand[shard] = amount if busy else 0
        even = rate / count
        rows = [["t:x", rate, demand[shard], held[shard]]] if demand[shard] or held[shard] != even else []
        for key, share in board.report(shard, rows, now_s * 0.1):
            assert key == "t:x"
            held[shard] = share
        assert sum(held) <= rate * (1 + 1e-9), (held, steps)


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 8), st.integers(10, 100_000).map(float), st.integers(0, 7), st.permutations(range(8)))
def test_a_lone_busy_shard_holds_all_but_the_floors_within_two_rounds(count, rate, busy, order):
    busy %= count
    board = RateBoard(count)
    held = [rate / count] * count
    turn = [s for s in order if s < count]
    now_s = 0.0
    for _ in range(2):
        for shard in turn:
            now_s += 0.01
            d = 1000 if shard == busy else 0
            rows = [["t:x", rate, d, held[shard]]] if d or held[shard] != rate / count else []
            for _, share in board.report(shard, rows, now_s):
                held[shard] = share
    floor = rate * FLOOR / count
    assert abs(held[busy] - (rate - floor * (count - 1))) <= rate * 1e-9, held
    assert sum(held) <= rate * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 300), st.integers(1, 5000)), min_size=1,
                max_size=60))
def test_a_bucket_whose_rate_moves_takes_no_more_than_its_rates_and_a_burst(steps):
    """Over any run the bucket takes at most the integral of its rates plus
    the largest burst it had (a new rate keeps the tokens, capped)."""
    rate = ReleaseRate(100, 0)
    now = 0
    allowed = rate.burst
    taken = 0
    for gap_ms, batch, per_s in steps:
        allowed += gap_ms * rate.per_s / 1000
        now += gap_ms
        rate.set_rate(per_s, now)
        assert rate.tokens <= rate.burst + 1e-9 and rate.burst == max(1.0, per_s * BURST_S)
        n = min(batch, rate.available(now))
        rate.took(n, n < batch, now)
        taken += n
        assert taken <= allowed + 1e-6


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 6), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1_000), st.lists(
    st.tuples(st.sampled_from(["t:x", "t:y", "j:a", "j:b"]), st.integers(0, 3), st.floats(0, 1)), max_size=4)),
    min_size=1, max_size=40))
def test_the_board_grants_what_the_plain_board_grants(count, steps):
    """Any reports (keys, demands, shares the shards say they hold), at any
    times (shards falling stale and coming back): the same moves."""
    rates = {"t:x": 1000.0, "t:y": 7.0, "j:a": 40.0, "j:b": 100_000.0}
    board, plain = RateBoard(count), PlainBoard(count)
    now_s = 0.0
    for who, gap_ms, rows in steps:
        now_s += gap_ms / 1000
        shard = who % count
        report = {}
        for key, demand, part in rows:
            report[key] = [key, rates[key], float(demand if key[0] == "t" else 1), rates[key] * part]
        got = board.report(shard, list(report.values()), now_s)
        want = plain.report(shard, list(report.values()), now_s)
        assert sorted(k for k, _ in got) == sorted(k for k, _ in want), (got, want)
        for (k, share), (_, expected) in zip(sorted(got), sorted(want)):
            assert abs(share - expected) <= 1e-6 * max(1.0, rates[k]), (k, share, expected)
