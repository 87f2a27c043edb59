"""broker.schedules.checks: the schedules' worker's checks against a model
(a plain list): a check comes due at the end of its BUCKET_MS bucket --
never before its time, less than BUCKET_MS after it --, is taken once,
earliest bucket first, at most `most` a call; `keep` leaves exactly the
wanted ones, each (schedule, run) once; the count is always the model's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from broker.schedules.checks import BUCKET_MS, FAR_MS, Checks

KEYS = st.sampled_from([("t", "a"), ("t", "b"), ("u", "a")])
NOMINALS = st.integers(0, 3)


class ChecksMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.checks = Checks()
        self.model: list[tuple[int, tuple[str, str], int]] = []  # (time, key, nominal)
        self.now_ms = 0
        self.far_added = 0

    @rule(ahead=st.one_of(st.integers(0, 3 * BUCKET_MS), st.integers(FAR_MS - 1, FAR_MS + 1)), key=KEYS,
          nominal=NOMINALS)
    def add(self, ahead: int, key: tuple[str, str], nominal: int) -> None:
        self.checks.add(self.now_ms + ahead, key, nominal, self.now_ms)
        self.model.append((self.now_ms + ahead, key, nominal))
        self.far_added += ahead > FAR_MS

    @rule(step=st.one_of(st.integers(0, 2 * BUCKET_MS), st.just(FAR_MS)))
    def advance(self, step: int) -> None:
        self.now_ms += step

    @rule(most=st.integers(1, 6))
    def take_due(self, most: int) -> None:
        taken = self.checks.take_due(self.now_ms, most)
        assert len(taken) <= most
        due_end = lambda at: -(-at // BUCKET_MS) * BUCKET_MS  # noqa: E731
        taken_ends = []
        for key, nominal in taken:
            times = sorted(at for at, k, n in self.model if (k, n) == (key, nominal) and due_end(at) <= self.now_ms)
            assert times, f"{key, nominal} taken before its bucket's end"  # (so never before its time)
            at = times[0]
            self.model.remove((at, key, nominal))
            taken_ends.append(due_end(at))
        due_left = [at for at, _, _ in self.model if due_end(at) <= self.now_ms]
        if len(taken) < most:  # all due ones were taken
            assert not due_left, (taken, due_left)
        if taken and due_left:  # earliest bucket first: none left due in an earlier bucket than one taken from
            assert min(due_end(at) for at in due_left) >= max(taken_ends), (taken_ends, due_left)

    @rule(dropped=st.sets(st.tuples(KEYS, NOMINALS)))
    def keep(self, dropped: set[tuple[tuple[str, str], int]]) -> None:
        self.checks.keep(lambda key, nominal: (key, nominal) not in dropped)
        kept: dict[tuple[tuple[str, str], int], int] = {}
        for at, key, nominal in sorted(self.model, key=lambda c: -(-c[0] // BUCKET_MS)):
            if (key, nominal) not in dropped:
                kept.setdefault((key, nominal), at)
        # each once, in its earliest bucket: the model keeps the one of the earliest bucket
        self.model = [(at, key, nominal) for (key, nominal), at in kept.items()]
        self.far_added = 0

    @invariant()
    def counts_and_first_due(self) -> None:
        assert len(self.checks) == len(self.model)
        assert self.checks.far_added == self.far_added
        due = self.checks.due_ms()
        if not self.model:
            assert due is None
        else:
            assert due == min(-(-at // BUCKET_MS) * BUCKET_MS for at, _, _ in self.model)


TestChecks = ChecksMachine.TestCase
TestChecks.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


@given(st.lists(st.tuples(st.integers(0, 10_000), KEYS, NOMINALS), max_size=60), st.integers(0, 12_000))
def test_take_due_takes_exactly_the_checks_whose_bucket_has_ended_earliest_first(adds, now_ms):
    checks = Checks()
    for at, key, nominal in adds:
        checks.add(at, key, nominal, 0)
    ends: list[int] = []
    while True:
        first = checks.due_ms()
        taken = checks.take_due(now_ms, 1)
        if not taken:
            break
        assert first is not None and first <= now_ms
        ends.append(first)
    assert ends == sorted(ends)  # earliest bucket first
    due = sorted(-(-at // BUCKET_MS) * BUCKET_MS for at, _, _ in adds if -(-at // BUCKET_MS) * BUCKET_MS <= now_ms)
    assert ends == due
    assert len(checks) == len(adds) - len(due)
